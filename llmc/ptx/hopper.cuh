// Hopper (sm_90a) building blocks of the wgmma attention engines (llmc/attention/wgmma_*.cuh; dev rungs 7
// and 8 teach them), each a thin wrapper over one PTX instruction (PTX ISA 8.x, "Asynchronous warpgroup level
// matrix multiply" and "Tensor copy" chapters), kept apart so the kernel reads as the algorithm. Four
// mechanisms:
//   mbarrier   a 64-bit shared-memory barrier with a phase bit. Threads arrive; the TMA unit "arrives" with
//              bytes (expect_tx announces how many, each completed copy counts its bytes down). A phase
//              completes when the arrival count and the byte count both reach zero; waiters poll the parity.
//   TMA        cp.async.bulk.tensor: one thread asks the copy engine for a whole box of a tensor described
//              by a CUtensorMap (built on the host); rows outside the tensor arrive as zeros. The box lands
//              in shared memory already in the 128-byte swizzled layout wgmma reads.
//   wgmma      a warpgroup (4 warps, 128 threads) issues one asynchronous 64×N×16 matrix multiply. A comes
//              from shared memory (a 64-bit descriptor) or registers, B from shared memory, D accumulates in
//              registers. fence → mma_async… → commit_group, later wait_group(n) until ≤ n groups are pending.
//   setmaxnreg a warpgroup gives registers back to the SM's pool or takes more: the producer warpgroup only
//              issues copies and needs few, the consumer warpgroups hold S and O accumulators and need many.
// Only compiled into kernels under `#if defined(__CUDA_ARCH_FEAT_SM90_ALL)` (sm_90a); the host half (tensor
// maps) is plain C++. Details checked against the PTX ISA and CUTLASS's documented canonical layouts.
#pragma once
#include <cstdint>
#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder is fetched at run time, no -lcuda)
#include <cudaTypedefs.h>
#include "llmc/common.cuh"
#include "llmc/error.h"

namespace flashgpt2::hopper {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ----------------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initializations visible to the other threads and to the TMA unit (the async proxy).
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` more bytes of TMA traffic for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One arrival (release semantics: this thread's earlier writes are visible to whoever waits on the phase).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Block until the phase with this parity has completed (acquire semantics; CLUSTER: at cluster scope, for
// arrivals from another block of the cluster). A fresh barrier is in phase 0, so waiting for parity 1 returns
// at once: producers start with parity 1 on their "empty" barriers.
template <bool CLUSTER = false>
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        if constexpr (CLUSTER)
            asm volatile(
                "{\n.reg .pred p;\n"
                "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                "selp.u32 %0, 1, 0, p;\n}\n"
                : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        else
            asm volatile(
                "{\n.reg .pred p;\n"
                "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                "selp.u32 %0, 1, 0, p;\n}\n"
                : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// ---- TMA ---------------------------------------------------------------------------------------------
// The box at coordinates (c0 innermost, c1, c2) of the tensor `map` → shared memory at dst; its bytes are
// counted down on barrier `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
// The same for a 2-D map: the matmul engine's (k, row) view of a row-major matrix.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
// The same for a 4-D map (c3 outermost): the attention kernel's (head dim, token, head, batch) view.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
// The reverse: a box of shared memory (laid out as the map says, e.g. 128-byte swizzled) → global memory at
// coordinates (c0, c1); parts of the box outside the tensor are not written. The copy reads shared memory
// asynchronously: the threads that wrote the box must first make their writes visible to the async proxy
// (fence_proxy_async), and the issuing thread tracks its copies in bulk groups (commit, then wait).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most N of this thread's bulk groups are still reading their shared-memory source.
template <int N>
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory"); }
// Until at most N of this thread's bulk groups are still in flight (their global writes done too).
template <int N>
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }
// This thread's shared-memory writes, visible to the async proxy (TMA, wgmma) from here on.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void prefetch_tma_map(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- named barriers: bar.sync / bar.arrive on barrier `id` (1..15; 0 is __syncthreads's) of `threads` threads,
// a multiple of 32: a barrier of some warps only, e.g. the consumer warpgroups of a warp-specialized block.
__device__ __forceinline__ void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- setmaxnreg: per-warpgroup register budgets (all warps of the warpgroup execute it) ---------------
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
// The registers per thread a block of `threads` gets at launch under __launch_bounds__(threads, 1): the SM's 65536
// shared out, at most 255, rounded down to a multiple of 8. setmaxnreg only moves registers within the block's
// threads × this: budgets that add up to more make setmaxnreg.inc wait forever (a hang, not an error).
constexpr int launch_regs(int threads) { return (65536 / threads < 255 ? 65536 / threads : 255) / 8 * 8; }

// ---- wgmma -------------------------------------------------------------------------------------------
// Orders this thread's earlier register writes (accumulators, A fragments) before the wgmmas that follow.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Closes the group of wgmmas issued since the last commit.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// The compiler does not know a wgmma writes its accumulators later, asynchronously. An empty asm that
// "modifies" each register, placed right after the wait, pins every later use of them below the wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+f"(d[i][j])::"memory");
}

// x as the compiler's warp-uniform value: lane 0's, for an x every lane of the warp holds (a warpgroup index
// from threadIdx, a work item read from shared memory). Values derived from it, loop counts included, may then
// live in uniform registers, where the wgmma descriptors built from them are read, instead of being computed
// per thread and moved there before every wgmma (CUTLASS's canonical_warp_group_idx does the same).
__device__ __forceinline__ int uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }

// Shared-memory matrix descriptor (PTX "Matrix Descriptor Format"): start address, leading- and stride-
// dimension byte offsets (all >> 4), layout = 128-byte swizzle (1 in bits 62–63). Our tiles are 1024-byte
// aligned (one swizzle pattern = 8 rows × 128 bytes), so the base-offset field stays 0.
//   K-major (A = Q, B = K: the 16-wide k slice is contiguous in a row): SBO = 1024 (next 8 rows), LBO unused.
//     Stepping k by 16 inside a 128-byte row is a +32-byte start address; the hardware applies the XOR.
//   MN-major (B = V for P·V: the N = head-dim columns are contiguous): SBO = 1024 (next 8 k-rows),
//     LBO = distance between 64-column panels (only used when N > 64).
// Built as two 32-bit words: `addr` is a shared-window address, below 2^18 (228 KB), so addr / 16 fits the 14-bit
// start field, and moving the start (smem_desc_plus) is one 32-bit add that cannot carry out of the field. A
// 64-bit add or OR would cost the uniform datapath two instructions per descriptor, one descriptor per wgmma.
__device__ __forceinline__ uint64_t smem_desc_words(uint32_t lo, uint32_t hi) { return (uint64_t)hi << 32 | lo; }
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    return smem_desc_words((addr >> 4) + ((lbo_bytes >> 4) << 16), (sbo_bytes >> 4) | (1u << 30));
}
// The same descriptor with its start address `bytes` (a multiple of 16) further on.
__device__ __forceinline__ uint64_t smem_desc_plus(uint64_t desc, uint32_t bytes) {
    return smem_desc_words((uint32_t)desc + (bytes >> 4), (uint32_t)(desc >> 32));
}

// The wgmma shapes the rung uses (bf16 in, fp32 accumulate). Accumulator layout, per warp w of the
// warpgroup (g = lane / 4, t = lane % 4): d[c][0..1] = row 16w + g, columns 8c + 2t, +1; d[c][2..3] = row
// 16w + g + 8, same columns: mma.sync's m16n8 layout repeated, so rung 5's softmax helpers apply as they are.
// A from registers has the same per-warp layout as mma.sync's A fragment. The long operand lists are
// mechanical: one "+f" per accumulator register.
// D(64×64, fp32) (+)= A(64×16, smem) · B(16×64, smem); scale_d = 0: D = A·B. Both K-major by default; TRANS = 1
// takes both MN-major (imm-trans-a = imm-trans-b = 1: each operand stored with its k index as the tile's rows,
// as in the backward's dQ_i = dS K_j with dS held as dS^T).
template <int TRANS = 0>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                                   int scale_d) {
    static_assert(TRANS == 0 || TRANS == 1, "TRANS: 0 (both K-major) or 1 (both MN-major)");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, %35, %35;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS));
}

// D(64×32, fp32) (+)= A(64×16, smem) · B(16×32, smem), both MN-major (TRANS = 1) or both K-major (0): the
// backward's dQ_i share at head size 64 when two warpgroups split its 64 columns.
template <int TRANS = 0>
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    static_assert(TRANS == 0 || TRANS == 1, "TRANS: 0 (both K-major) or 1 (both MN-major)");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, 1, 1, %19, %19;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS));
}

// D(64×64, fp32) (+)= A(64×16, registers: 4 × bf16x2) · B(16×64, smem; MN-major with TRANS_B = 1, K-major with 0).
template <int TRANS_B = 1>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int scale_d) {
    static_assert(TRANS_B == 0 || TRANS_B == 1, "TRANS_B: 0 (B K-major) or 1 (B MN-major)");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// D(64×128, fp32) (+)= A(64×16, smem, K-major) · B(16×128, smem, K-major); scale_d = 0: D = A·B.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b,
                                                   int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D(64×128, fp32) (+)= A(64×16, registers: 4 × bf16x2) · B(16×128, smem, MN-major: imm-trans-b = 1).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    static_assert(N == 64 || N == 128, "wgmma_ss: N is 64 or 128");
    if constexpr (N == 64) wgmma_m64n64k16_ss(d, desc_a, desc_b, scale_d);
    else wgmma_m64n128k16_ss(d, desc_a, desc_b, scale_d);
}
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    static_assert(N == 64 || N == 128, "wgmma_rs: N is 64 or 128");
    if constexpr (N == 64) wgmma_m64n64k16_rs(d, a, desc_b, scale_d);
    else wgmma_m64n128k16_rs(d, a, desc_b, scale_d);
}

// D(64×256, fp32) (+)= A(64×16, smem, K-major) · B(16×256, smem; K-major, or MN-major with TRANS_B = 1).
// The matmul engine's instruction (llmc/matmul/wgmma_gelu.cuh): one per 16 of k for a 64-row slice of a 128×256 tile.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16_ss(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1, 0, %131;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]),
          "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
          "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]),
          "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]),
          "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),
          "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]),
          "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
          "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),
          "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// ---- ordered hand-offs between blocks through global memory ---------------------------------------
// (PTX ISA, "Memory Consistency Model", and red's vector forms, sm_90.) A block waits for a counter with an
// acquire load, adds its partial sums with red (fire-and-forget atomics at the L2), and bumps the counter
// after a barrier with fence + atomic add: the next block's acquire then sees every add of this one.
__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_add_v4(float* p, float4 v) {  // p 16-byte aligned
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}
__device__ __forceinline__ void release_add(uint32_t* p) {  // every write this thread has seen, then *p += 1
    __threadfence();
    atomicAdd(p, 1u);
}

// ---- clusters: blocks that read and write each other's shared memory (sm_90) -----------------------
// (PTX ISA, "Distributed shared memory", mapa, barrier.cluster.) A kernel with __cluster_dims__ runs its
// blocks in groups that are scheduled together on one GPC; a block maps a neighbour's shared-memory address
// with mapa, stores there and arrives on the neighbour's mbarriers; it waits with mbar_wait<true> (cluster scope).
__device__ __forceinline__ void cluster_sync() {  // every block of the cluster got here; their writes are seen
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t map_to_rank(uint32_t smem_addr, uint32_t rank) {  // the same offset in block rank
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_addr), "r"(rank));
    return r;
}
__device__ __forceinline__ void st_cluster_v4(uint32_t addr, float4 v) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z),
                 "f"(v.w) : "memory");
}
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t remote_bar) {  // release: our earlier writes first
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}

// ---- host: tensor maps -------------------------------------------------------------------------------
// cuTensorMapEncodeTiled is a driver API function; fetched through the runtime so no -lcuda is needed.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !p) flashgpt2::fail("cuTensorMapEncodeTiled: not found in the driver");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

// A bf16 tensor of `rank` dimensions (dims[0] innermost and contiguous; strides in ELEMENTS of dims 1..rank-1)
// as a map whose box is box[] elements, 128-byte swizzled. Each box is 64 columns (128 bytes: the swizzle
// span) × rows of one head; head-dim panels beyond the first are separate boxes at column 64, 128, … Boxes
// reaching past a dimension's end read as zeros. TMA wants the base and every stride 16-byte aligned.
inline CUtensorMap make_bf16_map(const void* base, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                                 const cuuint32_t* box) {
    CUtensorMap map;
    cuuint64_t stride_bytes[4];
    const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
    for (int i = 0; i + 1 < rank; i++) stride_bytes[i] = strides[i] * 2;
    const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank,
                                            const_cast<void*>(base), dims, stride_bytes, box, elem_strides,
                                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        flashgpt2::fail("cuTensorMapEncodeTiled failed (CUresult %d) for a rank-%d bf16 map, dims %llu x %llu, "
                        "box %u x %u (base and strides must be 16-byte aligned)",
                        (int)r, rank, (unsigned long long)dims[0], (unsigned long long)dims[1], box[0], box[1]);
    return map;
}

// A contiguous (B·NH, T, HS) tensor as a 3-D map, box `rows` × 64 of one head. Why 3-D: with a 2-D
// (B·NH·T, HS) view a box past the end of a head would read the next head's rows instead of zeros.
inline CUtensorMap make_head_map(const void* base, int BH, int T, int HS, int rows) {
    const cuuint64_t dims[3] = {(cuuint64_t)HS, (cuuint64_t)T, (cuuint64_t)BH};
    const cuuint64_t strides[2] = {(cuuint64_t)HS, (cuuint64_t)T * HS};
    const cuuint32_t box[3] = {64, (cuuint32_t)rows, 1};
    return make_bf16_map(base, 3, dims, strides, box);
}

// Element (b, h, t, d) of a strided (B, NH, T, HS) tensor at b·sb + h·sh + t·st + d, as a 4-D map with
// coordinates (d, t, h, b) and box `rows` × 64 of one head. One map serves any layout: the contiguous
// (B, NH, T, HS) of the ladder, or q, k, v read in place from a (B, T, 3, NH, HS) qkv buffer.
inline CUtensorMap make_strided_head_map(const void* base, int B, int NH, int T, int HS, long long sb, long long sh,
                                         long long st, int rows) {
    const cuuint64_t dims[4] = {(cuuint64_t)HS, (cuuint64_t)T, (cuuint64_t)NH, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)st, (cuuint64_t)sh, (cuuint64_t)sb};
    const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1};
    return make_bf16_map(base, 4, dims, strides, box);
}

// ---- can this process run sm_90a code? ----------------------------------------------------------------
// A kernel compiled for anything but sm_90a has an empty body (every wgmma kernel is under
// `#if defined(__CUDA_ARCH_FEAT_SM90_ALL)`): a one-thread probe compiled the same way answers whether this
// binary holds sm_90a code for this device. Asked once per process.
static __global__ void sm90a_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}
inline bool sm90a_available() {
    static const bool ok = [] {
        int dev = 0, major = 0, minor = 0;
        cudaCheck(cudaGetLastError());  // an earlier launch's error is reported as such, not taken for "no sm_90a"
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        if (major != 9 || minor != 0) return false;
        int* d = nullptr;
        int h = 0;
        cudaCheck(cudaMalloc(&d, sizeof(int)));
        sm90a_probe_kernel<<<1, 1>>>(d);
        const bool launched = cudaGetLastError() == cudaSuccess;  // no image for this device at all: not supported
        if (launched) cudaCheck(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
        cudaCheck(cudaFree(d));
        return launched && h == 1;
    }();
    return ok;
}

}  // namespace flashgpt2::hopper
