// Flash attention forward on bf16 tensor cores (mma.sync m16n8k16, fp32 accumulators), head size 64: the BF16
// build's engine `mma`. Same algorithm as fp32_forward.cuh (read that first), with the tile products done by
// warp-wide matrix instructions instead of per-thread dot products: one block of 4 warps per 64 query rows;
// warp w owns rows 16w..16w+15 of Q_i (kept in registers as mma A fragments). Per 64-key tile: S = Q_i K_j^T
// (16x64 per warp, in registers), online softmax on the accumulators, then P (converted in registers to bf16 A
// fragments, the C->A layout trick of FlashAttention-2) times V_j. lse is saved; S and P never touch memory.
// The fragment layouts are in fragment.cuh: a B operand must have k contiguous in shared memory, so K for
// S = Q K^T (k = head dim) is fine as stored and V for P V (k = key) is stored transposed (Vt). Every tile row
// is padded by 8 bf16 (16 bytes) so the 32-bit fragment loads of a warp hit 32 different banks.
// The backward is mma_backward.cuh.
#pragma once
#include <cstdint>

#include "llmc/attention/fragment.cuh"
#include "llmc/error.h"
#include "llmc/kernel_common.cuh"

namespace flashgpt2 {

// The head sizes this engine is compiled for (both passes).
inline bool attention_flash_mma_supports(int HS) { return HS == 64; }

constexpr int FM_BR = 64, FM_BC = 64;  // query rows per block, key rows per tile (16 per warp)
constexpr int FM_THREADS = 128, FM_PAD = 8;

// Rows r0..r0+ROWS-1 (of T) of a (.., row_stride) bf16 matrix, HS columns from src, into shared memory:
// s (ROWS, HS+PAD) row-major and/or sT (HS, ROWS+PAD) transposed; rows >= T become 0. 16-byte loads.
template <int HS, int ROWS>
__device__ __forceinline__ void fm_load_tile(bf16_t* s, bf16_t* sT, const bf16_t* src, int row_stride, int r0, int T) {
    for (int e = threadIdx.x; e < ROWS * (HS / 8); e += blockDim.x) {
        const int r = e / (HS / 8), c = (e % (HS / 8)) * 8, row = r0 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row < T) v = *reinterpret_cast<const uint4*>(src + (size_t)row * row_stride + c);
        if (s) *reinterpret_cast<uint4*>(s + r * (HS + FM_PAD) + c) = v;
        if (sT) {
            const bf16_t* x = reinterpret_cast<const bf16_t*>(&v);
            for (int k = 0; k < 8; k++) sT[(c + k) * (ROWS + FM_PAD) + r] = x[k];
        }
    }
}

template <int HS>
__global__ void __launch_bounds__(FM_THREADS)
    attention_forward_flash_mma_kernel(bf16_t* out, float* lse, const bf16_t* qkv, int T, int NH) {
    constexpr int LD = HS + FM_PAD, LDT = FM_BC + FM_PAD, KS = HS / 16, NT = FM_BC / 8, DT = HS / 8;
    __shared__ __align__(16) bf16_t sQ[FM_BR * LD];   // Q_i (Br, HS)
    __shared__ __align__(16) bf16_t sK[FM_BC * LD];   // K_j (Bc, HS)
    __shared__ __align__(16) bf16_t sVt[HS * LDT];    // V_j transposed (HS, Bc)
    const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FM_BR;  // the longest (latest) Q blocks start first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, wr = warp * 16;
    const bf16_t* base = qkv + (size_t)b * T * 3 * C + h * HS;  // q of (b, t=0, h); k at +C, v at +2C
    const float sl2 = LOG2E / sqrtf((float)HS);                 // scores in log2 units: exp(x) = exp2(x log2 e)

    fm_load_tile<HS, FM_BR>(sQ, nullptr, base, 3 * C, q0, T);
    __syncthreads();  // Q_i is in shared memory before the warps read their fragments
    uint32_t qa[KS][4];
    for (int kk = 0; kk < KS; kk++) load_a_frag(qa[kk], sQ, LD, wr, kk * 16, g, t);

    float o[DT][4] = {};                        // O rows wr+g (c0,c1) and wr+g+8 (c2,c3)
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // per row; l is this thread's partial sum
    const int kv_end = min(T, q0 + FM_BR);
    for (int j0 = 0; j0 < kv_end; j0 += FM_BC) {
        __syncthreads();  // every warp is done with the previous K_j, V_j before they are overwritten
        fm_load_tile<HS, FM_BC>(sK, nullptr, base + C, 3 * C, j0, T);
        fm_load_tile<HS, FM_BC>(nullptr, sVt, base + 2 * C, 3 * C, j0, T);
        __syncthreads();  // the tile is in shared memory before anyone reads it

        float s[NT][4] = {};
        mma_rows<KS, NT>(s, qa, sK, LD, g, t);  // S = Q_i K_j^T
        float mt[2] = {-INFINITY, -INFINITY};
        for (int nt = 0; nt < NT; nt++)
            for (int e = 0; e < 4; e++) {
                const int qi = q0 + wr + g + (e >> 1) * 8, kj = j0 + nt * 8 + 2 * t + (e & 1);
                s[nt][e] = (kj <= qi && kj < T) ? s[nt][e] * sl2 : -INFINITY;  // causal mask
                mt[e >> 1] = fmaxf(mt[e >> 1], s[nt][e]);
            }
        float alpha[2];
        for (int r = 0; r < 2; r++) {  // row max over the 4 threads of the row, then the online update
            mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
            mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
            const float m_new = fmaxf(m[r], mt[r]);  // finite: key 0 is in the first tile, visible to all rows
            alpha[r] = exp2f(m[r] - m_new);           // 0 on the first tile
            m[r] = m_new;
            l[r] *= alpha[r];
        }
        for (int dt = 0; dt < DT; dt++)
            for (int e = 0; e < 4; e++) o[dt][e] *= alpha[e >> 1];
        for (int nt = 0; nt < NT; nt++)
            for (int e = 0; e < 4; e++) {
                s[nt][e] = exp2f(s[nt][e] - m[e >> 1]);  // P, 0 where masked
                l[e >> 1] += s[nt][e];
            }
        for (int kk = 0; kk < FM_BC / 16; kk++) {  // O += P V_j
            uint32_t pa[4];
            acc_to_a_frag(pa, s[2 * kk], s[2 * kk + 1]);
            for (int dt = 0; dt < DT; dt++) {
                const bf16_t* p = sVt + (dt * 8 + g) * LDT + kk * 16 + 2 * t;
                mma::mma_16816(o[dt], pa, ld_u32(p), ld_u32(p + 8));
            }
        }
    }
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    for (int r = 0; r < 2; r++) {
        const int qi = q0 + wr + g + r * 8;
        if (qi >= T) continue;
        bf16_t* orow = out + ((size_t)b * T + qi) * C + h * HS;
        for (int dt = 0; dt < DT; dt++)
            *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * t) = frag::pack_bf16(o[dt][2 * r] / l[r], o[dt][2 * r + 1] / l[r]);
        if (t == 0) lse[(size_t)bh * T + qi] = (m[r] + log2f(l[r])) * LN2;  // natural log of sum exp(scaled S)
    }
}

inline void attention_forward_flash_mma(bf16_t* out, float* lse, const bf16_t* qkv, int B, int T, int NH, int HS,
                                        cudaStream_t stream) {
    if (HS != 64) fail("attention_forward_flash_mma: head size %d (only 64)", HS);
    if (!aligned16(qkv) || !aligned16(out)) fail("attention_forward_flash_mma: qkv and out must be 16-byte aligned");
    dim3 grid(ceil_div(T, FM_BR), B * NH);
    attention_forward_flash_mma_kernel<64><<<grid, FM_THREADS, 0, stream>>>(out, lse, qkv, T, NH);
    cudaCheckLaunch();
}

}  // namespace flashgpt2
