// Backward rung 2 — recompute: FlashAttention-1's backward, S and P rebuilt tile by tile, never stored.
//
// The idea (Dao et al. 2022, arXiv:2205.14135, §3.1 "Recomputation" and Algorithm 4): the forward saved only O
// and the row statistics; P_ij = exp(scale · Q_i K_jᵀ − lse_i) is one tile product away, so the backward
// recomputes it on chip instead of reading a (T, T) matrix from HBM. (FlashAttention-1 saves m and l; we save
// lse = m + log l, FlashAttention-2's form, which gives P in one exp.) One block walks one head, outer loop
// over key tiles, inner loop over the query tiles that see them:
//     for each K_j, V_j (Bc keys, in shared memory; dK_j, dV_j accumulate in registers):
//         for each Q_i, dO_i with i >= j (Br queries, in shared memory):
//             D_i   = rowsum(dO_i ∘ O_i)                 (recomputed for every K_j: rung 3 does it once)
//             P_ij  = exp(scale · Q_i K_jᵀ − lse_i),  dP_ij = dO_i V_jᵀ,  dS_ij = P_ij ∘ (dP_ij − D_i)
//             dQ_i += scale · dS_ij K_j                  (read, add, write back: an fp32 (T, HS) buffer in HBM)
//             dV_j += P_ijᵀ dO_i,  dK_j += scale · dS_ijᵀ Q_i
//         write dK_j, dV_j
// What changed from rung 1: no (T, T) tensor exists anywhere; the HBM traffic is Q, K, V, O, dO read T/Bc
// times and dQ read and written T/Bc times, against rung 1's five (T, T) matrices.
// Deterministic: the block owns its head, so dQ_i's read-modify-write needs no atomics; each element is
// summed by one thread, over j in order.
// Still slow, and why rung 3 exists: one block per (b, h) — B·NH blocks, 12 at (1,12,32768,64) on a 132-SM
// card — and every K_j pass re-reads and re-writes dQ through HBM. FlashAttention-2 parallelizes over key
// blocks and computes dQ in a pass of its own (rung 3). The arithmetic is fp32 on the CUDA cores, as in
// llmc's fp32 engine (llmc/attention/fp32_backward.cuh): 4 threads per tile row, HS/4 dimensions each.
// Measured: the "Measured" block of doc/attention/backward/2_flash1_recompute.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 2
#pragma once
#include <cmath>

#include "dev/attention/attention.cuh"
#include "llmc/attention/common.cuh"
#include "llmc/attention/fp32_forward.cuh"  // fa_load_tile, quad_sum

namespace ladder::b2 {

using namespace flashgpt2;

constexpr int Br = 32, Bc = 32;     // query rows per Q_i tile, key rows per K_j tile
constexpr int THREADS = 4 * Br;     // 4 threads per row
static_assert(Br == Bc, "the inner loop starts at the diagonal tile i0 = j0: that needs Br == Bc");
static_assert(THREADS == 4 * Bc, "phase 2 gives each key row of K_j 4 threads, as phase 1 each query row");

// Shared memory, in floats: K_j, V_j (Bc, HS); Q_i, dO_i (Br, HS); P_ij, dS_ij (Br, Bc + 1: a padded row, so
// phase 2's column reads of 8 rows fall in 8 banks); lse_i, D_i (Br).
template <int HS>
constexpr size_t smem_bytes() { return (size_t)(2 * Bc * HS + 2 * Br * HS + 2 * Br * (Bc + 1) + 2 * Br) * sizeof(float); }

inline bool supports(int HS) { return HS == 64 || HS == 128; }
inline size_t workspace_bytes(int B, int NH, int T, int HS) { return (size_t)B * NH * T * HS * sizeof(float); }  // dQ, fp32

// One block per head bh = b·NH + h. dQacc (B, NH, T, HS) fp32: the dQ accumulator in HBM.
template <int HS>
__global__ void __launch_bounds__(THREADS)
    flash1_backward_kernel(floatX* dqkv, float* dQacc, const floatX* dout, const floatX* qkv, const floatX* out,
                           const float* lse, int T, int NH) {
    constexpr int DPT = HS / 4;  // head dimensions per thread: d = sub, sub + 4, ...
    extern __shared__ float smem[];
    float* sK = smem;                  // K_j  (Bc, HS)
    float* sV = sK + Bc * HS;          // V_j  (Bc, HS)
    float* sQ = sV + Bc * HS;          // Q_i  (Br, HS)
    float* sdO = sQ + Br * HS;         // dO_i (Br, HS)
    float* sP = sdO + Br * HS;         // P_ij (Br, Bc + 1)
    float* sdS = sP + Br * (Bc + 1);   // dS_ij (Br, Bc + 1)
    float* sL = sdS + Br * (Bc + 1);   // lse_i (Br)
    float* sD = sL + Br;               // D_i (Br)
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int r = threadIdx.x / 4, sub = threadIdx.x % 4;  // row r of a tile (a query in phase 1, a key in phase 2)
    const float scale = 1.0f / sqrtf((float)HS);
    float* dQ = dQacc + (size_t)bh * T * HS;  // (T, HS) of this head

    for (int j0 = 0; j0 < T; j0 += Bc) {
        __syncthreads();  // the last inner step's phase 2 is done reading sQ, sdO, sP, sdS before they are reloaded
        fa_load_tile<HS, Bc>(sK, qkv, 1, b, h, j0, T, NH);  // rows past T are 0
        fa_load_tile<HS, Bc>(sV, qkv, 2, b, h, j0, T, NH);
        float dk[DPT], dv[DPT];  // dK_j, dV_j of key row j0 + r, this thread's dimensions
        for (int k = 0; k < DPT; k++) dk[k] = dv[k] = 0.0f;

        for (int i0 = j0; i0 < T; i0 += Br) {  // causal: Q_i tiles below the diagonal tile see K_j
            const int i = i0 + r;               // this thread's query row in phase 1
            if (i0 > j0) __syncthreads();       // phase 2 of the previous Q_i is done with sQ, sdO, sP, sdS
            fa_load_tile<HS, Br>(sQ, qkv, 0, b, h, i0, T, NH);
            for (int e = threadIdx.x; e < Br * HS; e += THREADS) {  // dO_i from dout (B, T, NH, HS)
                const int t = i0 + e / HS, d = e % HS;
                sdO[e] = t < T ? to_float(dout[out_index(b, t, h, d, T, NH, HS)]) : 0.0f;
            }
            float dd = 0.0f;  // D_i = rowsum(dO_i ∘ O_i), this thread's quarter of row i
            for (int k = 0; k < DPT && i < T; k++) {
                const size_t x = out_index(b, i, h, sub + 4 * k, T, NH, HS);
                dd += to_float(dout[x]) * to_float(out[x]);
            }
            dd = quad_sum(dd);
            if (sub == 0) sL[r] = i < T ? lse[(size_t)bh * T + i] : 0.0f, sD[r] = dd;
            __syncthreads();  // K_j, V_j (on the first Q_i), Q_i, dO_i, lse_i and D_i are in shared memory

            // phase 1: thread (r, sub) owns query row i: its row of P_ij and dS_ij, and dQ_i += scale · dS_ij K_j
            float q[DPT], dor[DPT], dq[DPT];
            for (int k = 0; k < DPT; k++) q[k] = sQ[r * HS + sub + 4 * k], dor[k] = sdO[r * HS + sub + 4 * k], dq[k] = 0.0f;
            const float li = sL[r], Di = sD[r];
            for (int jj = 0; jj < Bc; jj++) {
                float sp = 0.0f, dpp = 0.0f;
                for (int k = 0; k < DPT; k++) sp += q[k] * sK[jj * HS + sub + 4 * k], dpp += dor[k] * sV[jj * HS + sub + 4 * k];
                const float s = quad_sum(sp) * scale, dp = quad_sum(dpp);
                const float p = (i < T && j0 + jj <= i) ? expf(s - li) : 0.0f;  // the causal mask; keys past T too
                const float ds = p * (dp - Di);
                if (sub == 0) sP[r * (Bc + 1) + jj] = p, sdS[r * (Bc + 1) + jj] = ds;
                for (int k = 0; k < DPT; k++) dq[k] += ds * sK[jj * HS + sub + 4 * k];
            }
            if (i < T)
                for (int k = 0; k < DPT; k++) {  // the first K_j (j0 = 0) sees every row: it starts the sum
                    const size_t x = (size_t)i * HS + sub + 4 * k;
                    dQ[x] = (j0 == 0 ? 0.0f : dQ[x]) + scale * dq[k];
                }
            __syncthreads();  // every row of P_ij and dS_ij is written before phase 2 reads them by column

            // phase 2: thread (r, sub) owns key row j0 + r: dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i
            for (int ii = 0; ii < Br; ii++) {
                const float p = sP[ii * (Bc + 1) + r], ds = sdS[ii * (Bc + 1) + r];
                for (int k = 0; k < DPT; k++) dv[k] += p * sdO[ii * HS + sub + 4 * k], dk[k] += ds * sQ[ii * HS + sub + 4 * k];
            }
        }
        const int j = j0 + r;
        if (j < T)
            for (int k = 0; k < DPT; k++) {
                dqkv[qkv_index(b, j, 1, h, sub + 4 * k, T, NH, HS)] = from_float<floatX>(scale * dk[k]);
                dqkv[qkv_index(b, j, 2, h, sub + 4 * k, T, NH, HS)] = from_float<floatX>(dv[k]);
            }
    }
    // dQ of this head is complete. This thread wrote rows i ≡ r (mod Br), dimensions sub + 4k, in every K_j pass,
    // and converts exactly those: its own writes, so no barrier is needed.
    for (int i = r; i < T; i += Br)
        for (int k = 0; k < DPT; k++)
            dqkv[qkv_index(b, i, 0, h, sub + 4 * k, T, NH, HS)] = from_float<floatX>(dQ[(size_t)i * HS + sub + 4 * k]);
}

template <int HS>
inline void launch(const AttnBwdParams& p) {
    constexpr size_t smem = smem_bytes<HS>();
    allow_shared_memory(flash1_backward_kernel<HS>, smem);
    flash1_backward_kernel<HS><<<p.B * p.NH, THREADS, smem, p.stream>>>(p.dqkv, (float*)p.workspace, p.dout, p.qkv,
                                                                        p.out, p.lse, p.T, p.NH);
    cudaCheckLaunch();
}

}  // namespace ladder::b2

inline void attention_backward_flash1_recompute(const AttnBwdParams& p) {
    if (p.HS == 64) return ladder::b2::launch<64>(p);
    if (p.HS == 128) return ladder::b2::launch<128>(p);
    flashgpt2::fail("attention_backward_flash1_recompute: head size %d (64 or 128)", p.HS);
}
