// GPT-2 on the GPU: its tensors, its memory plan, and the forward and backward passes wired from the layer ops.
//
// The forward pass reads like the model (llm.c's gpt2_forward):
//     x = wte[tokens] + wpe[positions]
//     for each layer l:   x = x + attproj(attention(qkv(ln1(x))))      (residual2)
//                         x = x + fcproj(gelu(fc(ln2(x))))             (residual3)
//     logits = lnf(x) @ wte^T   ->  softmax, cross-entropy, and (training) dlogits in place
// Every op dispatches on the KernelSet (llmc/kernels.h), so the same code runs the naive set, the flash set, or
// any mix; a LayerProfiler, when attached, times each op under its layer's name (llmc/profile.h).
//
// Memory: parameters and gradients (floatX) are each ONE flat buffer in llm.c's tensor order (config.h), so the
// optimizer, the checkpoint and the gradient norm see one array. fp32 master weights (BF16 build only) and the
// AdamW moments m, v are flat too. Activations are kept per layer for the backward pass. Everything is sized
// up front by plan_memory() and checked against the free GPU memory BEFORE the first allocation, so a run that
// cannot fit stops with one line saying how much it needs and which flag to lower.
//
// Data parallel (llmc/distributed.h): with num_shards W > 1 the model is one of W replicas, and the optimizer is
// ZeRO-1 sharded (Rajbhandari et al. 2020, stage 1): replica r owns the slice [shard_begin, shard_end) of the flat
// parameter buffer and keeps AdamW m, v and the master weights for that slice only (1/W of them); update() steps
// only that slice. The parameter and gradient buffers are padded to W equal slices, as NCCL's reduce-scatter and
// all-gather want. W = 1 (the default): one slice, the whole buffer, no padding: the plain model.
#pragma once
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"  // validate_config
#include "llmc/common.cuh"
#include "llmc/config.h"
#include "llmc/error.h"
#include "llmc/kernels.h"
#include "llmc/profile.h"

namespace flashgpt2 {

#if defined(ENABLE_FP32)
constexpr bool USE_MASTER_WEIGHTS = false;  // params are fp32 already: AdamW updates them in place
#else
constexpr bool USE_MASTER_WEIGHTS = true;   // bf16 params are round(fp32 master) after every step
#endif

// ---------------------------------------------------------------------------------------------------------
// Device memory: every allocation goes through here, so we know what we hold and out-of-memory is one line.

inline double gib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0 * 1024.0); }

struct GpuMemory {
    std::vector<void*> blocks;
    size_t allocated = 0;  // bytes we asked cudaMalloc for, in all
    std::string hint;      // what to lower when an allocation fails, e.g. "reduce -b (batch size) or -t"

    void* alloc(size_t bytes, const char* what) {
        void* p = nullptr;
        if (bytes == 0) return nullptr;
        const cudaError_t e = cudaMalloc(&p, bytes);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();  // clear the sticky-free error state of the runtime
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            fail("out of GPU memory: allocating %s (%.2f GiB) failed with %.2f GiB already allocated and %.2f GiB "
                 "free of %.2f GiB; %s",
                 what, gib(bytes), gib(allocated), gib(free_b), gib(total_b), hint.c_str());
        }
        cudaCheck(e);
        blocks.push_back(p);
        allocated += bytes;
        return p;
    }
    template <class T>
    T* alloc_n(size_t n, const char* what) { return static_cast<T*>(alloc(n * sizeof(T), what)); }

    void release() {
        for (void* p : blocks) cudaCheck(cudaFree(p));
        blocks.clear();
        allocated = 0;
    }
    GpuMemory() = default;
    GpuMemory(const GpuMemory&) = delete;
    GpuMemory& operator=(const GpuMemory&) = delete;
    ~GpuMemory() {
        for (void* p : blocks) cudaFree(p);  // no check: destructors must not exit
    }
};

// ---------------------------------------------------------------------------------------------------------
// Parameters (and, with the same layout, their gradients): named views into one flat floatX buffer.
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
    floatX* fch_gelu;   // (L, B, T, 4C)
    floatX* residual3;  // (L, B, T, C)    x after the MLP block
    floatX* lnf;        // (B, T, C)
    float* lnf_mean;    // (B, T)
    float* lnf_rstd;    // (B, T)
    floatX* logits;     // (B, T, Vp)      overwritten in place by dlogits when training
    float* losses;      // (B, T)
    int* inputs;        // (B, T)
    int* targets;       // (B, T)
    // backward scratch
    floatX* dresidual;     // (B, T, C)   gradient of the residual stream, carried down the layers
    floatX* scratch_btc;   // (B, T, C)   attproj / fcproj outputs (forward); dln, datty (backward)
    floatX* scratch_bt4c;  // (B, T, 4C)  dfch, dqkv (backward)
};

// What one layer's attention keeps for the backward pass, rounded up so that every layer's slice starts
// 256-byte aligned (like every cudaMalloc): (L, stride) bytes in all.
inline size_t attention_saved_stride(const KernelSet& ks, int B, int T, int NH) {
    return ws_round(attention_saved_bytes(ks, B, T, NH));
}

// ZeRO-1: the part of a layout inside [begin, end) of the flat buffer, with offsets relative to begin; tensors
// outside it become empty. What one optimizer shard's AdamW and grad-norm launches see. [0, total): the layout.
inline ParamLayout layout_slice(const ParamLayout& l, size_t begin, size_t end) {
    ParamLayout s = l;
    for (int i = 0; i <= l.count; i++) s.offset[i] = std::min(std::max(l.offset[i], begin), end) - begin;
    return s;
}

// Elements per optimizer shard: P itself for one shard; else ceil(P / W) rounded up to 128 elements (256-byte
// aligned slices for NCCL and the vector loads), so the padded buffer holds W * shard_size >= P.
inline size_t shard_size_for(size_t P, int num_shards) {
    return num_shards == 1 ? P : ceil_div(ceil_div(P, (size_t)num_shards), (size_t)128) * 128;
}

// Bytes of each kind of buffer for a model, a kernel set and a micro-batch shape: the memory plan.
struct MemoryPlan {
    size_t params = 0, grads = 0, master = 0, adam = 0;        // weights and optimizer
    size_t activations = 0, att_saved = 0, workspace = 0;      // per micro-batch (att_saved is part of activations)
    size_t total() const { return params + grads + master + adam + activations + workspace; }
};

inline MemoryPlan plan_memory(const GPT2Config& c, const KernelSet& ks, int B, int T, int num_shards = 1) {
    MemoryPlan m;
    const size_t P = num_parameters(c), N = (size_t)B * T, L = c.num_layers, C = c.channels;
    const size_t X = sizeof(floatX), F = sizeof(float);
    const size_t S = shard_size_for(P, num_shards);  // this replica's optimizer slice (at most)
    m.params = S * num_shards * X;
    m.grads = S * num_shards * X;
    m.master = USE_MASTER_WEIGHTS ? S * F : 0;
    m.adam = 2 * S * F;
    m.att_saved = L * attention_saved_stride(ks, B, T, c.num_heads);
    m.activations = N * C * X                       // encoded
                    + L * N * C * X * 2 + L * N * F * 4  // ln1, ln2 and their mean/rstd
                    + L * N * 3 * C * X              // qkv
                    + L * N * C * X * 3              // atty, residual2, residual3
                    + L * N * 4 * C * X * 2          // fch, fch_gelu
                    + N * C * X + N * F * 2          // lnf, its mean/rstd
                    + N * c.padded_vocab_size * X    // logits
                    + N * F + N * 4 * 2              // losses, inputs, targets
                    + N * C * X * 2 + N * 4 * C * X  // dresidual, scratch_btc, scratch_bt4c
                    + m.att_saved;
    m.workspace = workspace_bytes(ks, B, T, c.channels, c.num_heads, c.padded_vocab_size) + blas_workspace_bytes();
    return m;
}

// One line per kind, for the start-up print and the compare table.
inline void print_memory_plan(FILE* f, const MemoryPlan& m) {
    fprintf(f, "GPU memory plan: %.2f GiB = params %.2f + grads %.2f + master %.2f + AdamW m,v %.2f + activations %.2f "
               "(attention saved %.2f) + workspace %.2f\n",
            gib(m.total()), gib(m.params), gib(m.grads), gib(m.master), gib(m.adam), gib(m.activations),
            gib(m.att_saved), gib(m.workspace));
}

// Stops before allocating anything when the plan cannot fit in the free GPU memory.
inline void check_memory_fits(const MemoryPlan& m, int B, int T, const KernelSet& ks) {
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    if (m.total() <= free_b) return;
    fail("out of GPU memory: B=%d T=%d needs %.2f GiB (weights and optimizer %.2f, activations %.2f of which "
         "attention %.2f, workspace %.2f) but only %.2f GiB of %.2f GiB is free; reduce -b (batch size) or -t "
         "(sequence length)%s",
         B, T, gib(m.total()), gib(m.params + m.grads + m.master + m.adam), gib(m.activations), gib(m.att_saved),
         gib(m.workspace), gib(free_b), gib(total_b),
         ks.attention == Variant::naive ? ", or use --attention flash (naive attention keeps (B,NH,T,T) per layer)" : "");
}

// ---------------------------------------------------------------------------------------------------------
struct GPT2Model {
    GPT2Config config;
    KernelSet ks;
    int B = 0, T = 0;  // the allocated micro-batch shape: forward() accepts any B' <= B, T' <= T
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

    cudaStream_t stream = nullptr;
    LayerProfiler* prof = nullptr;    // set to time every op by layer
    int* tokens_pinned = nullptr;     // (2, B, T) page-locked staging of inputs and targets: copies stay async
    cudaEvent_t tokens_copied = nullptr;  // the last copy out of tokens_pinned has finished

    GPT2Model(const GPT2Config& cfg, const KernelSet& kernels, int B_, int T_, int shards = 1, int shard = 0)
        : config(cfg), ks(kernels), B(B_), T(T_), num_shards(shards), shard_rank(shard) {
        validate_config(cfg, "model");
        if (B < 1 || T < 1) fail("-b/-t: B=%d and T=%d must be positive", B, T);
        if (T > cfg.max_seq_len) fail("-t: T=%d exceeds the model's max_seq_len %d", T, cfg.max_seq_len);
        if ((size_t)B * T > (size_t)INT_MAX) fail("-b/-t: B*T = %zu positions is more than the kernels index (2^31)", (size_t)B * T);
        check_kernel_support(ks, cfg.channels, cfg.num_heads);
        num_params = num_parameters(cfg);
        layout = ParamLayout::gpt2(cfg);
        if (num_shards < 1 || shard_rank < 0 || shard_rank >= num_shards)
            fail("model: optimizer shard %d of %d does not exist", shard_rank, num_shards);
        shard_size = shard_size_for(num_params, num_shards);
        shard_begin = std::min(num_params, (size_t)shard_rank * shard_size);
        shard_end = std::min(num_params, shard_begin + shard_size);
        shard_layout = layout_slice(layout, shard_begin, shard_end);
        plan = plan_memory(cfg, ks, B, T, num_shards);
        check_memory_fits(plan, B, T, ks);
        mem.hint = "reduce -b (batch size) or -t (sequence length)";
        cudaCheck(cudaStreamCreate(&stream));
        cudaCheck(cudaEventCreateWithFlags(&tokens_copied, cudaEventDisableTiming));
        cudaCheck(cudaMallocHost(&tokens_pinned, 2 * (size_t)B * T * sizeof(int)));
        allocate();
    }
    ~GPT2Model() {  // no checks: destructors must not exit
        if (stream) cudaStreamSynchronize(stream);
        if (tokens_pinned) cudaFreeHost(tokens_pinned);
        if (tokens_copied) cudaEventDestroy(tokens_copied);
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
    // Runs the model on host tokens inputs/targets (B', T'); targets == nullptr: inference, logits kept.
    // With targets: losses (B', T') on the device, and when `for_training` the logits buffer holds dlogits
    // scaled by dloss_scale, ready for backward(). Returns nothing: read the losses with mean_loss().
    void forward(const int* inputs, const int* targets, int B_, int T_, bool for_training, float dloss_scale);
    void backward();  // accumulates parameter gradients of the last training forward()
    float mean_loss() const;  // waits for the stream; mean over the last forward's B'*T' losses
    // Queues a copy of the last forward's B'*T' losses into page-locked host memory (no wait).
    void losses_to_host_async(float* pinned) const {
        cudaCheck(cudaMemcpyAsync(pinned, acts.losses, (size_t)fwd_B * fwd_T * sizeof(float), cudaMemcpyDeviceToHost, stream));
    }
    // grad norm (before clipping) -> clip -> AdamW step t (from 1) on this replica's slice; returns the norm.
    // Sharded (ZeRO-1), the norm is over the slice's gradients; sum_norm2, when given, turns that squared norm
    // (one device float, on `stream`) into the global one (an all-reduce over the replicas).
    float update(float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip, int t,
                 const std::function<void(float* norm2)>& sum_norm2 = nullptr);

    // Layer l's slice of a per-layer buffer (L, B, T, k*C).
    template <class P>
    P* layer(P* base, int l, size_t per_row) const { return base + (size_t)l * B * T * per_row; }

private:
    int fwd_B = 0, fwd_T = 0;  // shape of the last forward()
    void allocate();
    void residual_layernorm(floatX* residual_out, floatX* ln_out, float* mean, float* rstd, const floatX* a,
                            const floatX* b, const floatX* w, const floatX* bias, int N);
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
    ActivationTensors& a = acts;
    a.encoded = mem.alloc_n<floatX>(N * C, "activations (encoded)");
    a.ln1 = mem.alloc_n<floatX>(L * N * C, "activations (ln1)");
    a.ln1_mean = mem.alloc_n<float>(L * N, "activations (ln1 mean)");
    a.ln1_rstd = mem.alloc_n<float>(L * N, "activations (ln1 rstd)");
    a.qkv = mem.alloc_n<floatX>(L * N * 3 * C, "activations (qkv)");
    a.atty = mem.alloc_n<floatX>(L * N * C, "activations (attention output)");
    a.att_saved = mem.alloc_n<char>(L * att_saved_bytes,
                                    ks.attention == Variant::naive ? "attention probabilities P (L,B,NH,T,T)" : "attention lse");
    a.residual2 = mem.alloc_n<floatX>(L * N * C, "activations (residual2)");
    a.ln2 = mem.alloc_n<floatX>(L * N * C, "activations (ln2)");
    a.ln2_mean = mem.alloc_n<float>(L * N, "activations (ln2 mean)");
    a.ln2_rstd = mem.alloc_n<float>(L * N, "activations (ln2 rstd)");
    a.fch = mem.alloc_n<floatX>(L * N * 4 * C, "activations (fch)");
    a.fch_gelu = mem.alloc_n<floatX>(L * N * 4 * C, "activations (fch_gelu)");
    a.residual3 = mem.alloc_n<floatX>(L * N * C, "activations (residual3)");
    a.lnf = mem.alloc_n<floatX>(N * C, "activations (lnf)");
    a.lnf_mean = mem.alloc_n<float>(N, "activations (lnf mean)");
    a.lnf_rstd = mem.alloc_n<float>(N, "activations (lnf rstd)");
    a.logits = mem.alloc_n<floatX>(N * Vp, "logits (B,T,Vp)");
    a.losses = mem.alloc_n<float>(N, "losses");
    a.inputs = mem.alloc_n<int>(N, "input tokens");
    a.targets = mem.alloc_n<int>(N, "target tokens");
    a.dresidual = mem.alloc_n<floatX>(N * C, "backward scratch (dresidual)");
    a.scratch_btc = mem.alloc_n<floatX>(N * C, "scratch (B,T,C)");
    a.scratch_bt4c = mem.alloc_n<floatX>(N * 4 * C, "scratch (B,T,4C)");
    ws = mem.alloc(workspace_bytes(ks, B, T, config.channels, config.num_heads, config.padded_vocab_size), "workspace");
    norm2 = mem.alloc_n<float>(1, "grad norm");
    cudaCheck(cudaMemset(params_memory, 0, padded_params() * sizeof(floatX)));
    cudaCheck(cudaMemset(grads_memory, 0, padded_params() * sizeof(floatX)));
    cudaCheck(cudaMemset(m, 0, shard_params() * sizeof(float)));
    cudaCheck(cudaMemset(v, 0, shard_params() * sizeof(float)));
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

// residual_out = a + b, then ln_out = layernorm(residual_out). Fused in one kernel when both layers are flash
// (kernels.h's residual_layernorm_forward decides that the same way); otherwise two ops, timed separately.
inline void GPT2Model::residual_layernorm(floatX* residual_out, floatX* ln_out, float* mean, float* rstd,
                                          const floatX* a, const floatX* b, const floatX* w, const floatX* bias,
                                          int N) {
    const int C = config.channels;
    if (ks.residual == Variant::flash && ks.layernorm == Variant::flash) {
        ProfileSpan s(prof, Layer::layernorm, Pass::forward, stream);  // residual fused into layernorm
        residual_layernorm_forward(ks, residual_out, ln_out, mean, rstd, a, b, w, bias, N, C, stream);
        return;
    }
    {
        ProfileSpan s(prof, Layer::residual, Pass::forward, stream);
        residual_forward(ks, residual_out, a, b, (size_t)N * C, stream);
    }
    ProfileSpan s(prof, Layer::layernorm, Pass::forward, stream);
    layernorm_forward(ks, ln_out, mean, rstd, residual_out, w, bias, N, C, stream);
}

inline void GPT2Model::forward(const int* inputs, const int* targets, int B_, int T_, bool for_training,
                               float dloss_scale) {
    if (B_ < 1 || B_ > B || T_ < 1 || T_ > T)
        fail("forward: batch %dx%d does not fit the model's buffers of %dx%d", B_, T_, B, T);
    if (for_training && !targets) fail("forward: training needs targets");
    const int L = config.num_layers, NH = config.num_heads, C = config.channels;
    const int V = config.vocab_size, Vp = config.padded_vocab_size, N = B_ * T_;
    for (int i = 0; i < N; i++) {  // a bad token would index past wte: refuse it here, with its position
        if (inputs[i] < 0 || inputs[i] >= V) fail("forward: input token %d at position %d is not in [0, %d)", inputs[i], i, V);
        if (targets && (targets[i] < 0 || targets[i] >= V))
            fail("forward: target token %d at position %d is not in [0, %d)", targets[i], i, V);
    }
    fwd_B = B_, fwd_T = T_;
    ActivationTensors& a = acts;
    const ParameterTensors& p = params;
    // tokens -> page-locked staging -> device, without stalling the host (a pageable copy would wait for the
    // stream to drain). The staging is reused only after the previous copy out of it has finished.
    cudaCheck(cudaEventSynchronize(tokens_copied));
    int* in_pinned = tokens_pinned;
    int* tg_pinned = tokens_pinned + (size_t)B * T;
    std::copy(inputs, inputs + N, in_pinned);
    if (targets) std::copy(targets, targets + N, tg_pinned);
    cudaCheck(cudaMemcpyAsync(a.inputs, in_pinned, N * sizeof(int), cudaMemcpyHostToDevice, stream));
    if (targets) cudaCheck(cudaMemcpyAsync(a.targets, tg_pinned, N * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(tokens_copied, stream));

    {
        ProfileSpan s(prof, Layer::encoder, Pass::forward, stream);
        encoder_forward(ks, a.encoded, a.inputs, p.wte, p.wpe, B_, T_, C, stream);  // (B,T,C)
    }
    {
        ProfileSpan s(prof, Layer::layernorm, Pass::forward, stream);
        layernorm_forward(ks, a.ln1, a.ln1_mean, a.ln1_rstd, a.encoded, p.ln1w, p.ln1b, N, C, stream);
    }
    for (int l = 0; l < L; l++) {
        const floatX* residual = l == 0 ? a.encoded : layer(a.residual3, l - 1, C);  // (B,T,C) x entering layer l
        floatX* ln1 = layer(a.ln1, l, C);                  // (B,T,C)
        floatX* qkv = layer(a.qkv, l, 3 * C);              // (B,T,3C)
        floatX* atty = layer(a.atty, l, C);                // (B,T,C)
        void* att_saved = a.att_saved + l * att_saved_bytes;
        floatX* residual2 = layer(a.residual2, l, C);      // (B,T,C)
        floatX* ln2 = layer(a.ln2, l, C);                  // (B,T,C)
        floatX* fch = layer(a.fch, l, 4 * C);              // (B,T,4C)
        floatX* fch_gelu = layer(a.fch_gelu, l, 4 * C);    // (B,T,4C)
        floatX* residual3 = layer(a.residual3, l, C);      // (B,T,C)
        floatX* proj = a.scratch_btc;                      // (B,T,C) attproj, then fcproj output
        const size_t CC = (size_t)C * C;

        // attention block
        {
            ProfileSpan s(prof, Layer::matmul, Pass::forward, stream);
            matmul_forward(ks, qkv, ln1, p.qkvw + l * 3 * CC, p.qkvb + l * 3 * C, N, C, 3 * C, stream);
        }
        {
            ProfileSpan s(prof, Layer::attention, Pass::forward, stream);
            attention_forward(ks, atty, att_saved, ws, qkv, B_, T_, C, NH, stream);
        }
        {
            ProfileSpan s(prof, Layer::matmul, Pass::forward, stream);
            matmul_forward(ks, proj, atty, p.attprojw + l * CC, p.attprojb + l * C, N, C, C, stream);
        }
        residual_layernorm(residual2, ln2, layer(a.ln2_mean, l, 1), layer(a.ln2_rstd, l, 1), residual, proj,
                           p.ln2w + l * C, p.ln2b + l * C, N);
        // MLP block
        if (ks.matmul == Variant::flash && ks.gelu == Variant::flash) {  // one cuBLASLt call with GELU epilogue
            ProfileSpan s(prof, Layer::matmul, Pass::forward, stream);
            matmul_gelu_forward(ks, fch_gelu, fch, ln2, p.fcw + l * 4 * CC, p.fcb + l * 4 * C, N, C, 4 * C, stream);
        } else {
            {
                ProfileSpan s(prof, Layer::matmul, Pass::forward, stream);
                matmul_forward(ks, fch, ln2, p.fcw + l * 4 * CC, p.fcb + l * 4 * C, N, C, 4 * C, stream);
            }
            ProfileSpan s(prof, Layer::gelu, Pass::forward, stream);
            gelu_forward(ks, fch_gelu, fch, (size_t)N * 4 * C, stream);
        }
        {
            ProfileSpan s(prof, Layer::matmul, Pass::forward, stream);
            matmul_forward(ks, proj, fch_gelu, p.fcprojw + l * 4 * CC, p.fcprojb + l * C, N, 4 * C, C, stream);
        }
        // x + MLP(x), normalized for the next layer (or by the final layernorm)
        const bool last = l == L - 1;
        residual_layernorm(residual3, last ? a.lnf : layer(a.ln1, l + 1, C),
                           last ? a.lnf_mean : layer(a.ln1_mean, l + 1, 1),
                           last ? a.lnf_rstd : layer(a.ln1_rstd, l + 1, 1), residual2, proj,
                           last ? p.lnfw : p.ln1w + (l + 1) * C, last ? p.lnfb : p.ln1b + (l + 1) * C, N);
    }
    {
        ProfileSpan s(prof, Layer::matmul, Pass::forward, stream);
        matmul_forward(ks, a.logits, a.lnf, p.wte, nullptr, N, C, Vp, stream);  // (B,T,Vp), weights tied to wte
    }
    if (targets) {
        // softmax + cross-entropy (+ dlogits in place when training); charged to the forward column
        ProfileSpan s(prof, Layer::classifier, Pass::forward, stream);
        fused_classifier(ks, a.logits, a.losses, ws, a.targets, B_, T_, V, Vp, dloss_scale, for_training, stream);
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
    ActivationTensors& a = acts;
    const ParameterTensors& p = params;
    ParameterTensors& g = grads;
    floatX* dresidual = a.dresidual;   // (B,T,C) d loss / d x at the current depth
    floatX* dbtc = a.scratch_btc;      // (B,T,C)
    floatX* dbt4c = a.scratch_bt4c;    // (B,T,4C)
    const size_t CC = (size_t)C * C;

    // LM head: dlogits (in a.logits) -> dlnf, dwte; then the final layernorm into the residual stream.
    {
        ProfileSpan s(prof, Layer::matmul, Pass::backward, stream);
        matmul_backward(ks, dbtc, g.wte, nullptr, ws, a.logits, a.lnf, p.wte, nullptr, N, C, Vp, stream);
    }
    cudaCheck(cudaMemsetAsync(dresidual, 0, (size_t)N * C * sizeof(floatX), stream));  // layernorm_backward adds
    {
        ProfileSpan s(prof, Layer::layernorm, Pass::backward, stream);
        layernorm_backward(ks, dresidual, g.lnfw, g.lnfb, ws, dbtc, layer(a.residual3, L - 1, C), p.lnfw,
                           a.lnf_mean, a.lnf_rstd, N, C, stream);
    }
    for (int l = L - 1; l >= 0; l--) {
        const floatX* residual = l == 0 ? a.encoded : layer(a.residual3, l - 1, C);
        // MLP block. dresidual = d residual3[l]; the residual add passes it unchanged to residual2 and fcproj.
        if (ks.matmul == Variant::flash && ks.gelu == Variant::flash) {  // DGELU in the cuBLASLt epilogue
            ProfileSpan s(prof, Layer::matmul, Pass::backward, stream);
            matmul_backward(ks, dbt4c, g.fcprojw + l * 4 * CC, g.fcprojb + l * C, ws, dresidual,
                            layer(a.fch_gelu, l, 4 * C), p.fcprojw + l * 4 * CC, layer(a.fch, l, 4 * C), N, 4 * C, C,
                            stream);
        } else {
            {
                ProfileSpan s(prof, Layer::matmul, Pass::backward, stream);
                matmul_backward(ks, dbt4c, g.fcprojw + l * 4 * CC, g.fcprojb + l * C, ws, dresidual,
                                layer(a.fch_gelu, l, 4 * C), p.fcprojw + l * 4 * CC, nullptr, N, 4 * C, C, stream);
            }
            ProfileSpan s(prof, Layer::gelu, Pass::backward, stream);
            gelu_backward(ks, dbt4c, layer(a.fch, l, 4 * C), dbt4c, (size_t)N * 4 * C, stream);  // in place
        }
        {
            ProfileSpan s(prof, Layer::matmul, Pass::backward, stream);  // dbt4c = d fch -> d ln2
            matmul_backward(ks, dbtc, g.fcw + l * 4 * CC, g.fcb + l * 4 * C, ws, dbt4c, layer(a.ln2, l, C),
                            p.fcw + l * 4 * CC, nullptr, N, C, 4 * C, stream);
        }
        {
            ProfileSpan s(prof, Layer::layernorm, Pass::backward, stream);  // dresidual += d residual2 via ln2
            layernorm_backward(ks, dresidual, g.ln2w + l * C, g.ln2b + l * C, ws, dbtc, layer(a.residual2, l, C),
                               p.ln2w + l * C, layer(a.ln2_mean, l, 1), layer(a.ln2_rstd, l, 1), N, C, stream);
        }
        // attention block. dresidual = d residual2[l], passed to the block input and to attproj.
        {
            ProfileSpan s(prof, Layer::matmul, Pass::backward, stream);  // -> d atty
            matmul_backward(ks, dbtc, g.attprojw + l * CC, g.attprojb + l * C, ws, dresidual, layer(a.atty, l, C),
                            p.attprojw + l * CC, nullptr, N, C, C, stream);
        }
        {
            ProfileSpan s(prof, Layer::attention, Pass::backward, stream);  // d atty -> d qkv (B,T,3C)
            attention_backward(ks, dbt4c, ws, dbtc, layer(a.qkv, l, 3 * C), layer(a.atty, l, C),
                               a.att_saved + l * att_saved_bytes, B_, T_, C, NH, stream);
        }
        {
            ProfileSpan s(prof, Layer::matmul, Pass::backward, stream);  // d qkv -> d ln1
            matmul_backward(ks, dbtc, g.qkvw + l * 3 * CC, g.qkvb + l * 3 * C, ws, dbt4c, layer(a.ln1, l, C),
                            p.qkvw + l * 3 * CC, nullptr, N, C, 3 * C, stream);
        }
        {
            ProfileSpan s(prof, Layer::layernorm, Pass::backward, stream);  // dresidual += d x via ln1
            layernorm_backward(ks, dresidual, g.ln1w + l * C, g.ln1b + l * C, ws, dbtc, residual, p.ln1w + l * C,
                               layer(a.ln1_mean, l, 1), layer(a.ln1_rstd, l, 1), N, C, stream);
        }
    }
    ProfileSpan s(prof, Layer::encoder, Pass::backward, stream);
    encoder_backward(ks, g.wte, g.wpe, ws, dresidual, a.inputs, B_, T_, C, Vp, stream);
}

// ---------------------------------------------------------------------------------------------------------
// The optimizer step: global gradient norm (deterministic), clip factor, AdamW on every tensor of this
// replica's slice (all of them when not sharded: shard_layout is then the layout itself).
inline float GPT2Model::update(float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip,
                               int t, const std::function<void(float* norm2)>& sum_norm2) {
    ProfileSpan s(prof, Layer::adamw, Pass::forward, stream);
    global_norm_squared(ks, norm2, ws, grads_memory + shard_begin, shard_layout, stream);
    if (sum_norm2) sum_norm2(norm2);
    float norm2_host = 0.0f;
    cudaCheck(cudaMemcpyAsync(&norm2_host, norm2, sizeof(float), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    const float norm = std::sqrt(norm2_host);
    AdamWHyper hp;
    hp.lr = lr, hp.beta1 = beta1, hp.beta2 = beta2, hp.eps = eps, hp.weight_decay = weight_decay, hp.t = t;
    hp.grad_scale = (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f;  // llm.c's clipping rule
    adamw_update(ks, master, params_memory + shard_begin, grads_memory + shard_begin, m, v, shard_layout, hp, stream);
    return norm;
}

}  // namespace flashgpt2
