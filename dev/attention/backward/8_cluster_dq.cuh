// Backward rung 8 — rung 7 with its dQ shares summed on chip first, across a cluster of CL key blocks.
//
// The idea: rung 7 lost to rung 5 because of what its dQ adds cost, not their arithmetic: per (query tile,
// key tile) one 16 KB fp32 add at the L2, and a wait for the neighbour's turn (its page measures both). Here
// CL consecutive key blocks of a head form a thread-block cluster (Hopper; CUDA guide, "Thread Block
// Clusters", "Distributed Shared Memory"), scheduled together on one GPC. Their shares of dQ_i go down the
// cluster by distributed shared memory: block r+1 stores its running sum into block r's receive buffer and
// arrives on block r's mbarrier; block r adds its own share and passes it on; block 0 of the cluster makes
// rung 7's one ordered add into HBM. So the L2 sees 1/CL of rung 7's adds, and the counter chain between
// clusters has CL steps of slack instead of one (cluster c+1 reaches tile i CL steps before cluster c).
// The sum order stays fixed, so the result is deterministic: within a cluster from its highest block down,
// then cluster by cluster from the diagonal one down to cluster 0, which writes dQ_i as bf16.
// What changed from rung 7: __cluster_dims__(CL), a 16 KB receive buffer and two mbarriers per block ("full":
// the upper neighbour's 128 threads have stored; "empty": the lower neighbour's 128 threads have read it),
// and the HBM protocol only in each cluster's block 0.
// What is still slow: everything; it is slower than rung 7, and more so the larger the cluster. Our reading
// (not profiled): each hop waits at the end of a step, with nothing left to overlap, for a neighbour that
// itself waits for the buffer to be read, so the blocks of a cluster march in lockstep. Kept for what it teaches (clusters, mapa,
// remote mbarriers) and for the measured reason; doc/attention/backward/8_cluster_dq.md has the figures.
// Measured: the "Measured" block of doc/attention/backward/8_cluster_dq.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 8
#pragma once
#include "dev/attention/backward/7_fused_dq.cuh"  // the pre-pass, the workspace, issue_share, add_share

namespace flashgpt2 {

constexpr int CLUSTER_DQ = 2;  // key blocks per cluster; of 2, 4 and 8, 2 was the least slow (its page)

template <int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(128, 3)
    attention_backward_cluster_dq_kernel(bf16_t* dqkv, float* dq_acc, uint32_t* count, const bf16_t* dout,
                                         const bf16_t* qkv, const float* LD, int T, int NH) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    namespace hb = wgmma_backward;
    namespace hp = flashgpt2::hopper;
    constexpr int HS = 64, NTHREADS = 128;
    extern __shared__ __align__(1024) unsigned char fbh_smem[];
    const uint32_t raw = mma::smem_u32(fbh_smem);
    const fused_dq::Tiles s(raw);                              // rung 7's tiles, then:
    const uint32_t sR = s.end;                                 // receive buffer: the upper blocks' dQ_i share, fp32
    const uint32_t full = sR + FB_BR * 64 * 4, empty = full + 8;  // mbarriers: sR written / sR read
    const int C = NH * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH, n_qt = ceil_div(T, FB_BR);
    const int n_cl = gridDim.x / CL, rank = blockIdx.x % CL;           // cluster = CL consecutive blockIdx.x
    const int cl = n_cl - 1 - blockIdx.x / CL, jt = cl * CL + rank, j0 = jt * 64;  // last cluster first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wk0 = j0 + 16 * warp, key_g = wk0 + g;
    const bf16_t* qbase = qkv + (size_t)b * T * 3 * C + h * HS;
    const bf16_t* dobase = dout + (size_t)b * T * C + h * HS;
    const float* LD_h = LD + (size_t)bh * n_qt * 2 * FB_BR;
    uint32_t* count_h = count + (size_t)bh * n_qt;
    const float sl2 = LOG2E / sqrtf((float)HS);
    const int n_tiles = n_qt - jt;  // query tiles jt, jt+1, ...; none for a block past T (the last cluster's pad)
    const uint32_t lower_full = hp::map_to_rank(full, rank - 1 + (rank == 0));   // block rank-1's barrier, buffer
    const uint32_t lower_sR = hp::map_to_rank(sR, rank - 1 + (rank == 0));
    const uint32_t upper_empty = hp::map_to_rank(empty, rank + 1 - (rank == CL - 1));
    const wgmma_backward::DkdvCopies<64> copies{s.sK, s.sV, s.sQ, s.sdO, s.sL, qbase, dobase, LD_h, C, T};

    if (threadIdx.x == 0) {
        hp::mbar_init(full, NTHREADS);
        hp::mbar_init(empty, NTHREADS);
        hp::fence_barrier_init();
    }
    hp::cluster_sync();  // every block's barriers are initialized before a neighbour arrives on them
    if (n_tiles > 0) copies.first(j0);  // none past T (the last cluster's pad)
    mma::cp_async_commit();

    float dk[8][4] = {}, dv[8][4] = {};
    for (int n = 0; n < n_tiles; n++) {
        const int i0 = j0 + n * FB_BR, it = jt + n, buf = n & 1;
        hb::tiles_landed();
        __syncthreads();  // tile n (and, at n = 0, K_j, V_j) is visible to every warp and to wgmma; every wgmma
                          // of step n-1 has completed and every thread has issued its dQ adds of step n-1
        if (threadIdx.x == 0 && n > 0 && rank == 0 && cl > 0) hp::release_add(count_h + it - 1);
        if (n + 1 < n_tiles) copies.query_tile(buf ^ 1, i0 + FB_BR);
        mma::cp_async_commit();
        const float* L = reinterpret_cast<const float*>(fbh_smem + (s.sL - raw) + buf * 2 * FB_BR * 4);
        const int before = n / CL;  // clusters that added to dQ_i before ours (block 0's steps; jt = cl CL)
        float dq[8][4];
        const uint32_t need = rank == 0 ? (uint32_t)before : 0u;  // only block 0 adds to HBM, so only it waits
        hb::dkdv_step(dk, dv, s.sK, s.sV, s.sQ + buf * FB_TILE, s.sdO + buf * FB_TILE, L, i0, wk0, key_g, t, sl2,
                      [] {}, [&](const uint32_t (&dsa)[4][4]) {
                          fused_dq::issue_share(dq, dsa, s, count_h + it, need, warp, g, t);
                      });
        hp::fence_regs(dq);
        const uint32_t slot = (uint32_t)threadIdx.x * 16;  // float4 nt of this thread at slot + nt * 2048
        if (rank < CL - 1 && n > 0) {  // block rank+1 sees tile i too (it did one step ago): its running sum first
            hp::mbar_wait<true>(full, (n - 1) & 1);
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                float4 s;
                asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                             : "=f"(s.x), "=f"(s.y), "=f"(s.z), "=f"(s.w) : "r"(sR + slot + nt * 2048) : "memory");
                dq[nt][0] = s.x + dq[nt][0], dq[nt][1] = s.y + dq[nt][1];
                dq[nt][2] = s.z + dq[nt][2], dq[nt][3] = s.w + dq[nt][3];
            }
            hp::mbar_arrive_cluster(upper_empty);  // sR is read: block rank+1 may send its next share
        }
        if (rank > 0) {  // pass the running sum down to block rank-1, once it has read the last one
            if (n > 0) hp::mbar_wait<true>(empty, (n - 1) & 1);
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
                hp::st_cluster_v4(lower_sR + slot + nt * 2048, make_float4(dq[nt][0], dq[nt][1], dq[nt][2], dq[nt][3]));
            hp::mbar_arrive_cluster(lower_full);
        } else {  // block 0: the cluster's sum of dQ_i into HBM in rung 7's order, cluster by cluster (the
                  // diagonal one first, cluster 0 last)
            fused_dq::add_share(dq, dq_acc + ((size_t)bh * n_qt + it) * FB_BR * 64 + 4 * threadIdx.x, before == 0,
                                cl == 0, dqkv, i0 + 16 * warp + g, T, b, h, NH, t);
        }
    }
    if (rank == 0 && cl > 0 && n_tiles > 0) {
        __syncthreads();  // every thread has issued its adds to the last tile
        if (threadIdx.x == 0) hp::release_add(count_h + n_qt - 1);
    }
    if (n_tiles > 0) fb_store_dkdv(dqkv, dk, dv, key_g, T, b, h, NH, t, 1.0f / sqrtf((float)HS));
    hp::cluster_sync();  // no block leaves while a neighbour may still store into it or arrive on its barriers
#else
    (void)dqkv, (void)dq_acc, (void)count, (void)dout, (void)qkv, (void)LD, (void)T, (void)NH;  // no sm_90a code
#endif
}

// The same interface as rung 7; ws is fused_dq::workspace_bytes(B, NH, T) bytes.
template <int CL = CLUSTER_DQ>
inline void attention_backward_flash_cluster_dq(bf16_t* dqkv, void* ws, const bf16_t* dout, const bf16_t* qkv,
                                                const bf16_t* out, const float* lse, int B, int T, int NH, int HS,
                                                cudaStream_t stream) {
    if (HS != 64) fail("attention_backward_flash_cluster_dq: its kernels run head size 64 only (HS = %d)", HS);
    attention_backward_flash_wgmma_check("attention_backward_flash_cluster_dq", dqkv, dout, qkv, out, B, NH, HS);
    const fused_dq::Workspace w = fused_dq::carve(ws, B, NH, T);
    attention_backward_fused_dq_pre(w, dout, out, lse, B, T, NH, stream);
    // K, V, Q x 2, dO x 2, dS^T, (lse, D) x 2, the receive buffer, 2 mbarriers, alignment
    constexpr int smem = 7 * FB_TILE + 2 * 2 * FB_BR * 4 + FB_BR * 64 * 4 + 16 + 1024;
    allow_shared_memory(attention_backward_cluster_dq_kernel<CL>, smem);
    attention_backward_cluster_dq_kernel<CL><<<dim3(ceil_div(ceil_div(T, FB_BR), CL) * CL, B * NH), 128, smem, stream>>>(
        dqkv, w.acc, w.count, dout, qkv, w.LD, T, NH);
    cudaCheckLaunch();
}

}  // namespace flashgpt2

namespace ladder::b8 {
using ladder::b7::supports;         // head size 64 and an sm_90a device, as rung 7
using ladder::b7::workspace_bytes;  // rung 7's workspace
}  // namespace ladder::b8

inline void attention_backward_cluster_dq(const AttnBwdParams& p) {
    flashgpt2::attention_backward_flash_cluster_dq(p.dqkv, p.workspace, p.dout, p.qkv, p.out, p.lse, p.B, p.T, p.NH,
                                                   p.HS, p.stream);
}
