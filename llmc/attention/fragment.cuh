// Register-level pieces the tensor-core attention engines share (dev rungs 5–8 explain them; mma_forward.cuh,
// mma_backward.cuh, wgmma_forward*.cuh and wgmma_backward.cuh use them): the online softmax on an accumulator
// fragment (namespace frag), and the mma.sync operand fragments (A from shared memory or from a previous
// product's accumulators, B read by 32-bit loads).
//
// A tile of scores in accumulator layout (g = lane / 4, t = lane % 4): s[c][0..1] are row g, columns 8c+2t,
// 8c+2t+1; s[c][2..3] are row g+8, same columns. The four lanes of a quad (same g) together hold complete
// rows. mma.sync's m16n8 accumulator and each warp's share of Hopper wgmma's m64nN accumulator both have
// this layout, so one set of helpers serves both. The softmax scale is folded into exp2:
// p = 2^(s·scale·log2e − m·scale·log2e) is one FFMA + one MUFU.EX2.
#pragma once
#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>

#include "llmc/kernel_common.cuh"  // LOG2E
#include "llmc/ptx/mma_sync.cuh"   // mma_16816

namespace flashgpt2 {
using bf16_t = __nv_bfloat16;
}

namespace flashgpt2::frag {

// Two floats → one register of two bf16 (lo in the low half: the lower column index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
// The reverse: one register of two bf16 → two floats (x the low half).
__device__ __forceinline__ float2 unpack_bf16(uint32_t u) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}

// 2^x on the special-function unit (one MUFU.EX2; 2^-inf = +0).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Causal mask: -inf where key > query. row_g: query index of row g; key0: key index of column 0.
template <int NC>
__device__ __forceinline__ void causal_mask(float (&s)[NC][4], int row_g, int key0, int lane) {
    const int col = key0 + 2 * (lane % 4);
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            if (col + 8 * c + (r & 1) > row_g + 8 * (r >> 1)) s[c][r] = -INFINITY;
}

// One step of the online softmax (Milakov & Gimelshein 2018; FlashAttention-2 Alg. 1, lines 8–10) for the
// thread's two rows. In: raw scores s, running max m (score units) and thread-partial sum l. Out: s holds
// P~ = exp(scale·(s − m_new)), computed as 2^(s·scale·log2e − m_new·scale·log2e); alpha = exp(scale·(m_old
// − m_new)) is the factor the caller applies to its O accumulator; l ← alpha·l + Σ P~ (this thread's part:
// the quad's four partial sums are added once, at the end, since alpha is the same for all four).
template <int NC>
__device__ __forceinline__ void online_softmax(float (&s)[NC][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                               float scale_log2) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int c = 0; c < NC; c++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[c][0], s[c][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[c][2], s[c][3]));
    }
    float neg_ms[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));  // the row's max over its quad
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        // A row with every score masked so far has max -inf: use 0 so that exps are 0, never inf - inf.
        const float m_use = mx[h] == -INFINITY ? 0.f : mx[h];
        alpha[h] = fast_exp2((m[h] - m_use) * scale_log2);  // first tile: m = -inf → alpha = 0
        m[h] = mx[h];
        neg_ms[h] = -m_use * scale_log2;
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            s[c][r] = fast_exp2(fmaf(s[c][r], scale_log2, neg_ms[r >> 1]));
            sum[r >> 1] += s[c][r];
        }
    l[0] = l[0] * alpha[0] + sum[0];
    l[1] = l[1] * alpha[1] + sum[1];
}

// O accumulator rows scaled by alpha (row g: [.][0..1], row g+8: [.][2..3]).
template <int NC>
__device__ __forceinline__ void scale_rows(float (&o)[NC][4], const float (&alpha)[2]) {
#pragma unroll
    for (int c = 0; c < NC; c++) {
        o[c][0] *= alpha[0]; o[c][1] *= alpha[0];
        o[c][2] *= alpha[1]; o[c][3] *= alpha[1];
    }
}

// P~ as the A operand of the P·V product for keys 16kk..16kk+15: slices 2kk and 2kk+1 of the S fragment.
template <int NC>
__device__ __forceinline__ void p_fragment(uint32_t (&a)[4], const float (&s)[NC][4], int kk) {
    a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Epilogue for one warp's 16 rows: O / l → bf16, lse = m·scale + ln l (natural log). Rows ≥ T are skipped.
// o_head points at the head's row 0 and ld is its row stride in elements (HS for a contiguous (.., T, HS)
// head; C for a head inside a (B, T, NH, HS) tensor); lse_head points at the head's lse[0]; row_g is the
// query index of fragment row g.
template <int NC>
__device__ __forceinline__ void write_rows(const float (&o)[NC][4], float (&l)[2], const float (&m)[2],
                                           __nv_bfloat16* o_head, float* lse_head, int row_g, int T, size_t ld,
                                           float scale, int lane) {
    const int t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);  // the quad's partial sums: the row's full l
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        const int row = row_g + 8 * h;
        if (row >= T) continue;
        const float inv_l = 1.f / l[h];
        __nv_bfloat16* dst = o_head + (size_t)row * ld + 2 * t;
#pragma unroll
        for (int c = 0; c < NC; c++)
            *reinterpret_cast<__nv_bfloat162*>(dst + 8 * c) =
                __floats2bfloat162_rn(o[c][2 * h] * inv_l, o[c][2 * h + 1] * inv_l);
        if (t == 0) lse_head[row] = m[h] * scale + logf(l[h]);
    }
}

}  // namespace flashgpt2::frag

namespace flashgpt2 {

// ---- mma.sync m16n8k16 operands (PTX ISA, "Matrix fragments for mma.m16n8k16"), g = lane/4, t = lane%4:
//   A (16x16, row-major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16x8,  "col"):     b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]   (two consecutive k of one column n)
//   C (16x8, fp32):       c0,c1 = C[g][2t], C[g][2t+1];  c2,c3 = C[g+8][2t], C[g+8][2t+1]

__device__ __forceinline__ uint32_t ld_u32(const bf16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The A fragment of rows r0..r0+15, columns k0..k0+15 of a row-major shared tile with row stride ld.
__device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], const bf16_t* s, int ld, int r0, int k0, int g, int t) {
    a[0] = ld_u32(s + (r0 + g) * ld + k0 + 2 * t);
    a[1] = ld_u32(s + (r0 + g + 8) * ld + k0 + 2 * t);
    a[2] = ld_u32(s + (r0 + g) * ld + k0 + 2 * t + 8);
    a[3] = ld_u32(s + (r0 + g + 8) * ld + k0 + 2 * t + 8);
}

// Two accumulator tiles (columns 16kk..16kk+15) become the A fragment of the next product: C->A in registers.
__device__ __forceinline__ void acc_to_a_frag(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = frag::pack_bf16(c0[0], c0[1]);
    a[1] = frag::pack_bf16(c0[2], c0[3]);
    a[2] = frag::pack_bf16(c1[0], c1[1]);
    a[3] = frag::pack_bf16(c1[2], c1[3]);
}

// acc[n-tile nt] += A (16 x 16*KSTEPS, as fragments) @ B, where B[k][n] = sB[n*ld + k] (k contiguous).
template <int KSTEPS, int NTILES>
__device__ __forceinline__ void mma_rows(float (&acc)[NTILES][4], const uint32_t (&a)[KSTEPS][4], const bf16_t* sB,
                                         int ld, int g, int t) {
    for (int kk = 0; kk < KSTEPS; kk++)
        for (int nt = 0; nt < NTILES; nt++) {
            const bf16_t* p = sB + (nt * 8 + g) * ld + kk * 16 + 2 * t;
            mma::mma_16816(acc[nt], a[kk], ld_u32(p), ld_u32(p + 8));
        }
}

}  // namespace flashgpt2
