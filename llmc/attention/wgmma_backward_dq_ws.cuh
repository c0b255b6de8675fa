// The wgmma backward's dQ kernel, warp-specialized: the forward's pipeline (wgmma_forward_pipeline.cuh) running the
// dQ pass's three products (dev rung 12; doc/attention/backward/12_dq_warp_specialized.md has the measurements).
//
// Why: at head size 128 the engine's dK/dV kernel is warp-specialized (wgmma_backward_ws.cuh) and its dQ kernel
// (wgmma_backward.cuh's) is not: one warpgroup of 64 queries per block, cp.async double buffering, a block barrier
// per step, two blocks an SM. Taken apart at (16,16,2048,128), that dQ kernel took as long as the dK/dV kernel
// for three tile products where the dK/dV kernel does four. Yet the dQ pass has the forward's shape: a block owns
// query rows and walks the key tiles, S = Q_i K_j^T then a product with the keys' side; only the middle differs.
//   forward   S = Q_i K_j^T,                      P = softmax (online),          O_i  += P V_j
//   dQ        S = Q_i K_j^T,  dP = dO_i V_j^T,     P = exp(S - lse), dS = P∘(dP - D_i),  dQ_i += dS K_j
// (FlashAttention-2's backward, Dao 2023, Alg. 2, the dQ lines; D_i = rowsum(dO_i ∘ O_i).) So this kernel is
// the forward's machinery with the dQ middle: a producer warp issues every TMA copy (Q_i and dO_i into two slots,
// K_j, V_j into rings of STAGES), two consumer warpgroups own 64 query rows each (Br = 128), take turns at the
// tensor cores (named barriers, the forward's Turns), and a persistent grid takes (head, query tile) items,
// heaviest first, from a counter.
// A consumer holds its 64 rows of Q_i and dO_i in registers for the item (the A operands of S and dP). One step
// (its turn: S_j and dP_j, one wgmma group):
//   wait for the group; dQ_{j-1} (issued last step) done before it: K_{j-1} is free; V_j is free now;
//   P = 2^(S scale log2e - lse log2e) (the causal mask where the tile crosses the diagonal), dS = P∘(dP - D_i);
//   issue dQ_i += dS K_j (outside the turn: it queues behind the other warpgroup's products).
// K_j is read by S_j and by dQ's product issued after it, which completes only in the next step, so its ring has 3
// slots where V's could do with 2; both have 3, which at head size 128 is 224 KB of the 227 a block may have.
// D_i and the dK/dV kernel's rows: at each item's start a consumer thread loads its two rows' lse and a quarter
// of their O from global memory, issues the first products, and only then sums D_i = rowsum(dO_i ∘ O_i) (dO_i from
// the slot the producer filled), so the loads' latency hides behind the tensor cores. It writes each 64-query
// tile's lse·log2(e) and D (attention_backward_d_tiles, zeros past T) for the dK/dV kernel that runs next.
// Deterministic: each dQ element is one thread's sum over the key tiles in order; no atomics but the work counter.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "llmc/attention/common.cuh"
#include "llmc/attention/fragment.cuh"
#include "llmc/attention/mma_backward.cuh"             // FB_BR, fb_dot2, fb_finish_D, fb_store_dq
#include "llmc/attention/schedule.h"                   // the items' order
#include "llmc/attention/wgmma_forward_consumers.cuh"  // Turns
#include "llmc/attention/wgmma_forward_pipeline.cuh"   // Smem, its barriers, produce_kv, decode_tile, release, pv_gemm, to_p
#include "llmc/common.cuh"
#include "llmc/error.h"
#include "llmc/ptx/hopper.cuh"

namespace flashgpt2 {
namespace dq_ws {

namespace hp = flashgpt2::hopper;
namespace wa = flashgpt2::wgmma_attention;

// Two consumer warpgroups of 64 query rows (Br = 128), Bc = 64 keys a step, rings of 3 K and 3 V slots.
// The member names are the forward's Cfg's, so its Smem, key_tiles and to_p read this layout.
template <int HS_>
struct Cfg {
    static constexpr int HS = HS_, NC = 2, BR = 64 * NC, BC = 64, STAGES = 3;
    static constexpr int THREADS = 128 * (NC + 1);  // producer warpgroup + NC consumers
    static constexpr int PANELS = HS / 64;          // 64-column (128-byte) swizzle panels per row
    static constexpr int Q_BYTES = BR * HS * 2, KV_BYTES = BC * HS * 2;
    // From a 1024-byte aligned base: Q_i x 2 slots | dO_i x 2 | K ring | V ring | mbarriers | each Q slot's item.
    static constexpr int DO_OFF = 2 * Q_BYTES, K_OFF = 4 * Q_BYTES, V_OFF = K_OFF + STAGES * KV_BYTES;
    static constexpr int BAR_OFF = V_OFF + STAGES * KV_BYTES;
    static constexpr int NUM_BARS = 4 + 4 * STAGES;  // q_full[2], q_empty[2], k_full[], k_empty[], v_full[], v_empty[]
    static constexpr int TILE_OFF = BAR_OFF + 8 * NUM_BARS;
    static constexpr int SMEM = TILE_OFF + 16 + 1024;  // + room to align the base up
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;
    static_assert(HS == 64 || HS == 128, "one or two 128-byte panels per row");
    static_assert(BR == 2 * FB_BR, "a consumer's 64 rows are one of the dK/dV kernel's query tiles");
    static_assert(SMEM <= 227 * 1024, "shared memory of one block");
    static_assert(128 * PRODUCER_REGS + 128 * NC * CONSUMER_REGS <= hp::launch_regs(THREADS) * THREADS,
                  "the block's registers at launch (setmaxnreg only moves them)");
};

// The forward's slots and barriers, plus the dO_i slots.
template <class C>
struct Smem : wa::Smem<C> {
    __device__ uint32_t dO(int b) const { return this->base + C::DO_OFF + b * C::Q_BYTES; }
};

// What every consumer thread needs besides the tensor maps (passed by value).
struct Args {
    bf16_t* dqkv;       // (B, T, 3, NH, HS): dQ is written into its first third
    float* LD;          // per 64-query tile: lse·log2(e), D (attention_backward_d_tiles), for the dK/dV kernel
    const bf16_t* out;  // O (B, T, NH, HS)
    const float* lse;   // (B, NH, T)
    int T, NH, BH, section_heads;
};

// acc (64 × Bc) = A (64 × HS: this warpgroup's bf16 A fragments, ldmatrix'd from its rows of Q_i or dO_i) ·
// B^T (B = K_j or V_j, Bc × HS, K-major): the forward's qk_gemm with A from registers, not shared memory. From
// shared memory an m64n64k16 reads 4 KB (A and B) per 32 tensor-core cycles, all of the 128 bytes a cycle shared
// memory delivers, beside the TMA copies landing; from registers only B is read (the page has the timings).
template <class C>
__device__ __forceinline__ void rows_gemm(float (&acc)[C::BC / 8][4], const uint32_t (&a)[C::HS / 16][4],
                                          uint32_t b_tile) {
#pragma unroll
    for (int kk = 0; kk < C::HS / 16; kk++) {
        const uint32_t panel = kk / 4, off = (kk % 4) * 32;  // 16 columns = 32 bytes inside a 128-byte row
        const uint64_t db = hp::smem_desc_plus(hp::smem_desc_sw128(b_tile + panel * C::BC * 128, 16, 1024), off);
        hp::wgmma_m64n64k16_rs<0>(acc, a[kk], db, kk > 0);
    }
}
// This warpgroup's 64 rows of a slot (Q_i or dO_i at `rows`, panels Br rows apart) as its A fragments.
template <class C>
__device__ __forceinline__ void load_rows(uint32_t (&a)[C::HS / 16][4], uint32_t rows, const FbOffsets& off) {
#pragma unroll
    for (int kk = 0; kk < C::HS / 16; kk++) mma::ldmatrix_x4(a[kk], rows + kk / 4 * C::BR * 128 + off.a[kk % 4]);
}

// The work counter (wgmma_forward_pipeline.cuh's g_tile_counter says how it resets itself); this kernel's own.
static __device__ int g_dq_ws_counter = 0;

// ---- the producer: one thread issues every TMA copy ---------------------------------------------------
template <class C>
__device__ __forceinline__ void producer(const CUtensorMap* tm_q, const CUtensorMap* tm_do, const CUtensorMap* tm_k,
                                         const CUtensorMap* tm_v, const Smem<C>& sm, volatile int* tile_slot,
                                         const Args& a) {
    hp::setmaxnreg_dec<C::PRODUCER_REGS>();
    if (threadIdx.x != 0) return;
    hp::prefetch_tma_map(tm_q);
    hp::prefetch_tma_map(tm_do);
    hp::prefetch_tma_map(tm_k);
    hp::prefetch_tma_map(tm_v);
    const int n_q = ceil_div(a.T, C::BR), total = n_q * a.BH;
    int it = 0;             // K/V tiles issued so far: slot it % STAGES, phase (it / STAGES) & 1
    int tile = blockIdx.x;  // first work item; the next ones come from the counter
    for (int n = 0;; n++) {  // work item n uses Q and dO slot b = n % 2
        const int b = n & 1;
        hp::mbar_wait(sm.q_empty(b), ((n >> 1) & 1) ^ 1);  // the consumers' last reads of item n-2's Q_i, dO_i are done
        if (tile >= total) {
            tile_slot[b] = -1;  // no more work (the arrival below publishes it)
            hp::mbar_arrive(sm.q_full(b));
            return;
        }
        tile_slot[b] = tile;
        const wa::Tile tl = wa::decode_tile(tile, n_q, a.BH, a.section_heads);
        const int bb = tl.bh / a.NH, h = tl.bh % a.NH;  // TMA coordinates (column, token, head, batch)
        hp::mbar_arrive_expect_tx(sm.q_full(b), 2 * C::Q_BYTES);
        for (int p = 0; p < C::PANELS; p++) {
            hp::tma_load_4d(sm.q(b) + p * C::BR * 128, tm_q, sm.q_full(b), 64 * p, tl.qt * C::BR, h, bb);
            hp::tma_load_4d(sm.dO(b) + p * C::BR * 128, tm_do, sm.q_full(b), 64 * p, tl.qt * C::BR, h, bb);
        }
        wa::produce_kv<C>(tm_k, tm_v, sm, it, wa::key_tiles<C>(tl.qt, a.T), h, bb);  // K_j is freed after dQ's product
        tile = wa::next_item(&g_dq_ws_counter, total);
    }
}

// ---- the consumers ------------------------------------------------------------------------------------
template <class C>
__device__ __forceinline__ void consumer(const Smem<C>& sm, const unsigned char* smem, uint32_t smem_at,
                                         volatile int* tile_slot, const Args& a) {
    hp::setmaxnreg_inc<C::CONSUMER_REGS>();
    constexpr int S = C::STAGES, Q4 = C::HS / 32;  // Q4: 16-byte chunks in a quarter row
    const int cw = hp::uniform(threadIdx.x / 128 - 1);  // consumer index: rows 64·cw .. 64·cw + 63 of Q_i
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int T = a.T, C_ = a.NH * C::HS, n_q = ceil_div(T, C::BR), n_q64 = ceil_div(T, FB_BR);
    const float sl2 = LOG2E / sqrtf((float)C::HS);
    const wa::Turns<C::NC> turn{cw};
    if (cw == C::NC - 1) hp::bar_arrive(1, 256);  // the last warpgroup "ends a turn" first: warpgroup 0 goes first

    int it = 0;  // K/V tiles consumed so far (mirrors the producer)
    for (int n = 0;; n++) {
        const int b = n & 1;
        hp::mbar_wait(sm.q_full(b), (n >> 1) & 1);  // Q_i, dO_i of item n (or the end marker) have arrived
        const int tile = hp::uniform(tile_slot[b]);
        if (tile < 0) break;
        const wa::Tile tl = wa::decode_tile(tile, n_q, a.BH, a.section_heads);
        const int n_k = wa::key_tiles<C>(tl.qt, T), bb = tl.bh / a.NH, h = tl.bh % a.NH;
        const int row_w = tl.qt * C::BR + 64 * cw + 16 * warp, row_g = row_w + g;  // this warp's first row, row g
        const uint32_t q_rows = sm.q(b) + cw * 64 * 128, do_rows = sm.dO(b) + cw * 64 * 128;

        // Rows g and g+8: their lse (log2 units) and quarter t of their O; rows >= T: 0. In flight during S_0, dP_0.
        float l2[2], D[2] = {0.0f, 0.0f};
        uint4 o[2][Q4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row_g + 8 * r;
            l2[r] = row < T ? a.lse[(size_t)tl.bh * T + row] * LOG2E : 0.0f;
            const uint4* src = reinterpret_cast<const uint4*>(a.out + ((size_t)bb * T + row) * C_ + h * C::HS) + t * Q4;
#pragma unroll
            for (int c = 0; c < Q4; c++) o[r][c] = row < T ? src[c] : make_uint4(0, 0, 0, 0);
        }

        uint32_t qa[C::HS / 16][4], doa[C::HS / 16][4];  // this warpgroup's rows of Q_i, dO_i as A fragments
        {
            const FbOffsets off(warp, lane);
            load_rows<C>(qa, q_rows, off);
            load_rows<C>(doa, do_rows, off);
        }
        float dq[C::HS / 8][4];       // (64, HS) slab of dQ_i, wgmma accumulator layout
        uint32_t ds[C::BC / 16][4];   // dS_j in bf16: the A operand of dQ's product
        float s[C::BC / 8][4], dp[C::BC / 8][4];  // S_j, then dS_j in fp32; dP_j
        const auto issue = [&](int j) {  // this warpgroup's turn: S_j and dP_j, one wgmma group
            const int kt = it + j, sk = kt % S;
            turn.begin();
            hp::mbar_wait(sm.k_full(sk), (kt / S) & 1);  // K_j has landed
            hp::mbar_wait(sm.v_full(sk), (kt / S) & 1);  // V_j has landed
            hp::wgmma_fence();                            // s, dp were read by ordinary code last step
            rows_gemm<C>(s, qa, sm.k(sk));                // S_j = Q_i K_j^T
            rows_gemm<C>(dp, doa, sm.v(sk));              // dP_j = dO_i V_j^T (the same shapes)
            hp::wgmma_commit();
            turn.end();  // the other warpgroup may issue its products
        };
        const auto finish = [&](int j) {  // S_j, dP_j -> dS_j, and dQ's product issued
            const int kt = it + j, sk = kt % S;
            hp::wgmma_wait<0>();  // S_j, dP_j are done
            hp::fence_regs(s);
            hp::fence_regs(dp);
            wa::release(sm.v_empty(sk), lane);
            if (j == n_k - 1) wa::release(sm.q_empty(b), lane);  // last read of Q_i, dO_i
            if ((j + 1) * C::BC - 1 > row_w) frag::causal_mask(s, row_g, j * C::BC, lane);  // a key after a row
#pragma unroll
            for (int c = 0; c < C::BC / 8; c++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float p = frag::fast_exp2(fmaf(s[c][e], sl2, -l2[e >> 1]));  // P; 0 where masked
                    s[c][e] = p * (dp[c][e] - D[e >> 1]);                                // dS
                }
            wa::to_p(ds, s);
            hp::wgmma_fence();                     // ds and dq written by this thread before the wgmma reads them
            wa::pv_gemm<C>(dq, ds, sm.k(sk), j == 0);  // dQ_i (+)= dS_j K_j: the forward's O += P V_j, K_j for V_j;
                                                      // an item's first overwrites dQ_i (no zeros, no registers before)
            hp::wgmma_commit();
        };

        issue(0);
        // D_i = rowsum(dO_i ∘ O_i) while S_0, dP_0 run: this thread's quarter of rows g, g+8, then the quad's sum
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = 16 * warp + g + 8 * r;  // in this warpgroup's 64 rows of the slot
#pragma unroll
            for (int c = 0; c < Q4; c++) {
                const int chunk = t * Q4 + c;  // 16-byte chunk of the row: panel chunk / 8
                const uint4 x = *reinterpret_cast<const uint4*>(
                    smem + (mma::swz128(do_rows + chunk / 8 * C::BR * 128, row, chunk % 8) - smem_at));
                D[r] += fb_dot2(x.x, o[r][c].x) + fb_dot2(x.y, o[r][c].y) + fb_dot2(x.z, o[r][c].z) +
                        fb_dot2(x.w, o[r][c].w);
            }
        }
        fb_finish_D(D);
        const int t64 = 2 * tl.qt + cw;  // this warpgroup's 64-query tile, for the dK/dV kernel
        if (t == 0 && t64 < n_q64) {
            float* ld = a.LD + ((size_t)tl.bh * n_q64 + t64) * 2 * FB_BR + 16 * warp + g;
            ld[0] = l2[0], ld[8] = l2[1], ld[FB_BR] = D[0], ld[FB_BR + 8] = D[1];
        }
        finish(0);
        for (int j = 1; j < n_k; j++) {
            issue(j);
            hp::wgmma_wait<1>();  // dQ's product of step j-1 is done (groups complete in order)
            hp::fence_regs(dq);
            wa::release(sm.k_empty((it + j - 1) % S), lane);  // K_{j-1} read for the last time
            finish(j);
        }
        hp::wgmma_wait<0>();  // the item's last product
        hp::fence_regs(dq);
        wa::release(sm.k_empty((it + n_k - 1) % S), lane);
        it += n_k;
        fb_store_dq(a.dqkv, dq, row_g, T, bb, h, a.NH, t, 1.0f / sqrtf((float)C::HS));
    }
    // Both warpgroups took the same number of turns; the last one's final hand-over to warpgroup 0 is still
    // pending on barrier 1. Warpgroup 0 consumes it, so no named barrier is left half-arrived.
    if (cw == 0) turn.begin();
}

}  // namespace dq_ws

template <int HS>
static __global__ void __launch_bounds__(dq_ws::Cfg<HS>::THREADS, 1)
    attention_backward_flash_wgmma_dq_ws_kernel(const __grid_constant__ CUtensorMap tm_q,
                                                const __grid_constant__ CUtensorMap tm_do,
                                                const __grid_constant__ CUtensorMap tm_k,
                                                const __grid_constant__ CUtensorMap tm_v, const dq_ws::Args a) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = dq_ws::Cfg<HS>;
    namespace hp = flashgpt2::hopper;
    extern __shared__ __align__(1024) unsigned char dq_ws_smem[];
    const uint32_t raw = hp::smem_u32(dq_ws_smem);
    const dq_ws::Smem<C> sm{{(raw + 1023) & ~1023u}};
    volatile int* tile_slot = reinterpret_cast<volatile int*>(dq_ws_smem + (sm.base - raw) + C::TILE_OFF);
    if (threadIdx.x == 0) wgmma_attention::init_barriers<C>(sm);  // (q_full also counts dO_i's bytes)
    __syncthreads();  // the barriers are initialized before any thread waits on or arrives at them
    if (threadIdx.x < 128) dq_ws::producer<C>(&tm_q, &tm_do, &tm_k, &tm_v, sm, tile_slot, a);
    else dq_ws::consumer<C>(sm, dq_ws_smem, raw, tile_slot, a);
#else
    (void)tm_q, (void)tm_do, (void)tm_k, (void)tm_v, (void)a;  // no sm_90a code: launches are refused on the host
#endif
}

// dQ (into dqkv) and the per-tile lse·log2(e), D that the dK/dV kernels read (in D, a workspace of
// attention_backward_d_floats(B, NH, T) floats), as wgmma_backward.cuh's dQ kernel writes them: a drop-in for it.
// A persistent grid, one block per SM. Head size 64 or 128 (the caller checks).
inline void attention_backward_flash_wgmma_dq_ws(bf16_t* dqkv, float* D, const bf16_t* dout, const bf16_t* qkv,
                                                 const bf16_t* out, const float* lse, int B, int T, int NH, int HS,
                                                 cudaStream_t stream) {
    namespace hp = flashgpt2::hopper;
    const auto launch = [&](auto hs) {
        constexpr int H = decltype(hs)::value;
        using C = dq_ws::Cfg<H>;
        const long long Cc = (long long)NH * H;
        // Q, K, V read in place from qkv (B, T, 3, NH, HS); dO from dout (B, T, NH, HS): element strides b, h, t
        const CUtensorMap mq = hp::make_strided_head_map(qkv, B, NH, T, H, T * 3 * Cc, H, 3 * Cc, C::BR);
        const CUtensorMap mdo = hp::make_strided_head_map(dout, B, NH, T, H, T * Cc, H, Cc, C::BR);
        const CUtensorMap mk = hp::make_strided_head_map(qkv + Cc, B, NH, T, H, T * 3 * Cc, H, 3 * Cc, C::BC);
        const CUtensorMap mv = hp::make_strided_head_map(qkv + 2 * Cc, B, NH, T, H, T * 3 * Cc, H, 3 * Cc, C::BC);
        const int BH = B * NH, total = ceil_div(T, C::BR) * BH;
        const dq_ws::Args a{dqkv, attention_backward_d_tiles(D, B, NH, T), out, lse, T, NH, BH, l2_section_heads(T, H)};
        const auto kernel = attention_backward_flash_wgmma_dq_ws_kernel<H>;
        allow_shared_memory(kernel, C::SMEM);
        launch_dependent(kernel, std::min(total, sm_count()), C::THREADS, C::SMEM, stream, mq, mdo, mk, mv, a);
    };
    if (HS == 64) launch(std::integral_constant<int, 64>{});
    else launch(std::integral_constant<int, 128>{});
}

}  // namespace flashgpt2
