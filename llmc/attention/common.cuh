// What every flash attention engine shares: the trainer's tensor layouts and the backward's D workspace.
//
//   qkv  (B, T, 3, NH, HS)  q, k, v of every position side by side (the qkv matmul's output, read in place)
//   out  (B, T, NH, HS)     the heads side by side (the attention projection's input); dout likewise
//   lse  (B, NH, T)  fp32   log Σ_j exp(S_ij) per query row, natural log of the scaled scores: what every flash
//                           backward rebuilds P = exp(S − lse) from
//   D    workspace          rowsum(dO ∘ O) per query row, written by the backward's first kernel (below)
#pragma once
#include <cstddef>

#include "llmc/kernel_common.cuh"

namespace flashgpt2 {

// Element (b, t, which, h, d) of qkv (B,T,3,NH,HS): which = 0 for q, 1 for k, 2 for v.
__device__ __forceinline__ size_t qkv_index(int b, int t, int which, int h, int d, int T, int NH, int HS) {
    return (((size_t)b * T + t) * 3 + which) * NH * HS + (size_t)h * HS + d;
}
// Element (b, t, h, d) of out (B,T,NH,HS).
__device__ __forceinline__ size_t out_index(int b, int t, int h, int d, int T, int NH, int HS) {
    return (((size_t)b * T + t) * NH + h) * HS + d;
}

// The flash backward's D buffer (workspace): D (B, NH, T) = rowsum(dO * O), then, from a 512-byte boundary,
// lse·log2(e) and D per 64-query tile, (B, NH, ceil(T / 64), 2, 64) floats, 0 for queries past T. The
// mma.sync and fp32 backwards use the first part; the wgmma backward only the second: its dQ kernel writes
// it, and a dK/dV step copies its tile's 128 floats with cp.async, no bounds checks (wgmma_backward.cuh says why).
inline size_t attention_backward_d_floats(int B, int NH, int T) {
    const size_t bh = (size_t)B * NH;
    return ceil_div(bh * T, (size_t)128) * 128 + bh * ceil_div(T, 64) * 128;
}
inline float* attention_backward_d_tiles(float* D, int B, int NH, int T) {
    return D + ceil_div((size_t)B * NH * T, (size_t)128) * 128;
}

}  // namespace flashgpt2
