// The wgmma backward's dK/dV kernel, warp-specialized (FlashAttention-3's structure, Shah et al. 2024,
// arXiv:2407.08608, §3.1): the engine's at head size 128, where it measured faster than wgmma_backward.cuh's
// (dev rung 6, doc/attention/backward/6_warp_specialized.md, has the story and the figures; at head size 64
// it is slower, and the engine keeps the one-warpgroup kernel there). One producer warp fills a ring of
// Q_i, dO_i tiles and their rows' lse, D; two consumer warpgroups (128 keys) run wgmma_backward::dkdv_step on
// them and never meet at a block barrier; a persistent grid takes its items, heaviest first in L2-sized
// sections of heads, from a counter. Same products in the same order as wgmma_backward.cuh's kernel: the same bits.
// Fused (DqBy::consumers, dev rung 10; DqBy::warpgroup, dev rung 11) the kernel makes dQ too: each step's dS also
// gives dQ_i's share dS K_j, summed in fixed point (wgmma_backward_fixed_dq.cuh says how and why): 5 tile products
// per pair instead of 7.
// Also here: the engine's entry, attention_backward_flash_wgmma, which picks the kernels by head size.
#pragma once
#include <algorithm>

#include "llmc/attention/schedule.h"                 // the tile order
#include "llmc/attention/wgmma_backward_dq_ws.cuh"     // the engine's dQ kernel at head size 128
#include "llmc/attention/wgmma_backward_fixed_dq.cuh"  // a fused dQ's shares summed in fixed point
#include "llmc/attention/wgmma_backward.cuh"          // the dQ kernel, the dK/dV step, the tiles
#include "llmc/attention/wgmma_forward_pipeline.cuh"  // release()

namespace flashgpt2 {

// ---------------------------------------------------------------------------------------------------------
// dK, dV, warp-specialized: warpgroup 0 is the producer, warpgroups 1 and 2 the consumers. One producer
// warp fills a ring of STAGES slots: its lane 0 issues Q_i and dO_i through TMA (the copy engine writes them
// already swizzled), and its 32 lanes store the tile's per-row floats (lse·log2(e), D, ...) from registers.
// A slot's "full" mbarrier completes when the TMA bytes have landed and every lane has arrived after its
// stores (a release arrival: the consumers' loads after their wait see the rows). Its "empty" one completes
// when every consumer thread has arrived after its last wgmma on them. K_j, V_j of an item have two slots
// of their own (kv_full / kv_empty), so the next item's land while this one finishes. Consumer warpgroup w
// owns keys 64w..64w+63 of the item's Bc = 128 and runs dkdv_step over the query tiles from j0 on.

// Who makes dQ (the kernel's template argument):
//   kernel      a separate dQ kernel, wgmma_backward.cuh's, ran before (the engine; dev rung 6);
//   consumers   the two consumers: after dS^T each stores it to shared memory, they meet at a named barrier, and
//               each issues dS K_j for half of dQ_i's columns (dev rung 10);
//   warpgroup   a fourth warpgroup: the consumers store dS^T and go on; the dQ warpgroup waits for both tiles
//               (an mbarrier), issues dS K_j for all of dQ_i and adds it, off the consumers' path (dev rung 11;
//               head size 64: at 128 the consumers' registers leave none for a fourth warpgroup). Its
//               consumers also hold K_j, V_j as A fragments for the item, so S^T and dP^T read only Q_i, dO_i
//               from shared memory.
// With consumers or warpgroup, dQ's shares are summed in fixed point (wgmma_backward_fixed_dq.cuh).
enum class DqBy { kernel, consumers, warpgroup };

// Head size HS: a (64, HS) tile is HS / 64 swizzled panels (wgmma_backward.cuh); at HS 128 the ring has 2 slots,
// so that K_j, V_j x 2 (128 KB) and the ring (64 KB) fit the 227 KB of one block. A fused dQ holds both consumers'
// dS^T tiles (one 64 x 64 tile each) in DS_BUFS buffers.
template <int HS, DqBy DQ = DqBy::kernel>
struct FbhWs {
    static constexpr bool FUSED = DQ != DqBy::kernel, DQ_WG = DQ == DqBy::warpgroup;
    static constexpr int NC = 2, BC = 64 * NC, STAGES = HS == 64 ? 4 : 2, THREADS = 128 * (NC + 1 + DQ_WG);
    static constexpr int TILE = HS / 64 * FB_TILE;                 // a (64, HS) tile
    static constexpr int KV_BYTES = NC * TILE;                     // K_j or V_j: NC tiles of 64 keys
    static constexpr int V_OFF = 2 * KV_BYTES, Q_OFF = 4 * KV_BYTES;  // K_j x 2 slots, V_j x 2, then the ring:
    static constexpr int DO_OFF = Q_OFF + STAGES * TILE;           // Q_i, dO_i (Br, HS) per slot
    static constexpr int DS_BUFS = !FUSED ? 0 : HS == 64 ? 2 : 1;  // (one buffer at 128: 227 KB)
    static constexpr int DS_OFF = DO_OFF + STAGES * TILE;          // dS^T of consumer c at + c FB_TILE per buffer
    // A query tile's rows of Br floats in its slot: lse_i·log2(e), D_i and, where the consumers make dQ, |dO_i|_2
    // (the first LD_TILE bytes of the tile's LD_ROWS rows in the workspace; the dQ warpgroup reads its own).
    static constexpr int LD_ROWS = FUSED ? fixed_dq::LD_ROWS : 2;
    static constexpr int LD_TILE = (DQ == DqBy::consumers ? 3 : 2) * FB_BR * 4;
    static constexpr int LD_OFF = DS_OFF + DS_BUFS * NC * FB_TILE;
    static constexpr int BAR_OFF = LD_OFF + STAGES * LD_TILE;      // kv_full[2], kv_empty[2], full[], empty[],
    static constexpr int ITEM_OFF = BAR_OFF + 8 * (4 + 2 * STAGES + 2 * DQ_WG * DS_BUFS);  // ds_full[], ds_empty[]
    static constexpr int SMEM = ITEM_OFF + 2 * 4 + 1024;           // the item of each K/V slot; + alignment
    // Registers per thread of each role (setmaxnreg; a warpgroup's 128 threads x these fill the 64 K of an SM).
    static constexpr int PRODUCER_REGS = 24, DQ_REGS = DQ_WG ? 72 : 0, CONSUMER_REGS = DQ_WG ? 208 : 240;
    static_assert(HS == 64 || HS == 128, "one or two 128-byte panels per row");
    static_assert(!DQ_WG || HS == 64, "a dQ warpgroup at head size 64 only: at 128 the four roles' registers exceed the SM's");
    static_assert(SMEM <= 227 * 1024, "shared memory of one block");
    static_assert(128 * (PRODUCER_REGS + DQ_REGS + NC * CONSUMER_REGS) <= hopper::launch_regs(THREADS) * THREADS,
                  "the block's registers at launch (setmaxnreg only moves them)");
    // TMA boxes are 64 columns (one 128-byte swizzle panel) wide. K_j, V_j at HS 64: one box of Bc rows, its
    // 64-key tiles one after the other; at HS 128 one box of 64 rows per (64-key tile, panel).
    static constexpr int KV_BOX_ROWS = HS == 64 ? BC : 64;
};

// Work items = (head bh, key tile of Bc keys at j0) in schedule.h's order, heaviest first (sections of heads
// whose Q and dO fit in L2; inside a section every head's first key tile first). Block b's first item is b;
// each later one is gridDim.x + a fetch of this counter (the forward's scheduler, wgmma_forward_pipeline.cuh,
// says why exactly one fetch per item taken, plus one, leaves it at 0 for the next launch). The producer
// fetches an item's successor when it starts the item, and hands the item to the consumers with its K_j, V_j
// (the K/V slot's "full" barrier publishes it).
static __device__ int g_dkdv_ws_counter = 0;

template <int HS, DqBy DQ>
static __global__ void __launch_bounds__(FbhWs<HS, DQ>::THREADS, 1)
    attention_backward_flash_wgmma_dkdv_ws_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                                      const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                                      bf16_t* dqkv, const float* LD, fixed_dq::Workspace dqw, int T, int NH, int BH,
                                      int section_heads) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    namespace hb = wgmma_backward;
    namespace hp = flashgpt2::hopper;
    using W = FbhWs<HS, DQ>;
    extern __shared__ __align__(1024) unsigned char fbh_smem[];
    const uint32_t raw = mma::smem_u32(fbh_smem), base = (raw + 1023) & ~1023u;
    const uint32_t sK = base, sV = base + W::V_OFF, sQ = base + W::Q_OFF, sdO = base + W::DO_OFF;
    const auto kv_full = [&](int k) { return base + W::BAR_OFF + 8 * k; };
    const auto kv_empty = [&](int k) { return base + W::BAR_OFF + 16 + 8 * k; };
    const auto full = [&](int s) { return base + W::BAR_OFF + 32 + 8 * s; };
    const auto empty = [&](int s) { return base + W::BAR_OFF + 32 + 8 * (W::STAGES + s); };
    const auto ds_full = [&](int d) { return base + W::BAR_OFF + 32 + 8 * (2 * W::STAGES + d); };  // (DqBy::warpgroup)
    const auto ds_empty = [&](int d) { return base + W::BAR_OFF + 32 + 8 * (2 * W::STAGES + W::DS_BUFS + d); };
    volatile int* items = reinterpret_cast<volatile int*>(fbh_smem + (base - raw) + W::ITEM_OFF);  // 1 per K/V slot
    const int n_kt = ceil_div(T, W::BC), n_qt = ceil_div(T, FB_BR), total = n_kt * BH;
    const auto decode = [&](int it, int& bh, int& j0) {  // item it -> its head and first key
        const HeadTile ht = heaviest_first(it, n_kt, BH, section_heads);  // rank 0: the first key tile
        bh = ht.bh, j0 = ht.rank * W::BC;
    };

    if (threadIdx.x == 0) {
        for (int k = 0; k < 2; k++) {
            hp::mbar_init(kv_full(k), 1);           // the producer's arrive.expect_tx, plus K_j's and V_j's bytes
            hp::mbar_init(kv_empty(k), 4 * W::NC + 4 * W::DQ_WG);  // one arrival per consumer (and dQ) warp
        }
        for (int s = 0; s < W::STAGES; s++) {
            hp::mbar_init(full(s), 1 + 32);         // lane 0's arrive.expect_tx (+ Q_i's, dO_i's bytes), every lane's rows
            hp::mbar_init(empty(s), 128 * W::NC);   // every consumer thread: see the release below
        }
        for (int d = 0; d < W::DS_BUFS * W::DQ_WG; d++) {
            hp::mbar_init(ds_full(d), 4 * W::NC);   // every consumer warp has stored its rows of dS^T
            hp::mbar_init(ds_empty(d), 4);          // every dQ warp's wgmma has read them
        }
        hp::fence_barrier_init();
    }
    __syncthreads();  // the barriers are initialized before any thread waits on or arrives at them

    if (threadIdx.x < 128) {  // ---- producer: one warp; the others give their registers back and exit
        hp::setmaxnreg_dec<W::PRODUCER_REGS>();
        if (threadIdx.x >= 32) return;
        const int lane = threadIdx.x;
        if (lane == 0) {
            hp::prefetch_tma_map(&tm_q);
            hp::prefetch_tma_map(&tm_do);
        }
        int n = 0, it = blockIdx.x;  // n: Q/dO tiles issued so far (slot n % STAGES); it: this item
        for (int m = 0;; m++) {
            const int k = m & 1;
            hp::mbar_wait(kv_empty(k), ((m >> 1) & 1) ^ 1);  // the consumers are done with item m-2 (and its slot)
            if (it >= total) {  // no more work: say so through slot k (the arrival publishes it)
                if (lane == 0) {
                    items[k] = -1;
                    hp::mbar_arrive(kv_full(k));
                }
                return;
            }
            int bh, j0;
            decode(it, bh, j0);
            const int b = bh / NH, h = bh % NH;
            const float* src = LD + ((size_t)bh * n_qt + j0 / FB_BR) * W::LD_ROWS * FB_BR + 4 * lane;  // tile j0's rows
            int next = 0;
            if (lane == 0) {
                const int fetched = atomicAdd(&g_dkdv_ws_counter, 1);
                if (fetched == total - 1) atomicExch(&g_dkdv_ws_counter, 0);  // the launch's last fetch: reset
                next = fetched + (int)gridDim.x;                               // (>= total: none)
                items[k] = it;
                hp::mbar_arrive_expect_tx(kv_full(k), 2 * W::KV_BYTES);
                for (int r = 0; r < W::BC; r += W::KV_BOX_ROWS)  // box by box: (64-key tile r / 64, panel p)
                    for (int p = 0; p < HS / 64; p++) {
                        const uint32_t at = k * W::KV_BYTES + r / 64 * W::TILE + p * FB_TILE;
                        hp::tma_load_4d(sK + at, &tm_k, kv_full(k), 64 * p, j0 + r, h, b);
                        hp::tma_load_4d(sV + at, &tm_v, kv_full(k), 64 * p, j0 + r, h, b);
                    }
            }
            next = __shfl_sync(0xffffffffu, next, 0);
            for (int i0 = j0; i0 < T; i0 += FB_BR, n++, src += W::LD_ROWS * FB_BR) {  // queries from j0 on
                const int s = n % W::STAGES;
                // this lane's 16 (or 32) bytes of the tile's rows (zeros past T, as written), loaded while slot s frees
                const bool second = W::LD_TILE > 512 && lane < (W::LD_TILE - 512) / 16;  // past 512 bytes (DqBy::consumers)
                const float4 r0 = __ldg(reinterpret_cast<const float4*>(src));
                const float4 r1 = second ? __ldg(reinterpret_cast<const float4*>(src + 128)) : float4{};
                hp::mbar_wait(empty(s), ((n / W::STAGES) & 1) ^ 1);  // every consumer thread is done with slot s
                if (lane == 0) {
                    hp::mbar_arrive_expect_tx(full(s), 2 * W::TILE);  // (rows past T arrive as zeros)
                    for (int p = 0; p < HS / 64; p++) {
                        hp::tma_load_4d(sQ + s * W::TILE + p * FB_TILE, &tm_q, full(s), 64 * p, i0, h, b);
                        hp::tma_load_4d(sdO + s * W::TILE + p * FB_TILE, &tm_do, full(s), 64 * p, i0, h, b);
                    }
                }
                float4* dst = reinterpret_cast<float4*>(fbh_smem + (base - raw) + W::LD_OFF + s * W::LD_TILE) + lane;
                dst[0] = r0;
                if (second) dst[32] = r1;  // 512 bytes on
                hp::mbar_arrive(full(s));  // release: the rows stored above are seen by every warp that waits on full(s)
            }
            it = next;
        }
    }

    if constexpr (W::DQ_WG) {  // ---- the dQ warpgroup (the last one): dS K_j of every step, added as integers
        if (threadIdx.x >= 128 * (W::NC + 1)) {
            hp::setmaxnreg_dec<W::DQ_REGS>();
            const int warp = threadIdx.x / 32 % 4, g = threadIdx.x % 32 / 4;
            int n = 0;  // steps seen: dS buffer n % DS_BUFS, as the consumers count them
            for (int m = 0;; m++) {
                const int k = m & 1;
                hp::mbar_wait(kv_full(k), (m >> 1) & 1);  // K_j of this item has landed, and its number
                const int it = items[k];
                if (it < 0) break;
                int bh, j0;
                decode(it, bh, j0);
                const unsigned* kv = dqw.kv_max + 2 * bh;
                for (int i0 = j0; i0 < T; i0 += FB_BR, n++) {
                    const size_t tile = (size_t)bh * n_qt + i0 / FB_BR;
                    const float* dn = fixed_dq::dO_norms(dqw, tile, warp, g);
                    const float dn0 = dn[0], dn1 = dn[8];  // loaded while the consumers make dS
                    const int d = n % W::DS_BUFS;
                    const uint32_t ds = base + W::DS_OFF + d * W::NC * FB_TILE;
                    hp::mbar_wait(ds_full(d), (n / W::DS_BUFS) & 1);  // both consumers' dS^T are in buffer d
                    float dq[HS / 8][4];
                    hp::wgmma_fence();
                    fixed_dq::gemm_share_all(dq, ds, sK + k * W::KV_BYTES);
                    hp::wgmma_commit();
                    hp::wgmma_wait<0>();
                    hp::fence_regs(dq);
                    wgmma_attention::release(ds_empty(d), threadIdx.x % 32);  // buffer d read: it may be refilled
                    const float s0 = fixed_dq::row_scale(fixed_dq::row_exponent(dn0, kv));
                    const float s1 = fixed_dq::row_scale(fixed_dq::row_exponent(dn1, kv));
                    fixed_dq::add_share(dqw.acc + tile * FB_BR * HS + threadIdx.x % 128, dq, s0, s1);
                }
                wgmma_attention::release(kv_empty(k), threadIdx.x % 32);  // K_j read for the last time
            }
            return;
        }
    }

    // ---- consumers
    hp::setmaxnreg_inc<W::CONSUMER_REGS>();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 - 4, g = lane / 4, t = lane % 4;
    const int wg = hp::uniform(warp / 4);  // this warpgroup's keys: 64 wg .. 64 wg + 63 of the item's Bc
    const float sl2 = LOG2E / sqrtf((float)HS);
    const auto nothing = [] {};  // no copies to issue while S^T and dP^T run: the producer makes them all
    int n = 0;                   // ring slot counter (as the producer's)
    for (int m = 0;; m++) {
        const int k = m & 1;
        hp::mbar_wait(kv_full(k), (m >> 1) & 1);  // K_j, V_j of this item have landed, and its number
        const int it = items[k];                  // (-1: no more work)
        if (it < 0) break;
        int bh, j0;
        decode(it, bh, j0);
        const int wg_k0 = j0 + 64 * wg, wk0 = wg_k0 + 16 * (warp % 4), key_g = wk0 + g;
        const uint32_t Kw = sK + k * W::KV_BYTES + wg * W::TILE, Vw = sV + k * W::KV_BYTES + wg * W::TILE;
        float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
        uint32_t ka[4][4], va[4][4];  // DqBy::warpgroup: K_j, V_j as A fragments, so S^T, dP^T read only Q_i, dO_i
        if constexpr (W::DQ_WG) {     // from shared memory (the registers the dQ warpgroup leaves free allow it)
            const FbOffsets off(warp % 4, lane);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                mma::ldmatrix_x4(ka[kk], Kw + off.a[kk]);
                mma::ldmatrix_x4(va[kk], Vw + off.a[kk]);
            }
        }
        unsigned kv[2] = {};  // DqBy::consumers: the head's max |K|, max |V|_2, for its rows' dQ scales
        if constexpr (DQ == DqBy::consumers) kv[0] = dqw.kv_max[2 * bh], kv[1] = dqw.kv_max[2 * bh + 1];
        for (int i0 = j0; i0 < T; i0 += FB_BR, n++) {
            const int s = n % W::STAGES;
            hp::mbar_wait(full(s), (n / W::STAGES) & 1);  // Q_i, dO_i of this tile and their rows are in slot s
            const float* L = reinterpret_cast<const float*>(fbh_smem + (base - raw) + W::LD_OFF + s * W::LD_TILE);
            if constexpr (DQ == DqBy::warpgroup) {  // store dS^T for the dQ warpgroup (both consumers, every step)
                const int d = n % W::DS_BUFS;
                const uint32_t ds = base + W::DS_OFF + d * W::NC * FB_TILE + wg * FB_TILE;
                const auto hand_over = [&](const uint32_t (&dsa)[4][4]) {
                    hp::mbar_wait(ds_empty(d), ((n / W::DS_BUFS) & 1) ^ 1);  // the dQ warpgroup has read buffer d
                    hb::store_ds(ds, dsa, warp % 4, g, t);
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // for the dQ wgmma's reads
                    __syncwarp();  // every lane's rows are stored before lane 0 arrives
                    wgmma_attention::release(ds_full(d), lane);
                };
                if (i0 + FB_BR <= wg_k0) {  // every query of the tile is before every key of this warpgroup:
                    const uint32_t zero[4][4] = {};  // dS^T = 0, and no product to run
                    hand_over(zero);
                } else {
                    hb::dkdv_step(dk, dv, ka, va, sQ + s * W::TILE, sdO + s * W::TILE, L, i0, wk0, key_g, t, sl2,
                                  nothing, hand_over);  // dS^T handed over while dK runs
                }
            } else if constexpr (DQ == DqBy::consumers) {  // both consumers take every step: each makes half of dQ_i's columns
                const size_t tile = (size_t)bh * n_qt + i0 / FB_BR;
                const uint32_t ds = base + W::DS_OFF + n % W::DS_BUFS * W::NC * FB_TILE;  // both consumers' dS^T
                float dq[HS / 16][4];
                hb::dkdv_step(dk, dv, Kw, Vw, sQ + s * W::TILE, sdO + s * W::TILE, L, i0, wk0, key_g, t, sl2, nothing,
                              [&](const uint32_t (&dsa)[4][4]) {  // while dK runs: dQ_i's share dS K_j
                                  if constexpr (W::DS_BUFS == 1)
                                      hp::bar_sync(1, 256);  // both consumers' last dQ products are done: ds is free
                                  hb::store_ds(ds + wg * FB_TILE, dsa, warp % 4, g, t);
                                  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // for wgmma's reads
                                  hp::bar_sync(2, 256);  // both consumers' dS^T are in ds (with two buffers, also:
                                                         // their dQ products of two steps ago, the last to read
                                                         // this buffer, are done)
                                  hp::wgmma_fence();
                                  fixed_dq::gemm_share<HS>(dq, ds, sK + k * W::KV_BYTES, wg);
                                  hp::wgmma_commit();
                              });
                hp::fence_regs(dq);
                const float* dn = L + 2 * FB_BR + 16 * (warp % 4) + g;  // |dO_i|_2 of rows 16 w + g, + 8 of the tile
                const float s0 = fixed_dq::row_scale(fixed_dq::row_exponent(dn[0], kv));
                const float s1 = fixed_dq::row_scale(fixed_dq::row_exponent(dn[8], kv));
                fixed_dq::add_share(dqw.acc + tile * FB_BR * HS + wg * FB_BR * HS / 2 + threadIdx.x % 128, dq, s0, s1);
            } else if (i0 + FB_BR > wg_k0) {  // (else every query of the tile is before every key of this
                                              // warpgroup: nothing to add)
                hb::dkdv_step(dk, dv, Kw, Vw, sQ + s * W::TILE, sdO + s * W::TILE, L, i0, wk0, key_g, t, sl2, nothing);
            }
            // Slot s read for the last time: it may be refilled. Every thread arrives, after its own reads of the
            // slot's rows (one arrival per warp after a __syncwarp is as ordered, but racecheck follows only a
            // thread's own arrival).
            hp::mbar_arrive(empty(s));
        }
        wgmma_attention::release(kv_empty(k), lane);  // K_j, V_j too: the item after next may load there
        fb_store_dkdv(dqkv, dk, dv, key_g, T, bh / NH, bh % NH, NH, t, 1.0f / sqrtf((float)HS));
    }
#else
    (void)tm_q, (void)tm_k, (void)tm_v, (void)tm_do, (void)dqkv, (void)LD, (void)dqw, (void)T, (void)NH, (void)BH,
        (void)section_heads;
#endif
}

// The kernel's launch: a persistent grid, one block per SM. LD: the per-tile lse·log2(e), D (written before);
// dqw: a fused dQ's workspace (fixed_dq::pre_kernel has run; unused with DqBy::kernel).
template <int HS, DqBy DQ>
void attention_backward_flash_wgmma_dkdv_ws_launch(bf16_t* dqkv, const float* LD, const fixed_dq::Workspace& dqw,
                                                   const bf16_t* dout, const bf16_t* qkv, int B, int T, int NH,
                                                   cudaStream_t stream) {
    namespace hp = flashgpt2::hopper;
    using W = FbhWs<HS, DQ>;
    const long long C = (long long)NH * HS;
    // q, k, v read in place from qkv (B, T, 3, NH, HS); dO from dout (B, T, NH, HS): element strides b, h, t
    const CUtensorMap mq = hp::make_strided_head_map(qkv, B, NH, T, HS, T * 3 * C, HS, 3 * C, FB_BR);
    const CUtensorMap mk = hp::make_strided_head_map(qkv + C, B, NH, T, HS, T * 3 * C, HS, 3 * C, W::KV_BOX_ROWS);
    const CUtensorMap mv = hp::make_strided_head_map(qkv + 2 * C, B, NH, T, HS, T * 3 * C, HS, 3 * C, W::KV_BOX_ROWS);
    const CUtensorMap mdo = hp::make_strided_head_map(dout, B, NH, T, HS, T * C, HS, C, FB_BR);
    const int BH = B * NH, total = ceil_div(T, W::BC) * BH;
    const int section_heads = l2_section_heads(T, HS);  // heads whose Q and dO fit in L2 together
    const auto kernel = attention_backward_flash_wgmma_dkdv_ws_kernel<HS, DQ>;
    allow_shared_memory(kernel, W::SMEM);
    launch_dependent(kernel, std::min(total, sm_count()), W::THREADS, W::SMEM, stream, mq, mk, mv, mdo, dqkv, LD, dqw,
                     T, NH, BH, section_heads);
}

// The dK/dV kernel alone (the dQ kernel, wgmma_backward.cuh's, runs first: it writes the per-tile lse, D this one
// reads). D: attention_backward_d_floats(B, NH, T) floats.
inline void attention_backward_flash_wgmma_dkdv_ws(bf16_t* dqkv, float* D, const bf16_t* dout, const bf16_t* qkv,
                                                   int B, int T, int NH, int HS, cudaStream_t stream) {
    const float* LD = attention_backward_d_tiles(D, B, NH, T);
    if (HS == 64) attention_backward_flash_wgmma_dkdv_ws_launch<64, DqBy::kernel>(dqkv, LD, {}, dout, qkv, B, T, NH, stream);
    else attention_backward_flash_wgmma_dkdv_ws_launch<128, DqBy::kernel>(dqkv, LD, {}, dout, qkv, B, T, NH, stream);
}

// dQ, dK and dV by the one fused kernel, dQ summed in fixed point (wgmma_backward_fixed_dq.cuh): the pre-pass, the
// fused kernel, the last pass. DQ: who in it makes dQ (consumers: dev rung 10; warpgroup: dev rung 11, head size
// 64 only). ws: fixed_dq::workspace_bytes(B, NH, T, HS) bytes.
template <DqBy DQ>
void attention_backward_flash_wgmma_fused(bf16_t* dqkv, void* ws, const bf16_t* dout, const bf16_t* qkv,
                                          const bf16_t* out, const float* lse, int B, int T, int NH, int HS,
                                          cudaStream_t stream) {
    static_assert(DQ != DqBy::kernel, "the fused kernel makes dQ itself");
    attention_backward_flash_wgmma_check("attention_backward_flash_wgmma_fused", dqkv, dout, qkv, out, B, NH, HS);
    if (DQ == DqBy::warpgroup && HS != 64) fail("attention_backward_flash_wgmma_fused: a dQ warpgroup runs head size 64 only");
    const fixed_dq::Workspace w = fixed_dq::carve(ws, B, NH, T, HS);
    const dim3 tiles(ceil_div(T, FB_BR), B * NH);
    cudaCheck(cudaMemsetAsync(w.kv_max, 0, 2 * sizeof(unsigned) * B * NH, stream));
    launch_dependent(HS == 64 ? fixed_dq::pre_kernel<64> : fixed_dq::pre_kernel<128>, tiles, 128, 0, stream, w, dout,
                     out, qkv, lse, T, NH);
    if (HS == 64) attention_backward_flash_wgmma_dkdv_ws_launch<64, DQ>(dqkv, w.LD, w, dout, qkv, B, T, NH, stream);
    else if constexpr (DQ != DqBy::warpgroup)
        attention_backward_flash_wgmma_dkdv_ws_launch<128, DQ>(dqkv, w.LD, w, dout, qkv, B, T, NH, stream);
    launch_dependent(HS == 64 ? fixed_dq::post_kernel<64> : fixed_dq::post_kernel<128>, tiles, 128, 0, stream, dqkv, w,
                     T, NH);
}

// Where the engine runs a fused kernel instead of two: head size 64 from T = 4096 on, with a dQ warpgroup (dev
// rung 11), where it measured level with the two kernels or faster (rung 11's page). At shorter T the fused
// kernel's pre-pass and last pass (O(T) bytes) cost more than the two tile products it saves. At head size 128
// the two kernels with the warp-specialized dQ kernel (dev rung 12) measured faster than the fused kernel at
// every T (rung 12's page), so it is never taken there.
constexpr int FUSED_DQ_MIN_T = 4096;
inline bool attention_backward_flash_wgmma_fused_here(int T, int HS) { return HS == 64 && T >= FUSED_DQ_MIN_T; }

// The engine's workspace in bytes: D (two kernels) or the fused kernel's integer sums and per-tile rows.
inline size_t attention_backward_flash_wgmma_workspace_bytes(int B, int T, int NH, int HS) {
    return attention_backward_flash_wgmma_fused_here(T, HS) ? fixed_dq::workspace_bytes(B, NH, T, HS)
                                                            : attention_backward_d_floats(B, NH, T) * sizeof(float);
}

// The engine's entry: dqkv (B,T,3,NH,HS) from dout, out (B,T,NH,HS), qkv and lse (B,NH,T); ws: workspace of
// attention_backward_flash_wgmma_workspace_bytes. Head size 64: from T = 4096 the fused kernel with a dQ
// warpgroup (other bits than the two kernels, the same on every run); below, the two kernels of
// wgmma_backward.cuh in the grid order attention_backward_flash_wgmma_order picks (the same bits in either).
// Head size 128: the warp-specialized dQ kernel (wgmma_backward_dq_ws.cuh, dev rung 12), then this file's
// warp-specialized dK/dV kernel, which measured faster than every other path there (rung 12's page).
inline void attention_backward_flash_wgmma(bf16_t* dqkv, void* ws, const bf16_t* dout, const bf16_t* qkv,
                                           const bf16_t* out, const float* lse, int B, int T, int NH, int HS,
                                           cudaStream_t stream) {
    attention_backward_flash_wgmma_check("attention_backward_flash_wgmma", dqkv, dout, qkv, out, B, NH, HS);
    float* D = static_cast<float*>(ws);
    if (attention_backward_flash_wgmma_fused_here(T, HS)) {
        attention_backward_flash_wgmma_fused<DqBy::warpgroup>(dqkv, ws, dout, qkv, out, lse, B, T, NH, HS, stream);
    } else if (HS == 128) {
        attention_backward_flash_wgmma_dq_ws(dqkv, D, dout, qkv, out, lse, B, T, NH, HS, stream);
        attention_backward_flash_wgmma_dkdv_ws(dqkv, D, dout, qkv, B, T, NH, HS, stream);
    } else if (attention_backward_flash_wgmma_order(B, T, NH, HS) == GridOrder::heaviest_first) {
        attention_backward_flash_wgmma_in<GridOrder::heaviest_first>(dqkv, D, dout, qkv, out, lse, B, T, NH, HS, stream);
    } else {
        attention_backward_flash_wgmma_in<GridOrder::head_major>(dqkv, D, dout, qkv, out, lse, B, T, NH, HS, stream);
    }
}

}  // namespace flashgpt2
