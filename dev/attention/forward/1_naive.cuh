// Rung 1 — naive ("standard") attention: three kernels, with the T×T scores S and probabilities P in HBM.
//
// The idea: do exactly what the formula says, one step at a time, each step a kernel that reads its input
// from HBM and writes its output back (the "Standard Attention Implementation", Algorithm 0 of
// FlashAttention, Dao et al. 2022, arXiv:2205.14135, Sec. 2.2):
//   1. S = Q Kᵀ / sqrt(HS)      one thread per element of S (B, NH, T, T); masked entries (j > i) get -inf
//   2. P = softmax(S) per row   one warp per row: max, sum of exponentials, normalize; lse = m + log l
//   3. O = P V                  one thread per element of O (B, NH, T, HS)
// Every element of the T×T matrices is written and read again: B·NH·T² values twice each, which for
// T = 16384 is 12.9 GB per matrix in fp32. The arithmetic is trivial next to that traffic; every later rung
// is about not doing this. Causality is honoured only by the -inf mask: the naive version still computes
// and moves the whole T×T square (half of it wasted), as the textbook PyTorch code does.
//
// Two precisions, one template: fp32 (S, P fp32) and bf16 (inputs, S, P and O stored in bf16, arithmetic in
// fp32: what PyTorch's standard attention does in bf16). The bf16 one is the "naive in the same precision"
// whose error the bf16 rungs are judged against (doc/design.md, "Correctness": the FlashAttention rule).
// Measured: the "Measured" block of doc/attention/1_naive.md, written by `make bench-attention`.
// Command: ./dev/attention/runner fwd 1
#pragma once
#include <cmath>
#include "dev/attention/attention.cuh"

namespace ladder::r1 {

// 1. S[bh][i][j] = scale · Σ_d Q[bh][i][d] · K[bh][j][d], or -inf when j > i (causal mask).
template <class T, class TS>
__global__ void scores_kernel(TS* S, const T* Q, const T* K, int Tn, int HS, float scale) {
    // S (B, NH, T, T)   Q, K (B, NH, T, HS); grid.x covers one head's T·T scores, grid.y = b·NH + h
    const int bh = blockIdx.y;
    const size_t ij = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ij >= (size_t)Tn * Tn) return;
    const int i = (int)(ij / Tn), j = (int)(ij % Tn);
    float s = -INFINITY;
    if (j <= i) {
        const T* q = Q + head_offset(bh, Tn, HS) + (size_t)i * HS;
        const T* k = K + head_offset(bh, Tn, HS) + (size_t)j * HS;
        float acc = 0.f;
        for (int d = 0; d < HS; d++) acc += to_float(q[d]) * to_float(k[d]);
        s = acc * scale;
    }
    S[(size_t)bh * Tn * Tn + ij] = from_float<TS>(s);
}

// 2. One warp per row of S: m = max_j S[i][j], l = Σ_j exp(S[i][j] - m), P[i][j] = exp(S[i][j] - m) / l,
//    lse[i] = m + log(l). Three sweeps over the row in HBM; masked entries give exp(-inf) = 0.
template <class TS>
__global__ void softmax_kernel(TS* P, float* lse, const TS* S, int rows, int Tn) {
    // P, S (B, NH, T, T) seen as rows × T   lse (B, NH, T) = rows
    const int warps_per_block = blockDim.x / 32, lane = threadIdx.x % 32;
    const size_t row = (size_t)blockIdx.x * warps_per_block + threadIdx.x / 32;
    if (row >= (size_t)rows) return;  // whole warps leave together: rows are per warp
    const TS* s = S + row * Tn;
    TS* p = P + row * Tn;
    float m = -INFINITY;
    for (int j = lane; j < Tn; j += 32) m = fmaxf(m, to_float(s[j]));
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float l = 0.f;  // column 0 is never masked, so m is finite and l >= 1
    for (int j = lane; j < Tn; j += 32) l += expf(to_float(s[j]) - m);
    for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
    const float inv_l = 1.f / l;
    for (int j = lane; j < Tn; j += 32) p[j] = from_float<TS>(expf(to_float(s[j]) - m) * inv_l);
    if (lane == 0) lse[row] = m + logf(l);
}

// 3. O[bh][i][d] = Σ_j P[bh][i][j] · V[bh][j][d], over the whole row (the masked zeros included).
template <class T, class TS>
__global__ void pv_kernel(T* O, const TS* P, const T* V, int Tn, int HS) {
    // O, V (B, NH, T, HS)   P (B, NH, T, T); grid.x covers one head's T·HS outputs, grid.y = b·NH + h
    const int bh = blockIdx.y;
    const size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)Tn * HS) return;
    const int i = (int)(id / HS), d = (int)(id % HS);
    const TS* p = P + (size_t)bh * Tn * Tn + (size_t)i * Tn;
    const T* v = V + head_offset(bh, Tn, HS) + d;
    float acc = 0.f;
    for (int j = 0; j < Tn; j++) acc += to_float(p[j]) * to_float(v[(size_t)j * HS]);
    O[head_offset(bh, Tn, HS) + id] = from_float<T>(acc);
}

template <class T, class TS>
void forward(const AttnFwdParams& p) {
    const int BNH = p.B * p.NH;
    TS* S = (TS*)p.workspace;                        // (B, NH, T, T)
    TS* P = S + (size_t)BNH * p.T * p.T;             // (B, NH, T, T)
    const float scale = 1.f / sqrtf((float)p.HS);
    const int threads = 256;
    const dim3 grid_s((unsigned)ceil_div<size_t>((size_t)p.T * p.T, threads), BNH);
    scores_kernel<T, TS><<<grid_s, threads, 0, p.stream>>>(S, (const T*)p.q, (const T*)p.k, p.T, p.HS, scale);
    cudaCheckLaunch();
    const int rows = BNH * p.T;
    softmax_kernel<TS><<<ceil_div(rows, threads / 32), threads, 0, p.stream>>>(P, p.lse, S, rows, p.T);
    cudaCheckLaunch();
    const dim3 grid_o((unsigned)ceil_div<size_t>((size_t)p.T * p.HS, threads), BNH);
    pv_kernel<T, TS><<<grid_o, threads, 0, p.stream>>>((T*)p.o, P, (const T*)p.v, p.T, p.HS);
    cudaCheckLaunch();
}

inline bool supports(int HS) { return HS >= 1 && HS <= 1024; }

// S and P, both (B, NH, T, T), in the storage type TS
template <class TS>
size_t workspace_bytes(int B, int NH, int T, int HS) {
    (void)HS;
    return 2 * (size_t)B * NH * T * T * sizeof(TS);
}

}  // namespace ladder::r1

inline void attention_forward_naive(const AttnFwdParams& p) { ladder::r1::forward<float, float>(p); }
inline void attention_forward_naive_bf16(const AttnFwdParams& p) {
    ladder::r1::forward<__nv_bfloat16, __nv_bfloat16>(p);
}
