// Backward rung 7 — dQ fused into the dK/dV kernel, added in a fixed order: five tile products instead of seven.
//
// The idea (FlashAttention-2, Dao 2023, §3.2, and FlashAttention-3's deterministic backward, Shah et al. 2024,
// arXiv:2407.08608, §3.3 and App. B): rung 5's dQ kernel rebuilds S and dP for every (Q_i, K_j) pair that its
// dK/dV kernel has already built, so each pair costs 7 tile products (S^T, dP^T, dV, dK there; S, dP, dQ here).
// The dK/dV kernel already holds dS_ij; one more product, dS_ij K_j, is block j's share of dQ_i. The blocks of
// different j must then add into the same dQ_i: with atomics in whatever order they arrive, the sum (and the
// trainer's bits) would change from run to run. So the adds are put in one fixed order with a counter per
// query tile: dQ_i = (((dS_ii K_i + dS_i,i-1 K_i-1) + ...) + dS_i0 K_0), fp32, the diagonal block first.
//
// Why that order: key block j visits query tiles j, j+1, ... in its steps 0, 1, ...; block j+1 visits tile i one
// step earlier than block j does. Blocks launched in the order "last key tile first" (within a head) each wait
// for a neighbour that is one step ahead, so in principle the wait is short (its page measures what it costs);
// a block only ever waits for one launched before it, so it cannot wait for a block that has no SM. (The other order, j = 0 first, makes
// block j wait for block j-1 one step behind it: every block would sit resident for the whole head's time.)
//
// What changed from rung 5:
//   * a pre-pass kernel writes each 64-query tile's lse·log2(e) and D = rowsum(dO∘O) (rung 5's dQ kernel did)
//     and zeroes the tile's counter;
//   * each dK/dV step stores dS^T (bf16) to shared memory and issues dQ_i += dS K_j (A = dS^T read transposed,
//     B = K_j, both MN-major) while dK runs; then the step's 64×64 fp32 partial goes to a per-tile fp32
//     accumulator in HBM: the first contributor (the diagonal block) stores it, the next ones add it with
//     16-byte red instructions, and block 0, the last, reads the sum, adds its own and writes dQ as bf16;
//   * blocks are launched last key tile first (light ones first).
// Costs that rung 5 did not have: per step one more barrier, the counter's wait, 16 KB of fp32 adds at the L2;
// per call an fp32 accumulator of B·NH·T·HS floats (the workspace) and the pre-pass.
// What is still slow: it is slower than rung 5 at every shape. Taking the step apart (its page): the two
// saved products are worth what they should be, but the adds at the L2 and the wait for the neighbour's turn
// each cost about as much again. FlashAttention-3 pays for the adds over 128 x 128 tiles (half the bytes
// per product) with a warp of their own; that needs two consumer warpgroups per block, which rung 6 shows
// our kernel does not yet run well. Rung 8 tries summing on chip first.
// Measured: the "Measured" block of doc/attention/backward/7_fused_dq.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 7
#pragma once
#include "dev/attention/attention.cuh"
#include "llmc/attention/wgmma_backward.cuh"

namespace flashgpt2 {

namespace fused_dq {

// The workspace, carved in this order: the per-tile lse·log2(e), D (rung 5's layout, after D's per-row part,
// which this rung leaves unused), the fp32 dQ accumulator (one 64×64 tile per (head, query tile), in the order
// the accumulator registers come: float4 v of thread x of step-tile nt at (nt·128 + x)·4), the counters.
inline size_t accum_floats(int B, int NH, int T) { return (size_t)B * NH * ceil_div(T, FB_BR) * FB_BR * 64; }
inline size_t workspace_bytes(int B, int NH, int T) {
    return (attention_backward_d_floats(B, NH, T) + accum_floats(B, NH, T)) * sizeof(float) +
           (size_t)B * NH * ceil_div(T, FB_BR) * sizeof(uint32_t);
}
struct Workspace {
    float* LD;        // (B, NH, T/64, 2, 64) lse·log2(e), D per query tile
    float* acc;       // (B, NH, T/64, 64 x 64) fp32 dQ accumulators
    uint32_t* count;  // (B, NH, T/64) key blocks (rung 8: clusters) that have added to dQ_i
};
inline Workspace carve(void* ws, int B, int NH, int T) {
    float* D = static_cast<float*>(ws);
    float* acc = D + attention_backward_d_floats(B, NH, T);
    return {attention_backward_d_tiles(D, B, NH, T), acc, reinterpret_cast<uint32_t*>(acc + accum_floats(B, NH, T))};
}

// The shared memory of a rung 7 / 8 block from the 1024-byte aligned base (the swizzle repeats every 1024 bytes).
struct Tiles {
    uint32_t sK, sV;   // K_j, V_j (64 keys, HS), resident for the loop
    uint32_t sQ, sdO;  // Q_i, dO_i (Br, HS), buffer b at + b * FB_TILE
    uint32_t sdS;      // dS^T (64 keys, Br queries), bf16
    uint32_t sL;       // lse·log2(e), D of tile i (2, Br) x 2 buffers
    uint32_t end;      // the first byte after them
    __device__ explicit Tiles(uint32_t raw)
        : sK((raw + 1023) & ~1023u), sV(sK + FB_TILE), sQ(sV + FB_TILE), sdO(sQ + 2 * FB_TILE),
          sdS(sdO + 2 * FB_TILE), sL(sdS + FB_TILE), end(sL + 2 * 2 * FB_BR * 4) {}
};

// acc (64 queries x 64) = dS · K_j with dS^T at ds_tile (rows keys) and K_j at k_tile (rows keys): both MN-major.
__device__ __forceinline__ void gemm_dq(float (&acc)[8][4], uint32_t ds_tile, uint32_t k_tile) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        hopper::wgmma_m64n64k16_ss<1>(acc, wgmma_backward::mnmajor(ds_tile, kk), wgmma_backward::mnmajor(k_tile, kk),
                                      kk > 0);
}

// This block's share of dQ_i, dq = dS K_j, issued and committed as a wgmma group (dkdv_step's final wait covers
// it): dS^T to shared memory, then, once thread 0 has seen the tile's counter reach `need` (its turn: that many
// contributors have added before it; no wait when need is 0), the product. Called by all 128 threads.
__device__ __forceinline__ void issue_share(float (&dq)[8][4], const uint32_t (&dsa)[4][4], const Tiles& s,
                                            const uint32_t* counter, uint32_t need, int warp, int g, int t) {
    wgmma_backward::store_ds(s.sdS, dsa, warp, g, t);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // for the wgmma's reads
    if (threadIdx.x == 0 && need > 0)
        while (hopper::ld_acquire_gpu(counter) < need) {}
    __syncthreads();  // dS^T is whole in shared memory; our turn at dQ_i has come
    hopper::wgmma_fence();
    gemm_dq(dq, s.sdS, s.sK);  // dQ_i share = dS K_j
    hopper::wgmma_commit();
}

// A share dq of dQ_i (this thread's accumulator rows: queries row_g, row_g + 8) into the tile's fp32
// accumulator, whose float4 nt of this thread is at acc + 512 nt, in the fixed order: the first contributor
// stores it, the next ones add it, and the last adds the sum so far to it and writes dQ_i as bf16.
__device__ __forceinline__ void add_share(float (&dq)[8][4], float* acc, bool first, bool last, bf16_t* dqkv,
                                          int row_g, int T, int b, int h, int NH, int t) {
    if (last) {
        if (!first)
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                const float4 s = __ldcg(reinterpret_cast<const float4*>(acc + nt * 512));
                dq[nt][0] = s.x + dq[nt][0], dq[nt][1] = s.y + dq[nt][1];
                dq[nt][2] = s.z + dq[nt][2], dq[nt][3] = s.w + dq[nt][3];
            }
        fb_store_dq(dqkv, dq, row_g, T, b, h, NH, t, 1.0f / sqrtf(64.0f));
        return;
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        const float4 v = make_float4(dq[nt][0], dq[nt][1], dq[nt][2], dq[nt][3]);
        if (first) __stcg(reinterpret_cast<float4*>(acc + nt * 512), v);
        else hopper::red_add_v4(acc + nt * 512, v);
    }
}

}  // namespace fused_dq

// ---------------------------------------------------------------------------------------------------------
// Pre-pass: per 64-query tile i of head bh, lse_i·log2(e) and D_i = rowsum(dO_i ∘ O_i) (zeros past T) into
// LD's tile, and the tile's counter set to 0 (no block has added to dQ_i yet). Two threads per row.
static __global__ void __launch_bounds__(128)
    attention_backward_fused_dq_pre_kernel(float* LD, uint32_t* count, const bf16_t* dout, const bf16_t* out,
                                           const float* lse, int T, int NH) {
    const int C = NH * 64, bh = blockIdx.y, b = bh / NH, h = bh % NH, it = blockIdx.x;
    const int r = threadIdx.x / 2, half = threadIdx.x % 2, q = it * FB_BR + r;
    float d = 0.0f;
    if (q < T) {
        const uint4* o = reinterpret_cast<const uint4*>(out + ((size_t)b * T + q) * C + h * 64 + 32 * half);
        const uint4* g = reinterpret_cast<const uint4*>(dout + ((size_t)b * T + q) * C + h * 64 + 32 * half);
        for (int v = 0; v < 4; v++) {
            const uint4 x = o[v], y = g[v];
            d += fb_dot2(x.x, y.x) + fb_dot2(x.y, y.y) + fb_dot2(x.z, y.z) + fb_dot2(x.w, y.w);
        }
    }
    d += __shfl_xor_sync(0xffffffffu, d, 1);  // the row's two halves, the same sum in both lanes
    float* ld = LD + ((size_t)bh * gridDim.x + it) * 2 * FB_BR;
    if (half == 0) {
        ld[r] = q < T ? lse[(size_t)bh * T + q] * LOG2E : 0.0f;
        ld[FB_BR + r] = d;
    }
    if (threadIdx.x == 0) count[(size_t)bh * gridDim.x + it] = 0;
}

// ---------------------------------------------------------------------------------------------------------
// dK, dV and dQ: one block (one warpgroup) per 64 keys, 3 blocks per SM, a head's last key tile first.

static __global__ void __launch_bounds__(128, 3)
    attention_backward_fused_dq_kernel(bf16_t* dqkv, float* dq_acc, uint32_t* count, const bf16_t* dout,
                                       const bf16_t* qkv, const float* LD, int T, int NH) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    namespace hb = wgmma_backward;
    namespace hp = flashgpt2::hopper;
    constexpr int HS = 64;
    extern __shared__ __align__(1024) unsigned char fbh_smem[];
    const uint32_t raw = mma::smem_u32(fbh_smem);
    const fused_dq::Tiles s(raw);
    const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH, n_qt = ceil_div(T, FB_BR);
    const int jt = gridDim.x - 1 - blockIdx.x, j0 = jt * 64;  // launched last key tile first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wk0 = j0 + 16 * warp, key_g = wk0 + g;
    const bf16_t* qbase = qkv + (size_t)b * T * 3 * C + h * HS;
    const bf16_t* dobase = dout + (size_t)b * T * C + h * HS;
    const float* LD_h = LD + (size_t)bh * n_qt * 2 * FB_BR;
    uint32_t* count_h = count + (size_t)bh * n_qt;
    const float sl2 = LOG2E / sqrtf((float)HS);
    const int n_tiles = n_qt - jt;  // query tiles jt, jt+1, ...: those that see these keys
    const wgmma_backward::DkdvCopies<64> copies{s.sK, s.sV, s.sQ, s.sdO, s.sL, qbase, dobase, LD_h, C, T};

    copies.first(j0);
    mma::cp_async_commit();

    float dk[8][4] = {}, dv[8][4] = {};
    for (int n = 0; n < n_tiles; n++) {
        const int i0 = j0 + n * FB_BR, it = jt + n, buf = n & 1;
        hb::tiles_landed();
        __syncthreads();  // tile n (and, at n = 0, K_j, V_j) is visible to every warp and to wgmma; every wgmma
                          // of step n-1 has completed and every thread has issued its dQ adds of step n-1
        if (threadIdx.x == 0 && n > 0 && jt > 0) hp::release_add(count_h + it - 1);  // dQ_{i-1}: our share is in
        if (n + 1 < n_tiles) copies.query_tile(buf ^ 1, i0 + FB_BR);
        mma::cp_async_commit();
        const float* L = reinterpret_cast<const float*>(fbh_smem + (s.sL - raw) + buf * 2 * FB_BR * 4);
        float dq[8][4];
        hb::dkdv_step(dk, dv, s.sK, s.sV, s.sQ + buf * FB_TILE, s.sdO + buf * FB_TILE, L, i0, wk0, key_g, t, sl2,
                      [] {}, [&](const uint32_t (&dsa)[4][4]) {  // blocks jt+1 .. it add to dQ_i first: n of them
                          fused_dq::issue_share(dq, dsa, s, count_h + it, (uint32_t)n, warp, g, t);
                      });
        hp::fence_regs(dq);
        // first: the diagonal block (n = 0); last: key block 0
        fused_dq::add_share(dq, dq_acc + ((size_t)bh * n_qt + it) * FB_BR * 64 + 4 * threadIdx.x, n == 0, jt == 0,
                            dqkv, i0 + 16 * warp + g, T, b, h, NH, t);
    }
    if (jt > 0) {
        __syncthreads();  // every thread has issued its adds to the last tile
        if (threadIdx.x == 0) hp::release_add(count_h + n_qt - 1);
    }
    fb_store_dkdv(dqkv, dk, dv, key_g, T, b, h, NH, t, 1.0f / sqrtf((float)HS));
#else
    (void)dqkv, (void)dq_acc, (void)count, (void)dout, (void)qkv, (void)LD, (void)T, (void)NH;  // no sm_90a code
#endif
}

// The pre-pass on the workspace w.
inline void attention_backward_fused_dq_pre(const fused_dq::Workspace& w, const bf16_t* dout, const bf16_t* out,
                                            const float* lse, int B, int T, int NH, cudaStream_t stream) {
    attention_backward_fused_dq_pre_kernel<<<dim3(ceil_div(T, FB_BR), B * NH), 128, 0, stream>>>(w.LD, w.count, dout,
                                                                                               out, lse, T, NH);
    cudaCheckLaunch();
}

// The same interface as attention_backward_flash_wgmma; ws is fused_dq::workspace_bytes(B, NH, T) bytes.
inline void attention_backward_flash_fused_dq(bf16_t* dqkv, void* ws, const bf16_t* dout, const bf16_t* qkv,
                                              const bf16_t* out, const float* lse, int B, int T, int NH, int HS,
                                              cudaStream_t stream) {
    if (HS != 64) fail("attention_backward_flash_fused_dq: its kernels run head size 64 only (HS = %d)", HS);
    attention_backward_flash_wgmma_check("attention_backward_flash_fused_dq", dqkv, dout, qkv, out, B, NH, HS);
    const fused_dq::Workspace w = fused_dq::carve(ws, B, NH, T);
    attention_backward_fused_dq_pre(w, dout, out, lse, B, T, NH, stream);
    constexpr int smem = 7 * FB_TILE + 2 * 2 * FB_BR * 4 + 1024;  // K, V, Q x 2, dO x 2, dS^T, (lse, D) x 2, alignment
    allow_shared_memory(attention_backward_fused_dq_kernel, smem);
    attention_backward_fused_dq_kernel<<<dim3(ceil_div(T, FB_BR), B * NH), 128, smem, stream>>>(
        dqkv, w.acc, w.count, dout, qkv, w.LD, T, NH);
    cudaCheckLaunch();
}

}  // namespace flashgpt2

namespace ladder::b7 {
inline bool supports(int HS) { return HS == 64; }  // and an sm_90a device, as rung 5
inline size_t workspace_bytes(int B, int NH, int T, int) { return flashgpt2::fused_dq::workspace_bytes(B, NH, T); }
}  // namespace ladder::b7

inline void attention_backward_fused_dq(const AttnBwdParams& p) {
    flashgpt2::attention_backward_flash_fused_dq(p.dqkv, p.workspace, p.dout, p.qkv, p.out, p.lse, p.B, p.T, p.NH,
                                                 p.HS, p.stream);
}
