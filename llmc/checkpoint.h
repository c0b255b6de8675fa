// Checkpoints, shared by the CPU and CUDA trainers: llm.c model files, their checksums, the training-state file
// and the directory layout that --resume reads.
//
// Model file (llm.c's format, so checkpoints move between llm.c, the CPU trainer and the CUDA trainer):
//   header: 256 x int32   [0] magic 20240326  [1] version: 3 = fp32 weights, 5 = bf16 weights
//                         [2] max_seq_len  [3] vocab_size  [4] num_layers  [5] num_heads  [6] channels
//                         [7] padded_vocab_size   (the rest 0)
//   then the 16 parameter tensors in llm.c order (config.h), back to back, fp32 or bf16.
// Its checksum lives in a side file, "<model file>.crc32c", one line: "crc32c <8 hex digits> bytes <size>", the
// CRC-32C (llmc/checksum.h) of the whole model file. Not a trailer after the parameters: llm.c's C trainers
// would ignore one, but its exporter (dev/eval/export_hf.py) asserts the file ends with the last parameter, so a
// trailer would make our files unreadable there. llm.c's files have no side file: they load with the header
// checks only. A resume (require_checksum) insists on the side file, which every checkpoint writes.
//
// State file (ours: everything a bit-exact resume needs beyond the weights), version 3:
//   header 256 x int64: [0] magic 20261129  [1] version 3  [2] step (optimizer steps done)
//                       [3] num_parameters  [4] 1 if fp32 master weights follow  [5] sampling RNG state
//                       [6] B  [7] T  [8] total batch tokens  [9] seed
//                       [10..17] DataLoaderState: epoch shard_pos batch_pos seed shuffle B T num_shards
//                       [18..23] config: max_seq_len vocab_size padded_vocab_size num_layers num_heads channels
//                       [24] world: processes (GPUs) of the run  [25] rank
//                       [26..27] the optimizer slice [begin, end) of the flat parameters in this file
//                       [28] payload bytes after the header  [29] CRC-32C of the payload
//                       [30] loss-spike window length  [31] updates skipped in a row  [32..95] the window's
//                            losses, oldest first, as float bits (llmc/guard.h)
//                       [255] CRC-32C of words [0..254]
//   then AdamW m (end - begin fp32), AdamW v (fp32), and the fp32 master weights when [4] is 1.
//   Reading checks the magic first, then the version, then the header's checksum, then every field's range and
//   the file's size against the fields, and last the payload's checksum: nothing is trusted before it is checked.
//
// A checkpoint directory (-o) holds, per checkpoint step s (8 digits):
//   model_<s>.bin (+ .crc32c)  state_<s>.bin (state_<s>_rank<r>.bin per GPU when data parallel)  DONE_<s>
// DONE is written last: a checkpoint counts only once it exists, so --resume takes the newest step with a DONE
// file and an interrupted save is ignored. Every file is written to "<path>.tmp" and renamed into place
// (llmc/fileio.h), so a crash never leaves a partial file under a real name.
#pragma once
#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "llmc/checksum.h"
#include "llmc/config.h"  // GPT2Config, validate_config
#include "llmc/dataloader.h"  // DataLoaderState
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/guard.h"  // GuardState

namespace flashgpt2 {

constexpr int CHECKPOINT_MAGIC = 20240326;
constexpr int CHECKPOINT_VERSION_FP32 = 3;
constexpr int CHECKPOINT_VERSION_BF16 = 5;
constexpr int CHECKPOINT_HEADER_INTS = 256;

// bf16 is the top half of an fp32: widening is exact; narrowing rounds to nearest, ties to even.
inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// ---------------------------------------------------------------------------------------------------------
// Checksum side files: "<path>.crc32c" holding "crc32c <hex> bytes <size>\n".

struct FileChecksum {
    uint32_t crc = 0;
    size_t bytes = 0;
};

inline std::string checksum_path(const std::string& path) { return path + ".crc32c"; }

inline void write_checksum_file(const std::string& path, const FileChecksum& c) {
    char line[64];
    snprintf(line, sizeof line, "crc32c %08x bytes %zu\n", c.crc, c.bytes);
    write_file_atomic(checksum_path(path), std::string(line));
}

// The side file's contents, or nothing when there is none; a side file that exists must be well formed.
inline std::optional<FileChecksum> read_checksum_file(const std::string& path) {
    const std::string side = checksum_path(path);
    std::error_code ec;
    if (!std::filesystem::exists(side, ec)) return std::nullopt;
    if (file_size(side) > 64) fail("%s: not a checksum file (longer than one line)", side.c_str());
    const std::string text = read_file(side);
    unsigned crc = 0;
    unsigned long long bytes = 0;
    int used = -1;
    if (sscanf(text.c_str(), "crc32c %8x bytes %20llu\n%n", &crc, &bytes, &used) != 2 || used != (int)text.size())
        fail("%s: not a checksum file (expected one line 'crc32c <8 hex digits> bytes <size>')", side.c_str());
    return FileChecksum{crc, (size_t)bytes};
}

// ---------------------------------------------------------------------------------------------------------
// Model files.

struct CheckpointHeader {
    int version = CHECKPOINT_VERSION_FP32;
    GPT2Config config;
};

inline size_t checkpoint_bytes_per_param(int version) { return version == CHECKPOINT_VERSION_BF16 ? 2 : 4; }

// Checks a model file's header words against the file's size: magic, version, a sane config, exact size.
inline CheckpointHeader parse_checkpoint_header(const std::string& path, const int32_t* h, size_t size) {
    if (h[0] != CHECKPOINT_MAGIC)
        fail("%s: bad magic %d (expected %d): not an llm.c model file", path.c_str(), h[0], CHECKPOINT_MAGIC);
    if (h[1] != CHECKPOINT_VERSION_FP32 && h[1] != CHECKPOINT_VERSION_BF16)
        fail("%s: unknown checkpoint version %d (expected 3 = fp32 or 5 = bf16)", path.c_str(), h[1]);
    CheckpointHeader hdr;
    hdr.version = h[1];
    hdr.config = GPT2Config{h[2], h[3], h[7], h[4], h[5], h[6]};
    validate_config(hdr.config, path.c_str());
    const size_t want = CHECKPOINT_HEADER_INTS * sizeof(int32_t) +
                        num_parameters(hdr.config) * checkpoint_bytes_per_param(hdr.version);
    if (size != want)
        fail("%s: %s checkpoint: %zu bytes, expected %zu for this config", path.c_str(),
             size < want ? "truncated" : "oversized", size, want);
    return hdr;
}

// Reads and checks the header only (no checksum: that needs the whole file).
inline CheckpointHeader read_checkpoint_header(const std::string& path) {
    InputFile in(path);
    const size_t size = file_size(in.f, path);
    int32_t h[CHECKPOINT_HEADER_INTS];
    if (std::fread(h, sizeof(int32_t), CHECKPOINT_HEADER_INTS, in.f) != CHECKPOINT_HEADER_INTS)
        fail("%s: truncated checkpoint: %zu bytes, shorter than the %zu-byte header", path.c_str(), size, sizeof h);
    return parse_checkpoint_header(path, h, size);
}

inline GPT2Config load_checkpoint_config(const std::string& path) { return read_checkpoint_header(path).config; }

// Loads a version 3 (fp32) or 5 (bf16, widened to fp32) checkpoint into params; returns its config. The CRC-32C
// side file is checked when there is one; require_checksum (a resume) makes a missing one an Error too.
inline GPT2Config load_checkpoint(const std::string& path, std::vector<float>& params, bool require_checksum = false) {
    const std::optional<FileChecksum> sum = read_checksum_file(path);
    if (!sum && require_checksum)
        fail("%s: no checksum file %s (every checkpoint writes one): cannot verify it", path.c_str(),
             checksum_path(path).c_str());
    InputFile in(path);
    const size_t size = file_size(in.f, path);
    if (sum && sum->bytes != size)
        fail("%s: %zu bytes, but its checksum file says %zu: the file is damaged", path.c_str(), size, sum->bytes);
    int32_t h[CHECKPOINT_HEADER_INTS];
    if (std::fread(h, sizeof(int32_t), CHECKPOINT_HEADER_INTS, in.f) != CHECKPOINT_HEADER_INTS)
        fail("%s: truncated checkpoint: %zu bytes, shorter than the %zu-byte header", path.c_str(), size, sizeof h);
    const CheckpointHeader hdr = parse_checkpoint_header(path, h, size);
    const size_t n = num_parameters(hdr.config);
    uint32_t crc = crc32c(h, sizeof h);
    params.resize(n);
    bool ok;
    if (hdr.version == CHECKPOINT_VERSION_FP32) {
        ok = std::fread(params.data(), sizeof(float), n, in.f) == n;
        crc = crc32c(params.data(), n * sizeof(float), crc);
    } else {
        std::vector<uint16_t> raw(n);
        ok = std::fread(raw.data(), sizeof(uint16_t), n, in.f) == n;
        crc = crc32c(raw.data(), n * sizeof(uint16_t), crc);
        for (size_t i = 0; i < n; i++) params[i] = bf16_to_float(raw[i]);
    }
    if (!ok) fail("%s: read error in the parameters (file changed while reading?)", path.c_str());
    if (sum && sum->crc != crc)
        fail("%s: checksum mismatch (crc32c %08x, %s says %08x): the file is damaged, or its save was cut short "
             "between the two files", path.c_str(), crc, checksum_path(path).c_str(), sum->crc);
    return hdr.config;
}

// The 256-int header of a model file (the layout above), after checking that cfg and version can be written.
// `where` names the file in the errors.
inline std::array<int32_t, CHECKPOINT_HEADER_INTS> checkpoint_header(const GPT2Config& cfg, int version,
                                                                       const std::string& where) {
    validate_config(cfg, where.c_str());
    if (version != CHECKPOINT_VERSION_FP32 && version != CHECKPOINT_VERSION_BF16)
        fail("%s: cannot write checkpoint version %d (3 = fp32 or 5 = bf16)", where.c_str(), version);
    std::array<int32_t, CHECKPOINT_HEADER_INTS> h{};
    h[0] = CHECKPOINT_MAGIC, h[1] = version, h[2] = cfg.max_seq_len, h[3] = cfg.vocab_size;
    h[4] = cfg.num_layers, h[5] = cfg.num_heads, h[6] = cfg.channels, h[7] = cfg.padded_vocab_size;
    return h;
}

// Writes header + raw parameter bytes atomically (tmp, then rename), then its checksum file. Used for both
// versions; the CUDA trainer writes its bf16 weights through this too. bytes must match the config and version.
// A failed write leaves the previous file and its checksum file as they were. A crash between the two renames
// leaves a new file beside an old checksum: it then reads as damaged (refused), never a damaged file as good.
inline void write_checkpoint_file(const std::string& path, const GPT2Config& cfg, int version, const void* data,
                                  size_t bytes) {
    const auto h = checkpoint_header(cfg, version, path);
    const size_t want = num_parameters(cfg) * checkpoint_bytes_per_param(version);
    if (bytes != want) fail("%s: %zu parameter bytes given, the config needs %zu", path.c_str(), bytes, want);

    make_directories(std::filesystem::path(path).parent_path().string(), "checkpoint");
    write_file_atomic(path, {{h.data(), sizeof h}, {data, bytes}});
    write_checksum_file(path, FileChecksum{crc32c(data, bytes, crc32c(h.data(), sizeof h)), sizeof h + bytes});
}

// Saves fp32 parameters (num_parameters(cfg) of them) as a version 3 checkpoint.
inline void save_checkpoint(const std::string& path, const GPT2Config& cfg, const float* params) {
    write_checkpoint_file(path, cfg, CHECKPOINT_VERSION_FP32, params, num_parameters(cfg) * sizeof(float));
}

// ---------------------------------------------------------------------------------------------------------
// The checkpoint directory.

inline std::string checkpoint_path(const std::string& dir, const char* kind, int64_t step) {
    char name[64];
    snprintf(name, sizeof name, "%s_%08lld%s", kind, (long long)step, strcmp(kind, "DONE") == 0 ? "" : ".bin");
    return (std::filesystem::path(dir) / name).string();
}

// The state file of one rank: state_<step>.bin on one GPU, state_<step>_rank<r>.bin with world > 1.
inline std::string state_path(const std::string& dir, int64_t step, int rank, int world) {
    if (world <= 1) return checkpoint_path(dir, "state", step);
    char kind[48];
    snprintf(kind, sizeof kind, "state_%08lld_rank%d", (long long)step, rank);
    return (std::filesystem::path(dir) / (std::string(kind) + ".bin")).string();
}

// The newest step in dir with a DONE marker, or -1 when there is none.
inline int64_t latest_checkpoint_step(const std::string& dir) {
    int64_t best = -1;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        long long step = -1;
        char tail = 0;
        if (sscanf(name.c_str(), "DONE_%lld%c", &step, &tail) == 1 && step > best) best = step;
    }
    return best;
}

// True for the names a checkpoint writes (model_, state_ or DONE_ and 8 digits, with any suffix), complete or not.
inline bool is_checkpoint_file(const std::string& name) {
    for (const char* kind : {"model_", "state_", "DONE_"}) {
        const size_t k = strlen(kind);
        if (name.compare(0, k, kind) != 0 || name.size() < k + 8) continue;
        if (name.find_first_not_of("0123456789", k) >= k + 8) return true;
    }
    return false;
}

// Every checkpoint file in dir (none when dir does not exist), sorted.
inline std::vector<std::string> checkpoint_files(const std::string& dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (is_checkpoint_file(e.path().filename().string())) out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
}

// ---------------------------------------------------------------------------------------------------------
// State files.

constexpr int64_t STATE_MAGIC = 20261129;  // the date this format was first defined
// Version 3 adds the checksums and the guard's window. Version 2 had neither and is refused (its data is fine,
// but a single flipped bit in it could not be told from a good file); version 1 indexed another data order.
constexpr int64_t STATE_VERSION = 3;
constexpr int STATE_HEADER_WORDS = 256;
constexpr size_t STATE_HEADER_BYTES = STATE_HEADER_WORDS * sizeof(int64_t);

// What a resume restores besides the weights and the optimizer moments.
struct TrainState {
    int64_t step = 0;             // optimizer steps completed
    uint64_t rng_state = 0;       // the sampler's Rng
    int64_t B = 0, T = 0, total_batch = 0;
    uint64_t seed = 0;
    DataLoaderState loader;       // the training loader's position: the next batch to read
    GuardState guard;             // the loss-spike guard's window (llmc/guard.h)
};

// Which optimizer state the file holds; a resume must find exactly its own layout (check_state_layout).
struct StateLayout {
    GPT2Config config;
    size_t num_params = 0;      // of the whole model
    bool master = false;        // fp32 master weights follow m and v (the BF16 CUDA build)
    int world = 1, rank = 0;    // processes of the run, and which one wrote this file
    size_t begin = 0, end = 0;  // the optimizer slice [begin, end) of the flat parameters (ZeRO-1)
    size_t slice() const { return end - begin; }
    size_t payload_bytes() const { return slice() * sizeof(float) * (master ? 3 : 2); }
};

struct StateFile {
    TrainState state;
    StateLayout layout;
    std::string bytes;  // the whole file (read_state_file); empty from read_state_header
    // The payload's three arrays, slice() floats each (master only when layout.master).
    const char* m() const { return bytes.data() + STATE_HEADER_BYTES; }
    const char* v() const { return m() + layout.slice() * sizeof(float); }
    const char* master() const { return v() + layout.slice() * sizeof(float); }
};

inline void write_state_file(const std::string& path, const TrainState& st, const StateLayout& lay, const float* m,
                             const float* v, const float* master) {
    const size_t n = lay.slice();
    int64_t h[STATE_HEADER_WORDS] = {};
    h[0] = STATE_MAGIC, h[1] = STATE_VERSION, h[2] = st.step, h[3] = (int64_t)lay.num_params, h[4] = lay.master;
    h[5] = (int64_t)st.rng_state, h[6] = st.B, h[7] = st.T, h[8] = st.total_batch, h[9] = (int64_t)st.seed;
    const DataLoaderState& d = st.loader;
    h[10] = (int64_t)d.epoch, h[11] = (int64_t)d.shard_pos, h[12] = (int64_t)d.batch_pos, h[13] = (int64_t)d.seed;
    h[14] = d.shuffle, h[15] = d.B, h[16] = d.T, h[17] = d.num_shards;
    const GPT2Config& c = lay.config;
    h[18] = c.max_seq_len, h[19] = c.vocab_size, h[20] = c.padded_vocab_size, h[21] = c.num_layers;
    h[22] = c.num_heads, h[23] = c.channels;
    h[24] = lay.world, h[25] = lay.rank, h[26] = (int64_t)lay.begin, h[27] = (int64_t)lay.end;
    h[28] = (int64_t)lay.payload_bytes();
    uint32_t crc = crc32c(v, n * sizeof(float), crc32c(m, n * sizeof(float)));
    if (lay.master) crc = crc32c(master, n * sizeof(float), crc);
    h[29] = crc;
    h[30] = st.guard.count, h[31] = st.guard.skipped_in_a_row;
    for (int i = 0; i < GuardState::WINDOW; i++) {
        uint32_t bits;
        std::memcpy(&bits, &st.guard.losses[i], 4);
        h[32 + i] = bits;
    }
    h[255] = crc32c(h, 255 * sizeof(int64_t));
    write_file_atomic(path, {{h, sizeof h},
                             {m, n * sizeof(float)},
                             {v, n * sizeof(float)},
                             {master, lay.master ? n * sizeof(float) : 0}});
}

// Checks a state file's header words (and the file's size) in the order the header comment gives; fills sf.
inline void parse_state_header(const std::string& path, const int64_t* h, size_t size, StateFile& sf) {
    const char* p = path.c_str();
    auto in = [](int64_t x, int64_t lo, int64_t hi) { return x >= lo && x <= hi; };
    if (h[0] != STATE_MAGIC)
        fail("%s: bad magic %lld (expected %lld): not a flashgpt2 state file", p, (long long)h[0], (long long)STATE_MAGIC);
    if (h[1] == 1 || h[1] == 2)
        fail("%s: state version %lld (%s): written by an older flashgpt2; start a new run", p, (long long)h[1],
             h[1] == 1 ? "another data order" : "no checksum");
    if (h[1] != STATE_VERSION) fail("%s: unsupported state version %lld (expected %lld)", p, (long long)h[1], (long long)STATE_VERSION);
    if ((uint32_t)h[255] != crc32c(h, 255 * sizeof(int64_t)) || !in(h[255], 0, UINT32_MAX))
        fail("%s: header checksum mismatch: the file is damaged", p);
    StateLayout& L = sf.layout;
    L.config = GPT2Config{(int)h[18], (int)h[19], (int)h[20], (int)h[21], (int)h[22], (int)h[23]};
    for (int i = 18; i <= 23; i++)
        if (!in(h[i], 1, INT32_MAX)) fail("%s: config word %d = %lld is out of range", p, i, (long long)h[i]);
    validate_config(L.config, p);
    if (h[3] != (int64_t)num_parameters(L.config))
        fail("%s: says %lld parameters, its config (%s) has %zu", p, (long long)h[3], config_str(L.config).c_str(),
             num_parameters(L.config));
    L.num_params = (size_t)h[3];
    if (!in(h[4], 0, 1)) fail("%s: master-weights flag %lld is not 0 or 1", p, (long long)h[4]);
    L.master = h[4] == 1;
    if (!in(h[24], 1, 1024) || !in(h[25], 0, h[24] - 1))
        fail("%s: rank %lld of %lld processes is out of range", p, (long long)h[25], (long long)h[24]);
    L.world = (int)h[24], L.rank = (int)h[25];
    if (!in(h[26], 0, h[3]) || !in(h[27], h[26], h[3]))
        fail("%s: optimizer slice [%lld, %lld) is not inside the %lld parameters", p, (long long)h[26],
             (long long)h[27], (long long)h[3]);
    L.begin = (size_t)h[26], L.end = (size_t)h[27];
    TrainState& st = sf.state;
    if (!in(h[2], 0, INT32_MAX)) fail("%s: step %lld is out of range", p, (long long)h[2]);
    if (!in(h[6], 1, 1 << 30) || !in(h[7], 1, 1 << 30) || !in(h[8], h[6] * h[7], 1ll << 50) || h[8] % (h[6] * h[7]))
        fail("%s: batch B=%lld T=%lld, %lld tokens per step, is out of range", p, (long long)h[6], (long long)h[7],
             (long long)h[8]);
    if (!in(h[9], 0, UINT32_MAX) || h[13] != h[9]) fail("%s: seed %lld (loader %lld) is out of range", p, (long long)h[9], (long long)h[13]);
    st.step = h[2], st.rng_state = (uint64_t)h[5], st.B = h[6], st.T = h[7], st.total_batch = h[8];
    st.seed = (uint64_t)h[9];
    if (!in(h[10], 0, INT64_MAX) || !in(h[17], 1, 1 << 24) || !in(h[11], 0, h[17] - 1) || !in(h[12], 0, INT64_MAX) ||
        !in(h[14], 0, 1) || h[15] != h[6] || h[16] != h[7])
        fail("%s: loader position (epoch %lld, shard %lld of %lld, batch %lld, shuffle %lld, B=%lld T=%lld) is out "
             "of range", p, (long long)h[10], (long long)h[11], (long long)h[17], (long long)h[12], (long long)h[14],
             (long long)h[15], (long long)h[16]);
    // every epoch holds at least one batch, and a step reads total_batch / (B*T) of them (micro-batches x GPUs)
    const int64_t per_step = h[8] / (h[6] * h[7]);
    if (per_step <= INT64_MAX / std::max<int64_t>(h[2], 1) && h[10] > h[2] * per_step)
        fail("%s: loader epoch %lld is more than the %lld batches %lld steps have read", p, (long long)h[10],
             (long long)(h[2] * per_step), (long long)h[2]);
    DataLoaderState& d = st.loader;
    d.epoch = (uint64_t)h[10], d.shard_pos = (uint64_t)h[11], d.batch_pos = (uint64_t)h[12], d.seed = (uint64_t)h[13];
    d.shuffle = h[14], d.B = h[15], d.T = h[16], d.num_shards = h[17];
    if (!in(h[30], 0, GuardState::WINDOW) || !in(h[31], 0, INT32_MAX))
        fail("%s: loss-spike window (%lld losses, %lld skipped) is out of range", p, (long long)h[30], (long long)h[31]);
    st.guard.count = (int)h[30], st.guard.skipped_in_a_row = (int)h[31];
    for (int i = 0; i < GuardState::WINDOW; i++) {
        const uint32_t bits = (uint32_t)h[32 + i];
        std::memcpy(&st.guard.losses[i], &bits, 4);
        if (!in(h[32 + i], 0, UINT32_MAX) || (i < st.guard.count && !std::isfinite(st.guard.losses[i])))
            fail("%s: loss-spike window entry %d is not a finite loss", p, i);
    }
    if (h[28] != (int64_t)L.payload_bytes() || size != STATE_HEADER_BYTES + L.payload_bytes())
        fail("%s: %zu bytes, expected %zu for its header (truncated or damaged)", p, size,
             STATE_HEADER_BYTES + L.payload_bytes());
}

// Reads and checks the header only (e.g. how many GPUs wrote a checkpoint, before any GPU work).
inline StateFile read_state_header(const std::string& path) {
    InputFile in(path);
    const size_t size = file_size(in.f, path);
    int64_t h[STATE_HEADER_WORDS];
    if (size < sizeof h || std::fread(h, 1, sizeof h, in.f) != sizeof h)
        fail("%s: truncated state file (%zu bytes, shorter than its %zu-byte header)", path.c_str(), size, sizeof h);
    StateFile sf;
    parse_state_header(path, h, size, sf);
    return sf;
}

// Reads and checks the whole file, payload checksum included.
inline StateFile read_state_file(const std::string& path) {
    StateFile sf;
    sf.bytes = read_file(path);
    int64_t h[STATE_HEADER_WORDS];
    if (sf.bytes.size() < sizeof h)
        fail("%s: truncated state file (%zu bytes, shorter than its %zu-byte header)", path.c_str(), sf.bytes.size(),
             sizeof h);
    std::memcpy(h, sf.bytes.data(), sizeof h);
    parse_state_header(path, h, sf.bytes.size(), sf);
    if (crc32c(sf.m(), sf.layout.payload_bytes()) != (uint32_t)h[29])
        fail("%s: checksum mismatch in the optimizer state: the file is damaged", path.c_str());
    return sf;
}

// A state file belongs to one model, one process count, one rank's slice and one precision: each mismatch
// is an Error naming the file and the field.
inline void check_state_layout(const std::string& path, const StateLayout& got, const StateLayout& want) {
    const char* p = path.c_str();
    if (!same_config(got.config, want.config))
        fail("%s: checkpoint config mismatch: the state is for %s, the model is %s", p, config_str(got.config).c_str(),
             config_str(want.config).c_str());
    if (got.world != want.world)
        fail("%s: written by a run on %d GPU(s) (its optimizer state is sharded per GPU); resume with --num-gpus %d "
             "(this run has %d)", p, got.world, got.world, want.world);
    if (got.rank != want.rank || got.begin != want.begin || got.end != want.end)
        fail("%s: holds rank %d's optimizer slice [%zu, %zu); this is rank %d with [%zu, %zu)", p, got.rank, got.begin,
             got.end, want.rank, want.begin, want.end);
    if (got.master != want.master)
        fail("%s: written by a %s run, this is a %s run (precision mismatch)", p,
             got.master ? "BF16 (fp32 master weights)" : "fp32", want.master ? "BF16 (fp32 master weights)" : "fp32");
}

}  // namespace flashgpt2
