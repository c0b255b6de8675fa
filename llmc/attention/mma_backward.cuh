// Flash attention backward on bf16 tensor cores (mma.sync m16n8k16, fp32 accumulators), head size 64: the BF16
// build's engine `mma` (the best flash backward on cards before Hopper, sm_80 on; wgmma_backward.cuh runs the same
// two kernels on wgmma). The algorithm is FlashAttention-2's backward (Dao 2023, Alg. 2), as in fp32_backward.cuh
// (read that first); here every tile product runs on the tensor cores and every tile travels global -> shared by
// cp.async, double-buffered, in the swizzled layout of llmc/ptx/mma_sync.cuh.
// Deterministic, no atomics: each output element is summed by one thread in one fixed order, so two runs
// give the same bits. Two kernels, nothing else (the pre-pass D = rowsum(dO * O) is fused into the first):
//
//   dQ kernel     one block of 4 warps per Br = 64 queries; warp w owns rows 16w..16w+15, its Q_i, dO_i kept
//                 in registers as mma A fragments. First D_i = rowsum(dO_i * O_i) (written to the workspace
//                 for the second kernel), then for every visible K_j, V_j (Bc = 64 keys, double-buffered):
//                     S = Q_i K_j^T,  P = exp(S * scale - lse),  dP = dO_i V_j^T,  dS = P * (dP - D_i),
//                     dQ_i += dS K_j                         (S, P, dP, dS never leave the registers)
//   dK/dV kernel  one block of NW warps per Bc = 16 NW keys; warp w owns keys 16w..16w+15, its K_j, V_j kept
//                 as A fragments. Computed "transposed" (rows = keys), for every Q_i tile that sees them
//                 (Br = 64 queries; Q_i, dO_i, lse_i, D_i double-buffered):
//                     S^T = K_j Q_i^T, P^T = exp(S^T * scale - lse), dV_j += P^T dO_i,
//                     dP^T = V_j dO_i^T, dS^T = P^T * (dP^T - D_i), dK_j += dS^T Q_i
//                 then dK = scale * dK, dV written once.
// Why a separate dQ kernel rather than per-key-block dQ partials: at (16,12,1024,64) fp32 partials would
// be T^2/(2 Bc) * 64 * 4 bytes = 2 MB per head written and read again (~0.8 GB per call, ~170 us of HBM
// at 4.8 TB/s), while recomputing S and dP in the dQ kernel costs 2 more tile products per tile (~40% more
// tensor work, which runs at a far higher rate than HBM): recompute wins.
//
// Fragments (PTX ISA, "Matrix fragments for mma.m16n8k16"; g = lane / 4, t = lane % 4): an accumulator tile
// holds rows g, g+8 and columns 2t, 2t+1 of each 8-column slice; two adjacent slices, packed to bf16, are
// exactly the A fragment of the next product (acc_to_a_frag), so P^T and dS^T go from one mma to the next
// in registers. B operands come from shared memory by ldmatrix, each tile stored once, row-major:
//   a tile whose row index is the mma's n (K_j in Q_i K_j^T; Q_i, dO_i in K_j Q_i^T, V_j dO_i^T): ldmatrix;
//   a tile whose row index is the mma's k (K_j in dS K_j; dO_i in P^T dO_i; Q_i in dS^T Q_i):   ldmatrix.trans.
// Causal work is skipped by tiles (no tile entirely above the diagonal is visited) and the mask is applied
// only on tiles that cross the diagonal; tiles past T arrive as zeros (cp.async zero-fill).
#pragma once
#include <cstdint>

#include "llmc/attention/common.cuh"
#include "llmc/attention/fragment.cuh"
#include "llmc/error.h"
#include "llmc/kernel_common.cuh"
#include "llmc/ptx/mma_sync.cuh"

namespace flashgpt2 {

constexpr int FB_BR = 64;                // queries per dQ block and per dK/dV step
constexpr int FB_BC = 64;                // keys per dQ step
constexpr int FB_TILE = 64 * 128;        // bytes of a swizzled (64, 64) bf16 tile
constexpr int FB_ROWS16 = 16 * 128;      // bytes of 16 tile rows
constexpr int FB_DQ_THREADS = 128;       // 4 warps x 16 query rows
constexpr int FB_DQ_SMEM = 7 * FB_TILE;  // Q_i, dO_i, O_i staging + K_j, V_j x 2 buffers: 56 KB
constexpr int FB_DKDV_WARPS = 8;         // the default dK/dV block: 8 warps, 128 keys

template <int NW>
constexpr int fb_dkdv_smem() {  // K_j, V_j staging (16 NW rows each) + Q_i, dO_i x 2 buffers + lse_i, D_i x 2
    return 2 * 16 * NW * 128 + 4 * FB_TILE + 4 * FB_BR * (int)sizeof(float);
}

// Rows r0..r0+ROWS-1 of a (T, HS) bf16 matrix with rows `stride` elements apart -> a swizzled tile at `tile`;
// rows >= T are zero-filled. A row of HS > 64 columns is HS/64 panels of 64 columns (128 bytes), panel p
// (columns 64p..64p+63) a (ROWS, 64) swizzled tile of its own at tile + p ROWS 128 (wgmma's layout for
// wider rows). Issues cp.async copies only (the caller commits and waits). Thread x copies chunk x % 8 of
// rows x / 8, x / 8 + NTHREADS / 8, ...: one address computed, then stepped. A tile wholly inside T (all but
// a head's last) takes no bounds checks: these copies run in every step of the backward's loops, and the
// checks and selects were a good part of the instructions issued there.
template <int ROWS, int NTHREADS, int HS = 64>
__device__ __forceinline__ void fb_load_tile(uint32_t tile, const bf16_t* src, int stride, int r0, int T) {
    static_assert(HS % 64 == 0, "whole 128-byte panels");
    if constexpr (HS > 64) {  // panel by panel
#pragma unroll
        for (int panel = 0; panel < HS / 64; panel++)
            fb_load_tile<ROWS, NTHREADS>(tile + panel * ROWS * 128, src + 64 * panel, stride, r0, T);
    } else {
        constexpr int N = ROWS * 8 / NTHREADS, RSTEP = NTHREADS / 8;  // chunks per thread, rows between them
        static_assert((ROWS * 8) % NTHREADS == 0 && RSTEP % 8 == 0,
                      "the same chunk count per thread, the same swizzle at every row step");
        const int r = threadIdx.x / 8, c = threadIdx.x % 8;
        const uint32_t dst = mma::swz128(tile, r, c);  // + n RSTEP rows: + n RSTEP 128 bytes (RSTEP is a multiple of 8)
        if (r0 + ROWS <= T) {
            const bf16_t* p = src + (size_t)(r0 + r) * stride + 8 * c;
#pragma unroll
            for (int n = 0; n < N; n++) mma::cp_async_16(dst + n * RSTEP * 128, p + (size_t)n * RSTEP * stride, 16);
        } else {
#pragma unroll
            for (int n = 0; n < N; n++) {
                const int row = r0 + r + n * RSTEP;
                const bool valid = row < T;
                mma::cp_async_16(dst + n * RSTEP * 128, src + (size_t)(valid ? row : 0) * stride + 8 * c, valid ? 16 : 0);
            }
        }
    }
}

// Entries r0..r0+63 of a length-T fp32 row vector (lse or D of one head) -> shared memory; >= T become 0.
template <int NTHREADS>
__device__ __forceinline__ void fb_load_vec(float* dst, const float* src, int r0, int T) {
    for (int x = threadIdx.x; x < FB_BR; x += NTHREADS) {
        const bool valid = r0 + x < T;
        mma::cp_async_4(mma::smem_u32(dst + x), src + (valid ? r0 + x : 0), valid ? 4 : 0);
    }
}

// Per-lane ldmatrix byte offsets into a swizzled tile, one per 16-column step kk (columns 16kk..16kk+15):
//   a_off: A fragment of rows 16w..16w+15 (matrices: rows 0-7 | 8-15 of columns 16kk.. , then of 16kk+8..)
//   n_off: B fragments of rows 0..15 used as the mma's n (matrices: n 0-7 k-lo | n 0-7 k-hi | n 8-15 k-lo |
//          n 8-15 k-hi), i.e. {b0, b1} of n-slice 0 and of n-slice 1
//   k_off: with .trans, B fragments of rows 0..15 used as the mma's k (matrices: k 0-7 | k 8-15 of columns
//          16kk.., then of 16kk+8..), i.e. {b0, b1} of n-slice 2kk and of n-slice 2kk+1
// Every row a lane addresses is lane % 8 modulo 8, so +16 rows is +FB_ROWS16 bytes on all three.
struct FbOffsets {
    uint32_t a[4], n[4], k[4];
    __device__ __forceinline__ FbOffsets(int warp, int lane) {
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            a[kk] = mma::swz128(0, 16 * warp + lane % 16, 2 * kk + lane / 16);
            n[kk] = mma::swz128(0, lane % 8 + 8 * (lane / 16), 2 * kk + (lane / 8) % 2);
            k[kk] = mma::swz128(0, lane % 16, 2 * kk + lane / 16);
        }
    }
};

// acc (16 x 64, 8 slices) += A (16 x 64, fragments over 4 k-steps) @ B, where B[k][n] = tile[n][k] (rows = n).
__device__ __forceinline__ void fb_mma_rows_n(float (&acc)[8][4], const uint32_t (&a)[4][4], uint32_t tile,
                                              const FbOffsets& off) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int nn = 0; nn < 4; nn++) {
            uint32_t b[4];
            mma::ldmatrix_x4(b, tile + off.n[kk] + nn * FB_ROWS16);
            mma::mma_16816(acc[2 * nn], a[kk], b[0], b[1]);
            mma::mma_16816(acc[2 * nn + 1], a[kk], b[2], b[3]);
        }
}

// acc (16 x 64) += A @ B with A = the 16 x 64 accumulator tile x packed to bf16 (k = its columns) and
// B[k][n] = tile[k][n] (rows = k): the product of a register-resident P/dS with a tile in shared memory.
__device__ __forceinline__ void fb_mma_rows_k(float (&acc)[8][4], const float (&x)[8][4], uint32_t tile,
                                              const FbOffsets& off) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4];
        acc_to_a_frag(a, x[2 * kk], x[2 * kk + 1]);
#pragma unroll
        for (int nn = 0; nn < 4; nn++) {
            uint32_t b[4];
            mma::ldmatrix_x4_trans(b, tile + off.k[nn] + kk * FB_ROWS16);
            mma::mma_16816(acc[2 * nn], a, b[0], b[1]);
            mma::mma_16816(acc[2 * nn + 1], a, b[2], b[3]);
        }
    }
}

// sum over the 2 bf16 pairs of two packed registers: a.lo*b.lo + a.hi*b.hi, in fp32
__device__ __forceinline__ float fb_dot2(uint32_t a, uint32_t b) {
    const float2 x = frag::unpack_bf16(a), y = frag::unpack_bf16(b);
    return fmaf(x.x, y.x, x.y * y.y);
}

// D_i = rowsum(dO_i * O_i) of rows g and g+8, from this lane's partial sums: the quad's four lanes hold a
// row's 64 columns between them, added in a fixed order; every lane of the quad ends with the sums.
__device__ __forceinline__ void fb_finish_D(float (&Di)[2]) {
    for (int r = 0; r < 2; r++) {
        Di[r] += __shfl_xor_sync(0xffffffffu, Di[r], 1);
        Di[r] += __shfl_xor_sync(0xffffffffu, Di[r], 2);
    }
}

// The dQ kernels' prologue: Q_i, dO_i, O_i of the 64 queries from q0 and K_0, V_0 -> their swizzled tiles
// (cp.async, committed as one group; the caller waits), and lse of this thread's rows g, g+8 in log2 units
// (rows >= T: 0). qbase: q of (b, t=0, h) in qkv (k at +C, v at +2C); dout_b, out_b: (b, t=0, h). Tiles of
// HS > 64 in panels (fb_load_tile).
template <int NTHREADS, int HS = 64>
__device__ __forceinline__ void fb_dq_prologue(float (&l2)[2], uint32_t sQ, uint32_t sdO, uint32_t sO, uint32_t sK,
                                               uint32_t sV, const bf16_t* qbase, const bf16_t* dout_b,
                                               const bf16_t* out_b, const float* lse_h, int C, int q0, int row_g,
                                               int T) {
    fb_load_tile<FB_BR, NTHREADS, HS>(sQ, qbase, 3 * C, q0, T);
    fb_load_tile<FB_BR, NTHREADS, HS>(sdO, dout_b, C, q0, T);
    fb_load_tile<FB_BR, NTHREADS, HS>(sO, out_b, C, q0, T);
    fb_load_tile<FB_BC, NTHREADS, HS>(sK, qbase + C, 3 * C, 0, T);
    fb_load_tile<FB_BC, NTHREADS, HS>(sV, qbase + 2 * C, 3 * C, 0, T);
    mma::cp_async_commit();
    for (int r = 0; r < 2; r++) l2[r] = row_g + 8 * r < T ? lse_h[row_g + 8 * r] * LOG2E : 0.0f;
}

// The epilogues: a warp's accumulator rows (g: c0, c1; g+8: c2, c3; columns 8 dt + 2t, dt < NT = HS / 8) of
// dQ (rows = queries from row_g) or of dK and dV (rows = keys from key_g) -> dqkv (B, T, 3, NH, HS) as bf16;
// dQ and dK take the softmax scale here. Rows >= T are not written.
template <int NT>
__device__ __forceinline__ void fb_store_dq(bf16_t* dqkv, const float (&dq)[NT][4], int row_g, int T, int b, int h,
                                            int NH, int t, float scale) {
    constexpr int HS = 8 * NT;
    const int C = NH * HS;
    for (int r = 0; r < 2; r++) {
        const int qi = row_g + 8 * r;
        if (qi >= T) continue;
        bf16_t* row = dqkv + ((size_t)b * T + qi) * 3 * C + h * HS;
        for (int dt = 0; dt < NT; dt++)
            *reinterpret_cast<uint32_t*>(row + 8 * dt + 2 * t) = frag::pack_bf16(dq[dt][2 * r] * scale, dq[dt][2 * r + 1] * scale);
    }
}
template <int NT>
__device__ __forceinline__ void fb_store_dkdv(bf16_t* dqkv, const float (&dk)[NT][4], const float (&dv)[NT][4],
                                              int key_g, int T, int b, int h, int NH, int t, float scale) {
    constexpr int HS = 8 * NT;
    const int C = NH * HS;
    for (int r = 0; r < 2; r++) {
        const int kj = key_g + 8 * r;
        if (kj >= T) continue;
        bf16_t* row = dqkv + ((size_t)b * T + kj) * 3 * C + h * HS;
        for (int dt = 0; dt < NT; dt++) {
            *reinterpret_cast<uint32_t*>(row + C + 8 * dt + 2 * t) = frag::pack_bf16(dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
            *reinterpret_cast<uint32_t*>(row + 2 * C + 8 * dt + 2 * t) = frag::pack_bf16(dv[dt][2 * r], dv[dt][2 * r + 1]);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// dQ (and D): one block per 64 queries, heaviest (latest) query blocks first

template <int HS>
__global__ void __launch_bounds__(FB_DQ_THREADS, 2)
    attention_backward_flash_mma_dq_kernel(bf16_t* dqkv, float* D, const bf16_t* dout, const bf16_t* out, const bf16_t* qkv,
                                 const float* lse, int T, int NH) {
    static_assert(HS == 64, "the swizzled tiles have 128-byte rows");
    extern __shared__ __align__(128) unsigned char fb_smem[];
    const uint32_t sQ = mma::smem_u32(fb_smem), sdO = sQ + FB_TILE, sO = sdO + FB_TILE;  // Q_i, dO_i, O_i (Br, HS)
    const uint32_t sK = sO + FB_TILE, sV = sK + 2 * FB_TILE;  // K_j, V_j (Bc, HS), buffer b at + b * FB_TILE
    const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FB_BR;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_g = q0 + 16 * warp + g;                        // query of fragment row g (row g+8: row_g + 8)
    const bf16_t* qbase = qkv + (size_t)b * T * 3 * C + h * HS;  // q of (b, t=0, h); k at +C, v at +2C
    const size_t obase = (size_t)b * T * C + h * HS;             // out, dout (B,T,NH,HS) at (b, t=0, h)
    const float sl2 = LOG2E / sqrtf((float)HS);                  // scores in log2 units: exp(x) = exp2(x log2 e)
    const int n_tiles = ceil_div(min(q0 + FB_BR, T), FB_BC);     // causal: keys up to the block's last query
    const FbOffsets off(warp, lane);

    float l2[2], Di[2] = {0.0f, 0.0f};  // lse (log2 units) and D of rows g, g+8; rows >= T: 0 (never written)
    fb_dq_prologue<FB_DQ_THREADS>(l2, sQ, sdO, sO, sK, sV, qbase, dout + obase, out + obase, lse + (size_t)bh * T, C,
                                  q0, row_g, T);
    mma::cp_async_wait<0>();
    __syncthreads();  // Q_i, dO_i, O_i and K_0, V_0 are in shared memory for every warp

    uint32_t qa[4][4], doa[4][4];  // this warp's rows of Q_i and dO_i as A fragments, for the whole loop
    for (int kk = 0; kk < 4; kk++) {
        uint32_t oa[4];
        mma::ldmatrix_x4(qa[kk], sQ + off.a[kk]);
        mma::ldmatrix_x4(doa[kk], sdO + off.a[kk]);
        mma::ldmatrix_x4(oa, sO + off.a[kk]);
        Di[0] += fb_dot2(doa[kk][0], oa[0]) + fb_dot2(doa[kk][2], oa[2]);  // row g: registers 0 and 2
        Di[1] += fb_dot2(doa[kk][1], oa[1]) + fb_dot2(doa[kk][3], oa[3]);  // row g+8: registers 1 and 3
    }
    fb_finish_D(Di);
    for (int r = 0; r < 2; r++)  // D (B, NH, T), for the dK/dV kernel
        if (t == 0 && row_g + 8 * r < T) D[(size_t)bh * T + row_g + 8 * r] = Di[r];

    float dq[8][4] = {};  // dQ rows g (c0, c1) and g+8 (c2, c3), columns 8 dt + 2t
    for (int j = 0; j < n_tiles; j++) {
        const uint32_t Kj = sK + (j & 1) * FB_TILE, Vj = sV + (j & 1) * FB_TILE;
        if (j > 0) {
            mma::cp_async_wait<0>();  // this thread's copies of K_j, V_j have landed
            __syncthreads();          // ...and every thread's; every warp is also done with step j-1, so the
                                      // other buffer (K_{j-1}, V_{j-1}) may be refilled below
        }
        if (j + 1 < n_tiles) {
            fb_load_tile<FB_BC, FB_DQ_THREADS>(sK + ((j + 1) & 1) * FB_TILE, qbase + C, 3 * C, (j + 1) * FB_BC, T);
            fb_load_tile<FB_BC, FB_DQ_THREADS>(sV + ((j + 1) & 1) * FB_TILE, qbase + 2 * C, 3 * C, (j + 1) * FB_BC, T);
        }
        mma::cp_async_commit();

        float s[8][4] = {}, dp[8][4] = {};
        fb_mma_rows_n(s, qa, Kj, off);   // S = Q_i K_j^T
        fb_mma_rows_n(dp, doa, Vj, off); // dP = dO_i V_j^T
        const int j0 = j * FB_BC;
        const bool diag = j0 + FB_BC - 1 > q0 + 16 * warp;  // some key of the tile is after some row of the warp
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = fmaf(s[nt][e], sl2, -l2[e >> 1]);
                if (diag && j0 + 8 * nt + 2 * t + (e & 1) > row_g + 8 * (e >> 1)) x = -INFINITY;  // causal mask
                const float p = frag::fast_exp2(x);          // P = exp(S scale - lse); 0 where masked
                dp[nt][e] = p * (dp[nt][e] - Di[e >> 1]);  // dS
            }
        fb_mma_rows_k(dq, dp, Kj, off);  // dQ_i += dS K_j
    }

    fb_store_dq(dqkv, dq, row_g, T, b, h, NH, t, 1.0f / sqrtf((float)HS));
}

// ---------------------------------------------------------------------------------------------------------
// dK, dV: one block per 16 NW keys (rows = keys), the first keys (which every query sees) first

template <int HS, int NW>
__global__ void __launch_bounds__(NW * 32, 8 / NW)
    attention_backward_flash_mma_dkdv_kernel(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const float* lse,
                                   const float* D, int T, int NH) {
    static_assert(HS == 64, "the swizzled tiles have 128-byte rows");
    constexpr int NTHREADS = NW * 32, BC = 16 * NW;
    extern __shared__ __align__(128) unsigned char fb_smem[];
    const uint32_t sK = mma::smem_u32(fb_smem), sV = sK + BC * 128;  // K_j, V_j (Bc, HS), read once into registers
    const uint32_t sQ = sV + BC * 128, sdO = sQ + 2 * FB_TILE;        // Q_i, dO_i (Br, HS), buffer b at + b * FB_TILE
    float* sL = reinterpret_cast<float*>(fb_smem + 2 * BC * 128 + 4 * FB_TILE);  // lse_i (Br) x 2 buffers
    float* sD = sL + 2 * FB_BR;                                                 // D_i (Br) x 2 buffers
    const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int j0 = blockIdx.x * BC;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wk0 = j0 + 16 * warp, key_g = wk0 + g;  // the warp's first key; key of fragment row g (g+8: +8)
    const bf16_t* qbase = qkv + (size_t)b * T * 3 * C + h * HS;
    const bf16_t* dobase = dout + (size_t)b * T * C + h * HS;
    const float* lse_h = lse + (size_t)bh * T;
    const float* D_h = D + (size_t)bh * T;
    const float sl2 = LOG2E / sqrtf((float)HS);
    const int i_first = j0 / FB_BR * FB_BR;  // causal: the first query tile holding a query >= j0
    const int n_tiles = ceil_div(T - i_first, FB_BR);
    const FbOffsets off(warp, lane);

    fb_load_tile<BC, NTHREADS>(sK, qbase + C, 3 * C, j0, T);
    fb_load_tile<BC, NTHREADS>(sV, qbase + 2 * C, 3 * C, j0, T);
    fb_load_tile<FB_BR, NTHREADS>(sQ, qbase, 3 * C, i_first, T);
    fb_load_tile<FB_BR, NTHREADS>(sdO, dobase, C, i_first, T);
    fb_load_vec<NTHREADS>(sL, lse_h, i_first, T);
    fb_load_vec<NTHREADS>(sD, D_h, i_first, T);
    mma::cp_async_commit();
    mma::cp_async_wait<0>();
    __syncthreads();  // K_j, V_j and the first Q_i, dO_i, lse_i, D_i tiles are in shared memory for every warp

    uint32_t ka[4][4], va[4][4];  // this warp's keys of K_j and V_j as A fragments, for the whole loop
    for (int kk = 0; kk < 4; kk++) {
        mma::ldmatrix_x4(ka[kk], sK + off.a[kk]);
        mma::ldmatrix_x4(va[kk], sV + off.a[kk]);
    }

    float dk[8][4] = {}, dv[8][4] = {};  // rows g (c0, c1) and g+8 (c2, c3), columns 8 dt + 2t
    for (int n = 0; n < n_tiles; n++) {
        const int i0 = i_first + n * FB_BR, buf = n & 1;
        if (n > 0) {
            mma::cp_async_wait<0>();  // this thread's copies of tile n have landed
            __syncthreads();          // ...and every thread's; every warp is also done with tile n-1, so the
                                      // other buffer may be refilled below
        }
        if (n + 1 < n_tiles) {
            const int nb = buf ^ 1, i1 = i0 + FB_BR;
            fb_load_tile<FB_BR, NTHREADS>(sQ + nb * FB_TILE, qbase, 3 * C, i1, T);
            fb_load_tile<FB_BR, NTHREADS>(sdO + nb * FB_TILE, dobase, C, i1, T);
            fb_load_vec<NTHREADS>(sL + nb * FB_BR, lse_h, i1, T);
            fb_load_vec<NTHREADS>(sD + nb * FB_BR, D_h, i1, T);
        }
        mma::cp_async_commit();
        if (i0 + FB_BR <= wk0) continue;  // every query of the tile is before every key of this warp: P = 0
                                          // (the warp still meets the barrier at the top of the next step)

        const uint32_t Qi = sQ + buf * FB_TILE, dOi = sdO + buf * FB_TILE;
        float st[8][4] = {}, dpt[8][4] = {};
        fb_mma_rows_n(st, ka, Qi, off);    // S^T = K_j Q_i^T   (rows keys, columns queries)
        fb_mma_rows_n(dpt, va, dOi, off);  // dP^T = V_j dO_i^T
        const bool diag = i0 < wk0 + 15;   // some query of the tile is before some key of the warp
        const float* Li = sL + buf * FB_BR;
        const float* Dv = sD + buf * FB_BR;
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const int c = 8 * nt + 2 * t;  // this thread's columns c, c+1 (queries i0 + c, i0 + c + 1)
            const float2 lv = *reinterpret_cast<const float2*>(Li + c);
            const float2 dv2 = *reinterpret_cast<const float2*>(Dv + c);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = fmaf(st[nt][e], sl2, -(e & 1 ? lv.y : lv.x) * LOG2E);
                if (diag && key_g + 8 * (e >> 1) > i0 + c + (e & 1)) x = -INFINITY;  // causal mask
                const float p = frag::fast_exp2(x);                                // P^T; 0 where masked
                st[nt][e] = p;
                dpt[nt][e] = p * (dpt[nt][e] - (e & 1 ? dv2.y : dv2.x));           // dS^T
            }
        }
        fb_mma_rows_k(dv, st, dOi, off);  // dV_j += P^T dO_i
        fb_mma_rows_k(dk, dpt, Qi, off);  // dK_j += dS^T Q_i
    }

    fb_store_dkdv(dqkv, dk, dv, key_g, T, b, h, NH, t, 1.0f / sqrtf((float)HS));
}

// ---------------------------------------------------------------------------------------------------------
// launch

template <int NW>
inline void attention_backward_flash_mma_dkdv(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const float* lse,
                                              const float* D, int B, int T, int NH, cudaStream_t stream) {
    auto kernel = attention_backward_flash_mma_dkdv_kernel<64, NW>;
    constexpr int smem = fb_dkdv_smem<NW>();
    allow_shared_memory(kernel, smem);
    dim3 grid(ceil_div(T, 16 * NW), B * NH);
    kernel<<<grid, NW * 32, smem, stream>>>(dqkv, dout, qkv, lse, D, T, NH);
    cudaCheckLaunch();
}

// dqkv (B,T,3,NH,HS) from dout, out (B,T,NH,HS), qkv and lse (B,NH,T); D (B,NH,T) fp32 is workspace (written
// by the first kernel, read by the second). dkdv_warps picks the dK/dV block (4: 64 keys, 8: 128 keys) for
// tuning; the trainer uses the default.
inline void attention_backward_flash_mma(bf16_t* dqkv, float* D, const bf16_t* dout, const bf16_t* qkv,
                                         const bf16_t* out, const float* lse, int B, int T, int NH, int HS,
                                         cudaStream_t stream, int dkdv_warps = FB_DKDV_WARPS) {
    if (HS != 64) fail("attention_backward_flash_mma: head size %d (only 64)", HS);
    if (!aligned16(qkv) || !aligned16(dout) || !aligned16(out) || !aligned16(dqkv))
        fail("attention_backward_flash_mma: qkv, dout, out and dqkv must be 16-byte aligned");
    if (B * NH > 65535) fail("attention_backward_flash_mma: B*NH = %d exceeds the grid's y limit 65535", B * NH);
    auto dq_kernel = attention_backward_flash_mma_dq_kernel<64>;
    allow_shared_memory(dq_kernel, FB_DQ_SMEM);
    dim3 grid_q(ceil_div(T, FB_BR), B * NH);
    dq_kernel<<<grid_q, FB_DQ_THREADS, FB_DQ_SMEM, stream>>>(dqkv, D, dout, out, qkv, lse, T, NH);
    cudaCheckLaunch();
    if (dkdv_warps == 4) attention_backward_flash_mma_dkdv<4>(dqkv, dout, qkv, lse, D, B, T, NH, stream);
    else if (dkdv_warps == 8) attention_backward_flash_mma_dkdv<8>(dqkv, dout, qkv, lse, D, B, T, NH, stream);
    else fail("attention_backward_flash_mma: dkdv_warps %d (4 or 8)", dkdv_warps);
}

}  // namespace flashgpt2
