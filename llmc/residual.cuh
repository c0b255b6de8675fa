// Residual add: out = inp1 + inp2 (the "x + f(x)" of every transformer block).
//
// naive: its own kernel, one thread per element. The backward needs no kernel: the gradient of a sum
//        passes through to both inputs (the trainer accumulates it into dresidual).
// flash: fused into the layernorm that follows it (residual_layernorm_forward_flash in layernorm.cuh), which
//        saves one write and one read of the (N, C) stream. Used alone (when the layernorm is naive), the
//        flash kernel moves 16 bytes per load.
#pragma once
#include "llmc/error.h"
#include "llmc/kernel_common.cuh"

namespace flashgpt2 {

static __global__ void residual_forward_naive_kernel(floatX* out, const floatX* inp1, const floatX* inp2, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_float<floatX>(to_float(inp1[i]) + to_float(inp2[i]));
}

inline void residual_forward_naive(floatX* out, const floatX* inp1, const floatX* inp2, size_t n, cudaStream_t stream) {
    residual_forward_naive_kernel<<<grid_for(n, 256), 256, 0, stream>>>(out, inp1, inp2, n);
    cudaCheckLaunch();
}

// One thread per 16 bytes; the last chunk (n not a multiple of X128) is done element by element.
static __global__ void residual_forward_flash_kernel(floatX* out, const floatX* inp1, const floatX* inp2, size_t n) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    if (i + X128 <= n) {
        Packed128<floatX> a = load128(inp1 + i), b = load128(inp2 + i);
        for (int e = 0; e < X128; e++) a[e] = from_float<floatX>(to_float(a[e]) + to_float(b[e]));
        store128(out + i, a);
    } else {
        for (; i < n; i++) out[i] = from_float<floatX>(to_float(inp1[i]) + to_float(inp2[i]));
    }
}

inline void residual_forward_flash(floatX* out, const floatX* inp1, const floatX* inp2, size_t n, cudaStream_t stream) {
    if (!aligned16(out) || !aligned16(inp1) || !aligned16(inp2)) fail("residual_forward_flash: buffers must be 16-byte aligned");
    launch_dependent(residual_forward_flash_kernel, grid_for(ceil_div<size_t>(n, X128), 256), 256, 0, stream,
        out, inp1, inp2, n);
}

}  // namespace flashgpt2
