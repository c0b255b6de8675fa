// The MLP's two GELU matmuls on Hopper, GELU applied to the fp32 accumulator (engine `wgmma`, BF16 builds on
// sm_90a). Both have the shape (N rows, 4C columns, C deep):
//   forward   pre = inp · fcwᵀ + fcb,  out = gelu(pre)        inp (N, C), fcw (4C, C): both K-major
//   backward  dpre = (dout · fcprojw) ∘ gelu'(pre)             dout (N, C), fcprojw (C, 4C): B is MN-major
// cuBLASLt fuses the same epilogues (GELU_AUX_BIAS, DGELU), but its kernels for them are slower than its plain
// GEMM by more than the bytes they add (doc/kernels.md, gelu). One persistent, warp-specialized kernel
// (FlashAttention-3's and CUTLASS's structure, as in llmc/attention/wgmma_forward*.cuh):
//   producer warp 0      one thread streams the k-slices of A (BM × BK) and B (BN × BK) through a ring of
//                        STAGES shared-memory slots with TMA (128-byte swizzle; rows past the end arrive as 0)
//   helper warps 1-3     backward only: turn the tile's pre, which a consumer TMA-loads during the mainloop,
//                        into gelu'(pre) in place (bf16), so the consumers' epilogue is one multiply
//   2 consumer warpgroups each owns 64 rows of the BM × BN = 128 × 256 tile: one m64n256k16 wgmma per 16 of k,
//                        a 64 × 256 fp32 accumulator in 128 registers; the epilogue writes bf16 64 × 64 boxes
//                        into 128-byte-swizzled shared memory and TMA stores copy them out while the
//                        warpgroup goes on to its next tile. Backward, when asked, the epilogue also sums its
//                        slice's columns (the bias gradient of the layer that made pre, without reading dpre
//                        back from HBM): in registers, across lanes by shuffles, across warps in shared memory
// The tiles go round-robin over one block per SM, column tile fastest: the blocks running together share rows of
// A (in L2), and all of B (4C × C, a few MB) stays in L2.
// What is still slow (dev/matmul/gelu_bench.cu; doc/kernels.md has the measurements): the mainloop alone beats
// cuBLAS's plain GEMM of the d12 shape, but the epilogue is not overlapped with wgmmas (both warpgroups finish a
// tile together), and its 32 KB of boxes per warpgroup hold half of a forward tile's two outputs, so the forward
// waits for its own copies to drain to memory. More boxes (a 2-slot ring) and clusters sharing B measured slower;
// a ping-pong schedule (each warpgroup its own 128 × 128 tile, one's epilogue under the other's wgmmas) made the
// kernel faster and the trainer at B=64 slower, where the card runs at its power limit.
#pragma once
#include <algorithm>
#include <cstdint>
#include "llmc/attention/fragment.cuh"  // frag::pack_bf16, unpack_bf16 (the attention engines' accumulator layout)
#include "llmc/common.cuh"
#include "llmc/error.h"
#include "llmc/gelu.cuh"                 // GELU_SCALE
#include "llmc/ptx/hopper.cuh"

namespace flashgpt2 {
namespace wgmma_matmul {

using bf16 = __nv_bfloat16;
namespace hp = flashgpt2::hopper;

constexpr int BM = 128, BN = 256, BK = 64, STAGES = 3;           // tile, k-slice (64 bf16: the 128-byte swizzle)
constexpr int THREADS = 384;                                     // producer warpgroup + 2 consumer warpgroups
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;      // one ring slot: 16 KB of A, 32 KB of B
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int BOX = 64 * 64 * 2;                                 // one 64 × 64 bf16 output box, 8 KB
constexpr int SLOTS_BYTES = (BN / 64) * BOX;                     // per consumer: 4 boxes, a backward 64 × 256 slice
constexpr int OUT_OFF = STAGES * STAGE_BYTES;
constexpr int BAR_OFF = OUT_OFF + 2 * SLOTS_BYTES;               // full[STAGES], empty[STAGES], pre_full[2], ready[2]
constexpr int SUMS_OFF = BAR_OFF + 128;                          // backward column sums: [tile parity][cw][warp][BN]
constexpr int SUMS_BYTES = 2 * 2 * 4 * BN * 4;                   // fp32, 16 KB
constexpr int SMEM = SUMS_OFF + SUMS_BYTES + 1024;               // + room to align the base to 1024 bytes
constexpr int SMEM_FORWARD = SUMS_OFF + 1024;                    // (the forward has no column sums: more L1 left)
static_assert(16 * STAGES + 32 <= 128, "the barriers fit before the column sums");
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
static_assert(SMEM <= 227 * 1024, "one block per SM, within the opt-in shared memory (4 stages do not fit)");
// (PRODUCER_REGS 48 passed a check against the SM's 65536 registers and hung every launch: 168 × 384 is the budget)
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= hp::launch_regs(THREADS) * THREADS,
              "the block's registers at launch (setmaxnreg only moves them)");
static_assert(A_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0 && BOX % 1024 == 0,
              "every slot starts on a swizzle pattern (1024 B)");

enum class Epilogue { gelu_forward, gelu_backward };

struct Problem {
    bf16* out;          // (M, N): gelu(pre) forward, dpre backward
    bf16* pre;          // (M, N): written forward, read backward
    const bf16* bias;   // (N) forward, or nullptr
    float* colsum;      // (ceil(M / 64), N) backward, or nullptr: row s = the column sums of dpre's rows 64s..64s+63
    int M, N, K;
};
struct Maps {           // TMA maps of out and pre, boxes of 64 × 64, 128-byte swizzle
    const CUtensorMap *out, *pre;
};

// tanh on the SFU (PTX tanh.approx.f32, max relative error about 2^-11): the result is rounded to bf16 anyway.
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// gelu(x) = hx + hx tanh(u) with hx = x / 2 and u = x (S + S C x²): five FMA-pipe operations and one tanh.
// gelu'(x) = (1 + tanh u) / 2 + hx (1 − tanh² u) u',  u' = S + 3 S C x².
constexpr float GELU_S = GELU_SCALE, GELU_SC = GELU_SCALE * 0.044715f;
__device__ __forceinline__ float gelu_acc(float x) {
    const float hx = 0.5f * x, th = tanh_approx(x * fmaf(GELU_SC * x, x, GELU_S));
    return fmaf(hx, th, hx);
}
__device__ __forceinline__ float gelu_grad_acc(float x) {
    const float x2 = x * x, th = tanh_approx(x * fmaf(GELU_SC, x2, GELU_S));
    const float du = fmaf(3.0f * GELU_SC, x2, GELU_S), sech2 = fmaf(-th, th, 1.0f);
    return fmaf(0.5f * x * sech2, du, fmaf(0.5f, th, 0.5f));
}

using frag::pack_bf16;
using frag::unpack_bf16;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---- shared memory: the epilogue's boxes and barriers ------------------------------------------------------
__device__ __forceinline__ void st_pair(uint32_t addr, uint32_t v) { asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v)); }
__device__ __forceinline__ uint32_t ld_pair(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
__device__ __forceinline__ void st_shared_v4(uint32_t a, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}
// Byte address of 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled 64 × 64 box: the chunk index is XORed
// with row % 8, so the 8 rows of an accumulator fragment (same chunk) land in 8 different bank groups.
__device__ __forceinline__ uint32_t swizzled(uint32_t box, int row, int chunk) {
    return box + row * 128 + ((chunk ^ (row & 7)) << 4);
}
struct Bars {  // the mbarriers after the ring's full[STAGES] and empty[STAGES]
    uint32_t base;
    __device__ uint32_t full(int s) const { return base + BAR_OFF + 8 * s; }              // producer → consumers
    __device__ uint32_t empty(int s) const { return base + BAR_OFF + 8 * (STAGES + s); }  // consumers → producer
    __device__ uint32_t pre_full(int cw) const { return base + BAR_OFF + 16 * STAGES + 8 * cw; }  // TMA → helpers
    __device__ uint32_t ready(int cw) const { return base + BAR_OFF + 16 * STAGES + 16 + 8 * cw; }  // helpers → cw
};

// ---- the producer: one thread, every TMA copy; ring slot s = it % STAGES, its use number it / STAGES -----
template <Epilogue E>
__device__ __forceinline__ void producer(const CUtensorMap* tm_a, const CUtensorMap* tm_b, uint32_t base,
                                         int tiles_n, int total, int k_steps) {
    hp::setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x != 0) return;  // (warps 1-3 go on to the helpers' work, backward)
    hp::prefetch_tma_map(tm_a);
    hp::prefetch_tma_map(tm_b);
    int it = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        const int m0 = tile / tiles_n * BM, n0 = tile % tiles_n * BN;
        for (int kb = 0; kb < k_steps; kb++, it++) {
            const int s = it % STAGES;
            const uint32_t a = base + s * STAGE_BYTES, b = a + A_BYTES, full = Bars{base}.full(s);
            hp::mbar_wait(Bars{base}.empty(s), ((it / STAGES) & 1) ^ 1);  // its last k-slice fully read
            hp::mbar_arrive_expect_tx(full, STAGE_BYTES);
            hp::tma_load_2d(a, tm_a, full, kb * BK, m0);                    // A rows m0.., k-slice kb
            if constexpr (E == Epilogue::gelu_forward) {
                hp::tma_load_2d(b, tm_b, full, kb * BK, n0);                // B (N, K): 256 rows × 64 k
            } else {
#pragma unroll
                for (int p = 0; p < BN / 64; p++)                           // B (K, N): 4 panels of 64 k × 64 n
                    hp::tma_load_2d(b + p * 64 * 128, tm_b, full, n0 + 64 * p, kb * BK);
            }
        }
    }
}

// ---- the helpers (backward): warps 1-3 of the producer warpgroup, 96 threads on the producer's registers ----
// For each tile and consumer: wait for the slice's pre (64 × 256, TMA-loaded into the consumer's slots), overwrite
// it with gelu'(pre) in bf16 (elementwise, so the swizzle does not matter), and release it to the consumer.
__device__ __forceinline__ uint32_t gelu_grad_pair(uint32_t u) {
    const float2 x = unpack_bf16(u);
    return pack_bf16(gelu_grad_acc(x.x), gelu_grad_acc(x.y));
}
__device__ __forceinline__ void helpers(uint32_t base, int total) {
    const Bars bars{base};
    int n_tile = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x, n_tile++)
        for (int cw = 0; cw < 2; cw++) {
            const uint32_t slots = base + OUT_OFF + cw * SLOTS_BYTES;
            hp::mbar_wait(bars.pre_full(cw), n_tile & 1);  // the tile's pre has landed
            for (int q = threadIdx.x - 32; q < SLOTS_BYTES / 16; q += 96) {
                uint4 v = ld_shared_v4(slots + q * 16);
                v.x = gelu_grad_pair(v.x), v.y = gelu_grad_pair(v.y), v.z = gelu_grad_pair(v.z), v.w = gelu_grad_pair(v.w);
                st_shared_v4(slots + q * 16, v);
            }
            __syncwarp();  // the warp's writes are done before its lane 0 releases them (one arrival per warp)
            if (threadIdx.x % 32 == 0) hp::mbar_arrive(bars.ready(cw));
        }
}

// ---- the consumers' epilogues: acc[j][2h + e] is row 16 wq + g + 8h of the slice, column n0 + 8j + 2t + e ----
// Only the leader thread issues TMA stores and waits for them: bulk groups belong to the thread that commits them.
// Forward: column block ci (64 columns) goes out as two boxes, pre (bias added) and gelu(pre) of the fp32 value,
// through slot pair ci % 2; before writing a pair, the leader waits until the copies of block ci − 2 (or of the
// last tile) have read it.
__device__ __forceinline__ void epilogue_forward(float (&acc)[BN / 8][4], const Problem& p, const Maps& mp,
                                                 uint32_t slots, int cw, int m0, int n0, int wq, int g, int t) {
    const bool leader = threadIdx.x % 128 == 0;
    const int row0 = wq * 16 + g;  // this thread's rows of the slice: row0, row0 + 8
#pragma unroll
    for (int ci = 0; ci < BN / 64; ci++) {
        const uint32_t s_pre = slots + (ci % 2) * 2 * BOX, s_out = s_pre + BOX;
        uint32_t bias2[8];  // this block's bias pairs, loaded before the wait below
#pragma unroll
        for (int cj = 0; cj < 8; cj++) {
            const int c = min(n0 + 8 * (ci * 8 + cj) + 2 * t, p.N - 2);  // columns past N: computed, never stored
            bias2[cj] = p.bias ? *reinterpret_cast<const uint32_t*>(p.bias + c) : 0u;
        }
        if (leader) hp::bulk_wait_read<1>();
        hp::bar_sync(1 + cw, 128);  // the pair is free: its last copies have read it
#pragma unroll
        for (int cj = 0; cj < 8; cj++) {
            const float2 bias = unpack_bf16(bias2[cj]);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int j = ci * 8 + cj;
                const float x0 = acc[j][2 * h] + bias.x, x1 = acc[j][2 * h + 1] + bias.y;
                const uint32_t at = swizzled(0, row0 + 8 * h, cj) + 4 * t;
                st_pair(s_pre + at, pack_bf16(x0, x1));
                st_pair(s_out + at, pack_bf16(gelu_acc(x0), gelu_acc(x1)));
            }
        }
        hp::fence_proxy_async();
        hp::bar_sync(1 + cw, 128);  // every thread's part of both boxes is written and visible to TMA
        if (leader) {  // parts of a box past M or N are not written
            hp::tma_store_2d(mp.pre, s_pre, n0 + 64 * ci, m0);
            hp::tma_store_2d(mp.out, s_out, n0 + 64 * ci, m0);
            hp::bulk_commit();
        }
    }
}
// Backward column sums, part 1: a warp's 16 rows of the slice (dpre in fp32, in acc[j][0..3]) summed per column
// into sums (BN floats of shared memory). A lane adds its two rows; then three halving rounds over the 8 lanes that
// share t (lane bits 4, 3, 2): a lane keeps half of its columns, gives the other half to its partner and adds the
// partner's half of its own, so 56 shuffles instead of 3 × 64. After them lane (g, t) holds columns 8j + 2t + e
// for j = 4g .. 4g + 3. Stored as float2 pairs p = 4j + t, XOR-swizzled by g % 4 so that a warp's stores spread over
// the banks. A fixed order: the same bits every run.
template <int M, int HALF>  // partner lane mask; column blocks kept (HALF .. 2 HALF - 1 by the upper lane, moved down)
__device__ __forceinline__ void halve_columns(float (&acc)[BN / 8][4], int lane) {
    const bool upper = lane & M;
#pragma unroll
    for (int q = 0; q < HALF; q++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float lo = acc[q][e], hi = acc[q + HALF][e];
            acc[q][e] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, M);
        }
}
__device__ __forceinline__ void warp_column_sums(float (&acc)[BN / 8][4], uint32_t sums, int lane, int g, int t) {
#pragma unroll
    for (int j = 0; j < BN / 8; j++) acc[j][0] += acc[j][2], acc[j][1] += acc[j][3];
    halve_columns<16, BN / 16>(acc, lane);
    halve_columns<8, BN / 32>(acc, lane);
    halve_columns<4, BN / 64>(acc, lane);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int pair = (4 * (4 * g + q) + t) ^ (4 * (g % 4));
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(sums + 8 * pair), "f"(acc[q][0]), "f"(acc[q][1]));
    }
}
// Part 2, after the warpgroup's barrier: thread i adds columns 2i, 2i + 1 of its 4 warps, in order, into row m0 / 64.
__device__ __forceinline__ void slice_column_sums(const Problem& p, uint32_t sums, int m0, int n0) {
    const int i = threadIdx.x % 128, pair = i ^ (4 * (i / 16 % 4));  // (the store's swizzle; g = i / 16)
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        float2 v;
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(sums + w * BN * 4 + 8 * pair));
        s0 += v.x, s1 += v.y;
    }
    if (m0 < p.M && n0 + 2 * i < p.N)
        *reinterpret_cast<float2*>(p.colsum + (size_t)(m0 / 64) * p.N + n0 + 2 * i) = make_float2(s0, s1);
}
// Backward: the slots hold gelu'(pre) from the helpers; dpre = acc · gelu'(pre) is written over it in place and
// leaves as four boxes; with p.colsum, its fp32 values (before the bf16 rounding) are summed by column as well.
__device__ __forceinline__ void epilogue_backward(float (&acc)[BN / 8][4], const Problem& p, const Maps& mp,
                                                  uint32_t slots, uint32_t sums, uint32_t ready, int n_tile, int cw,
                                                  int m0, int n0, int wq, int g, int t) {
    const int row0 = wq * 16 + g;
    hp::mbar_wait(ready, n_tile & 1);  // the helpers have turned this tile's pre into gelu'(pre)
#pragma unroll
    for (int ci = 0; ci < BN / 64; ci++)
#pragma unroll
        for (int cj = 0; cj < 8; cj++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int j = ci * 8 + cj;
                const uint32_t at = swizzled(slots + ci * BOX, row0 + 8 * h, cj) + 4 * t;
                const float2 d = unpack_bf16(ld_pair(at));
                acc[j][2 * h] *= d.x, acc[j][2 * h + 1] *= d.y;
                st_pair(at, pack_bf16(acc[j][2 * h], acc[j][2 * h + 1]));
            }
    // (double-buffered by tile: a fast warp's next tile cannot overwrite what a slow one still reads below)
    const uint32_t my_sums = sums + (n_tile % 2 * 2 + cw) * 4 * BN * 4;
    if (p.colsum) warp_column_sums(acc, my_sums + wq * BN * 4, threadIdx.x % 32, g, t);
    hp::fence_proxy_async();
    hp::bar_sync(1 + cw, 128);  // the whole dpre slice is written and visible to TMA; every warp's column sums too
    if (threadIdx.x % 128 == 0) {
#pragma unroll
        for (int ci = 0; ci < BN / 64; ci++) hp::tma_store_2d(mp.out, slots + ci * BOX, n0 + 64 * ci, m0);
        hp::bulk_commit();
    }
    if (p.colsum) slice_column_sums(p, my_sums, m0, n0);
}

// ---- a consumer warpgroup: rows 64·cw of each tile ----------------------------------------------------
template <Epilogue E>
__device__ __forceinline__ void consumer(int cw, uint32_t base, const Problem& p, const Maps& mp, int tiles_n,
                                         int total, int k_steps) {
    hp::setmaxnreg_inc<CONSUMER_REGS>();
    const int lane = threadIdx.x % 32, wq = (threadIdx.x / 32) % 4;  // warp within the warpgroup
    const int g = lane / 4, t = lane % 4;                             // accumulator layout (hopper.cuh)
    const bool leader = threadIdx.x % 128 == 0;
    const Bars bars{base};
    const uint32_t slots = base + OUT_OFF + cw * SLOTS_BYTES;
    float acc[BN / 8][4];
    int it = 0, n_tile = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x, n_tile++) {
        const int m0 = tile / tiles_n * BM + 64 * cw, n0 = tile % tiles_n * BN;  // this warpgroup's slice
        for (int kb = 0; kb < k_steps; kb++, it++) {
            const int s = it % STAGES;
            const uint32_t a = base + s * STAGE_BYTES + cw * 64 * 128, b = base + s * STAGE_BYTES + A_BYTES;
            hp::mbar_wait(bars.full(s), (it / STAGES) & 1);  // the slot's A and B have landed
            hp::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {   // 16 of k = 32 bytes along a swizzled 128-byte row
                const uint64_t da = hp::smem_desc_sw128(a + kk * 32, 16, 1024);
                if constexpr (E == Epilogue::gelu_forward)
                    hp::wgmma_m64n256k16_ss<0>(acc, da, hp::smem_desc_sw128(b + kk * 32, 16, 1024), kb + kk > 0);
                else  // MN-major: 16 k-rows further is 2048 bytes; the next 64 columns are the next panel (8 KB)
                    hp::wgmma_m64n256k16_ss<1>(acc, da, hp::smem_desc_sw128(b + kk * 16 * 128, 64 * 128, 1024),
                                               kb + kk > 0);
            }
            hp::wgmma_commit();
            if (E == Epilogue::gelu_backward && kb == min(2, k_steps - 1) && leader) {
                // the wgmmas run: fetch the slice's pre for the helpers meanwhile, once the last tile's dpre
                // copies have read the slots
                hp::bulk_wait_read<0>();
                hp::mbar_arrive_expect_tx(bars.pre_full(cw), SLOTS_BYTES);
#pragma unroll
                for (int ci = 0; ci < BN / 64; ci++)
                    hp::tma_load_2d(slots + ci * BOX, mp.pre, bars.pre_full(cw), n0 + 64 * ci, m0);
            }
            if (kb > 0) {  // the previous slice's wgmmas are done: give its slot back (one arrival per warp)
                hp::wgmma_wait<1>();
                if (lane == 0) hp::mbar_arrive(bars.empty((it - 1) % STAGES));
            }
        }
        hp::wgmma_wait<0>();
        if (lane == 0) hp::mbar_arrive(bars.empty((it - 1) % STAGES));
        hp::fence_regs(acc);
        if constexpr (E == Epilogue::gelu_forward) epilogue_forward(acc, p, mp, slots, cw, m0, n0, wq, g, t);
        else epilogue_backward(acc, p, mp, slots, base + SUMS_OFF, bars.ready(cw), n_tile, cw, m0, n0, wq, g, t);
    }
    if (leader) hp::bulk_wait<0>();  // every copy out has finished before the block's shared memory goes
}
#endif

template <Epilogue E>
__device__ __forceinline__ void kernel_body(const CUtensorMap& tm_a, const CUtensorMap& tm_b,
                                            const CUtensorMap& tm_out, const CUtensorMap& tm_pre, const Problem& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t base = (hp::smem_u32(smem_raw) + 1023u) & ~1023u;
    const Bars bars{base};
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            hp::mbar_init(bars.full(s), 1);   // the producer's expect_tx arrival
            hp::mbar_init(bars.empty(s), 8);  // one arrival per consumer warp
        }
        for (int cw = 0; cw < 2; cw++) {
            hp::mbar_init(bars.pre_full(cw), 1);  // the consumer leader's expect_tx arrival
            hp::mbar_init(bars.ready(cw), 3);     // one arrival per helper warp
        }
        hp::fence_barrier_init();
    }
    __syncthreads();  // the barriers are initialized before any thread waits on or arrives at them
    const int tiles_n = ceil_div(p.N, BN), total = ceil_div(p.M, BM) * tiles_n, k_steps = ceil_div(p.K, BK);
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);  // warp-uniform
    if (wg == 0) {
        producer<E>(&tm_a, &tm_b, base, tiles_n, total, k_steps);
        if (E == Epilogue::gelu_backward && threadIdx.x >= 32) helpers(base, total);
    } else {
        consumer<E>(wg - 1, base, p, Maps{&tm_out, &tm_pre}, tiles_n, total, k_steps);
    }
#else
    (void)tm_a, (void)tm_b, (void)tm_out, (void)tm_pre, (void)p;  // no sm_90a code: launches are refused on the host
#endif
}

// One kernel per pass, so profiles name the pass that ran (static: this header is in several translation units).
static __global__ void __launch_bounds__(THREADS, 1)
matmul_forward_gelu_wgmma_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                                 const __grid_constant__ CUtensorMap tm_out, const __grid_constant__ CUtensorMap tm_pre,
                                 const Problem p) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    kernel_body<Epilogue::gelu_forward>(tm_a, tm_b, tm_out, tm_pre, p);
}
static __global__ void __launch_bounds__(THREADS, 1)
matmul_backward_dgelu_wgmma_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                                   const __grid_constant__ CUtensorMap tm_out,
                                   const __grid_constant__ CUtensorMap tm_pre, const Problem p) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    kernel_body<Epilogue::gelu_backward>(tm_a, tm_b, tm_out, tm_pre, p);
}

// A row-major (rows, cols) bf16 matrix as a map with boxes of box_rows × box_cols.
inline CUtensorMap matrix_map(const void* base, int rows, int cols, int box_rows, int box_cols) {
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)cols};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows};
    return hopper::make_bf16_map(base, 2, dims, strides, box);
}

template <Epilogue E>
void launch(bf16* out, const bf16* pre, const bf16* a, const bf16* w, const bf16* bias, float* colsum, int M, int N,
            int K, cudaStream_t stream) {
    const CUtensorMap ma = matrix_map(a, M, K, BM, BK);
    const CUtensorMap mb = E == Epilogue::gelu_forward ? matrix_map(w, N, K, BN, BK) : matrix_map(w, K, N, BK, 64);
    const CUtensorMap mo = matrix_map(out, M, N, 64, 64), mp = matrix_map(pre, M, N, 64, 64);
    auto kernel = E == Epilogue::gelu_forward ? matmul_forward_gelu_wgmma_kernel : matmul_backward_dgelu_wgmma_kernel;
    const int smem = E == Epilogue::gelu_forward ? SMEM_FORWARD : SMEM;
    allow_shared_memory(kernel, smem);
    const int total = ceil_div(M, BM) * ceil_div(N, BN);
    launch_dependent(kernel, std::min(total, sm_count()), THREADS, smem, stream, ma, mb, mo, mp,
                     Problem{out, const_cast<bf16*>(pre), bias, colsum, M, N, K});
}

}  // namespace wgmma_matmul

// Can the engine run here: an sm_90a build on an sm_90 device, and bf16 rows whose strides TMA can take.
inline bool matmul_gelu_wgmma_supports(int N, int K) {
    return N % 8 == 0 && K % 8 == 0 && hopper::sm90a_available();
}

// Forward: pre (M, N) = inp (M, K) · w (N, K)ᵀ + bias, out = gelu(pre). Launches only.
inline void matmul_forward_gelu_wgmma(__nv_bfloat16* out, __nv_bfloat16* pre, const __nv_bfloat16* inp,
                                      const __nv_bfloat16* w, const __nv_bfloat16* bias, int M, int N, int K,
                                      cudaStream_t stream) {
    if (!matmul_gelu_wgmma_supports(N, K) || M <= 0)
        fail("matmul_forward_gelu_wgmma: needs an sm_90a build on an H100/H200, N %% 8 == 0, K %% 8 == 0 (M %d N %d K %d)",
             M, N, K);
    wgmma_matmul::launch<wgmma_matmul::Epilogue::gelu_forward>(out, pre, inp, w, bias, nullptr, M, N, K, stream);
}

// Backward: dpre (M, N) = (dout (M, K) · w (K, N)) ∘ gelu'(pre); colsum, if not null, (ceil(M / 64), N) fp32: the
// column sums of dpre (its fp32 values) over each 64 rows, each in a fixed order. Launches only.
inline void matmul_backward_dgelu_wgmma(__nv_bfloat16* dpre, float* colsum, const __nv_bfloat16* pre,
                                        const __nv_bfloat16* dout, const __nv_bfloat16* w, int M, int N, int K,
                                        cudaStream_t stream) {
    if (!matmul_gelu_wgmma_supports(N, K) || M <= 0)
        fail("matmul_backward_dgelu_wgmma: needs an sm_90a build on an H100/H200, N %% 8 == 0, K %% 8 == 0 (M %d N %d K %d)",
             M, N, K);
    wgmma_matmul::launch<wgmma_matmul::Epilogue::gelu_backward>(dpre, pre, dout, w, nullptr, colsum, M, N, K, stream);
}

}  // namespace flashgpt2
