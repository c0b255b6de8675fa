// GPU memory: every device allocation of the trainer goes through GpuMemory (so out-of-memory is one line that
// says what failed and what to lower), and the memory plan sizes every buffer BEFORE the first allocation, so a
// run that cannot fit stops with one line saying how much it needs and which flag to change.
#pragma once
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/common.cuh"
#include "llmc/config.h"
#include "llmc/error.h"
#include "llmc/kernels.h"

namespace flashgpt2 {

#if defined(ENABLE_FP32)
constexpr bool USE_MASTER_WEIGHTS = false;  // params are fp32 already: AdamW updates them in place
#else
constexpr bool USE_MASTER_WEIGHTS = true;   // bf16 params are round(fp32 master) after every step
#endif

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

// What one layer's attention keeps for the backward pass, rounded up so that every layer's slice starts
// 256-byte aligned (like every cudaMalloc): (L, stride) bytes in all.
inline size_t attention_saved_stride(const KernelSet& ks, int B, int T, int NH) {
    return ws_round(attention_saved_bytes(ks, B, T, NH));
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

// recompute: GELU's output is one (B, T, 4C) buffer that the backward refills per layer, not one per layer.
inline MemoryPlan plan_memory(const GPT2Config& c, const KernelSet& ks, int B, int T, int num_shards = 1,
                              bool recompute = false) {
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
                    + L * N * 4 * C * X              // fch
                    + (recompute ? 1 : L) * N * 4 * C * X  // fch_gelu
                    + N * C * X + N * F * 2          // lnf, its mean/rstd
                    // logits (one chunk of rows), sharing memory with the backward's scratch (B,T,4C)
                    + std::max((size_t)lm_head_rows(ks, (int)N) * c.padded_vocab_size, N * 4 * C) * X
                    + N * F + N * 4 * 2              // losses, inputs, targets
                    + N * C * X * 2                  // dresidual, scratch_btc
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
         ks.naive(Layer::attention) ? ", or use --attention flash (naive attention keeps (B,NH,T,T) per layer)" : "");
}

}  // namespace flashgpt2
