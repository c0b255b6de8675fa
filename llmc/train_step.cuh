// One optimizer step of the trainer (train_gpt2.cu): grad_accum micro-batches forward + backward, the gradients
// summed over the data-parallel ranks, the global norm read back and checked with the loss (the divergence policy,
// llmc/guard.h), then clipping + AdamW on this rank's slice and the new weights shared.
#pragma once
#include <chrono>
#include <functional>
#include <utility>
#include <vector>

#include "llmc/common.cuh"
#include "llmc/dataloader.h"
#include "llmc/distributed.h"
#include "llmc/fault.h"
#include "llmc/guard.h"
#include "llmc/model.cuh"
#include "llmc/schedule.h"
#include "llmc/train_options.h"

namespace flashgpt2 {

struct StepResult {
    float loss = 0.0f, norm = 0.0f, lr = 0.0f;
    double ms = 0.0;
    SpikeVerdict spike;  // skip: the update was not applied (the loss-spike guard, --spike-z)
};

struct StepRunner {
    GPT2Model& model;
    DataLoader& loader;
    int grad_accum;
    const Distributed& dist;
    float* losses_pinned = nullptr;  // (grad_accum, B, T) page-locked: loss copies do not stall the host
    cudaEvent_t losses_copied = nullptr;  // the last micro-batch's losses have landed in losses_pinned
    std::vector<int> inputs, targets;  // (B, T) this rank's batch when data parallel
    SpikeGuard guard;                // its state goes into every checkpoint
    // The next step's first micro-batch, drawn while the GPU runs this step's last backward (the host only waits
    // then), so that the next step's first kernels do not wait for the loader's copies.
    bool prefetched = false;
    DataLoaderState before_prefetch;  // the loader's position before that draw

    StepRunner(GPT2Model& m, DataLoader& l, int accum, const Distributed& d, float spike_z = 0.0f)
        : model(m), loader(l), grad_accum(accum), dist(d), guard(spike_z) {
        cudaCheck(cudaMallocHost(&losses_pinned, (size_t)accum * l.B * l.T * sizeof(float)));
        cudaCheck(cudaEventCreateWithFlags(&losses_copied, cudaEventDisableTiming));
    }
    ~StepRunner() {
        cudaFreeHost(losses_pinned);
        cudaEventDestroy(losses_copied);
    }
    StepRunner(const StepRunner&) = delete;
    StepRunner& operator=(const StepRunner&) = delete;

    // Draws this rank's next micro-batch. Every rank's loader walks the same order (same seed) and rank r of W
    // keeps global batches r, r+W, r+2W, ...: the loaders stay in step, so their positions (checkpointed) agree.
    void draw() {
        if (dist.world == 1) {
            loader.next_batch();
            return;
        }
        for (int r = 0; r < dist.world; r++) {
            loader.next_batch();
            if (r == dist.rank) inputs = loader.inputs, targets = loader.targets;
        }
    }
    // The micro-batch to train on: the one prefetched by the step before, else a new draw.
    std::pair<const int*, const int*> next_batch() {
        if (!prefetched) draw();
        prefetched = false;
        if (dist.world == 1) return {loader.inputs.data(), loader.targets.data()};
        return {inputs.data(), targets.data()};
    }
    // Where a checkpoint taken now must put the loader: before the prefetched batch, which no step has used.
    DataLoaderState loader_state() const { return prefetched ? before_prefetch : loader.state(); }

    // step counts from 0; AdamW's bias correction uses t = step + 1.
    StepResult run(int step, const TrainOptions& o) {
        const auto t0 = std::chrono::steady_clock::now();
        const int N = loader.B * loader.T;
        // d mean-loss / d each position's loss; the mean is over all W ranks' positions, so the reduce-scatter's
        // sum of the ranks' gradients is the gradient of the global mean (W = 1: exactly the plain factor)
        const float dloss = 1.0f / ((float)N * grad_accum * dist.world);
        model.zero_grad();
        for (int micro = 0; micro < grad_accum; micro++) {
            const auto [in, tg] = next_batch();
            model.forward(in, tg, loader.B, loader.T, true, dloss);
            model.losses_to_host_async(losses_pinned + (size_t)micro * N);
            cudaCheck(cudaEventRecord(losses_copied, model.stream));
            model.backward();
        }
        before_prefetch = loader.state();  // the next step's first micro-batch, while the GPU runs the backward
        draw();
        prefetched = true;
        // this rank's losses summed while the GPU runs the last backward, so that the host's loop over them is not
        // between the norm's readback and the update; fixed order: deterministic
        cudaCheck(cudaEventSynchronize(losses_copied));
        double sum = 0.0;
        for (size_t i = 0; i < (size_t)grad_accum * N; i++) sum += losses_pinned[i];
        // Data parallel: sum the gradients into each rank's optimizer slice, step the slice (clipping by the
        // global norm: the slices' squared norms summed), then every rank gets every slice's new weights.
        // (One reduce-scatter after the whole backward, not overlapped with it: the simple version.)
        dist.reduce_scatter_sum(model.grads_memory, model.shard_size, model.stream);
        StepResult r;
        r.lr = lr_cosine(step, o.steps, o.lr, o.warmup, o.final_lr_frac);
        std::function<void(float*)> sum_norm2;
        if (dist.active()) sum_norm2 = [this](float* norm2) { dist.all_reduce_sum(norm2, 1, model.stream); };
        r.norm = model.grad_norm(sum_norm2);  // waits for the stream
        r.loss = (float)(dist.sum_host(sum, model.stream) / ((double)grad_accum * N * dist.world));
        // the divergence policy (llmc/guard.h): a non-finite loss or norm stops the run before the update
        r.loss = fault_value("spike-loss", step, fault_value("nan-loss", step, r.loss));
        require_finite(step, "training loss", r.loss);
        r.norm = fault_value("nan-norm", step, r.norm);
        require_finite(step, "gradient norm", r.norm);
        fault_point(step);
        r.spike = guard.check(r.loss);
        if (!r.spike.skip) {
            model.apply_update(r.lr, 0.9f, 0.95f, 1e-8f, o.weight_decay, o.grad_clip, r.norm, step + 1);
            dist.all_gather(model.params_memory, model.shard_size, model.stream);
        }
        cudaCheck(cudaStreamSynchronize(model.stream));
        r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        return r;
    }
};

}  // namespace flashgpt2
