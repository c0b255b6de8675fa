// Rung 8 — ping-pong: rung 7's Hopper kernel with the consumer warpgroups taking turns at the tensor cores,
// item boundaries pipelined like ordinary steps, and a leaner softmax.
//
// Why (rung 7 measured on the H200 at (64,12,1024,64): 311 TFLOP/s; ncu: tensor pipe 36%, issue slots 42%,
// 2.3 warps per scheduler, 5.2 cycles between a warp's instructions, "latency issues"). At head size 64 the
// exponentials cost as much as the matmuls (one MUFU.EX2 per score at 16/clock/SM vs 256 tensor FLOPs per
// score at ~4096/clock/SM), so the kernel is fast only if one warpgroup's softmax runs while another's
// matmuls occupy the tensor cores. In rung 7 both consumers start every item together, so they tend to
// issue their matmuls together and then do their softmaxes together: tensor cores and MUFU idle in turn.
// Three changes, each a known technique:
//   1. Ping-pong (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608, §3.1 "pingpong scheduling"): the
//      consumers issue their wgmmas in strict round-robin order, enforced by named barriers (bar.sync /
//      bar.arrive, one per warpgroup). Warpgroup w waits for its turn, issues S_j = Q_i K_jᵀ and
//      O += P_{j-1} V_{j-1}, and hands the turn to warpgroup w+1; its softmax then runs while w+1's matmuls
//      run. Rung 7's intra-warpgroup overlap (§3.2) stays as it is inside each turn.
//   2. Item boundaries as ordinary steps: in rung 7 each work item began with a lone S_0 (nothing to overlap)
//      and ended with a lone P·V and the epilogue. Here the last P·V of item n and the first S of item n+1
//      are issued in ONE turn, the softmax of S_0 overlaps that P·V, and item n's epilogue (O / l, stores,
//      lse) is written while the other warpgroup has the tensor cores. At T = 1024 an item is only ~4.5
//      steps, so this removes about one un-overlapped step per item.
//   3. Fewer instructions on the softmax path: (a) the O rescale is skipped unless some row's max grew by
//      more than 2^8 in the exp2 domain (the conditional rescaling of FlashAttention's Blackwell kernels:
//      with a stale max m the exps are ≤ 2^8, harmless in fp32 and bf16, and O/l and lse = m·scale + ln l
//      stay exact because l and O use the same m); this removes 0.5 FMUL per score and the rescale from
//      the critical path between the P·V wait and the next turn. (b) row max and row sum as trees instead
//      of rung 5's 32-long serial chains (more independent instructions for the scheduler). (c) the causal
//      mask is decided per warp (16 rows), not per warpgroup (64 rows).
// Reused from rung 7 unchanged: the configuration and shared-memory layout, the producer (TMA + mbarriers
// + dynamic scheduler, heaviest tiles first in L2 sections), the two wgmma products, the tensor maps.
//
// Measured (H200, bf16, causal): not measured yet.
// Command: ./dev/attention/runner fwd 8 64 12 1024 64   (tile choice: FLASHGPT2_R8_TILE=0 or 1, see below)
#pragma once
#include "dev/attention/forward/7_hopper_wgmma.cuh"

namespace ladder::r8 {

using bf16 = __nv_bfloat16;
namespace hp = ladder::hopper;
using r7::Cfg;
using r7::Smem;
using r7::Tile;

// ---- turns: named barriers 1..NC (0 is __syncthreads's) ------------------------------------------------
// Warpgroup w's turn begins when it has synced on barrier 1+w, which completes once warpgroup w-1 (mod NC)
// has arrived there at the end of its own turn: 128 syncing + 128 arriving threads.
__device__ __forceinline__ void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int NC>
struct Turns {
    int cw;
    __device__ void begin() const { bar_sync(1 + cw, 256); }               // wait for the previous warpgroup
    __device__ void end() const { bar_arrive(1 + (cw + 1) % NC, 256); }    // hand the turn to the next one
};

// ---- the softmax step, leaner than rung 5's ------------------------------------------------------------
// Exps are kept relative to a possibly stale max: the row max m is only raised (and O, l rescaled) when
// the new max exceeds it by more than kRescaleLog2 in the exp2 domain, for the whole warp at once.
constexpr float kRescaleLog2 = 8.f;

// t[0] = op over t[0 .. 2W): a tree of depth log2(2W) (independent ops per level), unrolled at compile time.
template <int W, int N, class Op>
__device__ __forceinline__ void tree_reduce(float (&t)[N], Op op) {
#pragma unroll
    for (int c = 0; c < W; c++) t[c] = op(t[c], t[c + W]);
    if constexpr (W > 1) tree_reduce<W / 2>(t, op);
}

// In: raw scores s (accumulator layout, rows g and g+8 of the warp), running m (score units, per row) and
// thread-partial l. Out: s = P~ = 2^(s·scale_log2 − m·scale_log2), l += Σ P~. Returns true if m was raised;
// then alpha holds exp(scale·(m_old − m_new)) and the caller must scale its O rows by it.
template <int NS>
__device__ __forceinline__ bool softmax_step(float (&s)[NS][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                             float scale_log2) {
    static_assert((NS & (NS - 1)) == 0, "tree reductions over a power-of-two number of 8-column slices");
    float t0[NS], t1[NS];  // per-slice maxima of rows g and g+8, reduced as a tree (depth log2 NS, not NS)
#pragma unroll
    for (int c = 0; c < NS; c++) t0[c] = fmaxf(s[c][0], s[c][1]), t1[c] = fmaxf(s[c][2], s[c][3]);
    tree_reduce<NS / 2>(t0, [](float a, float b) { return fmaxf(a, b); });
    tree_reduce<NS / 2>(t1, [](float a, float b) { return fmaxf(a, b); });
    float mx[2] = {t0[0], t1[0]};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));  // the row's max over its quad
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
    // First tile: m = -inf, so the difference is +inf and the max is taken. A row still fully masked gives
    // -inf - -inf = NaN, which compares false: its m stays -inf and its exps below are 2^-inf = 0.
    const bool grow = (mx[0] - m[0]) * scale_log2 > kRescaleLog2 || (mx[1] - m[1]) * scale_log2 > kRescaleLog2;
    const bool rescale = __any_sync(0xffffffffu, grow);  // warp-uniform: the O rescale is skipped as a branch
    float neg_ms[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (rescale) {
            const float m_new = fmaxf(m[h], mx[h]);
            const float m_use = m_new == -INFINITY ? 0.f : m_new;  // never inf - inf
            alpha[h] = r5::fast_exp2((m[h] - m_use) * scale_log2);  // m = -inf → alpha = 0
            l[h] *= alpha[h];
            m[h] = m_new;
        }
        neg_ms[h] = -(m[h] == -INFINITY ? 0.f : m[h]) * scale_log2;
    }
    float u0[NS], u1[NS];  // per-slice sums, reduced as a tree like the maxima
#pragma unroll
    for (int c = 0; c < NS; c++) {
#pragma unroll
        for (int r = 0; r < 4; r++) s[c][r] = r5::fast_exp2(fmaf(s[c][r], scale_log2, neg_ms[r >> 1]));
        u0[c] = s[c][0] + s[c][1];
        u1[c] = s[c][2] + s[c][3];
    }
    tree_reduce<NS / 2>(u0, [](float a, float b) { return a + b; });
    tree_reduce<NS / 2>(u1, [](float a, float b) { return a + b; });
    l[0] += u0[0];
    l[1] += u1[0];
    return rescale;
}

// ---- a consumer warpgroup ------------------------------------------------------------------------------
// What a warpgroup needs to know about one work item.
template <class C>
struct Item {
    int b;         // its Q slot
    int bh, n_k;   // head, number of key tiles
    int row_w;     // first query row of this warp (16 rows)
    int row_g;     // query row of the thread's fragment row g
    uint32_t q_rows;  // this warpgroup's 64 rows of Q_i in shared memory
    __device__ Item(const Smem<C>& sm, int tile, int b_, int n_q, int BH, int section_heads, int T, int cw, int warp,
                    int lane) {
        const Tile tl = r7::decode_tile(tile, n_q, BH, section_heads);
        b = b_, bh = tl.bh, n_k = r7::key_tiles<C>(tl.qt, T);
        row_w = tl.qt * C::BR + 64 * cw + 16 * warp;
        row_g = row_w + lane / 4;
        q_rows = sm.q(b) + cw * 64 * 128;
    }
    // Key tile j holds a key above one of this warp's rows (future keys, or keys ≥ T): mask it.
    __device__ bool needs_mask(int j) const { return (j + 1) * C::BC - 1 > row_w; }
};

template <class C>
__device__ __forceinline__ void consumer(const Smem<C>& sm, volatile int* tile_slot, bf16* o, float* lse, int T,
                                         int BH, int section_heads, float scale) {
    hp::setmaxnreg_inc<C::CONSUMER_REGS>();
    constexpr int S = C::STAGES;
    const int cw = threadIdx.x / 128 - 1;  // consumer index: rows 64·cw .. 64·cw + 63 of Q_i
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const float scale_log2 = scale * r5::kLog2e;
    const int n_q = ceil_div(T, C::BR);
    const Turns<C::NC> turn{cw};
    if (cw == C::NC - 1) bar_arrive(1, 256);  // the last warpgroup "ends a turn" first: warpgroup 0 goes first
    using r7::release;

    float oacc[C::HS / 8][4] = {};  // (64, HS) slab of O_i, wgmma accumulator layout
    float s[C::BC / 8][4];          // S_j, then P~_j in fp32
    uint32_t p[C::BC / 16][4];      // P~_{j-1} in bf16: the A operand of the P·V wgmma
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];

    hp::mbar_wait(sm.q_full(0), 0);  // Q_i of item 0 (or the end marker) has arrived
    int tile = tile_slot[0];
    if (tile >= 0) {
        Item<C> cur(sm, tile, 0, n_q, BH, section_heads, T, cw, warp, lane);
        int it = 0;  // K/V tiles of earlier items (mirrors the producer's count)
        int n = 0;   // work items started
        {   // the very first S_0: alone, nothing to overlap with
            turn.begin();
            hp::mbar_wait(sm.k_full(0), 0);  // K_0 has landed
            hp::wgmma_fence();
            r7::qk_gemm<C>(s, cur.q_rows, sm.k(0));
            hp::wgmma_commit();
            turn.end();
            hp::wgmma_wait<0>();
            hp::fence_regs(s);
            release(sm.k_empty(0), lane);
            if (cur.n_k == 1) release(sm.q_empty(0), lane);
            if (cur.needs_mask(0)) r5::causal_mask(s, cur.row_g, 0, lane);
            softmax_step(s, m, l, alpha, scale_log2);  // first tile: m was -inf, O is still zero
            r7::to_p(p, s);
        }
        int j = 1;  // next key tile of the current item
        for (;;) {
            if (j < cur.n_k) {  // an ordinary step, as in rung 7 but inside a turn
                const int kt = it + j, vt = kt - 1, sk = kt % S, sv = vt % S;
                turn.begin();
                hp::mbar_wait(sm.k_full(sk), (kt / S) & 1);  // K_j has landed
                hp::wgmma_fence();                            // s, p, oacc were written by ordinary code
                r7::qk_gemm<C>(s, cur.q_rows, sm.k(sk));      // group 1: S_j = Q_i K_jᵀ
                hp::wgmma_commit();
                hp::mbar_wait(sm.v_full(sv), (vt / S) & 1);  // V_{j-1} has landed
                hp::wgmma_fence();
                r7::pv_gemm<C>(oacc, p, sm.v(sv));            // group 2: O += P~_{j-1} V_{j-1}
                hp::wgmma_commit();
                turn.end();                                   // the next warpgroup may issue its matmuls
                hp::wgmma_wait<1>();                          // group 1 done (group 2 may still run)
                hp::fence_regs(s);
                release(sm.k_empty(sk), lane);
                if (j == cur.n_k - 1) release(sm.q_empty(cur.b), lane);  // last read of Q_i
                if (cur.needs_mask(j)) r5::causal_mask(s, cur.row_g, j * C::BC, lane);
                const bool rescale = softmax_step(s, m, l, alpha, scale_log2);  // overlaps group 2
                hp::wgmma_wait<0>();                          // group 2 done: oacc and p are ours again
                hp::fence_regs(oacc);
                hp::fence_regs(s);                            // keeps the s → p conversion below the wait
                release(sm.v_empty(sv), lane);
                if (rescale) r5::scale_rows(oacc, alpha);
                r7::to_p(p, s);
                j++;
                continue;
            }
            // Every K_j of the current item is used; its last P·V remains. Fetch the next item first, so
            // that this P·V and the next item's S_0 go into one turn.
            const int vt = it + cur.n_k - 1, sv = vt % S;
            it += cur.n_k;
            n++;
            const int b = n & 1;
            hp::mbar_wait(sm.q_full(b), (n >> 1) & 1);  // the next Q_i (or the end marker) has arrived
            tile = tile_slot[b];
            if (tile < 0) {  // no next item: the last P·V alone, then the epilogue
                turn.begin();
                hp::mbar_wait(sm.v_full(sv), (vt / S) & 1);
                hp::wgmma_fence();
                r7::pv_gemm<C>(oacc, p, sm.v(sv));
                hp::wgmma_commit();
                turn.end();
                hp::wgmma_wait<0>();
                hp::fence_regs(oacc);
                release(sm.v_empty(sv), lane);
                r5::write_rows(oacc, l, m, o + head_offset(cur.bh, T, C::HS), lse + (size_t)cur.bh * T, cur.row_g,
                               T, C::HS, scale, lane);
                break;
            }
            const Item<C> nx(sm, tile, b, n_q, BH, section_heads, T, cw, warp, lane);
            const int sk = it % S;
            turn.begin();
            hp::mbar_wait(sm.k_full(sk), (it / S) & 1);  // the next item's K_0 has landed
            hp::wgmma_fence();
            r7::qk_gemm<C>(s, nx.q_rows, sm.k(sk));       // group 1: S_0 of the next item
            hp::wgmma_commit();
            hp::mbar_wait(sm.v_full(sv), (vt / S) & 1);  // the current item's last V has landed
            hp::wgmma_fence();
            r7::pv_gemm<C>(oacc, p, sm.v(sv));            // group 2: the current item's last P·V
            hp::wgmma_commit();
            turn.end();
            hp::wgmma_wait<1>();                          // group 1 done
            hp::fence_regs(s);
            release(sm.k_empty(sk), lane);
            if (nx.n_k == 1) release(sm.q_empty(b), lane);
            float m2[2] = {-INFINITY, -INFINITY}, l2[2] = {0.f, 0.f};  // the next item's statistics
            if (nx.needs_mask(0)) r5::causal_mask(s, nx.row_g, 0, lane);
            softmax_step(s, m2, l2, alpha, scale_log2);   // overlaps group 2
            hp::wgmma_wait<0>();                          // group 2 done: the current item's O is complete
            hp::fence_regs(oacc);
            hp::fence_regs(s);
            release(sm.v_empty(sv), lane);
            r5::write_rows(oacc, l, m, o + head_offset(cur.bh, T, C::HS), lse + (size_t)cur.bh * T, cur.row_g, T,
                           C::HS, scale, lane);
#pragma unroll
            for (int c = 0; c < C::HS / 8; c++) oacc[c][0] = oacc[c][1] = oacc[c][2] = oacc[c][3] = 0.f;
            m[0] = m2[0], m[1] = m2[1], l[0] = l2[0], l[1] = l2[1];
            r7::to_p(p, s);
            cur = nx;
            j = 1;
        }
    }
    // Every warpgroup took the same number of turns; the last one's final hand-over to warpgroup 0 is still
    // pending on barrier 1. Warpgroup 0 consumes it, so no named barrier is left half-arrived.
    if (cw == 0) turn.begin();
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
attention_forward_pingpong_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                                  const __grid_constant__ CUtensorMap tm_v, bf16* __restrict__ o,
                                  float* __restrict__ lse, int T, int BH, int section_heads, float scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(C::NC >= 2 && C::NC <= 3, "ping-pong needs two or three consumer warpgroups");
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
    if (threadIdx.x < 128) r7::producer<C>(&tm_q, &tm_k, &tm_v, sm, tile_slot, T, BH, section_heads);
    else r8::consumer<C>(sm, tile_slot, o, lse, T, BH, section_heads, scale);  // (qualified: ADL would also find r7::consumer)
#endif
}

inline bool supports(int HS) { return r7::supports(HS); }

// The launch of rung 7 with this rung's kernel. (Both rungs' producers share rung 7's self-resetting work
// counter; launches on one stream never overlap, so that is safe.)
template <class C>
void launch(const AttnFwdParams& p) {
    static int num_sms = 0;
    if (!num_sms) {  // once: the SM count, and the opt-in to more than 48 KB of shared memory
        int dev = 0;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
        cudaCheck(cudaFuncSetAttribute(attention_forward_pingpong_kernel<C>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
    }
    const int BH = p.B * p.NH, total = ceil_div(p.T, C::BR) * BH;
    const r7::Maps& maps = r7::tensor_maps(p, C::BR, C::BC);
    // Heads per scheduling section: as many as have their K and V (T·HS·2·2 bytes) in ~16 MB of L2.
    const int section_heads = std::max(1, (int)((16u << 20) / ((size_t)p.T * p.HS * 4)));
    attention_forward_pingpong_kernel<C><<<std::min(total, num_sms), C::THREADS, C::SMEM, p.stream>>>(
        maps.mq, maps.mk, maps.mv, static_cast<bf16*>(p.o), p.lse, p.T, BH, section_heads,
        1.0f / sqrtf((float)p.HS));
    cudaCheckLaunch();
}

// Tile choices, as in rung 7. HS 64: 0 = 2 consumer warpgroups (Br 128), 1 = 3 consumers (Br 192, turns
// rotate among three); both Bc 128, 3 stages. Default: 0 below T = 2048, 1 from there on (rung 7's measured
// split); FLASHGPT2_R8_TILE=0 or 1 forces one, for the tuning sweep. HS 128: 2 consumers, Bc 128, 2 stages.
inline int tile_override() {
    static const int choice = [] {
        const char* e = std::getenv("FLASHGPT2_R8_TILE");
        return e && (e[0] == '0' || e[0] == '1') && !e[1] ? e[0] - '0' : -1;
    }();
    return choice;
}

}  // namespace ladder::r8

inline void attention_forward_pingpong(const AttnFwdParams& p) {
    using namespace ladder::r8;
    if (!supports(p.HS))
        flashgpt2::fail("attention_forward_pingpong: needs an sm_90a build on an H100/H200 and HS 64 or 128 (HS = %d)",
                        p.HS);
    if (p.HS == 64) {
        const int t = tile_override();
        if (t == 1 || (t < 0 && p.T >= 2048)) launch<Cfg<64, 3, 128, 3>>(p);
        else launch<Cfg<64, 2, 128, 3>>(p);
    } else {
        launch<Cfg<128, 2, 128, 2>>(p);
    }
}
