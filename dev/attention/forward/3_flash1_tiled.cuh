// Rung 3 — FlashAttention-1 tiling: K/V blocks through shared memory, O, m, l rescaled in HBM.
//
// The idea (FlashAttention, Dao et al. 2022, arXiv:2205.14135, Sec. 3.1 and Algorithm 1): split Q into
// blocks Q_i of Br rows and K, V into blocks K_j, V_j of Bc rows. A block of K_j, V_j is loaded into
// shared memory (SRAM) once and used by every query block, and the online softmax of rung 2 works on whole
// blocks: for each (i, j) the block computes S_ij = Q_i K_jᵀ on chip, its row max m̃, P̃ = exp(S_ij - m̃),
// its row sum l̃, and merges them into the running statistics m_i, l_i and output O_i kept in HBM:
//     m_new = max(m_i, m̃)      l_new = e^(m_i - m_new) l_i + e^(m̃ - m_new) l̃
//     O_i  ← ( l_i e^(m_i - m_new) O_i + e^(m̃ - m_new) P̃ V_j ) / l_new            (Alg. 1, lines 11–13)
// Loop order as in Algorithm 1: OUTER loop over K/V blocks j, INNER loop over query blocks i (causal:
// only i >= j), one thread block per (batch, head) — the parallelization of the original FlashAttention.
//
// What changed from rung 2: each K/V element is read from HBM once per head instead of once per query
// row (T/2 times less K/V traffic); scores are computed as Br×Bc tiles, 256 threads each owning a 4×4 micro
// tile of S and a 4×(HS/16) tile of O. What is still slow: O_i, m_i, l_i make a round trip through HBM for
// every (i, j) pair, O is renormalized each time, and only B·NH blocks run — fewer than the 132 SMs for
// small batches. Rung 4 (FlashAttention-2) swaps the loops to fix all three.
// Still slow: at (1,12,16384,64) it is slower than rung 2, since one head's 12 thread blocks leave most of the
// 132 SMs idle (rung 4 parallelizes over query blocks).
// Measured: the "Measured" block of doc/attention/3_flash1_tiled.md, written by `make bench-attention`.
// Command: ./dev/attention/runner fwd 3
#pragma once
#include <cmath>
#include "dev/attention/attention.cuh"

namespace ladder::r3 {

// ---- the tile machinery, shared with rung 4 ----
constexpr int Br = 64, Bc = 64;    // query rows and key rows per block
constexpr int kThreads = 256;      // 16 × 16 threads: ty = tid / 16 picks rows, tx = tid % 16 picks columns
constexpr int RM = Br / 16;        // S micro tile: rows ty + 16·r (r < RM) ...
constexpr int CN = Bc / 16;        // ... × columns tx + 16·c (c < CN); O micro tile: rows as S, columns tx + 16·dd

// Shared memory, in floats. Q and K rows are padded by one float so that the 16 threads reading 16
// different rows at the same column hit 16 different banks; P rows likewise (two row groups per warp).
template <int HS>
struct Smem {
    static constexpr int q_stride = HS + 1, k_stride = HS + 1, v_stride = HS, p_stride = Bc + 1;
    static constexpr int q_off = 0;                          // Q_i (Br, HS)
    static constexpr int k_off = q_off + Br * q_stride;      // K_j (Bc, HS)
    static constexpr int v_off = k_off + Bc * k_stride;      // V_j (Bc, HS)
    static constexpr int p_off = v_off + Bc * v_stride;      // P   (Br, Bc)
    static constexpr size_t bytes = sizeof(float) * (p_off + Br * p_stride);
};

// Copies rows row0 .. row0+ROWS-1 of a (T, HS) head into shared memory (coalesced: consecutive threads,
// consecutive columns); rows past the end of the sequence are filled with zeros.
template <int HS, int ROWS>
__device__ __forceinline__ void load_rows(float* dst, int stride, const float* head, int row0, int Tn) {
    for (int e = threadIdx.x; e < ROWS * HS; e += kThreads) {
        const int r = e / HS, c = e % HS;
        dst[r * stride + c] = row0 + r < Tn ? head[(size_t)(row0 + r) * HS + c] : 0.f;
    }
}

// s[r][c] = scale · Σ_d Q_i[ty + 16r][d] · K_j[tx + 16c][d], masked to -inf above the diagonal when the
// key block starts where the query block does (j0 == i0: the diagonal block; earlier blocks are all visible).
template <int HS>
__device__ __forceinline__ void scores_tile(float (&s)[RM][CN], const float* Qs, const float* Ks, float scale,
                                            bool diagonal, int ty, int tx) {
    using L = Smem<HS>;
    for (int r = 0; r < RM; r++)
        for (int c = 0; c < CN; c++) s[r][c] = 0.f;
    for (int d = 0; d < HS; d++) {
        float a[RM], b[CN];
        for (int r = 0; r < RM; r++) a[r] = Qs[(ty + 16 * r) * L::q_stride + d];
        for (int c = 0; c < CN; c++) b[c] = Ks[(tx + 16 * c) * L::k_stride + d];
        for (int r = 0; r < RM; r++)
            for (int c = 0; c < CN; c++) s[r][c] += a[r] * b[c];
    }
    for (int r = 0; r < RM; r++)
        for (int c = 0; c < CN; c++)
            s[r][c] = diagonal && tx + 16 * c > ty + 16 * r ? -INFINITY : s[r][c] * scale;
}

// Reductions over the 16 threads that share a row (lanes 0–15 or 16–31 of a warp): xor offsets below 16
// stay inside the half-warp, and the butterfly leaves the identical result in all 16 lanes.
__device__ __forceinline__ float max16(float x) {
    for (int off = 8; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}
__device__ __forceinline__ float sum16(float x) {
    for (int off = 8; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

// acc[r][dd] += Σ_k P[ty + 16r][k] · V_j[k][tx + 16dd]
template <int HS>
__device__ __forceinline__ void pv_tile(float (&acc)[RM][HS / 16], const float* Ps, const float* Vs, int ty, int tx) {
    using L = Smem<HS>;
    for (int k = 0; k < Bc; k++) {
        float p[RM], v[HS / 16];
        for (int r = 0; r < RM; r++) p[r] = Ps[(ty + 16 * r) * L::p_stride + k];
        for (int dd = 0; dd < HS / 16; dd++) v[dd] = Vs[k * L::v_stride + tx + 16 * dd];
        for (int r = 0; r < RM; r++)
            for (int dd = 0; dd < HS / 16; dd++) acc[r][dd] += p[r] * v[dd];
    }
}

// ---- the FlashAttention-1 kernel: one thread block per (batch, head) ----
template <int HS>
__global__ void __launch_bounds__(kThreads, 1)
flash1_kernel(float* O, float* lse, float* m_hbm, float* l_hbm, const float* Q, const float* K, const float* V,
              int Tn, float scale) {
    // O, Q, K, V (B, NH, T, HS)   lse, m_hbm, l_hbm (B, NH, T); grid.x = B·NH
    using L = Smem<HS>;
    extern __shared__ float smem[];
    float* Qs = smem + L::q_off;
    float* Ks = smem + L::k_off;
    float* Vs = smem + L::v_off;
    float* Ps = smem + L::p_off;
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16, bh = blockIdx.x;
    const float* Qh = Q + head_offset(bh, Tn, HS);
    const float* Kh = K + head_offset(bh, Tn, HS);
    const float* Vh = V + head_offset(bh, Tn, HS);
    float* Oh = O + head_offset(bh, Tn, HS);
    float* mh = m_hbm + (size_t)bh * Tn;
    float* lh = l_hbm + (size_t)bh * Tn;

    // Alg. 1 line 2: O = 0, l = 0, m = -inf, in HBM.
    for (int e = threadIdx.x; e < Tn * HS; e += kThreads) Oh[e] = 0.f;
    for (int e = threadIdx.x; e < Tn; e += kThreads) mh[e] = -INFINITY, lh[e] = 0.f;

    const int n_blocks = ceil_div(Tn, Bc);  // Tc = Tr, since Br == Bc
    for (int j = 0; j < n_blocks; j++) {   // Alg. 1 line 5: outer loop over K/V blocks
        __syncthreads();  // the previous j's readers of K_j, V_j are done (and, first time, the init above is visible)
        load_rows<HS, Bc>(Ks, L::k_stride, Kh, j * Bc, Tn);
        load_rows<HS, Bc>(Vs, L::v_stride, Vh, j * Bc, Tn);
        for (int i = j; i < n_blocks; i++) {  // Alg. 1 line 7: inner loop over query blocks, causal: i >= j
            const int i0 = i * Br;
            __syncthreads();  // the previous i's readers of Q_i and P are done before we overwrite them
            load_rows<HS, Br>(Qs, L::q_stride, Qh, i0, Tn);
            __syncthreads();  // Q_i, K_j, V_j are in shared memory for every thread
            float s[RM][CN];
            scores_tile<HS>(s, Qs, Ks, scale, i == j, ty, tx);

            // Alg. 1 line 10: m̃ = rowmax(S_ij), P̃ = exp(S_ij - m̃), l̃ = rowsum(P̃); line 11: m_new, l_new.
            float mt[RM], lt[RM], mi[RM], li[RM];
            for (int r = 0; r < RM; r++) {
                float mx = -INFINITY;
                for (int c = 0; c < CN; c++) mx = fmaxf(mx, s[r][c]);
                mt[r] = max16(mx);  // finite: column 0 of each row of a visited block is never masked
                float sum = 0.f;
                for (int c = 0; c < CN; c++) {
                    const float p = expf(s[r][c] - mt[r]);
                    Ps[(ty + 16 * r) * L::p_stride + tx + 16 * c] = p;
                    sum += p;
                }
                lt[r] = sum16(sum);
                const int row = i0 + ty + 16 * r;
                mi[r] = row < Tn ? mh[row] : -INFINITY;  // Alg. 1 line 8: load m_i, l_i from HBM
                li[r] = row < Tn ? lh[row] : 0.f;
            }
            __syncthreads();  // P̃ complete in shared memory before any thread reads whole rows of it (and
                              // every thread has read its old m_i, l_i before the writes below)
            float acc[RM][HS / 16] = {};
            pv_tile<HS>(acc, Ps, Vs, ty, tx);  // P̃ V_j

            // Alg. 1 lines 12–13: O_i ← (l_i e^(m_i - m_new) O_i + e^(m̃ - m_new) P̃ V_j) / l_new, write m, l.
            for (int r = 0; r < RM; r++) {
                const int row = i0 + ty + 16 * r;
                if (row >= Tn) continue;
                const float m_new = fmaxf(mi[r], mt[r]);
                const float a = li[r] * expf(mi[r] - m_new), b = expf(mt[r] - m_new);
                const float l_new = a + b * lt[r];
                for (int dd = 0; dd < HS / 16; dd++) {
                    float* o = &Oh[(size_t)row * HS + tx + 16 * dd];  // this thread's own element, every time
                    *o = (a * *o + b * acc[r][dd]) / l_new;
                }
                if (tx == 0) mh[row] = m_new, lh[row] = l_new;
            }
        }
    }
    __syncthreads();  // every row's final m, l (written by other threads) is visible
    for (int e = threadIdx.x; e < Tn; e += kThreads) lse[(size_t)bh * Tn + e] = mh[e] + logf(lh[e]);
}

template <int HS>
void forward(const AttnFwdParams& p) {
    const int BNH = p.B * p.NH;
    float* m_hbm = (float*)p.workspace;       // (B, NH, T)
    float* l_hbm = m_hbm + (size_t)BNH * p.T;  // (B, NH, T)
    allow_shared_memory(flash1_kernel<HS>, Smem<HS>::bytes);
    flash1_kernel<HS><<<BNH, kThreads, Smem<HS>::bytes, p.stream>>>((float*)p.o, p.lse, m_hbm, l_hbm, (const float*)p.q,
                                                                   (const float*)p.k, (const float*)p.v, p.T,
                                                                   1.f / sqrtf((float)HS));
    cudaCheckLaunch();
}

inline bool supports(int HS) { return HS == 64 || HS == 128; }

// m and l, both (B, NH, T) fp32: the running statistics Algorithm 1 keeps in HBM
inline size_t workspace_bytes(int B, int NH, int T, int HS) {
    (void)HS;
    return 2 * (size_t)B * NH * T * sizeof(float);
}

}  // namespace ladder::r3

inline void attention_forward_flash1_tiled(const AttnFwdParams& p) {
    if (p.HS == 64) ladder::r3::forward<64>(p);
    else if (p.HS == 128) ladder::r3::forward<128>(p);
    else flashgpt2::fail("rung 3 (flash1_tiled): head dim %d not supported (64 or 128)", p.HS);
}
