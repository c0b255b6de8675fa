// Rung 7 — Hopper: wgmma tensor cores fed by TMA, a producer warpgroup and consumer warpgroups that
// communicate through mbarriers, and the softmax of one tile overlapped with the matmuls of its neighbours.
//
// The idea (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608): on H100/H200, mma.sync (rungs 5–6)
// reaches only about two thirds of the tensor cores' peak; the full rate needs the asynchronous warpgroup
// instruction wgmma, whose operands come straight from shared memory. Then the rest of the kernel must keep
// up with it:
//   * §3.1 warp specialization. Warpgroup 0 is the producer: one thread issues TMA copies (whole Q_i, K_j,
//     V_j tiles per instruction, zero-filled past T, already in the swizzled layout wgmma reads) into a
//     ring of STAGES shared-memory slots. The NC consumer warpgroups each own 64 query rows of Q_i and only
//     compute. "full" mbarriers say a slot has landed, "empty" mbarriers that every consumer warp is done
//     with it. setmaxnreg moves registers from the producer (24) to the consumers (240 or 160).
//   * §3.2 intra-warpgroup overlap: in step j a consumer issues S_j = Q_i K_jᵀ and O += P_{j-1} V_{j-1} as
//     two asynchronous wgmma groups, waits only for S_j, and runs the softmax of S_j (the exps: MUFU, a unit
//     the tensor cores do not use) while P_{j-1} V_{j-1} is still in flight. Only then does it wait for the
//     P·V group, rescale O by exp(m_old − m_new) and turn S_j into P_j.
//   * P stays in registers as in rung 5: the S accumulator fragment is the A-operand fragment of the
//     register-sourced wgmma (per warp the same layout as mma.sync's), so P_j V_j needs no shared memory.
//     V is read "MN-major" (transposed by the descriptor) since its head-dim columns are contiguous.
//   * Persistent grid with a dynamic tile scheduler: one block per SM loops over (head, query-tile) work
//     items taken from an atomic counter, heaviest query tiles first within sections of heads whose K, V fit
//     in L2. Q has two slots like K and V: the producer loads the next item's Q_i and first K/V tiles while
//     the consumers are still finishing the current one (block start-up and epilogue latencies are hidden).
//   * Softmax scale folded into exp2 as in rung 5.
// What changed from rung 6: mma.sync + ldmatrix + cp.async issued by every warp → wgmma + TMA with one
// producer thread; synchronous per-step matmuls → two wgmma groups in flight with the softmax between them;
// one block per tile → persistent blocks. Not here (yet): ping-pong scheduling between the two consumer
// warpgroups (FA3 §3.1, named barriers) and an FP8 path.
//
// Measured (H200, bf16, causal): not measured yet.
// Command: ./dev/attention/runner fwd 7 64 12 1024 64   (tile choice: FLASHGPT2_R7_TILE=n, see launch())
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include "dev/attention/forward/5_tensor_cores.cuh"
#include "dev/attention/forward/hopper_ptx.cuh"

namespace ladder::r7 {

using bf16 = __nv_bfloat16;
namespace hp = ladder::hopper;

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
    // PANELS panels of (rows × 128 B). Q is double-buffered too, so the next item's Q_i loads while the
    // current item is still being computed.
    static constexpr int K_OFF = 2 * Q_BYTES, V_OFF = K_OFF + STAGES * KV_BYTES, BAR_OFF = V_OFF + STAGES * KV_BYTES;
    static constexpr int NUM_BARS = 4 + 4 * STAGES;       // q_full[2], q_empty[2], k_full[], k_empty[], v_full[], v_empty[]
    static constexpr int TILE_OFF = BAR_OFF + 8 * NUM_BARS;
    static constexpr int SMEM = TILE_OFF + 16 + 1024;     // + room to align the base up
    // Register budgets after setmaxnreg (multiples of 8; THREADS · launch cap ≥ the sum of the budgets).
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = NC == 2 ? 240 : 160;
    static_assert(HS % 64 == 0 && (BC == 64 || BC == 128) && BR <= 256, "shapes wgmma and TMA boxes allow");
    static_assert(128 * PRODUCER_REGS + 128 * NC * CONSUMER_REGS <= 65536, "register file of one SM");
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

// Work item → (head bh, query tile qt). Heads are taken in sections of `section_heads` (their K and V fit
// in L2 together); inside a section all heads' last (heaviest) query tiles come first, then the next-to-
// last ones, …: longest jobs first balances the blocks, and the section keeps re-read K/V tiles in L2.
struct Tile {
    int bh, qt;
};
__device__ __forceinline__ Tile decode_tile(int tile, int n_q, int BH, int section_heads) {
    const int per_section = section_heads * n_q;
    const int sec = tile / per_section, within = tile - sec * per_section;
    const int heads = min(section_heads, BH - sec * section_heads);
    return Tile{sec * section_heads + within % heads, n_q - 1 - within / heads};
}

// Key tiles a query tile needs: those holding a key ≤ its last valid query row.
template <class C>
__device__ __forceinline__ int key_tiles(int qt, int T) { return ceil_div(min((qt + 1) * C::BR, T), C::BC); }

// The dynamic scheduler's work counter. Each block's first item is its blockIdx.x; every later one is
// gridDim.x + (a fetch of this counter). With G blocks and N ≥ G items there are exactly N fetches (N − G
// that return work, one final one per block), returning 0 … N−1 in atomic order: the block that draws N−1
// knows every other block has made its last fetch and puts the counter back to 0 for the next launch. So
// no per-launch memset; the price is that two launches of this rung must not run concurrently.
__device__ int g_tile_counter = 0;

// One arrival per consumer warp (the "empty" barriers count 4·NC of them), after the warp's wgmma wait.
__device__ __forceinline__ void release(uint32_t bar, int lane) {
    if (lane == 0) hp::mbar_arrive(bar);
}

// ---- the producer: one thread issues every TMA copy ---------------------------------------------------
template <class C>
__device__ __forceinline__ void producer(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                         const Smem<C>& sm, volatile int* tile_slot, int T, int BH,
                                         int section_heads) {
    hp::setmaxnreg_dec<C::PRODUCER_REGS>();
    if (threadIdx.x != 0) return;
    hp::prefetch_tma_map(tm_q);
    hp::prefetch_tma_map(tm_k);
    hp::prefetch_tma_map(tm_v);
    const int n_q = ceil_div(T, C::BR), total = n_q * BH;
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
        const Tile tl = decode_tile(tile, n_q, BH, section_heads);
        hp::mbar_arrive_expect_tx(sm.q_full(b), C::Q_BYTES);
        for (int p = 0; p < C::PANELS; p++)
            hp::tma_load_3d(sm.q(b) + p * C::BR * 128, tm_q, sm.q_full(b), 64 * p, tl.qt * C::BR, tl.bh);
        const int n_k = key_tiles<C>(tl.qt, T);
        for (int j = 0; j < n_k; j++, it++) {
            const int s = it % C::STAGES;
            const uint32_t phase = (it / C::STAGES) & 1;
            hp::mbar_wait(sm.k_empty(s), phase ^ 1);  // slot s of K is free (its previous tile fully used)
            hp::mbar_arrive_expect_tx(sm.k_full(s), C::KV_BYTES);
            for (int p = 0; p < C::PANELS; p++)
                hp::tma_load_3d(sm.k(s) + p * C::BC * 128, tm_k, sm.k_full(s), 64 * p, j * C::BC, tl.bh);
            hp::mbar_wait(sm.v_empty(s), phase ^ 1);  // slot s of V is free
            hp::mbar_arrive_expect_tx(sm.v_full(s), C::KV_BYTES);
            for (int p = 0; p < C::PANELS; p++)
                hp::tma_load_3d(sm.v(s) + p * C::BC * 128, tm_v, sm.v_full(s), 64 * p, j * C::BC, tl.bh);
        }
        const int fetched = atomicAdd(&g_tile_counter, 1);
        if (fetched == total - 1) atomicExch(&g_tile_counter, 0);  // the last fetch of this launch: reset
        tile = fetched + (int)gridDim.x;
    }
}

// ---- the consumers' two matmuls -----------------------------------------------------------------------
// S (64 × Bc) = Q_i rows (64 × HS, K-major) · K_jᵀ (K_j is Bc × HS, K-major): HS/16 wgmmas, k along HS.
template <class C>
__device__ __forceinline__ void qk_gemm(float (&s)[C::BC / 8][4], uint32_t q_rows, uint32_t k_tile) {
#pragma unroll
    for (int kk = 0; kk < C::HS / 16; kk++) {
        const uint32_t panel = kk / 4, off = (kk % 4) * 32;  // 16 columns = 32 bytes inside a 128-byte row
        const uint64_t da = hp::smem_desc_sw128(q_rows + panel * C::BR * 128 + off, 16, 1024);
        const uint64_t db = hp::smem_desc_sw128(k_tile + panel * C::BC * 128 + off, 16, 1024);
        hp::wgmma_ss<C::BC>(s, da, db, kk > 0);  // kk = 0 overwrites S
    }
}
// O (64 × HS) += P (64 × Bc, registers) · V_j (Bc × HS, MN-major): Bc/16 wgmmas, k along the keys.
template <class C>
__device__ __forceinline__ void pv_gemm(float (&o)[C::HS / 8][4], const uint32_t (&p)[C::BC / 16][4],
                                        uint32_t v_tile) {
#pragma unroll
    for (int kk = 0; kk < C::BC / 16; kk++) {
        const uint64_t db = hp::smem_desc_sw128(v_tile + kk * 16 * 128, C::BC * 128, 1024);
        hp::wgmma_rs<C::HS>(o, p[kk], db, 1);
    }
}
template <int NB>
__device__ __forceinline__ void to_p(uint32_t (&p)[NB][4], const float (&s)[2 * NB][4]) {
#pragma unroll
    for (int kk = 0; kk < NB; kk++) r5::p_fragment(p[kk], s, kk);
}

// ---- a consumer warpgroup: 64 query rows of every work item --------------------------------------------
template <class C>
__device__ __forceinline__ void consumer(const Smem<C>& sm, volatile int* tile_slot, bf16* o, float* lse, int T,
                                         int BH, int section_heads, float scale) {
    hp::setmaxnreg_inc<C::CONSUMER_REGS>();
    constexpr int S = C::STAGES;
    const int cw = threadIdx.x / 128 - 1;  // consumer index: rows 64·cw .. 64·cw + 63 of Q_i
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const float scale_log2 = scale * r5::kLog2e;
    const int n_q = ceil_div(T, C::BR);
    int it = 0;  // K/V tiles consumed so far (mirrors the producer)
    for (int n = 0;; n++) {
        const int b = n & 1;                           // item n's Q slot
        hp::mbar_wait(sm.q_full(b), (n >> 1) & 1);     // Q_i of item n (or the end marker) has arrived
        const int tile = tile_slot[b];
        if (tile < 0) return;
        const uint32_t q_rows = sm.q(b) + cw * 64 * 128;  // this warpgroup's rows in Q_i's first panel
        const Tile tl = decode_tile(tile, n_q, BH, section_heads);
        const int n_k = key_tiles<C>(tl.qt, T);
        const int row0 = tl.qt * C::BR + 64 * cw;         // this warpgroup's first query row
        const int row_g = row0 + 16 * warp + lane / 4;   // query row of the thread's fragment row g

        float oacc[C::HS / 8][4] = {};  // (64, HS) slab of O_i, wgmma accumulator layout
        float s[C::BC / 8][4];          // S_j, then P~_j in fp32
        uint32_t p[C::BC / 16][4];      // P~_{j-1} in bf16: the A operand of the P·V wgmma
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];

        {   // step 0: S_0 alone, nothing to overlap it with yet
            const int sk = it % S;
            hp::mbar_wait(sm.k_full(sk), (it / S) & 1);  // K_0 has landed
            hp::wgmma_fence();
            qk_gemm<C>(s, q_rows, sm.k(sk));
            hp::wgmma_commit();
            hp::wgmma_wait<0>();
            hp::fence_regs(s);
            release(sm.k_empty(sk), lane);
            if (n_k == 1) release(sm.q_empty(b), lane);
            if (C::BC - 1 > row0) r5::causal_mask(s, row_g, 0, lane);
            r5::online_softmax(s, m, l, alpha, scale_log2);
            to_p(p, s);
        }
        for (int j = 1; j < n_k; j++) {
            const int cur = it + j, prev = cur - 1;
            const int sk = cur % S, sv = prev % S;
            hp::mbar_wait(sm.k_full(sk), (cur / S) & 1);   // K_j has landed
            hp::wgmma_fence();                              // s, p, oacc were written by ordinary code
            qk_gemm<C>(s, q_rows, sm.k(sk));                // group 1: S_j = Q_i K_jᵀ
            hp::wgmma_commit();
            hp::mbar_wait(sm.v_full(sv), (prev / S) & 1);  // V_{j-1} has landed
            hp::wgmma_fence();                              // (the wait loop may have moved registers)
            pv_gemm<C>(oacc, p, sm.v(sv));                  // group 2: O += P~_{j-1} V_{j-1}
            hp::wgmma_commit();
            hp::wgmma_wait<1>();                            // group 1 done (group 2 may still run)
            hp::fence_regs(s);
            release(sm.k_empty(sk), lane);
            if (j == n_k - 1) release(sm.q_empty(b), lane);  // last read of Q_i: the producer may refill it
            if ((j + 1) * C::BC - 1 > row0) r5::causal_mask(s, row_g, j * C::BC, lane);
            r5::online_softmax(s, m, l, alpha, scale_log2);  // overlaps group 2 on the tensor cores
            hp::wgmma_wait<0>();                            // group 2 done: oacc and p are ours again
            hp::fence_regs(oacc);
            hp::fence_regs(s);                              // keeps the s → p conversion below the wait
            release(sm.v_empty(sv), lane);
            r5::scale_rows(oacc, alpha);
            to_p(p, s);
        }
        {   // the last P·V
            const int last = it + n_k - 1, sv = last % S;
            hp::mbar_wait(sm.v_full(sv), (last / S) & 1);  // V_{n_k - 1} has landed
            hp::wgmma_fence();
            pv_gemm<C>(oacc, p, sm.v(sv));
            hp::wgmma_commit();
            hp::wgmma_wait<0>();
            hp::fence_regs(oacc);
            release(sm.v_empty(sv), lane);
        }
        it += n_k;
        r5::write_rows(oacc, l, m, o + head_offset(tl.bh, T, C::HS), lse + (size_t)tl.bh * T, row_g, T, C::HS, scale,
                       lane);
    }
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
attention_forward_wgmma_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                               const __grid_constant__ CUtensorMap tm_v, bf16* __restrict__ o,
                               float* __restrict__ lse, int T, int BH, int section_heads, float scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = hp::smem_u32(smem_raw);
    const Smem<C> sm{(raw + 1023) & ~1023u};
    volatile int* tile_slot = reinterpret_cast<volatile int*>(smem_raw + (sm.base - raw) + C::TILE_OFF);
    if (threadIdx.x == 0) {
        for (int b = 0; b < 2; b++) {
            hp::mbar_init(sm.q_full(b), 1);           // the producer's arrive.expect_tx, plus Q_i's bytes
            hp::mbar_init(sm.q_empty(b), 4 * C::NC);  // one arrival per consumer warp
        }
        for (int s = 0; s < C::STAGES; s++) {
            hp::mbar_init(sm.k_full(s), 1);
            hp::mbar_init(sm.k_empty(s), 4 * C::NC);
            hp::mbar_init(sm.v_full(s), 1);
            hp::mbar_init(sm.v_empty(s), 4 * C::NC);
        }
        hp::fence_barrier_init();
    }
    __syncthreads();  // the barriers are initialized before any thread waits on or arrives at them
    if (threadIdx.x < 128) producer<C>(&tm_q, &tm_k, &tm_v, sm, tile_slot, T, BH, section_heads);
    else consumer<C>(sm, tile_slot, o, lse, T, BH, section_heads, scale);
#endif
}

// Does this binary hold sm_90a code for the kernel, and is the device an sm_90? (The kernel body is empty
// when compiled for anything else; a one-thread probe compiled the same way answers, once.)
__global__ void sm90a_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}
inline bool have_sm90a() {
    static const bool ok = [] {
        int dev = 0, major = 0, minor = 0;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        if (major != 9 || minor != 0) return false;
        int* d = nullptr;
        int h = 0;
        cudaCheck(cudaMalloc(&d, sizeof(int)));
        sm90a_probe_kernel<<<1, 1>>>(d);
        const bool launched = cudaGetLastError() == cudaSuccess;  // no sm_90 image at all: not supported
        if (launched) cudaCheck(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
        cudaCheck(cudaFree(d));
        return launched && h == 1;
    }();
    return ok;
}

inline bool supports(int HS) { return (HS == 64 || HS == 128) && have_sm90a(); }

// Tensor maps for (q, k, v): built on the host the first time a (pointers, shape, tile) combination is seen,
// then reused, so timed launches do not rebuild them.
struct Maps {
    const void *q = nullptr, *k = nullptr, *v = nullptr;
    int BH = 0, T = 0, HS = 0, br = 0, bc = 0;
    CUtensorMap mq, mk, mv;
};
inline const Maps& tensor_maps(const AttnFwdParams& p, int br, int bc) {
    constexpr int N = 8;
    static Maps cache[N];
    static int next = 0;
    const int BH = p.B * p.NH;
    for (const Maps& e : cache)
        if (e.q == p.q && e.k == p.k && e.v == p.v && e.BH == BH && e.T == p.T && e.HS == p.HS && e.br == br &&
            e.bc == bc)
            return e;
    Maps& e = cache[next];
    next = (next + 1) % N;
    e.mq = hp::make_head_map(p.q, BH, p.T, p.HS, br);
    e.mk = hp::make_head_map(p.k, BH, p.T, p.HS, bc);
    e.mv = hp::make_head_map(p.v, BH, p.T, p.HS, bc);
    e.q = p.q, e.k = p.k, e.v = p.v, e.BH = BH, e.T = p.T, e.HS = p.HS, e.br = br, e.bc = bc;
    return e;
}

template <class C>
void launch(const AttnFwdParams& p) {
    static int num_sms = 0;
    if (!num_sms) {  // once: the SM count, and the opt-in to more than 48 KB of shared memory
        int dev = 0;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
        cudaCheck(cudaFuncSetAttribute(attention_forward_wgmma_kernel<C>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
    }
    const int BH = p.B * p.NH, total = ceil_div(p.T, C::BR) * BH;
    const Maps& maps = tensor_maps(p, C::BR, C::BC);
    // Heads per scheduling section: as many as have their K and V (T·HS·2·2 bytes) in ~16 MB of L2.
    const int section_heads = std::max(1, (int)((16u << 20) / ((size_t)p.T * p.HS * 4)));
    attention_forward_wgmma_kernel<C><<<std::min(total, num_sms), C::THREADS, C::SMEM, p.stream>>>(
        maps.mq, maps.mk, maps.mv, static_cast<bf16*>(p.o), p.lse, p.T, BH, section_heads,
        1.0f / sqrtf((float)p.HS));
    cudaCheckLaunch();
}

// Tile choices. HS 64: A = 2 consumer warpgroups (Br 128), Bc 128, 3 stages; B = 3 consumers (Br 192, 160
// registers each: FlashAttention-3's hdim-64 shape), Bc 128, 3 stages. A wastes less of the causal diagonal
// and of the last, partial query tile on short sequences; B shares each K/V tile among more rows. Default: A
// below T = 2048, B from there on; FLASHGPT2_R7_TILE=0 (A) or 1 (B) forces one, for the tuning sweep.
// HS 128: 2 consumers, Bc 128, 2 stages (S, P and O of 64 rows need ~200 registers: no room for 3).
inline int tile_override() {
    static const int choice = [] {
        const char* e = std::getenv("FLASHGPT2_R7_TILE");
        return e && (e[0] == '0' || e[0] == '1') && !e[1] ? e[0] - '0' : -1;
    }();
    return choice;
}

}  // namespace ladder::r7

inline void attention_forward_hopper_wgmma(const AttnFwdParams& p) {
    using namespace ladder::r7;
    if (!supports(p.HS))
        flashgpt2::fail("attention_forward_hopper_wgmma: needs an sm_90a build on an H100/H200 and HS 64 or 128 (HS = %d)",
                        p.HS);
    if (p.HS == 64) {
        const int t = tile_override();
        if (t == 1 || (t < 0 && p.T >= 2048)) launch<Cfg<64, 3, 128, 3>>(p);
        else launch<Cfg<64, 2, 128, 3>>(p);
    } else {
        launch<Cfg<128, 2, 128, 2>>(p);
    }
}
