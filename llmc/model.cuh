// GPT-2 on the GPU: its tensors, and the forward and backward passes wired from the layer ops.
//
// The forward pass reads like the model (llm.c's gpt2_forward):
//     x = wte[tokens] + wpe[positions]
//     for each layer l:   x = x + attproj(attention(qkv(ln1(x))))      (residual2)
//                         x = x + fcproj(gelu(fc(ln2(x))))             (residual3)
//     logits = lnf(x) @ wte^T   ->  softmax, cross-entropy, and (training) dlogits in place, then at once the
//                                   head's backward; the flash set does this a chunk of rows at a time
// Every op dispatches on the KernelSet and makes its own fusion decisions (llmc/kernels.h), so the same code runs
// the naive set, the flash set, or any mix; a LayerProfiler, when attached, is charged by the ops themselves.
//
// Memory: parameters and gradients (floatX) are each ONE flat buffer in llm.c's tensor order (config.h), so the
// optimizer, the checkpoint and the gradient norm see one array. fp32 master weights (BF16 build only) and the
// AdamW moments m, v are flat too. Activations are kept per layer for the backward pass. Everything is sized
// up front by plan_memory() (llmc/memory.cuh) and checked against the free GPU memory BEFORE the first
// allocation.
//
// Data parallel (llmc/distributed.h): with num_shards W > 1 the model is one of W replicas, and the optimizer is
// ZeRO-1 sharded (Rajbhandari et al. 2020, stage 1): replica r owns the slice [shard_begin, shard_end) of the flat
// parameter buffer and keeps AdamW m, v and the master weights for that slice only (1/W of them); update() steps
// only that slice. The parameter and gradient buffers are padded to W equal slices, as NCCL's reduce-scatter and
// all-gather want. W = 1 (the default): one slice, the whole buffer, no padding: the plain model.
#pragma once
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "llmc/common.cuh"
#include "llmc/config.h"
#include "llmc/error.h"
#include "llmc/kernels.h"
#include "llmc/memory.cuh"
#include "llmc/profile.h"

namespace flashgpt2 {

// ---------------------------------------------------------------------------------------------------------
// Parameters (and, with the same layout, their gradients): named views into one flat floatX buffer.

// One transformer block's weights: layer l's slices of the per-layer tensors.
struct BlockWeights {
    floatX *ln1w, *ln1b;          // (C)
    floatX *qkvw, *qkvb;          // (3C, C), (3C)
    floatX *attprojw, *attprojb;  // (C, C), (C)
    floatX *ln2w, *ln2b;          // (C)
    floatX *fcw, *fcb;            // (4C, C), (4C)
    floatX *fcprojw, *fcprojb;    // (C, 4C), (C)
};

struct ParameterTensors {
    floatX* wte;       // (Vp, C)
    floatX* wpe;       // (maxT, C)
    floatX* ln1w;      // (L, C)
    floatX* ln1b;      // (L, C)
    floatX* qkvw;      // (L, 3C, C)
    floatX* qkvb;      // (L, 3C)
    floatX* attprojw;  // (L, C, C)
    floatX* attprojb;  // (L, C)
    floatX* ln2w;      // (L, C)
    floatX* ln2b;      // (L, C)
    floatX* fcw;       // (L, 4C, C)
    floatX* fcb;       // (L, 4C)
    floatX* fcprojw;   // (L, C, 4C)
    floatX* fcprojb;   // (L, C)
    floatX* lnfw;      // (C)
    floatX* lnfb;      // (C)

    static ParameterTensors view(floatX* base, const GPT2Config& cfg) {
        ParameterTensors t;
        floatX** slots[NUM_PARAMETER_TENSORS] = {&t.wte,  &t.wpe,  &t.ln1w, &t.ln1b,     &t.qkvw,    &t.qkvb,
                                                 &t.attprojw, &t.attprojb, &t.ln2w, &t.ln2b, &t.fcw, &t.fcb,
                                                 &t.fcprojw,  &t.fcprojb,  &t.lnfw, &t.lnfb};
        const auto sizes = parameter_sizes(cfg);
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            *slots[i] = base;
            base += sizes[i];
        }
        return t;
    }
    BlockWeights block(int l, int C) const {
        const size_t c = C, cc = c * c;
        return {ln1w + l * c,          ln1b + l * c,     qkvw + l * 3 * cc,     qkvb + l * 3 * c,
                attprojw + l * cc,     attprojb + l * c, ln2w + l * c,          ln2b + l * c,
                fcw + l * 4 * cc,      fcb + l * 4 * c,  fcprojw + l * 4 * cc,  fcprojb + l * c};
    }
};

// Everything the forward pass writes and the backward pass reads, for the allocated (B, T); N = B*T rows.
struct ActivationTensors {
    floatX* encoded;    // (B, T, C)       x after the embeddings
    floatX* ln1;        // (L, B, T, C)
    float* ln1_mean;    // (L, B, T)
    float* ln1_rstd;    // (L, B, T)
    floatX* qkv;        // (L, B, T, 3C)   [q | k | v] per position
    floatX* atty;       // (L, B, T, C)    attention output, heads side by side
    char* att_saved;    // (L, saved_bytes) flash: lse (B, NH, T) fp32; naive: P (B, NH, T, T)
    floatX* residual2;  // (L, B, T, C)    x after the attention block
    floatX* ln2;        // (L, B, T, C)
    float* ln2_mean;    // (L, B, T)
    float* ln2_rstd;    // (L, B, T)
    floatX* fch;        // (L, B, T, 4C)   fc output before GELU
    floatX* fch_gelu;   // (L, B, T, 4C); with recompute (B, T, 4C): every block's, refilled by the backward
    floatX* residual3;  // (L, B, T, C)    x after the MLP block
    floatX* lnf;        // (B, T, C)
    float* lnf_mean;    // (B, T)
    float* lnf_rstd;    // (B, T)
    floatX* logits;     // (head_rows, Vp) one chunk of positions; overwritten in place by dlogits when training
    float* losses;      // (B, T)
    int* inputs;        // (B, T)
    int* targets;       // (B, T)
    // backward scratch
    floatX* dresidual;     // (B, T, C)   gradient of the residual stream, carried down the layers
    floatX* scratch_btc;   // (B, T, C)   attproj / fcproj outputs (forward); dln, datty (backward)
    floatX* scratch_bt4c;  // (B, T, 4C)  dfch, dqkv (backward); the same memory as logits
};

// One block's activations: layer l's slices, and the residual stream entering it.
struct BlockActivations {
    const floatX* input;                     // (B, T, C)  x entering: encoded, or the last block's residual3
    floatX *ln1, *qkv, *atty;                // (B, T, C), (B, T, 3C), (B, T, C)
    float *ln1_mean, *ln1_rstd;              // (B, T)
    void* att_saved;                         // what attention keeps for its backward
    floatX *residual2, *ln2;                 // (B, T, C)
    float *ln2_mean, *ln2_rstd;              // (B, T)
    floatX *fch, *fch_gelu, *residual3;      // (B, T, 4C), (B, T, 4C), (B, T, C)
};

// A layernorm's output buffers and weights: the ln1 of block l, or lnf after the last block.
struct NormTensors {
    floatX* out;
    float *mean, *rstd;
    const floatX *w, *b;
};

// ZeRO-1: the part of a layout inside [begin, end) of the flat buffer, with offsets relative to begin; tensors
// outside it become empty. What one optimizer shard's AdamW and grad-norm launches see. [0, total): the layout.
inline ParamLayout layout_slice(const ParamLayout& l, size_t begin, size_t end) {
    ParamLayout s = l;
    for (int i = 0; i <= l.count; i++) s.offset[i] = std::min(std::max(l.offset[i], begin), end) - begin;
    return s;
}

// ---------------------------------------------------------------------------------------------------------
struct GPT2Model {
    GPT2Config config;
    KernelSet ks;
    int B = 0, T = 0;  // the allocated micro-batch shape: forward() accepts any B' <= B, T' <= T
    bool recompute = false;  // GELU's output is recomputed by the backward, not kept per layer (train -r 1)
    size_t num_params = 0;
    ParamLayout layout;
    MemoryPlan plan;
    GpuMemory mem;

    // ZeRO-1 (see the top of the file): this replica's optimizer slice [shard_begin, shard_end) of the flat buffer.
    int num_shards = 1, shard_rank = 0;
    size_t shard_size = 0;                 // elements per slice (the last one may hold fewer real parameters)
    size_t shard_begin = 0, shard_end = 0;
    ParamLayout shard_layout;              // layout_slice(layout, shard_begin, shard_end)

    floatX* params_memory = nullptr;  // (num_shards * shard_size) >= num_params; the padding is never read
    floatX* grads_memory = nullptr;   // (num_shards * shard_size), the padding stays 0
    float* master = nullptr;          // (shard_end - shard_begin) fp32 master weights, BF16 build only
    float* m = nullptr;               // (shard_end - shard_begin) AdamW first moment
    float* v = nullptr;               // (shard_end - shard_begin) AdamW second moment
    ParameterTensors params, grads;
    ActivationTensors acts;
    void* ws = nullptr;               // the ops' shared workspace
    float* norm2 = nullptr;           // (1) squared gradient norm
    size_t att_saved_bytes = 0;       // per layer (its stride in att_saved)
    int head_rows = 0;                // positions the LM head holds logits for at once (lm_head_rows)

    cudaStream_t stream = nullptr;
    LayerProfiler* prof = nullptr;    // set to time every op by layer
    int* tokens_pinned = nullptr;     // (2, B, T) page-locked staging of inputs and targets: copies stay async
    float* norm2_pinned = nullptr;    // (1) page-locked landing place of norm2 (a pageable one costs a staging copy)
    cudaEvent_t tokens_copied = nullptr;  // the last copy out of tokens_pinned has finished
    cudaEvent_t norm2_copied = nullptr;   // norm2_pinned holds the last grad_norm_async's value

    GPT2Model(const GPT2Config& cfg, const KernelSet& kernels, int B_, int T_, int shards = 1, int shard = 0,
              bool recompute_gelu = false)
        : config(cfg), ks(kernels), B(B_), T(T_), recompute(recompute_gelu), num_shards(shards), shard_rank(shard) {
        validate_config(cfg, "model");
        if (B < 1 || T < 1) fail("-b/-t: B=%d and T=%d must be positive", B, T);
        if (T > cfg.max_seq_len) fail("-t: T=%d exceeds the model's max_seq_len %d", T, cfg.max_seq_len);
        if ((size_t)B * T > (size_t)INT_MAX) fail("-b/-t: B*T = %zu positions is more than the kernels index (2^31)", (size_t)B * T);
        check_kernel_support(ks, cfg.channels, cfg.num_heads);
        if (ks.flash(Layer::attention)) attention_check_heads(B, cfg.num_heads);  // before anything is allocated
        num_params = num_parameters(cfg);
        layout = ParamLayout::gpt2(cfg);
        if (num_shards < 1 || shard_rank < 0 || shard_rank >= num_shards)
            fail("model: optimizer shard %d of %d does not exist", shard_rank, num_shards);
        shard_size = shard_size_for(num_params, num_shards);
        shard_begin = std::min(num_params, (size_t)shard_rank * shard_size);
        shard_end = std::min(num_params, shard_begin + shard_size);
        shard_layout = layout_slice(layout, shard_begin, shard_end);
        plan = plan_memory(cfg, ks, B, T, num_shards, recompute);
        check_memory_fits(plan, B, T, ks);
        mem.hint = "reduce -b (batch size) or -t (sequence length)";
        cudaCheck(cudaStreamCreate(&stream));
        cudaCheck(cudaEventCreateWithFlags(&tokens_copied, cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&norm2_copied, cudaEventDisableTiming));
        cudaCheck(cudaMallocHost(&tokens_pinned, 2 * (size_t)B * T * sizeof(int)));
        cudaCheck(cudaMallocHost(&norm2_pinned, sizeof(float)));
        allocate();
    }
    ~GPT2Model() {  // no checks: destructors must not exit
        if (stream) cudaStreamSynchronize(stream);
        if (tokens_pinned) cudaFreeHost(tokens_pinned);
        if (norm2_pinned) cudaFreeHost(norm2_pinned);
        if (tokens_copied) cudaEventDestroy(tokens_copied);
        if (norm2_copied) cudaEventDestroy(norm2_copied);
        if (stream) cudaStreamDestroy(stream);
    }
    GPT2Model(const GPT2Model&) = delete;
    GPT2Model& operator=(const GPT2Model&) = delete;

    // ---- parameters in and out (host float, llm.c order) ----
    void set_params(const std::vector<float>& host);   // also sets the master weights
    std::vector<float> get_params() const;              // the floatX weights the model computes with, widened
    std::vector<float> get_grads() const;
    size_t padded_params() const { return shard_size * num_shards; }
    size_t shard_params() const { return shard_end - shard_begin; }  // this replica's optimizer slice
    void zero_grad() { cudaCheck(cudaMemsetAsync(grads_memory, 0, padded_params() * sizeof(floatX), stream)); }
    void zero_optimizer() {
        cudaCheck(cudaMemsetAsync(m, 0, shard_params() * sizeof(float), stream));
        cudaCheck(cudaMemsetAsync(v, 0, shard_params() * sizeof(float), stream));
    }

    // ---- the passes ----
    // Runs the model on host tokens inputs/targets (B', T'); targets == nullptr: inference, logits (B'*T' <=
    // head_rows rows) kept. With targets: losses (B', T') on the device, and when `for_training` the LM head's
    // backward has run too (dwte accumulated, dlnf in scratch_btc; dlogits scaled by dloss_scale), the rest is
    // backward()'s. Returns nothing: read the losses with mean_loss().
    void forward(const int* inputs, const int* targets, int B_, int T_, bool for_training, float dloss_scale);
    void backward();  // accumulates parameter gradients of the last training forward()
    float mean_loss() const;  // waits for the stream; mean over the last forward's B'*T' losses
    // Queues a copy of the last forward's B'*T' losses into page-locked host memory (no wait).
    void losses_to_host_async(float* pinned) const {
        cudaCheck(cudaMemcpyAsync(pinned, acts.losses, (size_t)fwd_B * fwd_T * sizeof(float), cudaMemcpyDeviceToHost, stream));
    }
    // The optimizer step in three calls, so that a trainer can look at the loss before anything is applied and at
    // the norm right after, without the GPU waiting for the host in between (llmc/guard.h).
    // grad_norm_async: queues the gradients' global norm² (before clipping) and its copy to the host. Sharded
    // (ZeRO-1), it is over the slice's gradients; sum_norm2, when given, turns that squared norm (one device
    // float, on `stream`) into the global one (an all-reduce over the replicas). apply_update: queues AdamW step t
    // (from 1) on this replica's slice, clipped by that norm, which the kernel reads on the device: a norm that is
    // not finite moves nothing. grad_norm: waits for the copy, returns the norm. update(): all three.
    void grad_norm_async(const std::function<void(float* norm2)>& sum_norm2 = nullptr);
    void apply_update(float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip, int t);
    float grad_norm();
    float update(float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip, int t,
                 const std::function<void(float* norm2)>& sum_norm2 = nullptr) {
        grad_norm_async(sum_norm2);
        apply_update(lr, beta1, beta2, eps, weight_decay, grad_clip, t);
        return grad_norm();
    }
    // The fault nan-norm (llmc/fault.h): the queued norm² reads NaN (all bits set), for the update and, copied
    // again (grad_norm_async's copy was queued before this), for the host.
    void poison_grad_norm() {
        cudaCheck(cudaMemsetAsync(norm2, 0xff, sizeof(float), stream));
        norm2_to_host_async();
    }
    // norm2 into norm2_pinned, and norm2_copied recorded after it (what grad_norm waits for).
    void norm2_to_host_async() {
        cudaCheck(cudaMemcpyAsync(norm2_pinned, norm2, sizeof(float), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaEventRecord(norm2_copied, stream));
    }

    // What every layer op gets: this model's kernels, stream, workspace and profiler.
    OpContext ops() const { return OpContext{ks, stream, ws, prof}; }
    // Layer l's slice of a per-layer buffer (L, B, T, k*C).
    template <class P>
    P* layer(P* base, int l, size_t per_row) const { return base + (size_t)l * B * T * per_row; }
    BlockActivations block(int l) const;
    NormTensors norm_before(int l) const;  // the layernorm whose output block l reads (l = L: lnf)

private:
    int fwd_B = 0, fwd_T = 0;  // shape of the last forward()
    void allocate();
    void upload_tokens(const int* inputs, const int* targets, int N);
};

inline void GPT2Model::allocate() {
    const size_t N = (size_t)B * T, L = config.num_layers, C = config.channels, Vp = config.padded_vocab_size;
    params_memory = mem.alloc_n<floatX>(padded_params(), "parameters");
    grads_memory = mem.alloc_n<floatX>(padded_params(), "gradients");
    if (USE_MASTER_WEIGHTS) master = mem.alloc_n<float>(shard_params(), "fp32 master weights");
    m = mem.alloc_n<float>(shard_params(), "AdamW m");
    v = mem.alloc_n<float>(shard_params(), "AdamW v");
    params = ParameterTensors::view(params_memory, config);
    grads = ParameterTensors::view(grads_memory, config);

    att_saved_bytes = attention_saved_stride(ks, B, T, config.num_heads);
    head_rows = lm_head_rows(ks, (int)N);
    ActivationTensors& a = acts;
    a.encoded = mem.alloc_n<floatX>(N * C, "activations (encoded)");
    a.ln1 = mem.alloc_n<floatX>(L * N * C, "activations (ln1)");
    a.ln1_mean = mem.alloc_n<float>(L * N, "activations (ln1 mean)");
    a.ln1_rstd = mem.alloc_n<float>(L * N, "activations (ln1 rstd)");
    a.qkv = mem.alloc_n<floatX>(L * N * 3 * C, "activations (qkv)");
    a.atty = mem.alloc_n<floatX>(L * N * C, "activations (attention output)");
    a.att_saved = mem.alloc_n<char>(L * att_saved_bytes,
                                    ks.naive(Layer::attention) ? "attention probabilities P (L,B,NH,T,T)" : "attention lse");
    a.residual2 = mem.alloc_n<floatX>(L * N * C, "activations (residual2)");
    a.ln2 = mem.alloc_n<floatX>(L * N * C, "activations (ln2)");
    a.ln2_mean = mem.alloc_n<float>(L * N, "activations (ln2 mean)");
    a.ln2_rstd = mem.alloc_n<float>(L * N, "activations (ln2 rstd)");
    a.fch = mem.alloc_n<floatX>(L * N * 4 * C, "activations (fch)");
    a.fch_gelu = mem.alloc_n<floatX>((recompute ? 1 : L) * N * 4 * C, "activations (fch_gelu)");
    a.residual3 = mem.alloc_n<floatX>(L * N * C, "activations (residual3)");
    a.lnf = mem.alloc_n<floatX>(N * C, "activations (lnf)");
    a.lnf_mean = mem.alloc_n<float>(N, "activations (lnf mean)");
    a.lnf_rstd = mem.alloc_n<float>(N, "activations (lnf rstd)");
    // The LM head (the end of forward) and the backward's dfch/dqkv never live at once: one buffer for both.
    a.logits = mem.alloc_n<floatX>(std::max((size_t)head_rows * Vp, N * 4 * C), "logits / scratch (B,T,4C)");
    a.losses = mem.alloc_n<float>(N, "losses");
    a.inputs = mem.alloc_n<int>(N, "input tokens");
    a.targets = mem.alloc_n<int>(N, "target tokens");
    a.dresidual = mem.alloc_n<floatX>(N * C, "backward scratch (dresidual)");
    a.scratch_btc = mem.alloc_n<floatX>(N * C, "scratch (B,T,C)");
    a.scratch_bt4c = a.logits;
    ws = mem.alloc(workspace_bytes(ks, B, T, config.channels, config.num_heads, config.padded_vocab_size), "workspace");
    norm2 = mem.alloc_n<float>(1, "grad norm");
    cudaCheck(cudaMemset(params_memory, 0, padded_params() * sizeof(floatX)));
    cudaCheck(cudaMemset(grads_memory, 0, padded_params() * sizeof(floatX)));
    cudaCheck(cudaMemset(m, 0, shard_params() * sizeof(float)));
    cudaCheck(cudaMemset(v, 0, shard_params() * sizeof(float)));
}

inline BlockActivations GPT2Model::block(int l) const {
    const ActivationTensors& a = acts;
    const int C = config.channels;
    return {l == 0 ? a.encoded : layer(a.residual3, l - 1, C),
            layer(a.ln1, l, C),       layer(a.qkv, l, 3 * C),      layer(a.atty, l, C),
            layer(a.ln1_mean, l, 1),  layer(a.ln1_rstd, l, 1),     a.att_saved + l * att_saved_bytes,
            layer(a.residual2, l, C), layer(a.ln2, l, C),          layer(a.ln2_mean, l, 1),
            layer(a.ln2_rstd, l, 1),  layer(a.fch, l, 4 * C),      recompute ? a.fch_gelu : layer(a.fch_gelu, l, 4 * C),
            layer(a.residual3, l, C)};
}

inline NormTensors GPT2Model::norm_before(int l) const {
    const ActivationTensors& a = acts;
    const int C = config.channels;
    if (l == config.num_layers) return {a.lnf, a.lnf_mean, a.lnf_rstd, params.lnfw, params.lnfb};
    return {layer(a.ln1, l, C), layer(a.ln1_mean, l, 1), layer(a.ln1_rstd, l, 1), params.ln1w + (size_t)l * C,
            params.ln1b + (size_t)l * C};
}

// ---------------------------------------------------------------------------------------------------------
// floatX <-> float on the host (bf16: the top half of an fp32, rounded to nearest even).
inline void floats_to_floatX(const float* in, floatX* out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = (floatX)in[i];
}
inline void floatX_to_floats(const floatX* in, float* out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = (float)in[i];
}

inline void GPT2Model::set_params(const std::vector<float>& host) {
    if (host.size() != num_params) fail("set_params: %zu values for a model of %zu parameters", host.size(), num_params);
    std::vector<floatX> x(num_params);
    floats_to_floatX(host.data(), x.data(), num_params);
    cudaCheck(cudaMemcpy(params_memory, x.data(), num_params * sizeof(floatX), cudaMemcpyHostToDevice));
    // The master weights (this replica's slice) start as the given fp32 values (a resume overwrites them).
    if (master)
        cudaCheck(cudaMemcpy(master, host.data() + shard_begin, shard_params() * sizeof(float), cudaMemcpyHostToDevice));
}

inline std::vector<float> device_floatX_to_host(const floatX* d, size_t n) {
    std::vector<floatX> x(n);
    cudaCheck(cudaMemcpy(x.data(), d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    floatX_to_floats(x.data(), out.data(), n);
    return out;
}
inline std::vector<float> GPT2Model::get_params() const { return device_floatX_to_host(params_memory, num_params); }
inline std::vector<float> GPT2Model::get_grads() const { return device_floatX_to_host(grads_memory, num_params); }

// ---------------------------------------------------------------------------------------------------------
// The forward pass. N = B'*T' rows; per-layer buffers are strided by the allocated B*T.

// tokens -> page-locked staging -> device, without stalling the host (a pageable copy would wait for the stream
// to drain). The staging is reused only after the previous copy out of it has finished.
inline void GPT2Model::upload_tokens(const int* inputs, const int* targets, int N) {
    cudaCheck(cudaEventSynchronize(tokens_copied));
    int* in_pinned = tokens_pinned;
    int* tg_pinned = tokens_pinned + (size_t)B * T;
    std::copy(inputs, inputs + N, in_pinned);
    if (targets) std::copy(targets, targets + N, tg_pinned);
    cudaCheck(cudaMemcpyAsync(acts.inputs, in_pinned, N * sizeof(int), cudaMemcpyHostToDevice, stream));
    if (targets) cudaCheck(cudaMemcpyAsync(acts.targets, tg_pinned, N * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(tokens_copied, stream));
}

inline void GPT2Model::forward(const int* inputs, const int* targets, int B_, int T_, bool for_training,
                               float dloss_scale) {
    if (B_ < 1 || B_ > B || T_ < 1 || T_ > T)
        fail("forward: batch %dx%d does not fit the model's buffers of %dx%d", B_, T_, B, T);
    if (for_training && !targets) fail("forward: training needs targets");
    if (!targets && B_ * T_ > head_rows)
        fail("forward: without targets the logits of all %d positions are kept, but the LM head holds %d at a "
             "time (the flash classifier's chunk); use --classifier naive or fewer positions", B_ * T_, head_rows);
    const int L = config.num_layers, NH = config.num_heads, C = config.channels;
    const int V = config.vocab_size, Vp = config.padded_vocab_size, N = B_ * T_;
    for (int i = 0; i < N; i++) {  // a bad token would index past wte: refuse it here, with its position
        if (inputs[i] < 0 || inputs[i] >= V) fail("forward: input token %d at position %d is not in [0, %d)", inputs[i], i, V);
        if (targets && (targets[i] < 0 || targets[i] >= V))
            fail("forward: target token %d at position %d is not in [0, %d)", targets[i], i, V);
    }
    fwd_B = B_, fwd_T = T_;
    upload_tokens(inputs, targets, N);
    const OpContext ctx = ops();
    const ActivationTensors& a = acts;
    const ParameterTensors& p = params;
    floatX* proj = a.scratch_btc;  // (B,T,C) the attproj, then the fcproj output

    encoder_forward(ctx, a.encoded, a.inputs, p.wte, p.wpe, B_, T_, C);
    layernorm_forward(ctx, a.ln1, a.ln1_mean, a.ln1_rstd, a.encoded, p.ln1w, p.ln1b, N, C);
    for (int l = 0; l < L; l++) {
        const BlockActivations y = block(l);
        const BlockWeights w = p.block(l, C);
        const NormTensors next = norm_before(l + 1);
        matmul_forward(ctx, y.qkv, y.ln1, w.qkvw, w.qkvb, N, C, 3 * C);
        attention_forward(ctx, y.atty, y.att_saved, y.qkv, B_, T_, C, NH);
        matmul_forward(ctx, proj, y.atty, w.attprojw, w.attprojb, N, C, C);
        residual_layernorm_forward(ctx, y.residual2, y.ln2, y.ln2_mean, y.ln2_rstd, y.input, proj, w.ln2w, w.ln2b, N, C);
        matmul_gelu_forward(ctx, y.fch_gelu, y.fch, y.ln2, w.fcw, w.fcb, N, C, 4 * C);
        matmul_forward(ctx, proj, y.fch_gelu, w.fcprojw, w.fcprojb, N, 4 * C, C);
        residual_layernorm_forward(ctx, y.residual3, next.out, next.mean, next.rstd, y.residual2, proj, next.w, next.b,
                                   N, C);  // x + MLP(x), normalized for the next block (or by lnf)
    }
    // LM head (weights tied to wte), head_rows positions at a time: logits, loss, and when training dlogits
    // in place and at once the head's backward, dlnf rows (into scratch_btc, for backward()) and dwte.
    for (int r0 = 0; r0 < N; r0 += head_rows) {
        const int rows = std::min(head_rows, N - r0);
        const floatX* lnf = a.lnf + (size_t)r0 * C;
        matmul_forward(ctx, a.logits, lnf, p.wte, nullptr, rows, C, Vp);  // (rows, Vp)
        if (!targets) break;
        fused_classifier(ctx, a.logits, a.losses + r0, a.targets + r0, rows, V, Vp, dloss_scale, for_training);
        if (for_training)
            matmul_backward(ctx, a.scratch_btc + (size_t)r0 * C, grads.wte, nullptr, a.logits, lnf, p.wte, nullptr,
                            rows, C, Vp);  // dlnf (rows, C); dwte += dlogits^T lnf
    }
}

inline float GPT2Model::mean_loss() const {
    const int N = fwd_B * fwd_T;
    std::vector<float> losses(N);
    cudaCheck(cudaMemcpyAsync(losses.data(), acts.losses, N * sizeof(float), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    double sum = 0.0;  // fixed order: the same losses give the same mean
    for (float l : losses) sum += l;
    return (float)(sum / N);
}

// ---------------------------------------------------------------------------------------------------------
// The backward pass, layer by layer in reverse (llm.c's gpt2_backward). Parameter gradients accumulate (+=),
// so micro-batches of one step add up; the activation gradients are overwritten each time.
inline void GPT2Model::backward() {
    const int L = config.num_layers, NH = config.num_heads, C = config.channels, Vp = config.padded_vocab_size;
    const int B_ = fwd_B, T_ = fwd_T, N = B_ * T_;
    const OpContext ctx = ops();
    const ActivationTensors& a = acts;
    const ParameterTensors& p = params;
    const ParameterTensors& g = grads;
    floatX* dres = a.dresidual;     // (B,T,C) d loss / d x at the current depth
    floatX* dbtc = a.scratch_btc;   // (B,T,C)
    floatX* dbt4c = a.scratch_bt4c; // (B,T,4C)

    // The layernorm backwards also sum the residual stream's gradient they complete over the rows: that is the
    // bias gradient of attproj and fcproj, whose outputs join the stream (so their matmul_backward gets none).
    // The LM head's backward ran in forward(), chunk by chunk: dbtc holds dlnf. The final layernorm into the
    // residual stream:
    cudaCheck(cudaMemsetAsync(dres, 0, (size_t)N * C * sizeof(floatX), stream));  // layernorm_backward adds
    layernorm_backward(ctx, dres, g.lnfw, g.lnfb, g.block(L - 1, C).fcprojb, dbtc, layer(a.residual3, L - 1, C),
                       p.lnfw, a.lnf_mean, a.lnf_rstd, N, C);
    for (int l = L - 1; l >= 0; l--) {
        const BlockActivations y = block(l);
        const BlockWeights w = p.block(l, C), dw = g.block(l, C);
        // MLP: dres = d residual3, passed unchanged to residual2 and to fcproj (then through the GELU);
        // with recompute, GELU's output first (the forward left the last block's in the shared buffer)
        if (recompute && l < L - 1) gelu_forward(ctx, y.fch_gelu, y.fch, (size_t)N * 4 * C);
        // (fcproj's backward ends in d fch: it also sums fc's bias gradient, so fc's gets none)
        matmul_backward(ctx, dbt4c, dw.fcprojw, nullptr, dres, y.fch_gelu, w.fcprojw, y.fch, N, 4 * C, C, dw.fcb);
        matmul_backward(ctx, dbtc, dw.fcw, nullptr, dbt4c, y.ln2, w.fcw, nullptr, N, C, 4 * C);
        layernorm_backward(ctx, dres, dw.ln2w, dw.ln2b, dw.attprojb, dbtc, y.residual2, w.ln2w, y.ln2_mean,
                           y.ln2_rstd, N, C);
        // attention: dres = d residual2, passed to the block input and to attproj
        matmul_backward(ctx, dbtc, dw.attprojw, nullptr, dres, y.atty, w.attprojw, nullptr, N, C, C);
        attention_backward(ctx, dbt4c, dbtc, y.qkv, y.atty, y.att_saved, B_, T_, C, NH);  // -> d qkv (B,T,3C)
        matmul_backward(ctx, dbtc, dw.qkvw, dw.qkvb, dbt4c, y.ln1, w.qkvw, nullptr, N, C, 3 * C);
        layernorm_backward(ctx, dres, dw.ln1w, dw.ln1b, l > 0 ? g.block(l - 1, C).fcprojb : nullptr, dbtc, y.input,
                           w.ln1w, y.ln1_mean, y.ln1_rstd, N, C);
    }
    encoder_backward(ctx, g.wte, g.wpe, dres, a.inputs, B_, T_, C, Vp);
}

// ---------------------------------------------------------------------------------------------------------
// The optimizer step: global gradient norm (deterministic), clip factor, AdamW on every tensor of this
// replica's slice (all of them when not sharded: shard_layout is then the layout itself).
inline void GPT2Model::grad_norm_async(const std::function<void(float* norm2)>& sum_norm2) {
    global_norm_squared(ops(), norm2, grads_memory + shard_begin, shard_layout);
    if (sum_norm2) sum_norm2(norm2);
    norm2_to_host_async();
}

inline float GPT2Model::grad_norm() {
    cudaCheck(cudaEventSynchronize(norm2_copied));
    return std::sqrt(*norm2_pinned);
}

inline void GPT2Model::apply_update(float lr, float beta1, float beta2, float eps, float weight_decay,
                                    float grad_clip, int t) {
    AdamWHyper hp;
    hp.lr = lr, hp.beta1 = beta1, hp.beta2 = beta2, hp.eps = eps, hp.weight_decay = weight_decay, hp.t = t;
    hp.norm2 = norm2, hp.grad_clip = grad_clip;  // the clip factor, llm.c's rule, taken on the device
    adamw_update(ops(), master, params_memory + shard_begin, grads_memory + shard_begin, m, v, shard_layout, hp);
}

}  // namespace flashgpt2
