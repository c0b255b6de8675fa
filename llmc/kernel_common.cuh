// Small device-side pieces every layer file of llmc/ shares: floatX <-> float,
// 16-byte vector loads ("Packed128"), warp reductions, and the carving of the shared workspace.
// Written once here so the naive and flash kernels of each layer differ only in what they teach.
//
// Note on `static __global__` in the layer files: they are headers, included by several .cu files of one
// program (the GPU tests). A non-template kernel defined in two translation units is a duplicate symbol
// at link time (nvcc ignores `inline` on kernels); `static` gives each translation unit its own copy.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "llmc/common.cuh"
#include "llmc/layer.h"  // Variant

namespace flashgpt2 {

// ---- floatX <-> float: all arithmetic is fp32; storage is floatX ----
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// exp(x) = exp2(x log2 e): softmax kernels work in log2 units, one multiply-add and the hardware's exp2.
constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

// ---- 16 bytes of T as one load/store: 4 floats or 8 bf16. One instruction instead of 4 or 8. ----
template <class T>
struct alignas(16) Packed128 {
    static constexpr int size = 16 / sizeof(T);
    T v[size];
    __device__ __forceinline__ T& operator[](int i) { return v[i]; }
    __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }
};
template <class T>
__device__ __forceinline__ Packed128<T> load128(const T* p) { return *reinterpret_cast<const Packed128<T>*>(p); }
template <class T>
__device__ __forceinline__ void store128(T* p, const Packed128<T>& x) { *reinterpret_cast<Packed128<T>*>(p) = x; }
constexpr int X128 = Packed128<floatX>::size;  // floatX elements per 16 bytes

// True when a pointer can be read with 16-byte loads.
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// ---- warp reductions (all 32 lanes get the result) ----
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// ---- block reductions (every thread gets the result). blockDim.x a multiple of 32, at most 1024. ----
template <bool MAX>
__device__ __forceinline__ float block_reduce(float x) {
    __shared__ float partial[32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    const float identity = MAX ? -INFINITY : 0.0f;
    x = MAX ? warp_max(x) : warp_sum(x);
    __syncthreads();  // a previous block_reduce in this kernel may still be reading `partial`
    if (lane == 0) partial[warp] = x;
    __syncthreads();  // every warp's value is in `partial` before any warp reads them
    x = lane < warps ? partial[lane] : identity;
    return MAX ? warp_max(x) : warp_sum(x);
}
__device__ __forceinline__ float block_sum(float x) { return block_reduce<false>(x); }
__device__ __forceinline__ float block_max(float x) { return block_reduce<true>(x); }

// ---- the shared workspace: ops take consecutive 256-byte-aligned pieces of it ----
constexpr size_t WS_ALIGN = 256;
inline size_t ws_round(size_t bytes) { return (bytes + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN; }

// Usage: WorkspaceCarver ws(ptr); float* a = ws.take<float>(n); int* b = ws.take<int>(m);
// The matching size is ws_round(n * 4) + ws_round(m * 4): take() advances by exactly that.
struct WorkspaceCarver {
    char* p;
    explicit WorkspaceCarver(void* base) : p(static_cast<char*>(base)) {}
    template <class T>
    T* take(size_t n) {
        T* r = reinterpret_cast<T*>(p);
        p += ws_round(n * sizeof(T));
        return r;
    }
};

// A grid-size helper for simple elementwise kernels.
inline unsigned grid_for(size_t n, int block) { return (unsigned)ceil_div<size_t>(n, (size_t)block); }

// ---- the naive sets' column sum (bias gradients) ----
// out[c] += sum over n of x[n][c] for an (N, n) matrix, one thread per column walking all N rows.
static __global__ void colsum_naive_kernel(floatX* out, const floatX* x, int N, int n) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float acc = 0.0f;
    for (int r = 0; r < N; r++) acc += to_float(x[(size_t)r * n + c]);
    out[c] = from_float<floatX>(to_float(out[c]) + acc);
}
inline void colsum_naive(floatX* out, const floatX* x, int N, int n, cudaStream_t stream) {
    colsum_naive_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(out, x, N, n);
    cudaCheckLaunch();
}

}  // namespace flashgpt2
