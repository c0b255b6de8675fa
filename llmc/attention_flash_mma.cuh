// Flash attention on bf16 tensor cores (mma.sync m16n8k16, fp32 accumulators): the BF16 build's kernels for
// head size 64. Same algorithm as attention_flash.cuh (read that first), with the tile products done by
// warp-wide matrix instructions instead of per-thread dot products:
//
//   forward:  one block of 4 warps per 64 query rows; warp w owns rows 16w..16w+15 of Q_i (kept in registers
//             as mma A fragments). Per 64-key tile: S = Q_i K_j^T (16x64 per warp, in registers), online
//             softmax on the accumulators, then P (converted in registers to bf16 A fragments, the C->A
//             layout trick of FlashAttention-2) times V_j.  lse is saved; S and P never touch memory.
//   backward: llmc/attention_backward.cuh (cp.async double buffering, swizzled tiles, ldmatrix), which uses
//             the fragment helpers below.
//
// mma.sync.m16n8k16 fragment layout (PTX ISA, "Matrix fragments for mma.m16n8k16"), g = lane/4, t = lane%4:
//   A (16x16, row-major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16x8,  "col"):     b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]   (two consecutive k of one column n)
//   C (16x8, fp32):       c0,c1 = C[g][2t], C[g][2t+1];  c2,c3 = C[g+8][2t], C[g+8][2t+1]
// So a B operand must have k contiguous in shared memory: K for S = Q K^T (k = head dim) is fine as stored;
// V for P V (k = key) is stored transposed (Vt). Every tile row is padded by 8 bf16 (16 bytes) so the
// 32-bit fragment loads of a warp hit 32 different banks.
#pragma once
#include <cstdint>

#include "llmc/error.h"
#include "llmc/kernel_common.cuh"
#include "llmc/attention_flash.cuh"

namespace flashgpt2 {

using bf16_t = __nv_bfloat16;

inline bool attention_flash_mma_supports(int HS) { return HS == 64; }

constexpr int FM_BR = 64, FM_BC = 64;  // query rows per block, key rows per tile (16 per warp)
constexpr int FM_THREADS = 128, FM_PAD = 8;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo: the lower column index
    return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t ld_u32(const bf16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// c += a @ b, one 16x8x16 tile, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragment of rows r0..r0+15, columns k0..k0+15 of a row-major shared tile with row stride ld.
__device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], const bf16_t* s, int ld, int r0, int k0, int g, int t) {
    a[0] = ld_u32(s + (r0 + g) * ld + k0 + 2 * t);
    a[1] = ld_u32(s + (r0 + g + 8) * ld + k0 + 2 * t);
    a[2] = ld_u32(s + (r0 + g) * ld + k0 + 2 * t + 8);
    a[3] = ld_u32(s + (r0 + g + 8) * ld + k0 + 2 * t + 8);
}

// Two accumulator tiles (columns 16kk..16kk+15) become the A fragment of the next product: C->A in registers.
__device__ __forceinline__ void acc_to_a_frag(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

// acc[n-tile nt] += A (16 x 16*KSTEPS, as fragments) @ B, where B[k][n] = sB[n*ld + k] (k contiguous).
template <int KSTEPS, int NTILES>
__device__ __forceinline__ void mma_rows(float (&acc)[NTILES][4], const uint32_t (&a)[KSTEPS][4], const bf16_t* sB,
                                         int ld, int g, int t) {
    for (int kk = 0; kk < KSTEPS; kk++)
        for (int nt = 0; nt < NTILES; nt++) {
            const bf16_t* p = sB + (nt * 8 + g) * ld + kk * 16 + 2 * t;
            mma_16816(acc[nt], a[kk], ld_u32(p), ld_u32(p + 8));
        }
}

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

// ---------------------------------------------------------------------------------------------------------
// forward

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
                mma_16816(o[dt], pa, ld_u32(p), ld_u32(p + 8));
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
            *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * t) = pack_bf16(o[dt][2 * r] / l[r], o[dt][2 * r + 1] / l[r]);
        if (t == 0) lse[(size_t)bh * T + qi] = (m[r] + log2f(l[r])) * LN2;  // natural log of sum exp(scaled S)
    }
}

inline void attention_forward_flash_mma(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int HS,
                                        cudaStream_t stream) {
    if (HS != 64) fail("attention_forward_flash_mma: head size %d (only 64)", HS);
    if (!aligned16(qkv) || !aligned16(out)) fail("attention_forward_flash_mma: qkv and out must be 16-byte aligned");
    dim3 grid(ceil_div(T, FM_BR), B * NH);
    attention_forward_flash_mma_kernel<64><<<grid, FM_THREADS, 0, stream>>>(out, lse, qkv, T, NH);
    cudaCheckLaunch();
}

}  // namespace flashgpt2
