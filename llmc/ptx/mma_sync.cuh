// Warp-level tensor-core plumbing (sm_80+): each function a thin wrapper over one PTX instruction (PTX ISA,
// "Warp-level matrix multiply-accumulate", "Warp-level matrix load instruction: ldmatrix" and "cp.async"),
// plus the XOR swizzle that makes the loads conflict-free. Used by the mma.sync attention engines
// (llmc/attention/mma_*.cuh); dev/attention/forward/5_*, 6_* teach the same ideas.
//
//   mma.sync   one warp-wide 16x8x16 bf16 product with fp32 accumulators (operand layouts in
//              llmc/attention/fragment.cuh).
//   ldmatrix   one warp-wide load of four 8x8 bf16 matrices from shared memory, straight into the mma
//              fragment layout. Lane l gives the address of row l % 8 of matrix l / 8 (16 contiguous bytes)
//              and receives row l / 4, columns 2(l % 4), 2(l % 4) + 1 of each matrix; with .trans it
//              receives the transposed matrices' elements, i.e. column l / 4, rows 2(l % 4), 2(l % 4) + 1.
//   cp.async   a global -> shared copy that does not pass through registers and does not block: issue,
//              commit_group, and later wait_group(N) until at most N of this thread's groups are in flight
//              (then a __syncthreads makes every thread's copies visible to every thread).
//   swizzle    tiles of 64 bf16 columns have 128-byte rows (8 chunks of 16 bytes) and no padding; chunk c
//              of row r is stored at chunk c ^ (r % 8). The 8 rows one ldmatrix matrix reads share a logical
//              chunk but land in 8 different physical chunks: 8 different groups of 4 banks, no conflict.
#pragma once
#include <cstdint>

#include "llmc/common.cuh"

namespace flashgpt2::mma {

// c += a @ b, one 16x8x16 tile, bf16 inputs, fp32 accumulators (fragment layouts: llmc/attention/fragment.cuh).
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

// 16 bytes global -> shared (.cg: cached in L2 only); src_bytes = 0 copies nothing and writes 16 zeros.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// 4 bytes global -> shared (.ca: the only variant for sizes below 16); src_bytes = 0 writes a zero.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Byte address of 16-byte chunk `chunk` of row `row` in a swizzled tile with 128-byte rows starting at `tile`
// (a shared-memory address, 128-byte aligned). Adding 8k rows keeps the pattern: swz128(t, r + 8k, c) =
// swz128(t, r, c) + 8k * 128, so per-lane offsets can be computed once and stepped by whole 16-row blocks.
__device__ __forceinline__ uint32_t swz128(uint32_t tile, int row, int chunk) {
    return tile + row * 128 + ((chunk ^ (row & 7)) << 4);
}

}  // namespace flashgpt2::mma
