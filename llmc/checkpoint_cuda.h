// Checkpoints of the CUDA trainer: the model file (llm.c's format) plus a training-state file, so that a run
// stopped at step s and resumed with --resume continues bit-exactly as if it had never stopped. The formats,
// their checksums and the directory layout are llmc/checkpoint.h's (shared with the CPU trainer); this file
// moves the GPU's buffers in and out of them.
//
//   <dir>/model_<step>.bin   llm.c model file: version 5 = the bf16 weights the BF16 build computes with,
//                            version 3 = fp32 (FP32 build). Any llm.c tool can read it. Its CRC-32C is in
//                            model_<step>.bin.crc32c.
//   <dir>/state_<step>.bin   AdamW m and v, the fp32 master weights (BF16 build), the step, the data position,
//                            the sampling RNG: llmc/checkpoint.h's state file.
//   <dir>/state_<step>_rank<r>.bin   with W > 1 GPUs (llmc/distributed.h): one such file per rank, written by that
//                            rank, holding its optimizer slice (ZeRO-1). The model file is written by rank 0 only.
//   <dir>/DONE_<step>        written last (by rank 0, once every rank has written its state): a checkpoint counts
//                            only once its DONE file exists. A resume needs the same number of GPUs.
#pragma once

#include <cstdint>
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

// The model file: the weights exactly as the model computes with them (bf16 -> version 5, fp32 -> version 3).
inline void save_model_file(const std::string& path, const GPT2Model& model) {
    std::vector<floatX> host(model.num_params);
    cudaCheck(cudaMemcpy(host.data(), model.params_memory, model.num_params * sizeof(floatX), cudaMemcpyDeviceToHost));
    const int version = sizeof(floatX) == 2 ? CHECKPOINT_VERSION_BF16 : CHECKPOINT_VERSION_FP32;
    write_checkpoint_file(path, model.config, version, host.data(), host.size() * sizeof(floatX));
}

// Loads a model file (version 3 or 5) into the model; its config must be the model's. require_checksum: the
// file's CRC-32C side file must be there (a resume: every checkpoint writes one; llm.c's files have none).
// The master weights (BF16 build) start as the file's values widened to fp32.
inline void load_model_file(const std::string& path, GPT2Model& model, bool require_checksum = false) {
    std::vector<float> host;
    const GPT2Config c = load_checkpoint(path, host, require_checksum);
    if (!same_config(c, model.config))
        fail("%s: checkpoint config mismatch: the file has %s, the model is %s", path.c_str(), config_str(c).c_str(),
             config_str(model.config).c_str());
    model.set_params(host);
}

// The optimizer state this process holds: its ZeRO-1 slice (the whole model on one GPU).
inline StateLayout state_layout(const GPT2Model& model) {
    StateLayout lay;
    lay.config = model.config;
    lay.num_params = model.num_params;
    lay.master = model.master != nullptr;
    lay.world = model.num_shards, lay.rank = model.shard_rank;
    lay.begin = model.shard_begin, lay.end = model.shard_end;
    return lay;
}

inline void save_state_file(const std::string& path, const GPT2Model& model, const TrainState& st) {
    const size_t n = model.shard_params();  // the whole model unless ZeRO-1 sharded
    std::vector<float> m(n), v(n), master(model.master ? n : 0);
    cudaCheck(cudaMemcpy(m.data(), model.m, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(v.data(), model.v, n * sizeof(float), cudaMemcpyDeviceToHost));
    if (model.master) cudaCheck(cudaMemcpy(master.data(), model.master, n * sizeof(float), cudaMemcpyDeviceToHost));
    write_state_file(path, st, state_layout(model), m.data(), v.data(), master.data());
}

// Restores m, v and (BF16 build) the master weights into the model; returns the rest. The file is checked
// whole (llmc/checkpoint.h), then against this model's layout: a mismatch names the file and the field.
inline TrainState load_state_file(const std::string& path, GPT2Model& model) {
    const StateFile sf = read_state_file(path);
    check_state_layout(path, sf.layout, state_layout(model));
    const size_t n = model.shard_params();
    cudaCheck(cudaMemcpy(model.m, sf.m(), n * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model.v, sf.v(), n * sizeof(float), cudaMemcpyHostToDevice));
    if (model.master) cudaCheck(cudaMemcpy(model.master, sf.master(), n * sizeof(float), cudaMemcpyHostToDevice));
    return sf.state;
}

// model file (rank 0), state file (every rank: its optimizer slice), then, once every rank is done, the DONE
// marker (rank 0): the checkpoint exists once all of them do. Without a communicator: one GPU, all by itself.
inline void save_checkpoint_cuda(const std::string& dir, const GPT2Model& model, const TrainState& st,
                                 const Distributed& dist) {
    make_directories(dir, "-o");
    if (dist.is_main()) save_model_file(checkpoint_path(dir, "model", st.step), model);
    save_state_file(state_path(dir, st.step, dist.rank, dist.world), model, st);
    dist.barrier(model.stream);
    if (dist.is_main()) write_file_atomic(checkpoint_path(dir, "DONE", st.step), std::string());
}

// How many GPUs wrote the checkpoint of this step (read from its state files' checked header), for a clear
// error before any GPU work when a resume asks for a different number.
inline int checkpoint_world(const std::string& dir, int64_t step) {
    std::string path = state_path(dir, step, 0, 1);
    if (!std::filesystem::exists(path)) path = state_path(dir, step, 0, 2);  // rank 0's file of a multi-GPU run
    return read_state_header(path).layout.world;
}

}  // namespace flashgpt2
