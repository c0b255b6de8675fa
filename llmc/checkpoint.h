// Model files in llm.c's format, so checkpoints move between llm.c, the CPU trainer and the CUDA trainer.
//   header: 256 x int32   [0] magic 20240326  [1] version: 3 = fp32 weights, 5 = bf16 weights
//                         [2] max_seq_len  [3] vocab_size  [4] num_layers  [5] num_heads  [6] channels
//                         [7] padded_vocab_size   (the rest 0)
//   then the 16 parameter tensors in llm.c order (config.h), back to back, fp32 or bf16.
// Writes are atomic (fileio.h's write_file_atomic): the bytes go to "<path>.tmp", which is then renamed over
// <path>, so a crash never leaves a half-written checkpoint under the real name. Every error names the file.
#pragma once
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "llmc/config.h"  // GPT2Config, validate_config
#include "llmc/error.h"
#include "llmc/fileio.h"  // write_file_atomic

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

struct CheckpointHeader {
    int version = CHECKPOINT_VERSION_FP32;
    GPT2Config config;
};

inline size_t checkpoint_bytes_per_param(int version) { return version == CHECKPOINT_VERSION_BF16 ? 2 : 4; }

// Reads and checks the header only: magic, version, a sane config, and a file size that matches it.
inline CheckpointHeader read_checkpoint_header(const std::string& path) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) fail("%s: cannot open checkpoint: %s", path.c_str(), ec.message().c_str());
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) fail("%s: cannot open checkpoint: %s", path.c_str(), std::strerror(errno));
    int32_t h[CHECKPOINT_HEADER_INTS];
    const size_t got = std::fread(h, sizeof(int32_t), CHECKPOINT_HEADER_INTS, f);
    std::fclose(f);
    if (got != CHECKPOINT_HEADER_INTS)
        fail("%s: truncated checkpoint: %zu bytes, shorter than the %zu-byte header", path.c_str(), (size_t)size,
             sizeof h);
    if (h[0] != CHECKPOINT_MAGIC)
        fail("%s: bad magic %d (expected %d): not an llm.c model file", path.c_str(), h[0], CHECKPOINT_MAGIC);
    if (h[1] != CHECKPOINT_VERSION_FP32 && h[1] != CHECKPOINT_VERSION_BF16)
        fail("%s: unknown checkpoint version %d (expected 3 = fp32 or 5 = bf16)", path.c_str(), h[1]);
    CheckpointHeader hdr;
    hdr.version = h[1];
    hdr.config = GPT2Config{h[2], h[3], h[7], h[4], h[5], h[6]};
    validate_config(hdr.config, path.c_str());
    const size_t want = sizeof h + num_parameters(hdr.config) * checkpoint_bytes_per_param(hdr.version);
    if ((size_t)size != want)
        fail("%s: %s checkpoint: %zu bytes, expected %zu for this config", path.c_str(),
             (size_t)size < want ? "truncated" : "oversized", (size_t)size, want);
    return hdr;
}

inline GPT2Config load_checkpoint_config(const std::string& path) { return read_checkpoint_header(path).config; }

// Loads a version 3 (fp32) or 5 (bf16, widened to fp32) checkpoint into params; returns its config.
inline GPT2Config load_checkpoint(const std::string& path, std::vector<float>& params) {
    const CheckpointHeader hdr = read_checkpoint_header(path);
    const size_t n = num_parameters(hdr.config);
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) fail("%s: cannot open checkpoint: %s", path.c_str(), std::strerror(errno));
    bool ok = std::fseek(f, CHECKPOINT_HEADER_INTS * sizeof(int32_t), SEEK_SET) == 0;
    params.resize(n);
    if (hdr.version == CHECKPOINT_VERSION_FP32) {
        ok = ok && std::fread(params.data(), sizeof(float), n, f) == n;
    } else {
        std::vector<uint16_t> raw(n);
        ok = ok && std::fread(raw.data(), sizeof(uint16_t), n, f) == n;
        for (size_t i = 0; i < n; i++) params[i] = bf16_to_float(raw[i]);
    }
    std::fclose(f);
    if (!ok) fail("%s: read error in the parameters (file changed while reading?)", path.c_str());
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

// Writes header + raw parameter bytes atomically (tmp, then rename). Used for both versions; the
// CUDA trainer writes its bf16 weights through this too. bytes must match the config and version.
inline void write_checkpoint_file(const std::string& path, const GPT2Config& cfg, int version, const void* data,
                                  size_t bytes) {
    const auto h = checkpoint_header(cfg, version, path);
    const size_t want = num_parameters(cfg) * checkpoint_bytes_per_param(version);
    if (bytes != want) fail("%s: %zu parameter bytes given, the config needs %zu", path.c_str(), bytes, want);

    std::error_code ec;  // a missing parent directory is created; if that fails, the open below says so
    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    write_file_atomic(path, {{h.data(), sizeof h}, {data, bytes}});
}

// Saves fp32 parameters (num_parameters(cfg) of them) as a version 3 checkpoint.
inline void save_checkpoint(const std::string& path, const GPT2Config& cfg, const float* params) {
    write_checkpoint_file(path, cfg, CHECKPOINT_VERSION_FP32, params, num_parameters(cfg) * sizeof(float));
}

}  // namespace flashgpt2
