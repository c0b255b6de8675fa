// Checkpoints of the CUDA trainer: the model file (llm.c's format) plus a training-state file, so that a run
// stopped at step s and resumed with --resume continues bit-exactly as if it had never stopped.
//
//   <dir>/model_<step>.bin   llm.c model file (llmc/checkpoint.h): version 5 = the bf16 weights the BF16 build
//                            computes with, version 3 = fp32 (FP32 build). Any llm.c tool can read it.
//   <dir>/state_<step>.bin   everything else a resume needs (one GPU), in this format:
//       header 256 x int64: [0] magic 20261129  [1] version 2  [2] step (optimizer steps done)
//                           [3] num_parameters  [4] 1 if fp32 master weights follow  [5] sampling RNG state
//                           [6] B  [7] T  [8] total batch tokens  [9] seed
//                           [10..17] DataLoaderState: epoch shard_pos batch_pos seed shuffle B T num_shards
//                           [18..23] config: max_seq_len vocab_size padded_vocab_size num_layers num_heads channels
//                           [24] world: processes (GPUs) of the run, 0 or 1 = one  [25] rank
//                           [26..27] the ZeRO-1 optimizer slice [begin, end) of the flat parameters in this file
//       then AdamW m (end - begin fp32), AdamW v (fp32), and the fp32 master weights when [4] is 1.
//   <dir>/state_<step>_rank<r>.bin   with W > 1 GPUs (llmc/distributed.h): one such file per rank, written by that
//                            rank, holding its optimizer slice (ZeRO-1). The model file is written by rank 0 only.
//   <dir>/DONE_<step>        written last (by rank 0, once every rank has written its state): a checkpoint counts
//                            only once its DONE file exists. A resume needs the same number of GPUs.
// Every file is written to "<path>.tmp" and renamed into place, so a crash never leaves a partial file under a
// real name, and --resume picks the newest step with a DONE file (an interrupted save is simply ignored).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/distributed.h"
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/model.cuh"

namespace flashgpt2 {

constexpr int64_t STATE_MAGIC = 20261129;  // the date this format was defined
// Version 2: the loader position ([10..17]) indexes llm.c's shuffle order (llmc/dataloader.h). Version-1 files
// index the order this project's first loader drew (same layout, other batches): refused, not misread.
constexpr int64_t STATE_VERSION = 2;
constexpr int STATE_HEADER_WORDS = 256;

// What a resume restores besides the weights and the optimizer moments.
struct TrainState {
    int64_t step = 0;             // optimizer steps completed
    uint64_t rng_state = 0;       // the sampler's Rng
    int64_t B = 0, T = 0, total_batch = 0;
    uint64_t seed = 0;
    DataLoaderState loader;       // the training loader's position: the next batch to read
};

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

// The model file: the weights exactly as the model computes with them (bf16 -> version 5, fp32 -> version 3).
inline void save_model_file(const std::string& path, const GPT2Model& model) {
    std::vector<floatX> host(model.num_params);
    cudaCheck(cudaMemcpy(host.data(), model.params_memory, model.num_params * sizeof(floatX), cudaMemcpyDeviceToHost));
    const int version = sizeof(floatX) == 2 ? CHECKPOINT_VERSION_BF16 : CHECKPOINT_VERSION_FP32;
    write_checkpoint_file(path, model.config, version, host.data(), host.size() * sizeof(floatX));
}

// Loads a model file (version 3 or 5) into the model; its config must be the model's.
// The master weights (BF16 build) start as the file's values widened to fp32.
inline void load_model_file(const std::string& path, GPT2Model& model) {
    std::vector<float> host;
    const GPT2Config c = load_checkpoint(path, host);
    if (!same_config(c, model.config))
        fail("%s: checkpoint config mismatch: the file has %s, the model is %s", path.c_str(), config_str(c).c_str(),
             config_str(model.config).c_str());
    model.set_params(host);
}

inline void save_state_file(const std::string& path, const GPT2Model& model, const TrainState& st) {
    const size_t n = model.shard_params();  // the whole model unless ZeRO-1 sharded
    int64_t h[STATE_HEADER_WORDS] = {};
    h[0] = STATE_MAGIC, h[1] = STATE_VERSION, h[2] = st.step, h[3] = (int64_t)model.num_params;
    h[4] = model.master ? 1 : 0;
    h[5] = (int64_t)st.rng_state, h[6] = st.B, h[7] = st.T, h[8] = st.total_batch, h[9] = (int64_t)st.seed;
    const DataLoaderState& d = st.loader;
    h[10] = (int64_t)d.epoch, h[11] = (int64_t)d.shard_pos, h[12] = (int64_t)d.batch_pos, h[13] = (int64_t)d.seed;
    h[14] = d.shuffle, h[15] = d.B, h[16] = d.T, h[17] = d.num_shards;
    const GPT2Config& c = model.config;
    h[18] = c.max_seq_len, h[19] = c.vocab_size, h[20] = c.padded_vocab_size, h[21] = c.num_layers;
    h[22] = c.num_heads, h[23] = c.channels;
    h[24] = model.num_shards, h[25] = model.shard_rank, h[26] = (int64_t)model.shard_begin, h[27] = (int64_t)model.shard_end;
    std::vector<float> m(n), v(n), master(model.master ? n : 0);
    cudaCheck(cudaMemcpy(m.data(), model.m, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(v.data(), model.v, n * sizeof(float), cudaMemcpyDeviceToHost));
    if (model.master) cudaCheck(cudaMemcpy(master.data(), model.master, n * sizeof(float), cudaMemcpyDeviceToHost));
    write_file_atomic(path, {{h, sizeof h},
                             {m.data(), n * sizeof(float)},
                             {v.data(), n * sizeof(float)},
                             {master.data(), master.size() * sizeof(float)}});
}

// Restores m, v and (BF16 build) the master weights into the model; returns the rest. Every field that must
// agree with this run is checked, and a mismatch names the file and the field.
inline TrainState load_state_file(const std::string& path, GPT2Model& model) {
    const std::string data = read_file(path);
    int64_t h[STATE_HEADER_WORDS];
    if (data.size() < sizeof h) fail("%s: truncated state file (%zu bytes)", path.c_str(), data.size());
    memcpy(h, data.data(), sizeof h);
    if (h[0] != STATE_MAGIC) fail("%s: bad magic %lld (expected %lld): not a flashgpt2 state file", path.c_str(), (long long)h[0], (long long)STATE_MAGIC);
    if (h[1] == 1)
        fail("%s: state version 1 counts batches in the project's first data order (now llm.c's): resuming it "
             "would read other batches; start a new run", path.c_str());
    if (h[1] != STATE_VERSION) fail("%s: unsupported state version %lld (expected %lld)", path.c_str(), (long long)h[1], (long long)STATE_VERSION);
    const size_t n = model.shard_params();
    const GPT2Config c{(int)h[18], (int)h[19], (int)h[20], (int)h[21], (int)h[22], (int)h[23]};
    if (!same_config(c, model.config))
        fail("%s: checkpoint config mismatch: the state is for %s, the model is %s", path.c_str(), config_str(c).c_str(),
             config_str(model.config).c_str());
    if (h[3] != (int64_t)model.num_params)
        fail("%s: state holds %lld parameters, the model has %zu", path.c_str(), (long long)h[3], model.num_params);
    const int64_t world = h[24] == 0 ? 1 : h[24];
    if (world != model.num_shards)
        fail("%s: written by a run on %lld GPU(s) (its optimizer state is sharded per GPU); resume with --num-gpus %lld "
             "(this run has %d)", path.c_str(), (long long)world, (long long)world, model.num_shards);
    const bool whole = h[24] == 0 && h[26] == 0 && h[27] == 0;  // written before [24..27] existed: one GPU
    if (h[25] != model.shard_rank || (!whole && (h[26] != (int64_t)model.shard_begin || h[27] != (int64_t)model.shard_end)))
        fail("%s: holds rank %lld's optimizer slice [%lld, %lld); this is rank %d with [%zu, %zu)", path.c_str(),
             (long long)h[25], (long long)h[26], (long long)h[27], model.shard_rank, model.shard_begin, model.shard_end);
    if (h[4] != (model.master ? 1 : 0))
        fail("%s: written by a %s build, this is the %s build (precision mismatch)", path.c_str(),
             h[4] ? "BF16" : "FP32", PRECISION_NAME);
    const size_t want = sizeof h + n * sizeof(float) * (h[4] ? 3 : 2);
    if (data.size() != want) fail("%s: %zu bytes, expected %zu (truncated or corrupt)", path.c_str(), data.size(), want);
    const char* p = data.data() + sizeof h;
    cudaCheck(cudaMemcpy(model.m, p, n * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model.v, p + n * sizeof(float), n * sizeof(float), cudaMemcpyHostToDevice));
    if (model.master) cudaCheck(cudaMemcpy(model.master, p + 2 * n * sizeof(float), n * sizeof(float), cudaMemcpyHostToDevice));
    TrainState st;
    st.step = h[2], st.rng_state = (uint64_t)h[5], st.B = h[6], st.T = h[7], st.total_batch = h[8];
    st.seed = (uint64_t)h[9];
    DataLoaderState& d = st.loader;
    d.epoch = (uint64_t)h[10], d.shard_pos = (uint64_t)h[11], d.batch_pos = (uint64_t)h[12], d.seed = (uint64_t)h[13];
    d.shuffle = h[14], d.B = h[15], d.T = h[16], d.num_shards = h[17];
    return st;
}

// model file (rank 0), state file (every rank: its optimizer slice), then, once every rank is done, the DONE
// marker (rank 0): the checkpoint exists once all of them do. Without a communicator: one GPU, all by itself.
inline void save_checkpoint_cuda(const std::string& dir, const GPT2Model& model, const TrainState& st,
                                 const Distributed& dist) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) fail("-o %s: cannot create the output directory: %s", dir.c_str(), ec.message().c_str());
    if (dist.is_main()) save_model_file(checkpoint_path(dir, "model", st.step), model);
    save_state_file(state_path(dir, st.step, dist.rank, dist.world), model, st);
    dist.barrier(model.stream);
    if (dist.is_main()) write_file_atomic(checkpoint_path(dir, "DONE", st.step), std::string());
}

// How many GPUs wrote the checkpoint of this step (read from its state files), for a clear error before any
// GPU work when a resume asks for a different number.
inline int checkpoint_world(const std::string& dir, int64_t step) {
    std::string path = state_path(dir, step, 0, 1);
    if (!std::filesystem::exists(path)) path = state_path(dir, step, 0, 2);  // rank 0's file of a multi-GPU run
    const std::string data = read_file(path);
    int64_t h[STATE_HEADER_WORDS];
    if (data.size() < sizeof h) fail("%s: truncated state file (%zu bytes)", path.c_str(), data.size());
    memcpy(h, data.data(), sizeof h);
    return h[24] == 0 ? 1 : (int)h[24];
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

}  // namespace flashgpt2
