// The Hopper attention forward's shared machinery (engine `wgmma`; the kernels and their launch are
// wgmma_forward.cuh, the consumer warpgroups' loops wgmma_forward_consumers.cuh): the tile configuration and
// shared-memory layout, the problem every thread sees, the dynamic tile scheduler, the producer warpgroup (one
// thread issues every TMA copy) and the two wgmma products S = Q Kᵀ and O += P V. dev/attention/forward/7_*
// and 8_* teach every piece; llmc/ptx/hopper.cuh wraps each PTX instruction.
#pragma once
#include <algorithm>
#include <cstdint>
#include "llmc/attention/fragment.cuh"
#include "llmc/attention/schedule.h"
#include "llmc/common.cuh"
#include "llmc/error.h"
#include "llmc/ptx/hopper.cuh"

namespace flashgpt2 {

// Element (b, h, t, d) of a (B, NH, T, HS) tensor is at b·b_stride + h·h_stride + t·t_stride + d.
struct HeadStrides {
    long long b, h, t;
};

struct WgmmaAttentionParams {
    const __nv_bfloat16 *q, *k, *v;  // (B, NH, T, HS) each, strided by `in`
    HeadStrides in;
    __nv_bfloat16* o;  // (B, NH, T, HS), strided by `out`
    HeadStrides out;
    float* lse;        // (B, NH, T) contiguous
    int B, NH, T, HS;
    int tile = -1;     // HS 64 only: 0 = 2 consumers (Br 128), 1 = 3 consumers (Br 192), -1 = by T
    cudaStream_t stream = 0;
};

namespace wgmma_attention {

using bf16 = __nv_bfloat16;
namespace hp = flashgpt2::hopper;

// NC consumer warpgroups of 64 query rows each (Br = 64·NC), Bc keys per step, a ring of STAGES K and V slots.
template <int HS_, int NC_, int BC_, int STAGES_>
struct Cfg {
    static constexpr int HS = HS_, NC = NC_, BC = BC_, STAGES = STAGES_;
    static constexpr int BR = 64 * NC;
    static constexpr int THREADS = 128 * (NC + 1);        // producer warpgroup + NC consumers
    static constexpr int PANELS = HS / 64;                // 64-column (128-byte) swizzle panels per row
    static constexpr int Q_BYTES = BR * HS * 2, KV_BYTES = BC * HS * 2;
    // Shared memory from a 1024-byte aligned base (the swizzle pattern repeats every 1024 bytes):
    // 2 Q slots | STAGES K slots | STAGES V slots | mbarriers | the work item of each Q slot. A tile is
    // PANELS panels of (rows × 128 B).
    static constexpr int K_OFF = 2 * Q_BYTES, V_OFF = K_OFF + STAGES * KV_BYTES, BAR_OFF = V_OFF + STAGES * KV_BYTES;
    static constexpr int NUM_BARS = 4 + 4 * STAGES;       // q_full[2], q_empty[2], k_full[], k_empty[], v_full[], v_empty[]
    static constexpr int TILE_OFF = BAR_OFF + 8 * NUM_BARS;
    static constexpr int SMEM = TILE_OFF + 16 + 1024;     // + room to align the base up
    // Register budgets after setmaxnreg (multiples of 8; THREADS · launch cap ≥ the sum of the budgets).
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = NC == 2 ? 240 : 160;
    static_assert(HS % 64 == 0 && (BC == 64 || BC == 128) && BR <= 256, "shapes wgmma and TMA boxes allow");
    static_assert(128 * PRODUCER_REGS + 128 * NC * CONSUMER_REGS <= hopper::launch_regs(THREADS) * THREADS,
                  "the block's registers at launch (setmaxnreg only moves them)");
};

// Shared-memory addresses (shared window) of the slots and barriers.
template <class C>
struct Smem {
    uint32_t base;
    __device__ uint32_t q(int b) const { return base + b * C::Q_BYTES; }
    __device__ uint32_t k(int s) const { return base + C::K_OFF + s * C::KV_BYTES; }
    __device__ uint32_t v(int s) const { return base + C::V_OFF + s * C::KV_BYTES; }
    __device__ uint32_t q_full(int b) const { return base + C::BAR_OFF + 8 * b; }
    __device__ uint32_t q_empty(int b) const { return base + C::BAR_OFF + 16 + 8 * b; }
    __device__ uint32_t k_full(int s) const { return base + C::BAR_OFF + 32 + 8 * s; }
    __device__ uint32_t k_empty(int s) const { return base + C::BAR_OFF + 32 + 8 * (C::STAGES + s); }
    __device__ uint32_t v_full(int s) const { return base + C::BAR_OFF + 32 + 8 * (2 * C::STAGES + s); }
    __device__ uint32_t v_empty(int s) const { return base + C::BAR_OFF + 32 + 8 * (3 * C::STAGES + s); }
};

// What every thread needs about the problem besides the tensor maps (passed by value).
struct Problem {
    bf16* o;           // O (B, NH, T, HS), element strides o_b, o_h, o_t
    long long o_b, o_h, o_t;
    float* lse;        // (B, NH, T)
    int T, NH, BH, section_heads;
    float scale;       // 1 / sqrt(HS)
    __device__ bf16* o_head(int bh) const { return o + (bh / NH) * o_b + (bh % NH) * o_h; }
    __device__ float* lse_head(int bh) const { return lse + (size_t)bh * T; }
};

// Work item → (head bh, query tile qt): heaviest first in L2 sections (schedule.h), and a query tile's
// weight is its number of key tiles, so rank 0 is the last query tile.
struct Tile {
    int bh, qt;
};
__device__ __forceinline__ Tile decode_tile(int tile, int n_q, int BH, int section_heads) {
    const HeadTile ht = heaviest_first(tile, n_q, BH, section_heads);
    return Tile{ht.bh, n_q - 1 - ht.rank};
}

// Key tiles a query tile needs: those holding a key ≤ its last valid query row.
template <class C>
__device__ __forceinline__ int key_tiles(int qt, int T) { return ceil_div(min((qt + 1) * C::BR, T), C::BC); }

// The dynamic scheduler's work counter. Each block's first item is its blockIdx.x; every later one is
// gridDim.x + (a fetch of this counter). With G blocks and N ≥ G items there are exactly N fetches (N − G
// that return work, one final one per block), returning 0 … N−1 in atomic order: the block that draws N−1
// knows every other block has made its last fetch and puts the counter back to 0 for the next launch. So
// no per-launch memset, and launches back to back on one stream are correct; two launches must not run
// concurrently. (static: one counter per translation unit's device code, which its kernels use.)
static __device__ int g_tile_counter = 0;

// One arrival per consumer warp (the "empty" barriers count 4·NC of them), after the warp's wgmma wait.
__device__ __forceinline__ void release(uint32_t bar, int lane) {
    if (lane == 0) hp::mbar_arrive(bar);
}

// The mbarriers of the Q slots and the K, V rings: a "full" one completes on the producer's arrive.expect_tx and
// the copy's bytes, an "empty" one on one arrival per consumer warp. One thread, before the block's barrier.
template <class C>
__device__ __forceinline__ void init_barriers(const Smem<C>& sm) {
    for (int b = 0; b < 2; b++) {
        hp::mbar_init(sm.q_full(b), 1);
        hp::mbar_init(sm.q_empty(b), 4 * C::NC);
    }
    for (int s = 0; s < C::STAGES; s++) {
        hp::mbar_init(sm.k_full(s), 1);
        hp::mbar_init(sm.k_empty(s), 4 * C::NC);
        hp::mbar_init(sm.v_full(s), 1);
        hp::mbar_init(sm.v_empty(s), 4 * C::NC);
    }
    hp::fence_barrier_init();
}

// An item's key tiles 0 .. n_k-1 of head h, batch bb (TMA coordinates) into the K and V rings, each copy once its
// slot is free; it counts the tiles issued so far (slot it % STAGES, phase (it / STAGES) & 1) and is advanced.
template <class C>
__device__ __forceinline__ void produce_kv(const CUtensorMap* tm_k, const CUtensorMap* tm_v, const Smem<C>& sm, int& it,
                                           int n_k, int h, int bb) {
    for (int j = 0; j < n_k; j++, it++) {
        const int s = it % C::STAGES;
        const uint32_t phase = (it / C::STAGES) & 1;
        hp::mbar_wait(sm.k_empty(s), phase ^ 1);  // slot s of K is free (the consumers are done with its last tile)
        hp::mbar_arrive_expect_tx(sm.k_full(s), C::KV_BYTES);
        for (int p = 0; p < C::PANELS; p++)
            hp::tma_load_4d(sm.k(s) + p * C::BC * 128, tm_k, sm.k_full(s), 64 * p, j * C::BC, h, bb);
        hp::mbar_wait(sm.v_empty(s), phase ^ 1);  // slot s of V is free
        hp::mbar_arrive_expect_tx(sm.v_full(s), C::KV_BYTES);
        for (int p = 0; p < C::PANELS; p++)
            hp::tma_load_4d(sm.v(s) + p * C::BC * 128, tm_v, sm.v_full(s), 64 * p, j * C::BC, h, bb);
    }
}

// The producer's next work item, from a fetch of a launch's work counter (g_tile_counter above says how it resets).
__device__ __forceinline__ int next_item(int* counter, int total) {
    const int fetched = atomicAdd(counter, 1);
    if (fetched == total - 1) atomicExch(counter, 0);  // the last fetch of this launch: reset
    return fetched + (int)gridDim.x;
}

// ---- the producer: one thread issues every TMA copy ---------------------------------------------------
template <class C>
__device__ __forceinline__ void producer(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                         const Smem<C>& sm, volatile int* tile_slot, const Problem& pr) {
    hp::setmaxnreg_dec<C::PRODUCER_REGS>();
    if (threadIdx.x != 0) return;
    hp::prefetch_tma_map(tm_q);
    hp::prefetch_tma_map(tm_k);
    hp::prefetch_tma_map(tm_v);
    const int n_q = ceil_div(pr.T, C::BR), total = n_q * pr.BH;
    int it = 0;                 // K/V tiles issued so far: slot it % STAGES, phase (it / STAGES) & 1
    int tile = blockIdx.x;      // first work item; the next ones come from the atomic counter
    for (int n = 0;; n++) {   // work item n uses Q slot b = n % 2, for the (n / 2)-th time
        const int b = n & 1;
        hp::mbar_wait(sm.q_empty(b), ((n >> 1) & 1) ^ 1);  // consumers finished their last Q K_jᵀ of item n-2
        if (tile >= total) {
            tile_slot[b] = -1;        // no more work: tell the consumers (the arrival below publishes it)
            hp::mbar_arrive(sm.q_full(b));
            return;
        }
        tile_slot[b] = tile;
        const Tile tl = decode_tile(tile, n_q, pr.BH, pr.section_heads);
        const int bb = tl.bh / pr.NH, h = tl.bh % pr.NH;  // TMA coordinates (column, token, head, batch)
        hp::mbar_arrive_expect_tx(sm.q_full(b), C::Q_BYTES);
        for (int p = 0; p < C::PANELS; p++)
            hp::tma_load_4d(sm.q(b) + p * C::BR * 128, tm_q, sm.q_full(b), 64 * p, tl.qt * C::BR, h, bb);
        produce_kv<C>(tm_k, tm_v, sm, it, key_tiles<C>(tl.qt, pr.T), h, bb);
        tile = next_item(&g_tile_counter, total);
    }
}

// ---- the consumers' two matmuls -----------------------------------------------------------------------
// S (64 × Bc) = Q_i rows (64 × HS, K-major) · K_jᵀ (K_j is Bc × HS, K-major): HS/16 wgmmas, k along HS.
template <class C>
__device__ __forceinline__ void qk_gemm(float (&s)[C::BC / 8][4], uint32_t q_rows, uint32_t k_tile) {
#pragma unroll
    for (int kk = 0; kk < C::HS / 16; kk++) {
        const uint32_t panel = kk / 4, off = (kk % 4) * 32;  // 16 columns = 32 bytes inside a 128-byte row
        const uint64_t da = hp::smem_desc_plus(hp::smem_desc_sw128(q_rows + panel * C::BR * 128, 16, 1024), off);
        const uint64_t db = hp::smem_desc_plus(hp::smem_desc_sw128(k_tile + panel * C::BC * 128, 16, 1024), off);
        hp::wgmma_ss<C::BC>(s, da, db, kk > 0);  // kk = 0 overwrites S
    }
}
// O (64 × HS) += P (64 × Bc, registers) · V_j (Bc × HS, MN-major): Bc/16 wgmmas, k along the keys. first: O = P V_j
// instead (the backward's dQ kernel, wgmma_backward_dq_ws.cuh, starts an item's dQ_i += dS K_j so, with no zeros).
template <class C>
__device__ __forceinline__ void pv_gemm(float (&o)[C::HS / 8][4], const uint32_t (&p)[C::BC / 16][4],
                                        uint32_t v_tile, bool first = false) {
#pragma unroll
    for (int kk = 0; kk < C::BC / 16; kk++) {
        const uint64_t db = hp::smem_desc_plus(hp::smem_desc_sw128(v_tile, C::BC * 128, 1024), kk * 16 * 128);
        hp::wgmma_rs<C::HS>(o, p[kk], db, !first || kk > 0);
    }
}
template <int NB>
__device__ __forceinline__ void to_p(uint32_t (&p)[NB][4], const float (&s)[2 * NB][4]) {
#pragma unroll
    for (int kk = 0; kk < NB; kk++) frag::p_fragment(p[kk], s, kk);
}

}  // namespace wgmma_attention
}  // namespace flashgpt2
