// The consumer warpgroups' loops of the Hopper attention forward (engine `wgmma`; wgmma_forward_pipeline.cuh holds
// the configuration, the producer and the two wgmma products they call, wgmma_forward.cuh the kernels).
//   consumer_overlap   rung 7 (dev/attention/forward/7_hopper_wgmma.cuh): per step, S_j = Q_i K_jᵀ and
//                      O += P_{j-1} V_{j-1} as two wgmma groups, the softmax of S_j between their waits.
//   consumer_pingpong  rung 8 (dev/attention/forward/8_pingpong.cuh): the same step, issued in turns among
//                      the warpgroups (named barriers), the last P·V of an item and the first S of the next
//                      in one turn, a conditional O rescale and tree reductions in the softmax.
// Both write O / l and lse = m·scale + ln l per row (frag::write_rows), O through the problem's strides.
#pragma once
#include <cmath>
#include <cstdint>

#include "llmc/attention/fragment.cuh"
#include "llmc/attention/wgmma_forward_pipeline.cuh"
#include "llmc/kernel_common.cuh"
#include "llmc/ptx/hopper.cuh"

namespace flashgpt2::wgmma_attention {

// ---- rung 7's loop: 64 query rows of every work item -----------------------------------------------------
template <class C>
__device__ __forceinline__ void consumer_overlap(const Smem<C>& sm, volatile int* tile_slot, const Problem& pr) {
    hp::setmaxnreg_inc<C::CONSUMER_REGS>();
    constexpr int S = C::STAGES;
    const int cw = threadIdx.x / 128 - 1;  // consumer index: rows 64·cw .. 64·cw + 63 of Q_i
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const float scale_log2 = pr.scale * LOG2E;
    const int T = pr.T, n_q = ceil_div(T, C::BR);
    int it = 0;  // K/V tiles consumed so far (mirrors the producer)
    for (int n = 0;; n++) {
        const int b = n & 1;                           // item n's Q slot
        hp::mbar_wait(sm.q_full(b), (n >> 1) & 1);     // Q_i of item n (or the end marker) has arrived
        const int tile = tile_slot[b];
        if (tile < 0) return;
        const uint32_t q_rows = sm.q(b) + cw * 64 * 128;  // this warpgroup's rows in Q_i's first panel
        const Tile tl = decode_tile(tile, n_q, pr.BH, pr.section_heads);
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
            if (C::BC - 1 > row0) frag::causal_mask(s, row_g, 0, lane);
            frag::online_softmax(s, m, l, alpha, scale_log2);
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
            if ((j + 1) * C::BC - 1 > row0) frag::causal_mask(s, row_g, j * C::BC, lane);
            frag::online_softmax(s, m, l, alpha, scale_log2);  // overlaps group 2 on the tensor cores
            hp::wgmma_wait<0>();                            // group 2 done: oacc and p are ours again
            hp::fence_regs(oacc);
            hp::fence_regs(s);                              // keeps the s → p conversion below the wait
            release(sm.v_empty(sv), lane);
            frag::scale_rows(oacc, alpha);
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
        frag::write_rows(oacc, l, m, pr.o_head(tl.bh), pr.lse_head(tl.bh), row_g, T, pr.o_t, pr.scale, lane);
    }
}

// ---- rung 8's loop -----------------------------------------------------------------------------------------
// Turns: named barriers 1..NC (0 is __syncthreads's). Warpgroup w's turn begins when it has synced on
// barrier 1+w, which completes once warpgroup w-1 (mod NC) has arrived there at the end of its own turn:
// 128 syncing + 128 arriving threads.
using hopper::bar_arrive;
using hopper::bar_sync;
template <int NC>
struct Turns {
    int cw;
    __device__ void begin() const { bar_sync(1 + cw, 256); }               // wait for the previous warpgroup
    __device__ void end() const { bar_arrive(1 + (cw + 1) % NC, 256); }    // hand the turn to the next one
};

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
            alpha[h] = frag::fast_exp2((m[h] - m_use) * scale_log2);  // m = -inf → alpha = 0
            l[h] *= alpha[h];
            m[h] = m_new;
        }
        neg_ms[h] = -(m[h] == -INFINITY ? 0.f : m[h]) * scale_log2;
    }
    float u0[NS], u1[NS];  // per-slice sums, reduced as a tree like the maxima
#pragma unroll
    for (int c = 0; c < NS; c++) {
#pragma unroll
        for (int r = 0; r < 4; r++) s[c][r] = frag::fast_exp2(fmaf(s[c][r], scale_log2, neg_ms[r >> 1]));
        u0[c] = s[c][0] + s[c][1];
        u1[c] = s[c][2] + s[c][3];
    }
    tree_reduce<NS / 2>(u0, [](float a, float b) { return a + b; });
    tree_reduce<NS / 2>(u1, [](float a, float b) { return a + b; });
    l[0] += u0[0];
    l[1] += u1[0];
    return rescale;
}

// What a warpgroup needs to know about one work item.
template <class C>
struct Item {
    int b;         // its Q slot
    int bh, n_k;   // head, number of key tiles
    int row_w;     // first query row of this warp (16 rows)
    int row_g;     // query row of the thread's fragment row g
    uint32_t q_rows;  // this warpgroup's 64 rows of Q_i in shared memory
    __device__ Item(const Smem<C>& sm, int tile, int b_, int n_q, const Problem& pr, int cw, int warp, int lane) {
        const Tile tl = decode_tile(tile, n_q, pr.BH, pr.section_heads);
        b = b_, bh = tl.bh, n_k = key_tiles<C>(tl.qt, pr.T);
        row_w = tl.qt * C::BR + 64 * cw + 16 * warp;
        row_g = row_w + lane / 4;
        q_rows = sm.q(b) + cw * 64 * 128;
    }
    // Key tile j holds a key above one of this warp's rows (future keys, or keys ≥ T): mask it.
    __device__ bool needs_mask(int j) const { return (j + 1) * C::BC - 1 > row_w; }
};

template <class C>
__device__ __forceinline__ void consumer_pingpong(const Smem<C>& sm, volatile int* tile_slot, const Problem& pr) {
    static_assert(C::NC >= 2 && C::NC <= 3, "ping-pong needs two or three consumer warpgroups");
    hp::setmaxnreg_inc<C::CONSUMER_REGS>();
    constexpr int S = C::STAGES;
    const int cw = hp::uniform(threadIdx.x / 128 - 1);  // consumer index: rows 64·cw .. 64·cw + 63 of Q_i
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const float scale_log2 = pr.scale * LOG2E;
    const int T = pr.T, n_q = ceil_div(T, C::BR);
    const Turns<C::NC> turn{cw};
    if (cw == C::NC - 1) bar_arrive(1, 256);  // the last warpgroup "ends a turn" first: warpgroup 0 goes first

    float oacc[C::HS / 8][4] = {};  // (64, HS) slab of O_i, wgmma accumulator layout
    float s[C::BC / 8][4];          // S_j, then P~_j in fp32
    uint32_t p[C::BC / 16][4];      // P~_{j-1} in bf16: the A operand of the P·V wgmma
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];

    hp::mbar_wait(sm.q_full(0), 0);  // Q_i of item 0 (or the end marker) has arrived
    int tile = hp::uniform(tile_slot[0]);
    if (tile >= 0) {
        Item<C> cur(sm, tile, 0, n_q, pr, cw, warp, lane);
        int it = 0;  // K/V tiles of earlier items (mirrors the producer's count)
        int n = 0;   // work items started
        {   // the very first S_0: alone, nothing to overlap with
            turn.begin();
            hp::mbar_wait(sm.k_full(0), 0);  // K_0 has landed
            hp::wgmma_fence();
            qk_gemm<C>(s, cur.q_rows, sm.k(0));
            hp::wgmma_commit();
            turn.end();
            hp::wgmma_wait<0>();
            hp::fence_regs(s);
            release(sm.k_empty(0), lane);
            if (cur.n_k == 1) release(sm.q_empty(0), lane);
            if (cur.needs_mask(0)) frag::causal_mask(s, cur.row_g, 0, lane);
            softmax_step(s, m, l, alpha, scale_log2);  // first tile: m was -inf, O is still zero
            to_p(p, s);
        }
        int j = 1;  // next key tile of the current item
        for (;;) {
            if (j < cur.n_k) {  // an ordinary step, as in rung 7 but inside a turn
                const int kt = it + j, vt = kt - 1, sk = kt % S, sv = vt % S;
                turn.begin();
                hp::mbar_wait(sm.k_full(sk), (kt / S) & 1);  // K_j has landed
                hp::wgmma_fence();                            // s, p, oacc were written by ordinary code
                qk_gemm<C>(s, cur.q_rows, sm.k(sk));          // group 1: S_j = Q_i K_jᵀ
                hp::wgmma_commit();
                hp::mbar_wait(sm.v_full(sv), (vt / S) & 1);  // V_{j-1} has landed
                hp::wgmma_fence();
                pv_gemm<C>(oacc, p, sm.v(sv));                // group 2: O += P~_{j-1} V_{j-1}
                hp::wgmma_commit();
                turn.end();                                   // the next warpgroup may issue its matmuls
                hp::wgmma_wait<1>();                          // group 1 done (group 2 may still run)
                hp::fence_regs(s);
                release(sm.k_empty(sk), lane);
                if (j == cur.n_k - 1) release(sm.q_empty(cur.b), lane);  // last read of Q_i
                if (cur.needs_mask(j)) frag::causal_mask(s, cur.row_g, j * C::BC, lane);
                const bool rescale = softmax_step(s, m, l, alpha, scale_log2);  // overlaps group 2
                hp::wgmma_wait<0>();                          // group 2 done: oacc and p are ours again
                hp::fence_regs(oacc);
                hp::fence_regs(s);                            // keeps the s → p conversion below the wait
                release(sm.v_empty(sv), lane);
                if (rescale) frag::scale_rows(oacc, alpha);
                to_p(p, s);
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
            tile = hp::uniform(tile_slot[b]);
            if (tile < 0) {  // no next item: the last P·V alone, then the epilogue
                turn.begin();
                hp::mbar_wait(sm.v_full(sv), (vt / S) & 1);
                hp::wgmma_fence();
                pv_gemm<C>(oacc, p, sm.v(sv));
                hp::wgmma_commit();
                turn.end();
                hp::wgmma_wait<0>();
                hp::fence_regs(oacc);
                release(sm.v_empty(sv), lane);
                frag::write_rows(oacc, l, m, pr.o_head(cur.bh), pr.lse_head(cur.bh), cur.row_g, T, pr.o_t, pr.scale,
                                 lane);
                break;
            }
            const Item<C> nx(sm, tile, b, n_q, pr, cw, warp, lane);
            const int sk = it % S;
            turn.begin();
            hp::mbar_wait(sm.k_full(sk), (it / S) & 1);  // the next item's K_0 has landed
            hp::wgmma_fence();
            qk_gemm<C>(s, nx.q_rows, sm.k(sk));           // group 1: S_0 of the next item
            hp::wgmma_commit();
            hp::mbar_wait(sm.v_full(sv), (vt / S) & 1);  // the current item's last V has landed
            hp::wgmma_fence();
            pv_gemm<C>(oacc, p, sm.v(sv));                // group 2: the current item's last P·V
            hp::wgmma_commit();
            turn.end();
            hp::wgmma_wait<1>();                          // group 1 done
            hp::fence_regs(s);
            release(sm.k_empty(sk), lane);
            if (nx.n_k == 1) release(sm.q_empty(b), lane);
            float m2[2] = {-INFINITY, -INFINITY}, l2[2] = {0.f, 0.f};  // the next item's statistics
            if (nx.needs_mask(0)) frag::causal_mask(s, nx.row_g, 0, lane);
            softmax_step(s, m2, l2, alpha, scale_log2);   // overlaps group 2
            hp::wgmma_wait<0>();                          // group 2 done: the current item's O is complete
            hp::fence_regs(oacc);
            hp::fence_regs(s);
            release(sm.v_empty(sv), lane);
            frag::write_rows(oacc, l, m, pr.o_head(cur.bh), pr.lse_head(cur.bh), cur.row_g, T, pr.o_t, pr.scale,
                             lane);
#pragma unroll
            for (int c = 0; c < C::HS / 8; c++) oacc[c][0] = oacc[c][1] = oacc[c][2] = oacc[c][3] = 0.f;
            m[0] = m2[0], m[1] = m2[1], l[0] = l2[0], l[1] = l2[1];
            to_p(p, s);
            cur = nx;
            j = 1;
        }
    }
    // Every warpgroup took the same number of turns; the last one's final hand-over to warpgroup 0 is still
    // pending on barrier 1. Warpgroup 0 consumes it, so no named barrier is left half-arrived.
    if (cw == 0) turn.begin();
}

}  // namespace flashgpt2::wgmma_attention
