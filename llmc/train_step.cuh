// One optimizer step of the trainer (train_gpt2.cu): grad_accum micro-batches forward + backward, the gradients
// summed over the data-parallel ranks, the loss checked before the update and the global norm read back and
// checked right after it is queued (the divergence policy, llmc/guard.h: the update itself moves nothing when the
// norm is not finite), clipping + AdamW on this rank's slice and the new weights shared.
// A step is queued, not waited for: run() returns while the GPU still updates, so the host's logging and the next
// step's first launches overlap the update, and the GPU does not wait for the host between steps.
#pragma once
#include <chrono>
#include <functional>
#include <optional>
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
    // Timing: a step runs from the end of the one before to its own end, its update queued and its norm read
    // (so consecutive steps add up to the wall time). drain() waits for the GPU: the step after it is timed from
    // its own start, plus the drained update's share after the last step ended.
    using Clock = std::chrono::steady_clock;
    std::optional<Clock::time_point> last_end;  // set while the last step's update may still run
    double drained_ms = 0.0;

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

    // Waits for the last step's update: call it before anything else reads the model (evaluation, sampling, a
    // checkpoint) or before the run ends.
    void drain() {
        cudaCheck(cudaStreamSynchronize(model.stream));
        if (last_end) drained_ms += ms_since(*last_end);
        last_end.reset();
    }
    static double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

    // step counts from 0; AdamW's bias correction uses t = step + 1.
    StepResult run(int step, const TrainOptions& o) {
        const Clock::time_point t0 = last_end.value_or(Clock::now());
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
        // this rank's losses summed while the GPU runs the last backward, so that the loss is known, and checked,
        // before the backward ends; fixed order: deterministic
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
        model.grad_norm_async(sum_norm2);
        if (fault_planned("nan-norm", step)) model.poison_grad_norm();  // for the update and the host alike
        r.loss = (float)(dist.sum_host(sum, model.stream) / ((double)grad_accum * N * dist.world));
        // the divergence policy (llmc/guard.h): a non-finite loss stops the run before the update is queued; a
        // non-finite norm, which the update reads on the GPU and then moves nothing, once the host has it
        r.loss = fault_value("spike-loss", step, fault_value("nan-loss", step, r.loss));
        require_finite(step, "training loss", r.loss);
        fault_point(step);
        r.spike = guard.check(r.loss);
        if (!r.spike.skip) {
            model.apply_update(r.lr, 0.9f, 0.95f, 1e-8f, o.weight_decay, o.grad_clip, step + 1);
            dist.all_gather(model.params_memory, model.shard_size, model.stream);
        }
        r.norm = model.grad_norm();  // waits for the norm's copy, queued before the update
        require_finite(step, "gradient norm", r.norm);
        r.ms = ms_since(t0) + drained_ms;
        drained_ms = 0.0;
        last_end = Clock::now();
        return r;
    }
};

}  // namespace flashgpt2
