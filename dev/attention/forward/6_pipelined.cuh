// Rung 6 — pipelined: rung 5's tensor-core loop, with the loads of K_{j+1}, V_{j+1} overlapping the math
// on K_j, V_j, a swizzled (padding-free) shared-memory layout, and tile shapes chosen per head size.
//
// The idea (FlashAttention-2, arXiv:2307.08691, §3.3 and its CUTLASS implementation; the cp.async
// multi-stage pipeline of Ampere GEMMs): rung 5 stops every warp at a __syncthreads while K_j, V_j travel
// from HBM, so the tensor cores idle for a full memory latency per tile. Here
//   * cp.async copies 16 bytes global → shared without passing through registers and without blocking:
//     the copy of the next tile is issued, then the current tile is computed while it is in flight.
//     K and V each have two buffers (double buffering); K_{j+1} is issued before S = Q_i K_jᵀ, V_{j+1}
//     before O += P V_j, and cp.async.wait_group waits only for the tile about to be used.
//   * Swizzle instead of padding: row r of a tile stores its 16-byte chunk c at chunk position c ^ (r % 8).
//     The 8 rows an ldmatrix matrix reads share a logical chunk but land in 8 different physical chunks,
//     i.e. 8 different groups of 4 banks: conflict-free, with no wasted bytes (the layout Hopper's TMA and
//     wgmma use too, rung 7).
//   * Tile shapes: Br = 128 query rows per block. With MT = 2 a warp owns 32 rows (two m16 tiles), so each
//     K_j / V_j fragment read by ldmatrix feeds twice as many mma instructions, halving shared-memory traffic
//     per FLOP (mma.sync on Hopper is otherwise limited by it). The other shapes stay compiled in for the
//     tuning sweep (FLASHGPT2_R6_TILE=n, see kTiles below), so the choice is measured, not guessed.
// What changed from rung 5: synchronous loads → cp.async double buffering; padding → XOR swizzle; Br 64 →
// 128 (two m16 tiles per warp for head size 64). The math (mma.sync, P in registers, exp2) is rung 5's.
//
// Measured: the "Measured" block of doc/attention/6_pipelined.md, written by `make bench-attention`.
// Command: ./dev/attention/runner fwd 6 64 12 1024 64   (tiles: FLASHGPT2_R6_TILE=1 ./dev/attention/runner ...)
#pragma once
#include <cstdint>
#include <cstdlib>
#include "dev/attention/forward/5_tensor_cores.cuh"

namespace ladder::r6 {

using bf16 = __nv_bfloat16;
using r5::smem_u32;

// ---- cp.async: asynchronous 16-byte global → shared copies, completed in commit groups ----------------
// cp_async_16(dst, src, src_bytes) starts one copy (src_bytes = 0 copies nothing and fills the 16 bytes with
// zeros: rows past T); cp_async_commit() closes a group; cp_async_wait<N>() waits until at most N of this
// thread's groups are still in flight. They live in llmc/ptx/mma_sync.cuh, shared with the trainer's backward.
using flashgpt2::mma::cp_async_16;
using flashgpt2::mma::cp_async_commit;
using flashgpt2::mma::cp_async_wait;

// ---- the swizzled layout: a tile is (rows, HS) bf16 with no padding; chunk c of row r sits at c ^ (r % 8) --
template <int HS>
__device__ __forceinline__ uint32_t swz(uint32_t tile, int row, int chunk) {
    return tile + row * (HS * 2) + ((chunk ^ (row & 7)) << 4);
}

// Issue the copies of a ROWS×HS tile of one head (rows from row0; rows ≥ T are zero-filled).
template <int ROWS, int HS, int NTHREADS>
__device__ __forceinline__ void load_tile_async(uint32_t tile, const bf16* head, int row0, int T) {
    constexpr int CHUNKS = HS / 8;
    static_assert((ROWS * CHUNKS) % NTHREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
    for (int n = 0; n < ROWS * CHUNKS / NTHREADS; n++) {
        const int x = n * NTHREADS + threadIdx.x, r = x / CHUNKS, c = x % CHUNKS;
        const bool valid = row0 + r < T;
        const bf16* src = head + (size_t)(valid ? row0 + r : 0) * HS + 8 * c;
        cp_async_16(swz<HS>(tile, r, c), src, valid ? 16 : 0);
    }
}

// ---- the kernel ---------------------------------------------------------------------------------------
// NWARPS warps, each owning MT m16 tiles (16·MT consecutive query rows): Br = 16·MT·NWARPS; Bc keys per step.
// MINB blocks per SM are asked of the register allocator (it caps registers at 65536 / (MINB · threads)).
template <int HS, int NWARPS, int MT, int BC, int MINB>
__global__ void __launch_bounds__(NWARPS * 32, MINB)
attention_forward_pipelined_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                   const bf16* __restrict__ v, bf16* __restrict__ o, float* __restrict__ lse, int T,
                                   float scale) {
    constexpr int BR = 16 * MT * NWARPS, NTHREADS = NWARPS * 32;
    constexpr int Q_BYTES = BR * HS * 2, KV_BYTES = BC * HS * 2;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // Shared memory: Q_i (Br, HS), then K buffers 0, 1 and V buffers 0, 1 (Bc, HS) each, all swizzled.
    const uint32_t Qs = smem_u32(smem_raw);
    const uint32_t Ks0 = Qs + Q_BYTES, Vs0 = Ks0 + 2 * KV_BYTES;  // buffer b of K is Ks0 + b·KV_BYTES

    const int i = gridDim.x - 1 - blockIdx.x;  // query tile: heaviest first
    const int bh = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t head = head_offset(bh, T, HS);
    const int q0 = i * BR;
    const int wrow0 = q0 + 16 * MT * warp;  // this warp's first query row
    const float scale_log2 = scale * r5::LOG2E;
    const int n_tiles = ceil_div(min(q0 + BR, T), BC);

    // Prologue: commit groups in issue order are {Q_i, K_0}, {V_0}, then per step {K_{j+1}}, {V_{j+1}}.
    load_tile_async<BR, HS, NTHREADS>(Qs, q + head, q0, T);
    load_tile_async<BC, HS, NTHREADS>(Ks0, k + head, 0, T);
    cp_async_commit();
    load_tile_async<BC, HS, NTHREADS>(Vs0, v + head, 0, T);
    cp_async_commit();
    cp_async_wait<1>();  // this thread's copies of Q_i and K_0 have landed (V_0 may still fly)
    __syncthreads();     // ...and every other thread's: Q_i and K_0 are complete in shared memory

    uint32_t qf[MT][HS / 16][4];  // this warp's rows of Q_i as mma A fragments, kept for the whole loop
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++)
            r5::ldmatrix_x4(qf[mt][kk], swz<HS>(Qs, 16 * (MT * warp + mt) + lane % 16, 2 * kk + lane / 16));

    // ldmatrix addresses inside K_j and V_j. Every row this lane addresses is ≡ lane (mod 8), so the swizzle
    // depends only on the lane and the 16-column step: precompute one offset per step, and the other loop
    // index (16 rows at a time) becomes a constant added to it.
    uint32_t k_off[HS / 16], v_off[HS / 16];
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        k_off[kk] = swz<HS>(0, lane % 8 + 8 * (lane / 16), 2 * kk + (lane / 8) % 2);  // K_j rows: keys
        v_off[kk] = swz<HS>(0, lane % 16, 2 * kk + lane / 16);                         // V_j rows: keys
    }
    constexpr uint32_t ROWS16 = 16 * HS * 2;  // bytes of 16 tile rows

    float oacc[MT][HS / 8][4] = {};
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;

    for (int j = 0; j < n_tiles; j++) {
        const int buf = j & 1;
        const uint32_t Kj = Ks0 + buf * KV_BYTES, Vj = Vs0 + buf * KV_BYTES;
        const uint32_t Knext = Ks0 + (buf ^ 1) * KV_BYTES, Vnext = Vs0 + (buf ^ 1) * KV_BYTES;
        if (j > 0) {
            cp_async_wait<1>();  // K_j has landed (only V_j, issued after it, may still fly)
            __syncthreads();     // K_j complete for every warp; every warp also finished step j-1 entirely,
                                 // so the buffers of K_{j-1}, V_{j-1} are free to refill
        }
        if (j + 1 < n_tiles) load_tile_async<BC, HS, NTHREADS>(Knext, k + head, (j + 1) * BC, T);
        cp_async_commit();  // committed even when empty, so the group counting above stays uniform

        // S = Q_i K_jᵀ: each K_j fragment (ldmatrix) is used by all MT of this warp's m16 tiles.
        float s[MT][BC / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++)
#pragma unroll
            for (int nn = 0; nn < BC / 16; nn++) {
                uint32_t b[4];
                r5::ldmatrix_x4(b, Kj + k_off[kk] + nn * ROWS16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    r5::mma_bf16_16816(s[mt][2 * nn], qf[mt][kk], b[0], b[1]);
                    r5::mma_bf16_16816(s[mt][2 * nn + 1], qf[mt][kk], b[2], b[3]);
                }
            }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int row_g = wrow0 + 16 * mt + lane / 4;
            if (j * BC + BC - 1 > wrow0 + 16 * mt) r5::causal_mask(s[mt], row_g, j * BC, lane);
            float alpha[2];
            r5::online_softmax(s[mt], m[mt], l[mt], alpha, scale_log2);
            r5::scale_rows(oacc[mt], alpha);
        }

        cp_async_wait<1>();  // V_j has landed (only K_{j+1} may still fly)
        __syncthreads();     // V_j complete for every warp
        if (j + 1 < n_tiles) load_tile_async<BC, HS, NTHREADS>(Vnext, v + head, (j + 1) * BC, T);
        cp_async_commit();

        // O += P~ V_j, P~ from registers; each V_j fragment feeds all MT m16 tiles.
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) r5::p_fragment(a[mt], s[mt], kk);
#pragma unroll
            for (int nn = 0; nn < HS / 16; nn++) {
                uint32_t b[4];
                r5::ldmatrix_x4_trans(b, Vj + v_off[nn] + kk * ROWS16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    r5::mma_bf16_16816(oacc[mt][2 * nn], a[mt], b[0], b[1]);
                    r5::mma_bf16_16816(oacc[mt][2 * nn + 1], a[mt], b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait<0>();  // nothing may still be writing shared memory when the block exits (empty groups only)
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        r5::write_rows(oacc[mt], l[mt], m[mt], o + head, lse + (size_t)bh * T, wrow0 + 16 * mt + lane / 4, T, HS,
                       scale, lane);
}

template <int HS, int NWARPS, int MT, int BC, int MINB>
void launch(const AttnFwdParams& p) {
    constexpr int BR = 16 * MT * NWARPS;
    constexpr size_t smem = (size_t)(BR + 4 * BC) * HS * sizeof(bf16);
    auto kernel = attention_forward_pipelined_kernel<HS, NWARPS, MT, BC, MINB>;
    allow_shared_memory(kernel, smem);
    const dim3 grid(ceil_div(p.T, BR), p.B * p.NH);
    kernel<<<grid, NWARPS * 32, smem, p.stream>>>(
        static_cast<const bf16*>(p.q), static_cast<const bf16*>(p.k), static_cast<const bf16*>(p.v),
        static_cast<bf16*>(p.o), p.lse, p.T, 1.0f / sqrtf((float)p.HS));
    cudaCheckLaunch();
}

// The tile shapes compiled in, per head size: entry 0 is the default, the others are for the tuning sweep
// (FLASHGPT2_R6_TILE=n picks entry n). "minB" is the blocks per SM the register cap is set for; registers
// grow with MT·(Bc + HS) (S and O accumulators) + MT·HS/2 (Q_i fragments).
//   HS 64:  0: 4 warps × 2 m16 tiles (Br 128), Bc 64, minB 2    1: 8 warps × 1 (Br 128), Bc 64, minB 2
//           2: 4 warps × 1 (Br 64), Bc 64, minB 4 (≤ 128 registers, 16 warps per SM; 4 × 2 under a 168 cap
//              spills: S, O and Q_i fragments for 32 rows need ~190 registers)
//   HS 128: 0: 8 warps × 1 m16 tile (Br 128), Bc 64, minB 1     1: 4 warps × 1 (Br 64), Bc 64, minB 2
//           2: 8 warps × 1 (Br 128), Bc 32, minB 1
constexpr int kTiles = 3;
inline int tile_choice() {
    static const int choice = [] {
        const char* e = std::getenv("FLASHGPT2_R6_TILE");
        const int n = e ? std::atoi(e) : 0;
        return n >= 0 && n < kTiles ? n : 0;
    }();
    return choice;
}

inline bool supports(int HS) { return HS == 64 || HS == 128; }

}  // namespace ladder::r6

inline void attention_forward_pipelined(const AttnFwdParams& p) {
    using namespace ladder::r6;
    const int t = tile_choice();
    if (p.HS == 64) {
        if (t == 0) launch<64, 4, 2, 64, 2>(p);
        else if (t == 1) launch<64, 8, 1, 64, 2>(p);
        else launch<64, 4, 1, 64, 4>(p);
    } else if (p.HS == 128) {
        if (t == 0) launch<128, 8, 1, 64, 1>(p);
        else if (t == 1) launch<128, 4, 1, 64, 2>(p);
        else launch<128, 8, 1, 32, 1>(p);
    } else {
        flashgpt2::fail("attention_forward_pipelined: head size %d not supported (64, 128)", p.HS);
    }
}
