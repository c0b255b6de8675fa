// Flash attention backward on Hopper's warpgroup tensor cores (wgmma, sm_90a), head size 64: the BF16 build's
// attention backward on an H100/H200. It is attention_backward.cuh (read that first) with one change: every
// tile product is a wgmma instead of a warp's mma.sync loop. Same two kernels, same tiles (Br = Bc = 64), same
// cp.async double buffering into the same swizzled tiles, same register math for P, dP, dS, same result
// order per output element (so it is deterministic too).
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
//   dK/dV kernel (each warpgroup owns 64 keys of the block's Bc = 64 NWG)
//                S^T = K_j Q_i^T   A = K_j (smem)            B = Q_i (K-major)
//                dP^T = V_j dO_i^T A = V_j (smem)            B = dO_i (K-major)
//                dV_j += P^T dO_i  A = P^T (registers)       B = dO_i (MN-major)
//                dK_j += dS^T Q_i  A = dS^T (registers)      B = Q_i (MN-major)
// Inside a step the second product of a pair runs while the registers of the first are worked on: dP (dP^T)
// is in flight while P (P^T) is computed, and dV while dS^T is.
//
// Measured (NVIDIA H200, 2026-11-29 15:48 UTC, scripts/gpu.d/22 = `make bench-attention-bwd`, L2 flushed):
// 1.124 ms = 229 TFLOP/s at (64,12,1024,64), against 1.454 ms = 177 TFLOP/s for the mma.sync kernels (1.29x);
// cuDNN's backward in the same session (sdpa_bench.py): 257 TFLOP/s, so 0.89x cuDNN. Of the 1.09 ms one
// call takes with a warm L2, the dQ kernel is 0.41 and the dK/dV kernel 0.70 (each launch timed alone,
// 15:37 UTC): the dK/dV kernel does 4 of the 7 tile products but takes 63% of the time; that is where
// cuDNN's lead is.
// Still missing here, from FlashAttention-3: a producer warp with TMA and mbarriers instead of cp.async and
// block barriers, so that warpgroups drift apart and one's exps overlap another's wgmmas.
#pragma once
#include <cstdint>

#include "llmc/attention_backward.cuh"
#include "llmc/attention_hopper.cuh"
#include "llmc/hopper_ptx.cuh"

namespace flashgpt2 {

// The default dK/dV block: 1 warpgroup (64 keys), 3 blocks per SM. Measured against 2 warpgroups (128 keys,
// one block per SM; `runner bwd` times both, 15:48 UTC): 1.124 vs 1.181 ms at (64,12,1024,64), 0.304 vs
// 0.317 at (16,12,1024,64). At 3 blocks per SM the register cap is 168, and ptxas says so ("wgmma.mma_async
// instructions are serialized due to insufficient register resources"); measured, it is still the faster.
constexpr int FBH_DKDV_WGS = 1;

template <int NWG>
constexpr int fbh_dkdv_smem() {  // K_j, V_j (64 NWG rows each) + Q_i, dO_i x 2 + lse_i, D_i x 2 + alignment room
    return 2 * 64 * NWG * 128 + 4 * FB_TILE + 4 * FB_BR * (int)sizeof(float) + 1024;
}
constexpr int FBH_DQ_SMEM = FB_DQ_SMEM + 1024;  // the mma.sync dQ kernel's tiles + alignment room

namespace hopper_backward {

namespace hp = flashgpt2::hopper;

// Descriptors of a swizzled (64, 64) bf16 tile at `tile` (1024-byte aligned), as the B (or A) operand of
// the 16-wide k step kk:
//   K-major: k = tile columns 16kk..16kk+15, 32 bytes into each 128-byte row (the hardware applies the XOR);
//   MN-major: k = tile rows 16kk..16kk+15, 16 rows of 128 bytes further on.
__device__ __forceinline__ uint64_t kmajor(uint32_t tile, int kk) {
    return hp::smem_desc_sw128(tile + 32 * kk, 16, 1024);
}
__device__ __forceinline__ uint64_t mnmajor(uint32_t tile, int kk) {
    return hp::smem_desc_sw128(tile + kk * 16 * 128, 64 * 128, 1024);
}

// acc (64 x 64, this warpgroup) = A · B^T for A, B two (64, 64) tiles in shared memory (both K-major).
__device__ __forceinline__ void gemm_ss(float (&acc)[8][4], uint32_t a_tile, uint32_t b_tile) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) hp::wgmma_ss<64>(acc, kmajor(a_tile, kk), kmajor(b_tile, kk), kk > 0);
}
// acc (64 x 64) += X · tile, X = the (64 x 64) accumulator x packed to bf16 A fragments `a` (k = X's columns).
__device__ __forceinline__ void gemm_rs(float (&acc)[8][4], const uint32_t (&a)[4][4], uint32_t b_tile) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) hp::wgmma_rs<64>(acc, a[kk], mnmajor(b_tile, kk), 1);
}
__device__ __forceinline__ void to_a_frags(uint32_t (&a)[4][4], const float (&x)[8][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) acc_to_a_frag(a[kk], x[2 * kk], x[2 * kk + 1]);
}
// This thread's cp.async copies have landed; make them visible to the tensor cores (the caller's barrier
// then publishes every thread's).
__device__ __forceinline__ void tiles_landed() {
    mma::cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace hopper_backward

// ---------------------------------------------------------------------------------------------------------
// dQ (and D): one block (one warpgroup) per 64 queries, heaviest (latest) query blocks first

static __global__ void __launch_bounds__(FB_DQ_THREADS, 2)
    attention_backward_dq_hopper_kernel(bf16_t* dqkv, float* D, const bf16_t* dout, const bf16_t* out,
                                        const bf16_t* qkv, const float* lse, int T, int NH) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    namespace hb = hopper_backward;
    namespace hp = flashgpt2::hopper;
    constexpr int HS = 64;
    extern __shared__ __align__(1024) unsigned char fbh_smem[];
    const uint32_t sQ = (mma::smem_u32(fbh_smem) + 1023) & ~1023u;  // the swizzle repeats every 1024 bytes
    const uint32_t sdO = sQ + FB_TILE, sO = sdO + FB_TILE;          // Q_i, dO_i, O_i (Br, HS)
    const uint32_t sK = sO + FB_TILE, sV = sK + 2 * FB_TILE;        // K_j, V_j (Bc, HS), buffer b at + b * FB_TILE
    const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FB_BR;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_g = q0 + 16 * warp + g;
    const bf16_t* qbase = qkv + (size_t)b * T * 3 * C + h * HS;
    const size_t obase = (size_t)b * T * C + h * HS;
    const float sl2 = LOG2E / sqrtf((float)HS);
    const int n_tiles = ceil_div(min(q0 + FB_BR, T), FB_BC);
    const FbOffsets off(warp, lane);

    fb_load_tile<FB_BR, FB_DQ_THREADS>(sQ, qbase, 3 * C, q0, T);
    fb_load_tile<FB_BR, FB_DQ_THREADS>(sdO, dout + obase, C, q0, T);
    fb_load_tile<FB_BR, FB_DQ_THREADS>(sO, out + obase, C, q0, T);
    fb_load_tile<FB_BC, FB_DQ_THREADS>(sK, qbase + C, 3 * C, 0, T);
    fb_load_tile<FB_BC, FB_DQ_THREADS>(sV, qbase + 2 * C, 3 * C, 0, T);
    mma::cp_async_commit();
    float l2[2], Di[2] = {0.0f, 0.0f};
    for (int r = 0; r < 2; r++) l2[r] = row_g + 8 * r < T ? lse[(size_t)bh * T + row_g + 8 * r] * LOG2E : 0.0f;
    hb::tiles_landed();
    __syncthreads();  // Q_i, dO_i, O_i and K_0, V_0 are in shared memory, visible to every warp and to wgmma

    for (int kk = 0; kk < 4; kk++) {  // D = rowsum(dO * O), exactly as the mma.sync kernel sums it
        uint32_t doa[4], oa[4];
        mma::ldmatrix_x4(doa, sdO + off.a[kk]);
        mma::ldmatrix_x4(oa, sO + off.a[kk]);
        Di[0] += fb_dot2(doa[0], oa[0]) + fb_dot2(doa[2], oa[2]);
        Di[1] += fb_dot2(doa[1], oa[1]) + fb_dot2(doa[3], oa[3]);
    }
    for (int r = 0; r < 2; r++) {
        Di[r] += __shfl_xor_sync(0xffffffffu, Di[r], 1);
        Di[r] += __shfl_xor_sync(0xffffffffu, Di[r], 2);
        if (t == 0 && row_g + 8 * r < T) D[(size_t)bh * T + row_g + 8 * r] = Di[r];
    }

    float dq[8][4] = {};
    for (int j = 0; j < n_tiles; j++) {
        const uint32_t Kj = sK + (j & 1) * FB_TILE, Vj = sV + (j & 1) * FB_TILE;
        if (j > 0) {
            hb::tiles_landed();
            __syncthreads();  // K_j, V_j are visible to all; every wgmma of step j-1 has completed (each thread
                              // waited for its group), so the other buffer may be refilled below
        }
        if (j + 1 < n_tiles) {
            fb_load_tile<FB_BC, FB_DQ_THREADS>(sK + ((j + 1) & 1) * FB_TILE, qbase + C, 3 * C, (j + 1) * FB_BC, T);
            fb_load_tile<FB_BC, FB_DQ_THREADS>(sV + ((j + 1) & 1) * FB_TILE, qbase + 2 * C, 3 * C, (j + 1) * FB_BC, T);
        }
        mma::cp_async_commit();

        float s[8][4], dp[8][4];
        hp::wgmma_fence();
        hb::gemm_ss(s, sQ, Kj);    // S = Q_i K_j^T
        hp::wgmma_commit();
        hb::gemm_ss(dp, sdO, Vj);  // dP = dO_i V_j^T, a second group: still running during P below
        hp::wgmma_commit();
        const int j0 = j * FB_BC;
        const bool diag = j0 + FB_BC - 1 > q0 + 16 * warp;  // some key of the tile is after some row of the warp
        hp::wgmma_wait<1>();  // S is done
        hp::fence_regs(s);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = fmaf(s[nt][e], sl2, -l2[e >> 1]);
                if (diag && j0 + 8 * nt + 2 * t + (e & 1) > row_g + 8 * (e >> 1)) x = -INFINITY;  // causal mask
                s[nt][e] = frag::fast_exp2(x);  // P = exp(S scale - lse); 0 where masked
            }
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

    const float scale = 1.0f / sqrtf((float)HS);
    for (int r = 0; r < 2; r++) {
        const int qi = row_g + 8 * r;
        if (qi >= T) continue;
        bf16_t* row = dqkv + ((size_t)b * T + qi) * 3 * C + h * HS;
        for (int dt = 0; dt < 8; dt++)
            *reinterpret_cast<uint32_t*>(row + 8 * dt + 2 * t) = pack_bf16(dq[dt][2 * r] * scale, dq[dt][2 * r + 1] * scale);
    }
#else
    // no sm_90a code: launches are refused on the host
    (void)dqkv, (void)D, (void)dout, (void)out, (void)qkv, (void)lse, (void)T, (void)NH;
#endif
}

// ---------------------------------------------------------------------------------------------------------
// dK, dV: one block per 64 NWG keys, warpgroup w owns keys 64w..64w+63 (rows = keys), first keys first

template <int NWG>
__global__ void __launch_bounds__(128 * NWG, NWG == 1 ? 3 : 1)
    attention_backward_dkdv_hopper_kernel(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const float* lse,
                                          const float* D, int T, int NH) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    namespace hb = hopper_backward;
    namespace hp = flashgpt2::hopper;
    constexpr int HS = 64, NTHREADS = 128 * NWG, BC = 64 * NWG;
    extern __shared__ __align__(1024) unsigned char fbh_smem[];
    const uint32_t raw = mma::smem_u32(fbh_smem), sK = (raw + 1023) & ~1023u;
    const uint32_t sV = sK + BC * 128;                         // K_j, V_j (Bc, HS), resident for the whole loop
    const uint32_t sQ = sV + BC * 128, sdO = sQ + 2 * FB_TILE;  // Q_i, dO_i (Br, HS), buffer b at + b * FB_TILE
    float* sL = reinterpret_cast<float*>(fbh_smem + (sK - raw) + 2 * BC * 128 + 4 * FB_TILE);  // lse_i (Br) x 2
    float* sD = sL + 2 * FB_BR;                                                            // D_i (Br) x 2
    const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int j0 = blockIdx.x * BC;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wg = warp / 4, wg_k0 = j0 + 64 * wg;    // this warpgroup's first key
    const int wk0 = wg_k0 + 16 * (warp % 4), key_g = wk0 + g;
    const uint32_t Kw = sK + wg * FB_TILE, Vw = sV + wg * FB_TILE;  // the warpgroup's 64 keys of K_j, V_j
    const bf16_t* qbase = qkv + (size_t)b * T * 3 * C + h * HS;
    const bf16_t* dobase = dout + (size_t)b * T * C + h * HS;
    const float* lse_h = lse + (size_t)bh * T;
    const float* D_h = D + (size_t)bh * T;
    const float sl2 = LOG2E / sqrtf((float)HS);
    const int i_first = j0 / FB_BR * FB_BR;
    const int n_tiles = ceil_div(T - i_first, FB_BR);

    fb_load_tile<BC, NTHREADS>(sK, qbase + C, 3 * C, j0, T);
    fb_load_tile<BC, NTHREADS>(sV, qbase + 2 * C, 3 * C, j0, T);
    fb_load_tile<FB_BR, NTHREADS>(sQ, qbase, 3 * C, i_first, T);
    fb_load_tile<FB_BR, NTHREADS>(sdO, dobase, C, i_first, T);
    fb_load_vec<NTHREADS>(sL, lse_h, i_first, T);
    fb_load_vec<NTHREADS>(sD, D_h, i_first, T);
    mma::cp_async_commit();

    float dk[8][4] = {}, dv[8][4] = {};
    for (int n = 0; n < n_tiles; n++) {
        const int i0 = i_first + n * FB_BR, buf = n & 1;
        hb::tiles_landed();
        __syncthreads();  // tile n (and, at n = 0, K_j, V_j) is visible to every warp and to wgmma; every
                          // wgmma of tile n-1 has completed, so the other buffer may be refilled below
        if (n + 1 < n_tiles) {
            const int nb = buf ^ 1, i1 = i0 + FB_BR;
            fb_load_tile<FB_BR, NTHREADS>(sQ + nb * FB_TILE, qbase, 3 * C, i1, T);
            fb_load_tile<FB_BR, NTHREADS>(sdO + nb * FB_TILE, dobase, C, i1, T);
            fb_load_vec<NTHREADS>(sL + nb * FB_BR, lse_h, i1, T);
            fb_load_vec<NTHREADS>(sD + nb * FB_BR, D_h, i1, T);
        }
        mma::cp_async_commit();
        if (i0 + FB_BR <= wg_k0) continue;  // every query of the tile is before every key of this warpgroup
                                            // (the same for its 4 warps, as a wgmma needs)

        const uint32_t Qi = sQ + buf * FB_TILE, dOi = sdO + buf * FB_TILE;
        float st[8][4], dpt[8][4];
        hp::wgmma_fence();
        hb::gemm_ss(st, Kw, Qi);    // S^T = K_j Q_i^T   (rows keys, columns queries)
        hp::wgmma_commit();
        hb::gemm_ss(dpt, Vw, dOi);  // dP^T = V_j dO_i^T, a second group: still running during P^T below
        hp::wgmma_commit();
        const bool diag = i0 < wk0 + 15;
        const float* Li = sL + buf * FB_BR;
        const float* Dv = sD + buf * FB_BR;
        hp::wgmma_wait<1>();  // S^T is done
        hp::fence_regs(st);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const int c = 8 * nt + 2 * t;  // this thread's columns c, c+1 (queries i0 + c, i0 + c + 1)
            const float2 lv = *reinterpret_cast<const float2*>(Li + c);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = fmaf(st[nt][e], sl2, -(e & 1 ? lv.y : lv.x) * LOG2E);
                if (diag && key_g + 8 * (e >> 1) > i0 + c + (e & 1)) x = -INFINITY;  // causal mask
                st[nt][e] = frag::fast_exp2(x);                                    // P^T; 0 where masked
            }
        }
        uint32_t pa[4][4], dsa[4][4];
        hb::to_a_frags(pa, st);
        hp::wgmma_fence();         // P^T fragments written by this thread before the wgmma reads them
        hb::gemm_rs(dv, pa, dOi);  // dV_j += P^T dO_i: runs while dS^T is computed below
        hp::wgmma_commit();
        hp::wgmma_wait<1>();       // dP^T is done (groups complete in order; dV may still run)
        hp::fence_regs(dpt);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const float2 dv2 = *reinterpret_cast<const float2*>(Dv + 8 * nt + 2 * t);
#pragma unroll
            for (int e = 0; e < 4; e++) dpt[nt][e] = st[nt][e] * (dpt[nt][e] - (e & 1 ? dv2.y : dv2.x));  // dS^T
        }
        hb::to_a_frags(dsa, dpt);
        hp::wgmma_fence();         // dS^T fragments written before the wgmma reads them
        hb::gemm_rs(dk, dsa, Qi);  // dK_j += dS^T Q_i
        hp::wgmma_commit();
        hp::wgmma_wait<0>();       // dV and dK done: their registers may be read, the tiles refilled
        hp::fence_regs(dv);
        hp::fence_regs(dk);
    }

    const float scale = 1.0f / sqrtf((float)HS);
    for (int r = 0; r < 2; r++) {
        const int kj = key_g + 8 * r;
        if (kj >= T) continue;
        bf16_t* row = dqkv + ((size_t)b * T + kj) * 3 * C + h * HS;
        for (int dt = 0; dt < 8; dt++) {
            *reinterpret_cast<uint32_t*>(row + C + 8 * dt + 2 * t) = pack_bf16(dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
            *reinterpret_cast<uint32_t*>(row + 2 * C + 8 * dt + 2 * t) = pack_bf16(dv[dt][2 * r], dv[dt][2 * r + 1]);
        }
    }
#else
    (void)dqkv, (void)dout, (void)qkv, (void)lse, (void)D, (void)T, (void)NH;  // no sm_90a code (see above)
#endif
}

// ---------------------------------------------------------------------------------------------------------
// launch

// Can it run here: an sm_90a build on an sm_90 device (asked once per process), head size 64.
inline bool attention_backward_hopper_supports(int HS) { return HS == 64 && hopper_attention::have_sm90a(); }

template <int NWG>
inline void attention_backward_dkdv_hopper_launch(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                                  const float* lse, const float* D, int B, int T, int NH,
                                                  cudaStream_t stream) {
    auto kernel = attention_backward_dkdv_hopper_kernel<NWG>;
    constexpr int smem = fbh_dkdv_smem<NWG>();
    allow_shared_memory(kernel, smem);
    kernel<<<dim3(ceil_div(T, 64 * NWG), B * NH), 128 * NWG, smem, stream>>>(dqkv, dout, qkv, lse, D, T, NH);
    cudaCheckLaunch();
}

// The same interface as attention_backward_flash_mma; dkdv_wgs picks the dK/dV block (1: 64 keys, 2: 128).
inline void attention_backward_flash_hopper(floatX* dqkv, float* D, const floatX* dout, const floatX* qkv,
                                            const floatX* out, const float* lse, int B, int T, int NH, int HS,
                                            cudaStream_t stream, int dkdv_wgs = FBH_DKDV_WGS) {
    if (!attention_backward_hopper_supports(HS))
        fail("attention_backward_flash_hopper: needs an sm_90a build on an H100/H200 and head size 64 (HS = %d)", HS);
    if (!aligned16(qkv) || !aligned16(dout) || !aligned16(out) || !aligned16(dqkv))
        fail("attention_backward_flash_hopper: qkv, dout, out and dqkv must be 16-byte aligned");
    if (B * NH > 65535) fail("attention_backward_flash_hopper: B*NH = %d exceeds the grid's y limit 65535", B * NH);
    allow_shared_memory(attention_backward_dq_hopper_kernel, FBH_DQ_SMEM);
    attention_backward_dq_hopper_kernel<<<dim3(ceil_div(T, FB_BR), B * NH), FB_DQ_THREADS, FBH_DQ_SMEM, stream>>>(
        dqkv, D, dout, out, qkv, lse, T, NH);
    cudaCheckLaunch();
    if (dkdv_wgs == 1) attention_backward_dkdv_hopper_launch<1>(dqkv, dout, qkv, lse, D, B, T, NH, stream);
    else if (dkdv_wgs == 2) attention_backward_dkdv_hopper_launch<2>(dqkv, dout, qkv, lse, D, B, T, NH, stream);
    else fail("attention_backward_flash_hopper: dkdv_wgs %d (1 or 2)", dkdv_wgs);
}

}  // namespace flashgpt2
