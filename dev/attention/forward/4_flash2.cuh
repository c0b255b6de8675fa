// Rung 4 — FlashAttention-2: one thread block per query block, O kept in registers, normalized once.
//
// The idea (FlashAttention-2, Dao 2023, arXiv:2307.08691, Sec. 3.1–3.2 and Algorithm 1): swap rung 3's
// loops. Each thread block owns ONE query block Q_i and loops over the K/V blocks j = 0, 1, ... itself, so
// the running max m_i, the running sum l_i and the output O_i never leave the chip: they live in registers
// for the whole loop. Per K/V block:
//     S = Q_i K_jᵀ                m_new = max(m_i, rowmax(S))         P = exp(S - m_new)
//     l_i ← e^(m_i - m_new) l_i + rowsum(P)      O_i ← e^(m_i - m_new) O_i + P V_j      (unnormalized!)
// and only after the last block: O_i ← O_i / l_i and lse_i = m_i + log l_i (FA2 Sec. 3.1.1: one division
// per row instead of one per block). Causal masking (Sec. 3.1.1, "causal masking"): K/V blocks entirely
// right of the diagonal are never visited, and only the diagonal block needs the element mask.
// Parallelism (Sec. 3.2): the grid is (query blocks) × (batch·heads), so even B·NH = 12 gives T/Br·12
// blocks to fill 132 SMs; blocks with the most work (the last query blocks) are launched first.
//
// What changed from rung 3: loop order (outer over Q_i, per block; inner over K_j, V_j), O/m/l in registers
// instead of an HBM round trip per (i, j), one normalization at the end, no workspace, grid over query
// blocks too. The tile machinery (loading, S = Q Kᵀ micro tiles, row reductions, P V) is rung 3's, reused.
// Also each thread keeps only its partial row sum of P; the 16 partials of a row are added once at the
// end (the max still needs the full row every block, the sum does not).
// What is still slow: all arithmetic is fp32 FMA on the CUDA cores; rung 5 moves both matmuls onto bf16
// tensor cores, which do ~12× the FLOPs per cycle.
// Measured: the "Measured" block of doc/attention/4_flash2.md, written by `make bench-attention`.
// Command: ./dev/attention/runner fwd 4
#pragma once
#include <cmath>
#include "dev/attention/attention.cuh"
#include "dev/attention/forward/3_flash1_tiled.cuh"

namespace ladder::r4 {

using r3::Bc;
using r3::Br;
using r3::CN;
using r3::kThreads;
using r3::RM;
using r3::Smem;

template <int HS>
__global__ void __launch_bounds__(kThreads)
flash2_kernel(float* O, float* lse, const float* Q, const float* K, const float* V, int Tn, float scale) {
    // O, Q, K, V (B, NH, T, HS)   lse (B, NH, T); grid = (T / Br query blocks, B·NH)
    using L = Smem<HS>;
    extern __shared__ float smem[];
    float* Qs = smem + L::q_off;
    float* Ks = smem + L::k_off;
    float* Vs = smem + L::v_off;
    float* Ps = smem + L::p_off;
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16, bh = blockIdx.y;
    const int i = gridDim.x - 1 - blockIdx.x;  // heaviest query blocks (most K/V blocks) first
    const int i0 = i * Br;
    const float* Kh = K + head_offset(bh, Tn, HS);
    const float* Vh = V + head_offset(bh, Tn, HS);

    r3::load_rows<HS, Br>(Qs, L::q_stride, Q + head_offset(bh, Tn, HS), i0, Tn);  // Q_i, for the whole loop
    float o[RM][HS / 16] = {};  // O_i, unnormalized
    float m[RM], l[RM];         // running max; this thread's partial running sum of its row
    for (int r = 0; r < RM; r++) m[r] = -INFINITY, l[r] = 0.f;

    const int n_kv = min(ceil_div(Tn, Bc), i + 1);  // causal: key blocks 0..i only (Br == Bc)
    for (int j = 0; j < n_kv; j++) {
        __syncthreads();  // the previous j's readers of K_j, V_j and P are done before we overwrite them
        r3::load_rows<HS, Bc>(Ks, L::k_stride, Kh, j * Bc, Tn);
        r3::load_rows<HS, Bc>(Vs, L::v_stride, Vh, j * Bc, Tn);
        __syncthreads();  // K_j, V_j (and Q_i, first time) are in shared memory for every thread
        float s[RM][CN];
        r3::scores_tile<HS>(s, Qs, Ks, scale, j == i, ty, tx);

        for (int r = 0; r < RM; r++) {
            float mx = m[r];
            for (int c = 0; c < CN; c++) mx = fmaxf(mx, s[r][c]);
            const float m_new = r3::max16(mx);  // finite: column 0 of each row of a visited block is never masked
            const float corr = expf(m[r] - m_new);  // 0 on the first block (m = -inf)
            float sum = 0.f;
            for (int c = 0; c < CN; c++) {
                const float p = expf(s[r][c] - m_new);
                Ps[(ty + 16 * r) * L::p_stride + tx + 16 * c] = p;
                sum += p;
            }
            l[r] = l[r] * corr + sum;
            for (int dd = 0; dd < HS / 16; dd++) o[r][dd] *= corr;
            m[r] = m_new;
        }
        __syncthreads();  // P complete in shared memory before any thread reads whole rows of it
        r3::pv_tile<HS>(o, Ps, Vs, ty, tx);  // O_i += P V_j
    }

    // The one normalization: O_i / l_i, and lse_i = m_i + log l_i for the backward.
    for (int r = 0; r < RM; r++) {
        const int row = i0 + ty + 16 * r;
        const float l_row = r3::sum16(l[r]);  // all 16 lanes of the row take part, valid row or not
        if (row >= Tn) continue;
        float* out = O + head_offset(bh, Tn, HS) + (size_t)row * HS;
        for (int dd = 0; dd < HS / 16; dd++) out[tx + 16 * dd] = o[r][dd] / l_row;
        if (tx == 0) lse[(size_t)bh * Tn + row] = m[r] + logf(l_row);
    }
}

template <int HS>
void forward(const AttnFwdParams& p) {
    allow_shared_memory(flash2_kernel<HS>, Smem<HS>::bytes);
    const dim3 grid(ceil_div(p.T, Br), p.B * p.NH);
    flash2_kernel<HS><<<grid, kThreads, Smem<HS>::bytes, p.stream>>>((float*)p.o, p.lse, (const float*)p.q,
                                                                    (const float*)p.k, (const float*)p.v, p.T,
                                                                    1.f / sqrtf((float)HS));
    cudaCheckLaunch();
}

inline bool supports(int HS) { return HS == 64 || HS == 128; }

}  // namespace ladder::r4

inline void attention_forward_flash2(const AttnFwdParams& p) {
    if (p.HS == 64) ladder::r4::forward<64>(p);
    else if (p.HS == 128) ladder::r4::forward<128>(p);
    else flashgpt2::fail("rung 4 (flash2): head dim %d not supported (64 or 128)", p.HS);
}
