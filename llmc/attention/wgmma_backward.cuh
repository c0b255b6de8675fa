// Flash attention backward on Hopper's warpgroup tensor cores (wgmma, sm_90a), head sizes 64 and 128: the BF16
// build's engine `wgmma`, the best flash backward on an H100/H200. It is mma_backward.cuh (read that first) with
// one change: every tile product is a wgmma instead of a warp's mma.sync loop. Same two kernels, same tiles
// (Br = Bc = 64), same cp.async double buffering into the same swizzled tiles, same register math for P, dP, dS,
// same result order per output element: deterministic, and at head size 64 the same bits as the mma.sync engine.
// Head size 128 changes only the products' width: a (64, 128) tile is two 128-byte swizzle panels, S and dP
// take 8 k-steps instead of 4, dQ, dK, dV are n = 128 wgmmas and twice the accumulator registers.
//
// What a wgmma changes (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"; FlashAttention-3,
// Shah et al. 2024, arXiv:2407.08608, uses these for its backward):
//   * one instruction per warpgroup (4 warps) computes a 64 x 64 x 16 product: the 4 warps' 16-row slices
//     of a 64-row tile, accumulators in exactly the layout the mma.sync version already has (warp w of the
//     group holds rows 16w..16w+15), so the softmax/dS code is unchanged;
//   * the B operand (and A, for S and dP) is read by the tensor cores straight from shared memory through a
//     descriptor: no ldmatrix, no B fragments in registers. Our software swizzle (chunk c of row r at
//     c ^ (r % 8)) is the hardware's 128-byte swizzle, given 1024-byte aligned tiles;
//   * it is asynchronous: issue, commit, wait. A tile written by cp.async (the generic proxy) must be made
//     visible to the tensor cores' reads (the async proxy) by fence.proxy.async before the barrier that
//     publishes it.
// The products, with their operands (K-major: the 16-wide k slice is contiguous in a tile row; MN-major:
// the tile's rows are k):
//   dQ kernel    S = Q_i K_j^T     A = Q_i (smem, K-major)   B = K_j (K-major)
//                dP = dO_i V_j^T   A = dO_i (smem)           B = V_j (K-major)
//                dQ_i += dS K_j    A = dS (registers)        B = K_j (MN-major)
//   dK/dV kernel (one warpgroup owns 64 keys)
//                S^T = K_j Q_i^T   A = K_j (smem; registers*)  B = Q_i (K-major)
//                dP^T = V_j dO_i^T A = V_j (smem; registers*)  B = dO_i (K-major)
//                dV_j += P^T dO_i  A = P^T (registers)       B = dO_i (MN-major)
//                dK_j += dS^T Q_i  A = dS^T (registers)      B = Q_i (MN-major)
// (* the warp-specialized kernel with a dQ warpgroup, head size 64: K_j, V_j stay in its 64 keys' registers.)
// Inside a step the second product of a pair runs while the registers of the first are worked on: dP (dP^T)
// is in flight while P (P^T) is computed, and dV while dS^T is.
//
// Registers and instructions decide the speed (doc/attention/backward/5_hopper_wgmma.md tells the measurements):
//   * at 3 blocks per SM the dK/dV kernel may use 168 registers; with lse and D loaded per step as
//     bounds-checked vectors ptxas serialized its wgmmas ("insufficient register resources"). So the dQ kernel
//     also writes lse·log2(e) and D per 64-query tile, 128 floats with zeros past T, which a dK/dV step copies
//     with one 4-byte cp.async per thread: no bounds checks, no pointers, the wgmmas overlap.
//   * only tiles crossing the diagonal take the masked path; fb_load_tile steps one address with no checks for
//     tiles inside T; a wgmma descriptor is computed once per tile and stepped by addition.
//   * the dQ kernel fits 4 blocks per SM: O_i, read once for D, is staged in K's second buffer.
//   * at head size 128 both kernels hold 2 blocks per SM (96 KB of tiles each), so the dK/dV kernel may use
//     255 registers: dK and dV take 128 of them.
// A warp-specialized dK/dV kernel (a TMA producer warp, two consumer warpgroups, a persistent grid) does not
// beat this one at head size 64, and does at 128: wgmma_backward_ws.cuh, which is also the engine's entry
// (attention_backward_flash_wgmma) and takes it there, after the warp-specialized dQ kernel of
// wgmma_backward_dq_ws.cuh (this file's dQ kernel is the engine's at head size 64). The grids here come in two
// orders (GridOrder): head by head (dev rung 5) and every head's heaviest blocks first (dev rung 9); at head size
// 64 the engine takes the second where the dK/dV grid is short (attention_backward_flash_wgmma_order).
#pragma once
#include <cstdint>
#include <type_traits>

#include "llmc/attention/common.cuh"
#include "llmc/attention/fragment.cuh"
#include "llmc/attention/schedule.h"
#include "llmc/attention/mma_backward.cuh"  // the tiles, their loads and the register math it shares
#include "llmc/error.h"
#include "llmc/ptx/hopper.cuh"
#include "llmc/ptx/mma_sync.cuh"

namespace flashgpt2 {

// Shared memory of the two kernels at head size HS; a (64, HS) tile is HS / 64 panels of FB_TILE bytes.
template <int HS>
constexpr int fbh_dq_smem() {  // Q_i, dO_i, K_j and V_j x 2 buffers (O_i in K's second) + alignment
    return 6 * (HS / 64) * FB_TILE + 1024;
}
template <int HS>
constexpr int fbh_dkdv_smem() {  // K_j, V_j, Q_i x 2, dO_i x 2, (lse, D) x 2, alignment
    return 6 * (HS / 64) * FB_TILE + 2 * 2 * FB_BR * 4 + 1024;
}
// Blocks per SM the two kernels are built for (their __launch_bounds__; the shared memory allows as many).
constexpr int fbh_dq_blocks_per_sm(int HS) { return HS == 64 ? 4 : 2; }
constexpr int fbh_dkdv_blocks_per_sm(int HS) { return HS == 64 ? 3 : 2; }

// The order of the two kernels' grids. head_major: grid (tiles, B·NH), one head's tiles after another, each
// head's heaviest tile first (dev rung 5). heaviest_first: a 1-D grid of tiles·B·NH blocks in schedule.h's
// order, balanced L2 sections (dev rung 9). Same blocks, same bits.
enum class GridOrder { head_major, heaviest_first };

namespace wgmma_backward {

namespace hp = flashgpt2::hopper;

// A block's work in a grid of order O with n tiles per head (a kernel of head size HS): its head, and the rank
// of its tile in the head, 0 the heaviest (dQ: the last query tile, dK/dV: the first key tile). Unsigned, as
// blockIdx is: head_major is then exactly the trainer's index arithmetic.
template <int HS>
__device__ __forceinline__ HeadTile heaviest_block(int n, int T) {
    const int BH = gridDim.x / n;
    return heaviest_first(blockIdx.x, n, BH, balanced_section_heads(BH, l2_section_heads(T, HS)));
}
template <GridOrder O, int HS>
__device__ __forceinline__ unsigned block_head(int n, int T) {
    if constexpr (O == GridOrder::head_major) return blockIdx.y;
    else return heaviest_block<HS>(n, T).bh;
}
template <GridOrder O, int HS>
__device__ __forceinline__ unsigned block_rank(int n, int T) {
    if constexpr (O == GridOrder::head_major) return blockIdx.x;
    else return heaviest_block<HS>(n, T).rank;
}
template <GridOrder O>
__device__ __forceinline__ unsigned tiles_per_head(int n) {  // the grid's own count where it has one
    if constexpr (O == GridOrder::head_major) return gridDim.x;
    else return n;
}

// Descriptors of a swizzled (64, 64) bf16 tile at `tile` (1024-byte aligned), as the B (or A) operand of
// the 16-wide k step kk:
//   K-major: k = tile columns 16kk..16kk+15, 32 bytes into each 128-byte row (the hardware applies the XOR);
//   MN-major: k = tile rows 16kk..16kk+15, 16 rows of 128 bytes further on.
// The descriptor's low 14 bits are the start address / 16 (shared memory is < 256 KB, so it never carries
// out): moving the start by 32 or 2048 bytes is adding 2 or 128 to the tile's descriptor, computed once.
// A tile of head size 128 is two such (64, 64) panels FB_TILE apart (fb_load_tile): K-major steps kk 4..7
// are in the second panel; MN-major, the descriptor's leading byte offset (64 x 128 bytes) is the step from
// one panel to the next along N, so one n = 128 wgmma reads both.
// (A plain 64-bit add: in these unrolled loops it compiles to 16-48 fewer instructions per kernel than
// hopper::smem_desc_plus.)
__device__ __forceinline__ uint64_t kmajor(uint32_t tile, int kk) {  // panel kk / 4, 32 (kk % 4) bytes into its rows
    return hp::smem_desc_sw128(tile + (kk / 4) * FB_TILE, 16, 1024) + 2 * (kk % 4);
}
__device__ __forceinline__ uint64_t mnmajor(uint32_t tile, int kk) {
    return hp::smem_desc_sw128(tile, 64 * 128, 1024) + 128 * kk;
}

// acc (64 x 64, this warpgroup) = A · B^T for A, B two (64, HS) tiles in shared memory (both K-major, k = HS).
template <int HS = 64>
__device__ __forceinline__ void gemm_ss(float (&acc)[8][4], uint32_t a_tile, uint32_t b_tile) {
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) hp::wgmma_ss<64>(acc, kmajor(a_tile, kk), kmajor(b_tile, kk), kk > 0);
}
// gemm_ss with A in registers: acc = A · B^T, A (64 x 64) as this warpgroup's bf16 A fragments `a`
// (k = its columns; ldmatrix'd from a K-major tile), B (64, 64) K-major in shared memory. Head size 64 only.
__device__ __forceinline__ void gemm_rs_kmajor(float (&acc)[8][4], const uint32_t (&a)[4][4], uint32_t b_tile) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) hp::wgmma_m64n64k16_rs<0>(acc, a[kk], kmajor(b_tile, kk), kk > 0);
}
// acc (64 x HS, HS = 8 NT) += X · tile, X = a (64 x 64) accumulator packed to bf16 A fragments `a` (k = X's
// columns), tile (64, HS) MN-major.
template <int NT>
__device__ __forceinline__ void gemm_rs(float (&acc)[NT][4], const uint32_t (&a)[4][4], uint32_t b_tile) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) hp::wgmma_rs<8 * NT>(acc, a[kk], mnmajor(b_tile, kk), 1);
}
__device__ __forceinline__ void to_a_frags(uint32_t (&a)[4][4], const float (&x)[8][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) acc_to_a_frag(a[kk], x[2 * kk], x[2 * kk + 1]);
}
// dS^T (this warp's 16 keys x 64 queries, as the bf16 A fragments dsa) -> the shared tile sdS, rows = keys,
// columns = queries, in the 128-byte swizzle (chunk c of row r at c ^ (r % 8): the 8 rows a warp's lanes
// write land in 8 different 16-byte chunks, no bank conflicts). What a fused dQ share, dS K_j, reads.
__device__ __forceinline__ void store_ds(uint32_t sdS, const uint32_t (&dsa)[4][4], int warp, int g, int t) {
    const int r = 16 * warp + g;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {  // dsa[kk]: rows r, r+8 x columns 16kk + 2t (+1) | 16kk + 8 + 2t (+1)
        const uint32_t c0 = mma::swz128(sdS, r, 2 * kk) + 4 * t, c1 = mma::swz128(sdS, r, 2 * kk + 1) + 4 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(c0), "r"(dsa[kk][0]) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(c0 + 8 * 128), "r"(dsa[kk][1]) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(c1), "r"(dsa[kk][2]) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(c1 + 8 * 128), "r"(dsa[kk][3]) : "memory");
    }
}

// This thread's cp.async copies have landed; make them visible to the tensor cores (the caller's barrier
// then publishes every thread's).
__device__ __forceinline__ void tiles_landed() {
    mma::cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The copies of a dK/dV block, in the layout of this file's dK/dV kernel (dev rungs 7 and 8 use it too): K_j,
// V_j resident; Q_i, dO_i and the tile's lse·log2(e), D in two buffers. Issued by all 128 threads with cp.async;
// the caller commits and waits.
template <int HS>
struct DkdvCopies {
    static constexpr int TILE = HS / 64 * FB_TILE;  // bytes of a (64, HS) tile
    uint32_t sK, sV, sQ, sdO, sL;  // tiles; buffer b of Q_i, dO_i at + b * TILE, of lse, D at + b * 2 Br floats
    const bf16_t* qbase;           // q of (b, t=0, h) in qkv (B, T, 3, NH, HS): k at + C, v at + 2C
    const bf16_t* dobase;          // dO of (b, t=0, h) in dout (B, T, NH, HS)
    const float* LD_h;             // this head's per-tile lse·log2(e), D (attention_backward_d_tiles)
    int C, T;
    // Q_i, dO_i of the query tile at i0 and its lse, D (128 floats, one 4-byte copy per thread) into buffer buf.
    __device__ __forceinline__ void query_tile(int buf, int i0) const {
        fb_load_tile<FB_BR, 128, HS>(sQ + buf * TILE, qbase, 3 * C, i0, T);
        fb_load_tile<FB_BR, 128, HS>(sdO + buf * TILE, dobase, C, i0, T);
        mma::cp_async_4(sL + buf * 2 * FB_BR * 4 + 4 * threadIdx.x, LD_h + (i0 / FB_BR) * 2 * FB_BR + threadIdx.x, 4);
    }
    // K_j, V_j of the 64 keys from j0, and the first query tile, at j0, into buffer 0.
    __device__ __forceinline__ void first(int j0) const {
        fb_load_tile<64, 128, HS>(sK, qbase + C, 3 * C, j0, T);
        fb_load_tile<64, 128, HS>(sV, qbase + 2 * C, 3 * C, j0, T);
        query_tile(0, j0);
    }
};

// One step of a dK/dV warpgroup: its 64 keys (rows of Kw, Vw; this thread's key_g, key_g + 8; its warp's
// first key wk0) against the query tile at i0 (Qi, dOi; lse·log2(e) and D of the tile's queries at L, 2 x 64
// floats); head size HS = 8 NT, the width of dK and dV. `meanwhile` runs while S^T and dP^T are on the tensor
// cores; `with_ds(dsa)`, given dS^T as bf16 A fragments, while dK runs (it may issue wgmmas of its own).
// Kw, Vw are the tiles' shared addresses, or (KA = uint32_t[4][4], head size 64) the warpgroup's A fragments
// of them, loaded once per item: then S^T and dP^T read only Q_i and dO_i from shared memory.
// Returns with every wgmma complete.
struct NoDs {
    __device__ void operator()(const uint32_t (&)[4][4]) const {}
};
template <int NT, class F, class G = NoDs, class KA = uint32_t>
__device__ __forceinline__ void dkdv_step(float (&dk)[NT][4], float (&dv)[NT][4], const KA& Kw, const KA& Vw,
                                          uint32_t Qi, uint32_t dOi, const float* L, int i0, int wk0, int key_g,
                                          int t, float sl2, F&& meanwhile, G&& with_ds = G{}) {
    float st[8][4], dpt[8][4];
    hp::wgmma_fence();
    if constexpr (std::is_same_v<KA, uint32_t>) gemm_ss<8 * NT>(st, Kw, Qi);  // S^T = K_j Q_i^T (rows keys,
    else gemm_rs_kmajor(st, Kw, Qi);                                           // columns queries)
    hp::wgmma_commit();
    if constexpr (std::is_same_v<KA, uint32_t>) gemm_ss<8 * NT>(dpt, Vw, dOi);  // dP^T = V_j dO_i^T, a second
    else gemm_rs_kmajor(dpt, Vw, dOi);                                           // group: running during P^T below
    hp::wgmma_commit();
    meanwhile();
    hp::wgmma_wait<1>();  // S^T is done
    hp::fence_regs(st);
    const auto p_t = [&](auto masked) {  // S^T -> P^T in place; the mask only where the tile crosses the diagonal
        constexpr bool MASK = decltype(masked)::value;
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const int c = 8 * nt + 2 * t;  // this thread's columns c, c+1 (queries i0 + c, i0 + c + 1)
            const float2 l2 = *reinterpret_cast<const float2*>(L + c);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = fmaf(st[nt][e], sl2, -(e & 1 ? l2.y : l2.x));
                if (MASK && key_g + 8 * (e >> 1) > i0 + c + (e & 1)) x = -INFINITY;  // causal mask
                st[nt][e] = frag::fast_exp2(x);                                       // P^T; 0 where masked
            }
        }
    };
    if (i0 < wk0 + 15) p_t(std::true_type{});  // some query of the tile is before some key of the warp
    else p_t(std::false_type{});
    uint32_t pa[4][4], dsa[4][4];
    to_a_frags(pa, st);
    hp::wgmma_fence();      // P^T fragments written by this thread before the wgmma reads them
    gemm_rs(dv, pa, dOi);   // dV_j += P^T dO_i: runs while dS^T is computed below
    hp::wgmma_commit();
    hp::wgmma_wait<1>();    // dP^T is done (groups complete in order; dV may still run)
    hp::fence_regs(dpt);
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        const float2 d2 = *reinterpret_cast<const float2*>(L + FB_BR + 8 * nt + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; e++) dpt[nt][e] = st[nt][e] * (dpt[nt][e] - (e & 1 ? d2.y : d2.x));  // dS^T
    }
    to_a_frags(dsa, dpt);
    hp::wgmma_fence();      // dS^T fragments written before the wgmma reads them
    gemm_rs(dk, dsa, Qi);   // dK_j += dS^T Q_i
    hp::wgmma_commit();
    with_ds(dsa);
    hp::wgmma_wait<0>();    // dV, dK (and with_ds's products) done: their registers may be read, the tiles refilled
    hp::fence_regs(dv);
    hp::fence_regs(dk);
}

}  // namespace wgmma_backward

// ---------------------------------------------------------------------------------------------------------
// dQ (and the per-tile lse, D): one block (one warpgroup) per 64 queries, heaviest (latest) query blocks
// first; 4 blocks per SM at HS 64, 2 at HS 128 (shared memory)

template <int HS, GridOrder O = GridOrder::head_major>
static __global__ void __launch_bounds__(FB_DQ_THREADS, fbh_dq_blocks_per_sm(HS))
    attention_backward_flash_wgmma_dq_kernel(bf16_t* dqkv, float* LD, const bf16_t* dout, const bf16_t* out,
                                        const bf16_t* qkv, const float* lse, int T, int NH) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    namespace hb = wgmma_backward;
    namespace hp = flashgpt2::hopper;
    static_assert(HS == 64 || HS == 128, "one or two 128-byte panels per row");
    constexpr int TILE = HS / 64 * FB_TILE;  // bytes of a (64, HS) tile
    extern __shared__ __align__(1024) unsigned char fbh_smem[];
    const uint32_t sQ = (mma::smem_u32(fbh_smem) + 1023) & ~1023u;  // the swizzle repeats every 1024 bytes
    const uint32_t sdO = sQ + TILE;                                 // Q_i, dO_i (Br, HS)
    const uint32_t sK = sdO + TILE, sV = sK + 2 * TILE;             // K_j, V_j (Bc, HS), buffer b at + b * TILE
    const uint32_t sO = sK + TILE;  // O_i (Br, HS), read once for D, in K's buffer 1 before K_1 lands there
    const int n_q = ceil_div(T, FB_BR);
    const int C = NH * HS, bh = hb::block_head<O, HS>(n_q, T), b = bh / NH, h = bh % NH;
    const int q0 = (hb::tiles_per_head<O>(n_q) - 1 - hb::block_rank<O, HS>(n_q, T)) * FB_BR;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_g = q0 + 16 * warp + g;
    const bf16_t* qbase = qkv + (size_t)b * T * 3 * C + h * HS;
    const size_t obase = (size_t)b * T * C + h * HS;
    const float sl2 = LOG2E / sqrtf((float)HS);
    const int n_tiles = ceil_div(min(q0 + FB_BR, T), FB_BC);
    const FbOffsets off(warp, lane);

    float l2[2], Di[2] = {0.0f, 0.0f};  // lse (log2 units) and D of rows g, g+8; rows >= T: 0
    fb_dq_prologue<FB_DQ_THREADS, HS>(l2, sQ, sdO, sO, sK, sV, qbase, dout + obase, out + obase,
                                      lse + (size_t)bh * T, C, q0, row_g, T);
    hb::tiles_landed();
    __syncthreads();  // Q_i, dO_i, O_i and K_0, V_0 are in shared memory, visible to every warp and to wgmma

    for (int kk = 0; kk < HS / 16; kk++) {  // D = rowsum(dO * O), at HS 64 exactly as the mma.sync kernel sums it
        uint32_t doa[4], oa[4];
        const uint32_t panel = (kk / 4) * FB_TILE;  // columns 16kk.. are in panel kk / 4
        mma::ldmatrix_x4(doa, sdO + panel + off.a[kk % 4]);
        mma::ldmatrix_x4(oa, sO + panel + off.a[kk % 4]);
        Di[0] += fb_dot2(doa[0], oa[0]) + fb_dot2(doa[2], oa[2]);
        Di[1] += fb_dot2(doa[1], oa[1]) + fb_dot2(doa[3], oa[3]);
    }
    fb_finish_D(Di);
    __syncthreads();  // every warp has read O_i: K_1 may land on it (the first step's copies)
    for (int r = 0; r < 2; r++)  // the tile's lse·log2(e) and D, all 64 rows (past T: 0 and 0), for the dK/dV kernel
        if (t == 0) {
            float* ld = LD + ((size_t)bh * hb::tiles_per_head<O>(n_q) + q0 / FB_BR) * 2 * FB_BR + row_g + 8 * r - q0;
            ld[0] = l2[r], ld[FB_BR] = Di[r];
        }

    float dq[HS / 8][4] = {};
    for (int j = 0; j < n_tiles; j++) {
        const uint32_t Kj = sK + (j & 1) * TILE, Vj = sV + (j & 1) * TILE;
        if (j > 0) {
            hb::tiles_landed();
            __syncthreads();  // K_j, V_j are visible to all; every wgmma of step j-1 has completed (each thread
                              // waited for its group), so the other buffer may be refilled below
        }
        if (j + 1 < n_tiles) {
            fb_load_tile<FB_BC, FB_DQ_THREADS, HS>(sK + ((j + 1) & 1) * TILE, qbase + C, 3 * C, (j + 1) * FB_BC, T);
            fb_load_tile<FB_BC, FB_DQ_THREADS, HS>(sV + ((j + 1) & 1) * TILE, qbase + 2 * C, 3 * C, (j + 1) * FB_BC, T);
        }
        mma::cp_async_commit();

        float s[8][4], dp[8][4];
        hp::wgmma_fence();
        hb::gemm_ss<HS>(s, sQ, Kj);    // S = Q_i K_j^T
        hp::wgmma_commit();
        hb::gemm_ss<HS>(dp, sdO, Vj);  // dP = dO_i V_j^T, a second group: still running during P below
        hp::wgmma_commit();
        const int j0 = j * FB_BC;
        hp::wgmma_wait<1>();  // S is done
        hp::fence_regs(s);
        const auto p = [&](auto masked) {  // S -> P in place; the mask only where the tile crosses the diagonal
            constexpr bool MASK = decltype(masked)::value;
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = fmaf(s[nt][e], sl2, -l2[e >> 1]);
                    if (MASK && j0 + 8 * nt + 2 * t + (e & 1) > row_g + 8 * (e >> 1)) x = -INFINITY;  // causal mask
                    s[nt][e] = frag::fast_exp2(x);  // P = exp(S scale - lse); 0 where masked
                }
        };
        if (j0 + FB_BC - 1 > q0 + 16 * warp) p(std::true_type{});  // some key of the tile is after some row of the warp
        else p(std::false_type{});
        hp::wgmma_wait<0>();  // dP is done
        hp::fence_regs(dp);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) dp[nt][e] = s[nt][e] * (dp[nt][e] - Di[e >> 1]);  // dS
        uint32_t dsa[4][4];
        hb::to_a_frags(dsa, dp);
        hp::wgmma_fence();  // dS fragments and dq written by this thread before the wgmma reads them
        hb::gemm_rs(dq, dsa, Kj);  // dQ_i += dS K_j
        hp::wgmma_commit();
        hp::wgmma_wait<0>();
        hp::fence_regs(dq);
    }

    fb_store_dq(dqkv, dq, row_g, T, b, h, NH, t, 1.0f / sqrtf((float)HS));
#else
    // no sm_90a code: launches are refused on the host
    (void)dqkv, (void)LD, (void)dout, (void)out, (void)qkv, (void)lse, (void)T, (void)NH;
#endif
}

// ---------------------------------------------------------------------------------------------------------
// dK, dV: one block (one warpgroup) per 64 keys, the first keys (which every query sees) first; 3 blocks per
// SM at HS 64 (168 registers a thread), 2 at HS 128 (shared memory; dK and dV alone are 128 registers). Q_i,
// dO_i and the tile's lse·log2(e), D come in with cp.async, double-buffered, one block barrier per step.

template <int HS, GridOrder O = GridOrder::head_major>
static __global__ void __launch_bounds__(128, fbh_dkdv_blocks_per_sm(HS))
    attention_backward_flash_wgmma_dkdv_kernel(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const float* LD,
                                          int T, int NH) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    namespace hb = wgmma_backward;
    static_assert(HS == 64 || HS == 128, "one or two 128-byte panels per row");
    constexpr int TILE = HS / 64 * FB_TILE;  // bytes of a (64, HS) tile
    extern __shared__ __align__(1024) unsigned char fbh_smem[];
    const uint32_t raw = mma::smem_u32(fbh_smem), sK = (raw + 1023) & ~1023u;
    const uint32_t sV = sK + TILE;                       // K_j, V_j (64 keys, HS), resident for the loop
    const uint32_t sQ = sV + TILE, sdO = sQ + 2 * TILE;  // Q_i, dO_i (Br, HS), buffer b at + b * TILE
    const uint32_t sL = sdO + 2 * TILE;                  // lse·log2(e), D of tile i (2, Br) x 2 buffers
    const int C = NH * HS, bh = hb::block_head<O, HS>(ceil_div(T, 64), T), b = bh / NH, h = bh % NH;
    const int j0 = hb::block_rank<O, HS>(ceil_div(T, 64), T) * 64, n_qt = ceil_div(T, FB_BR);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wk0 = j0 + 16 * warp, key_g = wk0 + g;
    const bf16_t* qbase = qkv + (size_t)b * T * 3 * C + h * HS;
    const bf16_t* dobase = dout + (size_t)b * T * C + h * HS;
    const float* LD_h = LD + (size_t)bh * n_qt * 2 * FB_BR;
    const float sl2 = LOG2E / sqrtf((float)HS);
    const int n_tiles = ceil_div(T - j0, FB_BR);  // query tiles from j0 on (j0 is a multiple of Br)
    const hb::DkdvCopies<HS> copies{sK, sV, sQ, sdO, sL, qbase, dobase, LD_h, C, T};

    copies.first(j0);
    mma::cp_async_commit();

    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    for (int n = 0; n < n_tiles; n++) {
        const int i0 = j0 + n * FB_BR, buf = n & 1;
        hb::tiles_landed();
        __syncthreads();  // tile n (and, at n = 0, K_j, V_j) is visible to every warp and to wgmma; every
                          // wgmma of tile n-1 has completed, so the other buffer may be refilled below
        if (n + 1 < n_tiles) copies.query_tile(buf ^ 1, i0 + FB_BR);
        mma::cp_async_commit();
        const float* L = reinterpret_cast<const float*>(fbh_smem + (sL - raw) + buf * 2 * FB_BR * 4);
        hb::dkdv_step(dk, dv, sK, sV, sQ + buf * TILE, sdO + buf * TILE, L, i0, wk0, key_g, t, sl2, [] {});
    }
    // heaviest_first: b and h come from divisions, which ptxas does not redo after the loop as it re-reads
    // blockIdx, and keeping them live through the loop spilled registers; the head's offset in dqkv is qbase's.
    if constexpr (O == GridOrder::head_major) fb_store_dkdv(dqkv, dk, dv, key_g, T, b, h, NH, t, 1.0f / sqrtf((float)HS));
    else fb_store_dkdv(dqkv + (qbase - qkv), dk, dv, key_g, T, 0, 0, NH, t, 1.0f / sqrtf((float)HS));
#else
    (void)dqkv, (void)dout, (void)qkv, (void)LD, (void)T, (void)NH;  // no sm_90a code: launches are refused
#endif
}

// ---------------------------------------------------------------------------------------------------------
// launch

// Can this engine's backward run here: an sm_90a build on an sm_90 device (asked once per process), head size
// 64 or 128.
inline bool attention_backward_flash_wgmma_supports(int HS) {
    return (HS == 64 || HS == 128) && hopper::sm90a_available();
}

// The grid of order O for n tiles per head.
template <GridOrder O>
dim3 attention_backward_wgmma_grid(int n, int BH) {
    return O == GridOrder::head_major ? dim3(n, BH) : dim3(n * BH);
}

// The two kernels, each on its own (the runner also times them apart), at head size HS (64 or 128; the caller
// checks), in grid order O. D is the workspace of attention_backward_d_floats(B, NH, T) floats; on this path
// only its per-tile part is used: the dQ kernel writes each 64-query tile's lse·log2(e) and D there, and the
// dK/dV kernel reads them.
template <GridOrder O = GridOrder::head_major>
void attention_backward_flash_wgmma_dq(bf16_t* dqkv, float* D, const bf16_t* dout, const bf16_t* qkv, const bf16_t* out,
                                       const float* lse, int B, int T, int NH, int HS, cudaStream_t stream) {
    const auto kernel = HS == 64 ? attention_backward_flash_wgmma_dq_kernel<64, O>
                                 : attention_backward_flash_wgmma_dq_kernel<128, O>;
    const int smem = HS == 64 ? fbh_dq_smem<64>() : fbh_dq_smem<128>();
    allow_shared_memory(kernel, smem);
    launch_dependent(kernel, attention_backward_wgmma_grid<O>(ceil_div(T, FB_BR), B * NH), FB_DQ_THREADS, smem, stream,
        dqkv, attention_backward_d_tiles(D, B, NH, T), dout, out, qkv, lse, T, NH);
}
template <GridOrder O = GridOrder::head_major>
void attention_backward_flash_wgmma_dkdv(bf16_t* dqkv, float* D, const bf16_t* dout, const bf16_t* qkv, int B, int T,
                                         int NH, int HS, cudaStream_t stream) {
    const auto kernel = HS == 64 ? attention_backward_flash_wgmma_dkdv_kernel<64, O>
                                 : attention_backward_flash_wgmma_dkdv_kernel<128, O>;
    const int smem = HS == 64 ? fbh_dkdv_smem<64>() : fbh_dkdv_smem<128>();
    allow_shared_memory(kernel, smem);
    launch_dependent(kernel, attention_backward_wgmma_grid<O>(ceil_div(T, 64), B * NH), 128, smem, stream,
        dqkv, dout, qkv, attention_backward_d_tiles(D, B, NH, T), T, NH);
}

// The checks of this engine's launches, and of the dev kernels built on it.
inline void attention_backward_flash_wgmma_check(const char* who, const bf16_t* dqkv, const bf16_t* dout,
                                                 const bf16_t* qkv, const bf16_t* out, int B, int NH, int HS) {
    if (!attention_backward_flash_wgmma_supports(HS))
        fail("%s: needs an sm_90a build on an H100/H200 and head size 64 or 128 (HS = %d)", who, HS);
    if (!aligned16(qkv) || !aligned16(dout) || !aligned16(out) || !aligned16(dqkv))
        fail("%s: qkv, dout, out and dqkv must be 16-byte aligned", who);
    if (B * NH > 65535) fail("%s: B*NH = %d exceeds the dQ grid's y limit 65535", who, B * NH);
}

// The engine's grid order: heaviest first where the dK/dV grid is short, under 16 waves of blocks (a wave: the
// blocks all SMs hold at once), since there one heavy block is a large part of what a place runs; head by head
// where it is longer, as there the two orders measured alike (rung 9's page has the measurements).
inline GridOrder attention_backward_flash_wgmma_order(int B, int T, int NH, int HS) {
    const long long blocks = (long long)ceil_div(T, 64) * B * NH, wave = (long long)fbh_dkdv_blocks_per_sm(HS) * sm_count();
    return blocks < 16 * wave ? GridOrder::heaviest_first : GridOrder::head_major;
}

// The two kernels in grid order O, after the checks.
template <GridOrder O>
void attention_backward_flash_wgmma_in(bf16_t* dqkv, float* D, const bf16_t* dout, const bf16_t* qkv, const bf16_t* out,
                                       const float* lse, int B, int T, int NH, int HS, cudaStream_t stream) {
    attention_backward_flash_wgmma_dq<O>(dqkv, D, dout, qkv, out, lse, B, T, NH, HS, stream);
    attention_backward_flash_wgmma_dkdv<O>(dqkv, D, dout, qkv, B, T, NH, HS, stream);
}

}  // namespace flashgpt2
