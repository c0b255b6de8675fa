// dQ summed in fixed point: how the dK/dV kernel can make dQ too, with the same bits in any order of its blocks.
//
// In a fused backward (FlashAttention-2, Dao 2023, §3.2) key block j holds dS_ij and adds its share dS_ij K_j
// into dQ_i; the blocks of one query tile arrive in whatever order the SMs ran them. Floating-point addition
// is not associative, so adding the shares in arrival order (atomics) gives other bits on every run, and adding
// them in a fixed order makes the blocks wait for one another (dev rungs 7 and 8 measure that wait). Integer
// addition is associative. So each share is turned into integers, round(2^e_i x) with one power-of-two scale
// per query row i, and added with integer atomics: every order gives the same sum, and after the conversion
// nothing is rounded again. A last pass turns the sums back into bf16 dQ.
//
// The scale must be the same for every share of row i, so it is fixed before any share exists, from a bound:
//   |dQ_id| <= sum_j |dS_ij| |K_jd| <= max|K| sum_j P_ij |dP_ij - D_i|,  with sum_j P_ij = 1 and
//   |dP_ij - D_i| = |dO_i · (V_j - O_i)| <= |dO_i|_2 (|V_j|_2 + |O_i|_2) <= 2 |dO_i|_2 max_j |V_j|_2
// (O_i is an average of the V_j). The same bound holds for the shares of any set of blocks, so no share and no
// partial sum exceeds it. bound_i = 2.5 |dO_i|_2 max_j |V_j|_2 max_jd |K_jd| (the 2.5 covers the bf16 rounding
// of O and dS), and e_i is the largest exponent with 2^e_i bound_i < 2^22. Then every scaled share is below
// 2^22, where one fma with 1.5 · 2^23 rounds it to an integer exactly (to_fixed), and no sum overflows int32. The
// bound is loose (dS_i sums to zero over j, so dQ_i is far below it), which costs a few of the 22 bits; dQ is
// stored in bf16 (8 bits).
// A NaN or inf input must not vanish into a finite integer sum: such a row's scale is NaN, and the last pass
// writes NaN on that row (a NaN in K or V marks every row of the head).
//
// Three kernels around the fused one: the pre-pass (per 64-query tile: lse·log2(e) and D, as the dK/dV step
// reads them; |dO_i|_2; the head's max |K| and max |V|_2; the tile's integer sums zeroed), the fused kernel
// (wgmma_backward_ws.cuh, DqBy::consumers or DqBy::warpgroup), and the last pass (integer sums -> dQ in dqkv).
#pragma once
#include <cfloat>
#include <climits>
#include <cstdint>

#include "llmc/attention/common.cuh"
#include "llmc/attention/mma_backward.cuh"    // fb_dot2, fb_store_dq, FB_TILE
#include "llmc/attention/wgmma_backward.cuh"  // mnmajor
#include "llmc/ptx/hopper.cuh"

namespace flashgpt2::fixed_dq {

// The workspace, in this order: the integer sums, (B·NH, T/64 tiles, 64 x HS) in the order the accumulator
// registers hold them (add_share); per query tile its rows' lse·log2(e), D and |dO_i|_2 (LD_ROWS x 64 floats,
// 0 past T; the dK/dV kernel's producer warp stores a tile's into the ring slot with Q_i, dO_i: a load from global
// memory right before the step's fence.proxy.async would hold the fence for its latency); per head max|K| and max|V|_2 (the bit
// patterns of non-negative floats, maxed as unsigned integers: a NaN's is above inf's).
constexpr int LD_ROWS = 3;
inline size_t acc_ints(int B, int NH, int T, int HS) { return (size_t)B * NH * ceil_div(T, FB_BR) * FB_BR * HS; }
inline size_t ld_floats(int B, int NH, int T) { return (size_t)B * NH * ceil_div(T, FB_BR) * LD_ROWS * FB_BR; }
inline size_t workspace_bytes(int B, int NH, int T, int HS) {
    return (acc_ints(B, NH, T, HS) + ld_floats(B, NH, T) + 2 * (size_t)B * NH) * 4;
}
struct Workspace {
    int* acc;          // (B·NH, T/64, 64 x HS) dQ's integer sums
    float* LD;         // (B·NH, T/64, LD_ROWS, 64) lse·log2(e), D, |dO_i|_2 (NaN where lse_i or D_i is not finite)
    unsigned* kv_max;  // (B·NH, 2) max_jd |K_jd|, max_j |V_j|_2
};
inline Workspace carve(void* ws, int B, int NH, int T, int HS) {
    int* acc = static_cast<int*>(ws);
    float* LD = reinterpret_cast<float*>(acc + acc_ints(B, NH, T, HS));
    return {acc, LD, reinterpret_cast<unsigned*>(LD + ld_floats(B, NH, T))};
}

// Row i's exponent e_i (the header), or NAN_ROW where the bound is not finite.
constexpr int NAN_ROW = INT_MIN;
__device__ __forceinline__ int row_exponent(float dO_norm, const unsigned* kv_max) {
    const float bound = __fmul_rn(__fmul_rn(__fmul_rn(2.5f, dO_norm), __uint_as_float(kv_max[1])), __uint_as_float(kv_max[0]));
    if (!(bound <= FLT_MAX)) return NAN_ROW;  // NaN or inf
    if (bound == 0.0f) return 0;              // dO_i = 0: every share is 0
    int E;
    frexpf(bound, &E);                        // bound < 2^E, and E <= 128
    return min(22 - E, 126);
}
__device__ __forceinline__ float pow2(int e) { return __int_as_float((127 + e) << 23); }  // exactly, |e| <= 126
__device__ __forceinline__ float row_scale(int e) { return e == NAN_ROW ? __int_as_float(0x7fc00000) : pow2(e); }
__device__ __forceinline__ float row_unscale(int e) { return e == NAN_ROW ? __int_as_float(0x7fc00000) : pow2(-e); }

// N columns of the block's share of dQ_i, dq (64 queries x N) = dS K_j over the block's 128 keys: dS^T in two
// swizzled tiles (keys 0-63 at ds, 64-127 at ds + FB_TILE; rows = keys), K_j's two 64-key tiles TILE bytes
// apart from k, which points at the first of the N columns. Both operands MN-major (their rows are k). A slice
// of 32 columns starts 64 bytes into K_j's 128-byte rows: the hardware swizzles the address it computes.
template <int N, int TILE>
__device__ __forceinline__ void gemm_cols(float (&dq)[N / 8][4], uint32_t ds, uint32_t k) {
    static_assert(N == 32 || N == 64, "a half or a whole 128-byte panel of K_j's rows");
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {  // 16 keys a step
        const uint64_t a = wgmma_backward::mnmajor(ds + kk / 4 * FB_TILE, kk % 4);
        const uint64_t b = wgmma_backward::mnmajor(k + kk / 4 * TILE, kk % 4);
        if constexpr (N == 32) hopper::wgmma_m64n32k16_ss<1>(dq, a, b, kk > 0);
        else hopper::wgmma_m64n64k16_ss<1>(dq, a, b, kk > 0);
    }
}
// Consumer warpgroup wg's half of the share (DqBy::consumers): at head size 64 the left or right 32 columns of
// K_j's rows, at 128 one whole panel.
template <int HS>
__device__ __forceinline__ void gemm_share(float (&dq)[HS / 16][4], uint32_t ds, uint32_t k, int wg) {
    gemm_cols<HS / 2, HS / 64 * FB_TILE>(dq, ds, k + (HS == 64 ? 64 * wg : wg * FB_TILE));
}
// The whole share, for the dQ warpgroup of head size 64 (DqBy::warpgroup).
__device__ __forceinline__ void gemm_share_all(float (&dq)[8][4], uint32_t ds, uint32_t k) {
    gemm_cols<64, FB_TILE>(dq, ds, k);
}

// |dO_i|_2 of query tile `tile`'s rows 16 warp + g (and, 8 further on, + 8): the third of its LD_ROWS rows.
__device__ __forceinline__ const float* dO_norms(const Workspace& w, size_t tile, int warp, int g) {
    return w.LD + (tile * LD_ROWS + 2) * FB_BR + 16 * warp + g;
}

// round(x s) as an int, for |x s| < 2^22: x s + 1.5 · 2^23 lies in [2^23, 2^24), where a float's unit in the
// last place is 1, so the fma's one rounding is to the nearest integer, and that integer sits in the low bits
// (Hacker's Delight's "magic number" conversion). One fma and one integer subtraction, where cvt.rni.s32.f32
// would queue behind the softmax's exp2 on the same pipe. A NaN x s gives a meaningless integer: that row's
// scale is NaN, so the last pass writes NaN there whatever its sum.
__device__ __forceinline__ int to_fixed(float x, float s) { return __float_as_int(fmaf(x, s, 12582912.0f)) - 0x4B400000; }

// A share into the tile's integer sums: this thread's accumulator rows (16 w + g: dq[.][0..1], + 8: [2..3]) at
// scales s0, s1. Element e of n-tile nt goes to acc + (4 nt + e) 128 (acc: this thread's first), so a warp's
// 32 lanes add 128 consecutive bytes. The atomics' results are unused: they compile to fire-and-forget RED.
template <int NT>
__device__ __forceinline__ void add_share(int* acc, const float (&dq)[NT][4], float s0, float s1) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) atomicAdd(acc + (4 * nt + e) * 128, to_fixed(dq[nt][e], e < 2 ? s0 : s1));
}

// The bit pattern of max |x| over the 8 bf16 of v, as a float's (bf16 is a float's upper half).
__device__ __forceinline__ unsigned absmax_bits(uint4 v) {
    const auto m2 = [](unsigned w) { return max(w & 0x7fffu, (w >> 16) & 0x7fffu); };
    return max(max(m2(v.x), m2(v.y)), max(m2(v.z), m2(v.w))) << 16;
}

// Pre-pass, one block per (64-query tile, head), two threads per row: the tile's lse·log2(e), D_i = rowsum(dO_i ∘
// O_i) and |dO_i|_2 (rows past T: 0), its rows' contribution to the head's max |K| and max |V|_2 (kv_max zeroed
// before), and the tile's integer sums zeroed.
template <int HS>
static __global__ void __launch_bounds__(128)
    pre_kernel(Workspace w, const bf16_t* dout, const bf16_t* out, const bf16_t* qkv, const float* lse, int T, int NH) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH, it = blockIdx.x, n_qt = gridDim.x;
    const int r = threadIdx.x / 2, half = threadIdx.x % 2, q = it * FB_BR + r;
    const size_t tile = (size_t)bh * n_qt + it;
    float d = 0.0f, n2 = 0.0f, v2 = 0.0f;
    unsigned k_max = 0;
    if (q < T) {
        const size_t at = ((size_t)b * T + q) * C + h * HS + HS / 2 * half;  // this thread's half of row q
        const uint4* o = reinterpret_cast<const uint4*>(out + at);
        const uint4* g = reinterpret_cast<const uint4*>(dout + at);
        const uint4* k = reinterpret_cast<const uint4*>(qkv + 2 * ((size_t)b * T + q) * C + at + C);  // (b, q, 1, h)
        const uint4* v = k + C / 8;                                                                 // (b, q, 2, h)
        for (int c = 0; c < HS / 16; c++) {
            const uint4 x = o[c], y = g[c], z = v[c];
            d += fb_dot2(x.x, y.x) + fb_dot2(x.y, y.y) + fb_dot2(x.z, y.z) + fb_dot2(x.w, y.w);
            n2 += fb_dot2(y.x, y.x) + fb_dot2(y.y, y.y) + fb_dot2(y.z, y.z) + fb_dot2(y.w, y.w);
            v2 += fb_dot2(z.x, z.x) + fb_dot2(z.y, z.y) + fb_dot2(z.z, z.z) + fb_dot2(z.w, z.w);
            k_max = max(k_max, absmax_bits(k[c]));
        }
    }
    d += __shfl_xor_sync(0xffffffffu, d, 1);  // the row's two halves: the same sums in both lanes
    n2 += __shfl_xor_sync(0xffffffffu, n2, 1);
    v2 += __shfl_xor_sync(0xffffffffu, v2, 1);
    if (half == 0) {
        const float l = q < T ? lse[(size_t)bh * T + q] : 0.0f;
        float* ld = w.LD + tile * LD_ROWS * FB_BR + r;
        ld[0] = l * LOG2E, ld[FB_BR] = d;
        ld[2 * FB_BR] = isfinite(l) && isfinite(d) ? sqrtf(n2) : __int_as_float(0x7fc00000);
    }
    __shared__ unsigned block_max[2][4];  // per warp: max |K|, max |V|_2
    const unsigned kw = __reduce_max_sync(0xffffffffu, k_max);
    const unsigned vw = __reduce_max_sync(0xffffffffu, __float_as_uint(sqrtf(v2)) & 0x7fffffffu);
    if (threadIdx.x % 32 == 0) block_max[0][threadIdx.x / 32] = kw, block_max[1][threadIdx.x / 32] = vw;
    __syncthreads();  // every warp's maxima are in block_max
    if (threadIdx.x < 2) {
        const unsigned* m = block_max[threadIdx.x];
        atomicMax(w.kv_max + 2 * bh + threadIdx.x, max(max(m[0], m[1]), max(m[2], m[3])));
    }
    int4* acc = reinterpret_cast<int4*>(w.acc + tile * FB_BR * HS);
    for (int x = threadIdx.x; x < FB_BR * HS / 4; x += 128) acc[x] = make_int4(0, 0, 0, 0);
}

// Last pass, one block per (64-query tile, head): thread x reads the integer sums that thread x of each consumer
// warpgroup added (rows 16 w + g, + 8 of the tile; warpgroup c's columns c HS/2 ..), scales them back and
// writes dQ (times the softmax scale, as bf16) into dqkv.
template <int HS>
static __global__ void __launch_bounds__(128) post_kernel(bf16_t* dqkv, Workspace w, int T, int NH) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    const int bh = blockIdx.y, it = blockIdx.x, n_qt = gridDim.x;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const size_t tile = (size_t)bh * n_qt + it;
    const float* dn = dO_norms(w, tile, warp, g);
    const float inv[2] = {row_unscale(row_exponent(dn[0], w.kv_max + 2 * bh)), row_unscale(row_exponent(dn[8], w.kv_max + 2 * bh))};
    const int* acc = w.acc + tile * FB_BR * HS + threadIdx.x;
    float dq[HS / 8][4];
#pragma unroll
    for (int c = 0; c < 2; c++)
#pragma unroll
        for (int nt = 0; nt < HS / 16; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dq[c * HS / 16 + nt][e] = (float)__ldcs(acc + c * FB_BR * HS / 2 + (4 * nt + e) * 128) * inv[e / 2];
    fb_store_dq(dqkv, dq, it * FB_BR + 16 * warp + g, T, bh / NH, bh % NH, NH, t, 1.0f / sqrtf((float)HS));
}

}  // namespace flashgpt2::fixed_dq
