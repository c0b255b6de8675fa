// Classifier: logits (N, Vp) -> softmax over the V real columns -> cross-entropy loss against the target
// -> dlogits = (softmax - onehot(target)) * dloss_scale, written over the logits. Padded columns V..Vp-1 are
// ignored by the softmax and get zero gradient.
//
// naive: the probabilities are materialized: a softmax kernel writes probs (N, Vp) in fp32 to HBM (the
//        biggest tensor of the whole model: 3.3 GB at B=16, T=1024), then a loss kernel reads
//        probs[target], then a gradient kernel reads probs again and writes dlogits.
// flash: one block per row does it all: one read of the row with an online softmax (running max m and
//        running sum l, rescaled when m grows), the loss from lse = m + log l, and a second pass over the row
//        to write dlogits in place. The (N, Vp) probabilities never exist. Where the row fits in shared
//        memory (GPT-2's 50304 bf16 logits: 98 KB), it is copied there once and both passes read it there, so
//        the row crosses HBM once each way; a longer row (the FP32 build's) is read from global memory twice.
//
// The LM head around it (model.cuh) takes the same idea one level up: the flash set runs logits = lnf @ wte^T,
// this classifier and the head's backward (dlnf, dwte) on one chunk of positions at a time, so only one
// chunk's (rows, Vp) logits exist instead of all N rows' (1.5 GiB at B=16, T=1024: the largest activation).
// The same idea as Liger Kernel's fused linear cross-entropy (Hsu et al. 2024) and Cut Cross-Entropy
// (Wijmans et al. 2024). The naive set keeps the whole (N, Vp) logits, one chunk of N rows.
#pragma once
#include <algorithm>

#include "llmc/error.h"
#include "llmc/kernel_common.cuh"
#include "llmc/ptx/mma_sync.cuh"

namespace flashgpt2 {

// A chunk is a quarter of the positions, and at least CLASSIFIER_CHUNK_ROWS of them (412 MB of bf16 logits at
// GPT-2's 50304 padded columns): each chunk costs one more read-modify-write of dwte (Vp, C), 154 MB, so there
// are at most 4 of them, and small batches stay one chunk.
constexpr int CLASSIFIER_CHUNK_ROWS = 4096;
inline int classifier_chunk_rows(Variant v, int N) {
    if (v == Variant::naive) return N;
    return std::min(N, std::max(CLASSIFIER_CHUNK_ROWS, ceil_div(ceil_div(N, 4), 64) * 64));
}

inline size_t classifier_workspace_bytes(Variant v, int N, int Vp) {
    return v == Variant::naive ? ws_round((size_t)N * Vp * sizeof(float)) : 0;
}

// ---------------------------------------------------------------------------------------------------------
// naive

// One block per row: max pass, sum pass, then probs written out (fp32).
static __global__ void classifier_softmax_naive_kernel(float* probs, const floatX* logits, int V, int Vp) {
    const size_t row = (size_t)blockIdx.x * Vp;
    float m = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, to_float(logits[row + v]));
    m = block_max(m);
    float s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(to_float(logits[row + v]) - m);
    s = block_sum(s);
    for (int v = threadIdx.x; v < Vp; v += blockDim.x)
        probs[row + v] = v < V ? expf(to_float(logits[row + v]) - m) / s : 0.0f;
}

static __global__ void classifier_loss_naive_kernel(float* losses, const float* probs, const int* targets, int N, int Vp) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;  // one row per thread
    if (n < N) losses[n] = -logf(probs[(size_t)n * Vp + targets[n]]);
}

static __global__ void classifier_dlogits_naive_kernel(floatX* dlogits, const float* probs, const int* targets, int N, int V,
                                                int Vp, float dloss_scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // one element per thread
    if (idx >= (size_t)N * Vp) return;
    int n = (int)(idx / Vp), v = (int)(idx % Vp);
    float g = v < V ? (probs[idx] - (v == targets[n] ? 1.0f : 0.0f)) * dloss_scale : 0.0f;
    dlogits[idx] = from_float<floatX>(g);
}

inline void classifier_naive(floatX* logits, float* losses, void* ws, const int* targets, int N, int V, int Vp,
                             float dloss_scale, bool write_dlogits, cudaStream_t stream) {
    float* probs = WorkspaceCarver(ws).take<float>((size_t)N * Vp);  // (N, Vp) fp32, in HBM
    classifier_softmax_naive_kernel<<<N, 512, 0, stream>>>(probs, logits, V, Vp);
    cudaCheckLaunch();
    classifier_loss_naive_kernel<<<ceil_div(N, 256), 256, 0, stream>>>(losses, probs, targets, N, Vp);
    cudaCheckLaunch();
    if (write_dlogits) {
        classifier_dlogits_naive_kernel<<<grid_for((size_t)N * Vp, 256), 256, 0, stream>>>(logits, probs, targets, N, V,
                                                                                          Vp, dloss_scale);
        cudaCheckLaunch();
    }
}

// ---------------------------------------------------------------------------------------------------------
// flash

constexpr int CLASSIFIER_THREADS = 1024;

// The row in shared memory: two blocks an SM (2 x (112 KB + 1 KB the block reserves) of the SM's 228 KB), so one
// block's copy runs while the other computes.
constexpr int CLASSIFIER_SMEM_ROW_BYTES = 112 * 1024;
inline bool classifier_row_in_smem(int Vp) { return (size_t)Vp * sizeof(floatX) <= CLASSIFIER_SMEM_ROW_BYTES; }

// Exponentials as 2^(x log2 e - c): one fused multiply-add and the hardware's exp2 per element, with m and lse
// kept in the same log2 units; 1024 threads per row keep more loads in flight (doc/kernels.md has the timings).
// ROW_IN_SMEM: the row is first copied to shared memory with cp.async, every one of a thread's 16-byte copies in
// flight at once, and the passes read it there (thread t always takes chunks t, t + 1024, ..., in both the copy
// and the passes, so each thread reads only what it copied itself: no block barrier before pass 1).
template <bool ROW_IN_SMEM>
static __global__ void __launch_bounds__(CLASSIFIER_THREADS, ROW_IN_SMEM ? 2 : 1)
    classifier_flash_kernel(floatX* logits, float* losses, const int* targets, int V, int Vp, float dloss_scale,
                            bool write_dlogits) {
    extern __shared__ Packed128<floatX> classifier_row_s[];  // (Vp / X128) this row, when ROW_IN_SMEM
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    floatX* x = logits + (size_t)blockIdx.x * Vp;  // this row, (Vp)
    const int target = targets[blockIdx.x];
    const float x_target = to_float(x[target]);  // read before any thread overwrites the row (barriers below)
    if constexpr (ROW_IN_SMEM) {
        for (int v0 = threadIdx.x * X128; v0 < Vp; v0 += blockDim.x * X128)
            mma::cp_async_16(mma::smem_u32(classifier_row_s + v0 / X128), x + v0, 16);
        mma::cp_async_commit();
        mma::cp_async_wait<0>();  // this thread's copies have landed (and only those are read by it)
    }
    auto chunk_at = [&](int v0) {  // the 16 bytes of columns v0 .. v0 + X128 - 1
        if constexpr (ROW_IN_SMEM) return classifier_row_s[v0 / X128];
        else return load128(x + v0);
    };

    // Pass 1: online softmax over this thread's 16-byte chunks, in log2 units: m = running max of x log2 e,
    // l = sum of 2^(x log2 e - m), rescaled when a chunk raises m.
    // Chunks wholly inside V take the loop without a bounds test per element (the same operations in the same
    // order as the tail's, so the same bits); the one chunk across V, if any, is the tail.
    float m = -INFINITY, l = 0.0f;
    auto add_chunk = [&](const Packed128<floatX>& c, int n) {  // the chunk's first n columns
        float cm = -INFINITY;
#pragma unroll
        for (int e = 0; e < X128; e++)
            if (e < n) cm = fmaxf(cm, to_float(c[e]));
        cm *= LOG2E;
        if (cm > m) { l *= exp2f(m - cm); m = cm; }  // the max grew: rescale what was summed so far
#pragma unroll
        for (int e = 0; e < X128; e++)
            if (e < n) l += exp2f(to_float(c[e]) * LOG2E - m);
    };
    const int V_full = V / X128 * X128;  // columns in whole chunks
    int v0 = threadIdx.x * X128;
    for (; v0 < V_full; v0 += blockDim.x * X128) add_chunk(chunk_at(v0), X128);
    if (v0 < V) add_chunk(chunk_at(v0), V - v0);
    const float m_row = block_max(m);
    const float l_row = block_sum(l * exp2f(m - m_row));  // each thread's sum rescaled to the row's max
    const float lse2 = m_row + log2f(l_row);              // log2 of sum 2^(x log2 e) = lse * log2 e
    if (threadIdx.x == 0) losses[blockIdx.x] = lse2 / LOG2E - x_target;
    if (!write_dlogits) return;

    // Pass 2: dlogits in place (the block_sum barriers above ordered every read of pass 1 before this).
    for (int v0 = threadIdx.x * X128; v0 < Vp; v0 += blockDim.x * X128) {
        Packed128<floatX> c = chunk_at(v0);
        const int t = target - v0, n = V - v0;  // the target's and V's places in this chunk
#pragma unroll
        for (int e = 0; e < X128; e++) {
            float p = exp2f(to_float(c[e]) * LOG2E - lse2);  // softmax probability of column v0 + e
            float g = e < n ? (p - (e == t ? 1.0f : 0.0f)) * dloss_scale : 0.0f;
            c[e] = from_float<floatX>(g);
        }
        store128(x + v0, c);
    }
}

inline void classifier_flash(floatX* logits, float* losses, const int* targets, int N, int V, int Vp,
                             float dloss_scale, bool write_dlogits, cudaStream_t stream) {
    if (Vp % X128 != 0 || !aligned16(logits))
        fail("classifier_flash: padded vocab %d must be a multiple of %d and logits 16-byte aligned", Vp, X128);
    if (classifier_row_in_smem(Vp)) {
        const size_t row_bytes = (size_t)Vp * sizeof(floatX);
        allow_shared_memory(classifier_flash_kernel<true>, row_bytes);
        launch_dependent(classifier_flash_kernel<true>, N, CLASSIFIER_THREADS, row_bytes, stream,
            logits, losses, targets, V, Vp, dloss_scale, write_dlogits);
    } else {
        launch_dependent(classifier_flash_kernel<false>, N, CLASSIFIER_THREADS, 0, stream,
            logits, losses, targets, V, Vp, dloss_scale, write_dlogits);
    }
}

}  // namespace flashgpt2
