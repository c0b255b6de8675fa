// GELU, tanh approximation (GPT-2's): gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
//
// naive: its own elementwise kernel, one thread per element, forward and backward.
// flash: fused into the matmul before it (the forward writes gelu(xW+b) and keeps the pre-activation for the
//        backward, whose matmul multiplies dinp by gelu'(pre) before writing it): the (N, 4C) activation is then
//        never re-read just to apply GELU. The matmul is our wgmma GEMM on Hopper (llmc/matmul/wgmma_gelu.cuh),
//        else cuBLASLt with its GELU_AUX_BIAS and DGELU epilogues. When the matmul is naive, the flash gelu is a
//        standalone kernel with 16-byte loads.
#pragma once
#include "llmc/error.h"
#include "llmc/kernel_common.cuh"

namespace flashgpt2 {

constexpr float GELU_SCALE = 0.7978845608028654f;  // sqrt(2/pi)

__device__ __forceinline__ float gelu_f(float x) {
    return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
}
// d gelu / dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) u',  u = s (x + 0.044715 x^3),  u' = s (1 + 3*0.044715 x^2)
__device__ __forceinline__ float gelu_grad_f(float x) {
    float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

static __global__ void gelu_forward_naive_kernel(floatX* out, const floatX* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_float<floatX>(gelu_f(to_float(inp[i])));
}

static __global__ void gelu_backward_naive_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dinp[i] = from_float<floatX>(to_float(dout[i]) * gelu_grad_f(to_float(inp[i])));
}

inline void gelu_forward_naive(floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
    gelu_forward_naive_kernel<<<grid_for(n, 256), 256, 0, stream>>>(out, inp, n);
    cudaCheckLaunch();
}

inline void gelu_backward_naive(floatX* dinp, const floatX* inp, const floatX* dout, size_t n, cudaStream_t stream) {
    gelu_backward_naive_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dinp, inp, dout, n);
    cudaCheckLaunch();
}

// Standalone flash kernels: one thread per 16 bytes, the tail (n not a multiple of X128) element by element.
static __global__ void gelu_forward_flash_kernel(floatX* out, const floatX* inp, size_t n) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    if (i + X128 <= n) {
        Packed128<floatX> x = load128(inp + i);
        for (int e = 0; e < X128; e++) x[e] = from_float<floatX>(gelu_f(to_float(x[e])));
        store128(out + i, x);
    } else {
        for (; i < n; i++) out[i] = from_float<floatX>(gelu_f(to_float(inp[i])));
    }
}

static __global__ void gelu_backward_flash_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    if (i + X128 <= n) {
        Packed128<floatX> x = load128(inp + i), g = load128(dout + i);
        for (int e = 0; e < X128; e++) g[e] = from_float<floatX>(to_float(g[e]) * gelu_grad_f(to_float(x[e])));
        store128(dinp + i, g);
    } else {
        for (; i < n; i++) dinp[i] = from_float<floatX>(to_float(dout[i]) * gelu_grad_f(to_float(inp[i])));
    }
}

inline void gelu_forward_flash(floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
    if (!aligned16(out) || !aligned16(inp)) fail("gelu_forward_flash: buffers must be 16-byte aligned");
    launch_dependent(gelu_forward_flash_kernel, grid_for(ceil_div<size_t>(n, X128), 256), 256, 0, stream, out, inp, n);
}

inline void gelu_backward_flash(floatX* dinp, const floatX* inp, const floatX* dout, size_t n, cudaStream_t stream) {
    if (!aligned16(dinp) || !aligned16(inp) || !aligned16(dout)) fail("gelu_backward_flash: buffers must be 16-byte aligned");
    launch_dependent(gelu_backward_flash_kernel, grid_for(ceil_div<size_t>(n, X128), 256), 256, 0, stream,
        dinp, inp, dout, n);
}

}  // namespace flashgpt2
