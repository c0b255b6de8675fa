// Rung 2 — online softmax: one fused pass per query row, no T×T buffer at all.
//
// The idea (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax", arXiv:1805.02867,
// Sec. 3; used by FlashAttention, Dao et al. 2022, arXiv:2205.14135, Sec. 3.1): softmax needs the row max m
// and the sum l = Σ exp(s_j - m) before it can normalize, which seems to force two passes over the scores.
// It does not: keep a running max m and a running sum l, and when a new score raises the max from m to m',
// rescale what was summed so far by exp(m - m'):
//     m' = max(m, s_j)    l' = l · exp(m - m') + exp(s_j - m')    o' = o · exp(m - m') + exp(s_j - m') · v_j
// After the last key, O = o / l and lse = m + log l. (doc/attention/2_online_softmax.md works an example.)
// So one warp walks the keys 0..i of its query row i once, computing each score, folding it into m, l and
// the output row o, and never stores a score: S and P vanish from HBM (rung 1 wrote and read them).
//
// What changed from rung 1: three kernels → one; no workspace; causal rows stop at key i instead of
// computing the masked half. Each lane of the warp owns HS/32 of the head's dimensions (q, o in registers)
// and a warp shuffle sums the partial dot products. What is still slow: every query row reads all of its
// K and V rows from global memory (L2 at best) on its own — T/2 rows on average, nothing shared between the
// rows of a block. Rung 3 stages K and V blocks in shared memory so many query rows reuse each load.
// Measured: the "Measured" block of doc/attention/2_online_softmax.md, written by `make bench-attention`.
// Command: ./dev/attention/runner fwd 2
#pragma once
#include <cmath>
#include "dev/attention/attention.cuh"

namespace ladder::r2 {

constexpr int kWarpsPerBlock = 8;

template <int HS>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
online_softmax_kernel(float* O, float* lse, const float* Q, const float* K, const float* V, int rows, int Tn, float scale) {
    // O, Q, K, V (B, NH, T, HS)   lse (B, NH, T); one warp per query row, rows = B·NH·T
    constexpr int C = HS / 32;  // dimensions per lane: d = lane + 32·c
    const int lane = threadIdx.x % 32;
    const size_t row = (size_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;  // = bh·T + i
    if (row >= (size_t)rows) return;  // the whole warp leaves together
    const int bh = (int)(row / Tn), i = (int)(row % Tn);
    const float* k = K + head_offset(bh, Tn, HS);  // (T, HS) of this head
    const float* v = V + head_offset(bh, Tn, HS);

    float q[C], o[C];
    for (int c = 0; c < C; c++) {
        q[c] = Q[row * HS + lane + 32 * c];
        o[c] = 0.f;
    }
    float m = -INFINITY, l = 0.f;  // running max and running sum of exp(s - m)
    for (int j = 0; j <= i; j++) {  // causal: keys 0..i only
        float part = 0.f;
        for (int c = 0; c < C; c++) part += q[c] * k[(size_t)j * HS + lane + 32 * c];
        for (int off = 16; off > 0; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);  // all lanes: the full dot
        const float s = part * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);  // rescales the old sums to the new max; 0 on the first key (m = -inf)
        const float p = expf(s - m_new);
        l = l * corr + p;
        for (int c = 0; c < C; c++) o[c] = o[c] * corr + p * v[(size_t)j * HS + lane + 32 * c];
        m = m_new;
    }
    for (int c = 0; c < C; c++) O[row * HS + lane + 32 * c] = o[c] / l;
    if (lane == 0) lse[row] = m + logf(l);
}

template <int HS>
void forward(const AttnFwdParams& p) {
    const int rows = p.B * p.NH * p.T;
    online_softmax_kernel<HS><<<ceil_div(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, p.stream>>>(
        (float*)p.o, p.lse, (const float*)p.q, (const float*)p.k, (const float*)p.v, rows, p.T, 1.f / sqrtf((float)HS));
    cudaCheckLaunch();
}

inline bool supports(int HS) { return HS == 64 || HS == 128; }

}  // namespace ladder::r2

inline void attention_forward_online_softmax(const AttnFwdParams& p) {
    if (p.HS == 64) ladder::r2::forward<64>(p);
    else if (p.HS == 128) ladder::r2::forward<128>(p);
    else flashgpt2::fail("rung 2 (online_softmax): head dim %d not supported (64 or 128)", p.HS);
}
