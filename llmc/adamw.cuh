// AdamW (Loshchilov & Hutter 2019) with bias correction, as llm.c and llmc/ref/adamw.h apply it:
//   g = grad * grad_scale (clipping)    m = b1 m + (1-b1) g    v = b2 v + (1-b2) g^2
//   p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)      (wd only on the decayed tensors)
// State (m, v) and master weights are fp32; in the BF16 build params = round(master) after each step.
// And the global gradient norm for clipping: sum of squares, deterministic (fixed-order reductions).
//
// naive: one launch per parameter tensor (16 for GPT-2), each with its own weight decay; the norm likewise.
// flash: one launch over the whole flat parameter buffer, 4 parameters per thread with vector loads; each
//        thread finds its tensor (<= 16 offsets, in the kernel's parameter space) for the decay flag. Same
//        arithmetic, 16x fewer launches and tails. The norm: one launch with 16-byte loads.
#pragma once
#include <array>
#include <cmath>

#include "llmc/config.h"
#include "llmc/error.h"
#include "llmc/kernel_common.cuh"

namespace flashgpt2 {

// Where each parameter tensor lives in the flat buffer and whether AdamW decays it.
struct ParamLayout {
    int count = 0;
    std::array<size_t, NUM_PARAMETER_TENSORS + 1> offset{};  // tensor i is [offset[i], offset[i+1])
    std::array<bool, NUM_PARAMETER_TENSORS> decay{};

    size_t total() const { return offset[count]; }
    static ParamLayout gpt2(const GPT2Config& cfg) {
        ParamLayout p;
        p.count = NUM_PARAMETER_TENSORS;
        auto sizes = parameter_sizes(cfg);
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            p.offset[i + 1] = p.offset[i] + sizes[i];
            p.decay[i] = parameter_decays(i);
        }
        return p;
    }
};

struct AdamWHyper {
    float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
    int t = 1;                // step, from 1 (bias correction)
    float grad_scale = 1.0f;  // min(1, clip / grad_norm), applied to every gradient before the moments
    // Or, when norm2 is set, the kernel takes the clip factor from the gradients' global norm² on the device
    // (grad_scale unused): the host queues the update without waiting for the norm, and a norm that is not finite
    // moves nothing (the divergence guard, llmc/guard.h, stops the run when the host reads it).
    const float* norm2 = nullptr;
    float grad_clip = 0.0f;  // with norm2: the clip (0: none)
};

// The per-step constants, computed on the host as llmc/ref does.
struct AdamWStep {
    float lr, beta1, beta2, eps, c1, c2, grad_scale;
    const float* norm2;
    float grad_clip;
};
inline AdamWStep adamw_step_constants(const AdamWHyper& hp) {
    if (hp.t < 1) fail("adamw_update: step t=%d must start at 1 (bias correction divides by 1 - beta^t)", hp.t);
    return {hp.lr, hp.beta1, hp.beta2, hp.eps, 1.0f - std::pow(hp.beta1, (float)hp.t),
            1.0f - std::pow(hp.beta2, (float)hp.t), hp.grad_scale, hp.norm2, hp.grad_clip};
}

// s.grad_scale from the device norm² when there is one; false: the norm is not finite, leave everything as it is.
// sqrtf and the division are IEEE-rounded (no fast math), so the factor is the host's to the bit.
__device__ __forceinline__ bool adamw_clip(AdamWStep& s) {
    if (!s.norm2) return true;
    const float norm = sqrtf(*s.norm2);
    if (!isfinite(norm)) return false;
    s.grad_scale = (s.grad_clip > 0.0f && norm > s.grad_clip) ? s.grad_clip / norm : 1.0f;  // llm.c's clipping rule
    return true;
}

// The update of one parameter p with gradient g; m, v updated in place. Returns the new p.
__device__ __forceinline__ float adamw_math(float g, float& m, float& v, float p, const AdamWStep& s, float wd) {
    g *= s.grad_scale;
    m = s.beta1 * m + (1.0f - s.beta1) * g;
    v = s.beta2 * v + (1.0f - s.beta2) * g * g;
    return p - s.lr * ((m / s.c1) / (sqrtf(v / s.c2) + s.eps) + wd * p);
}

// One parameter. master == nullptr: params (fp32 build) hold the weights themselves.
__device__ __forceinline__ void adamw_one(float* master, floatX* params, const floatX* grads, float* m, float* v,
                                          size_t i, const AdamWStep& s, float wd) {
    float mi = m[i], vi = v[i];
    const float p = adamw_math(to_float(grads[i]), mi, vi, master ? master[i] : to_float(params[i]), s, wd);
    m[i] = mi;
    v[i] = vi;
    if (master) master[i] = p;
    params[i] = from_float<floatX>(p);
}

inline void adamw_check(const float* master) {
#if !defined(ENABLE_FP32)
    if (!master) fail("adamw_update: the BF16 build needs fp32 master weights (master == nullptr)");
#else
    (void)master;
#endif
}

// ---- naive: one launch per tensor ----

static __global__ void adamw_tensor_naive_kernel(float* master, floatX* params, const floatX* grads, float* m, float* v,
                                          size_t n, AdamWStep s, float wd) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && adamw_clip(s)) adamw_one(master, params, grads, m, v, i, s, wd);
}

inline void adamw_update_naive(float* master, floatX* params, const floatX* grads, float* m, float* v,
                               const ParamLayout& layout, const AdamWHyper& hp, cudaStream_t stream) {
    adamw_check(master);
    const AdamWStep s = adamw_step_constants(hp);
    for (int t = 0; t < layout.count; t++) {
        const size_t off = layout.offset[t], n = layout.offset[t + 1] - off;
        if (n == 0) continue;
        adamw_tensor_naive_kernel<<<grid_for(n, 256), 256, 0, stream>>>(master ? master + off : nullptr, params + off,
                                                                        grads + off, m + off, v + off, n, s,
                                                                        layout.decay[t] ? hp.weight_decay : 0.0f);
        cudaCheckLaunch();
    }
}

// ---- flash: one launch over all parameters ----

struct ParamLayoutDevice {  // ParamLayout, passed by value to the kernel
    int count;
    size_t offset[NUM_PARAMETER_TENSORS + 1];
    float wd[NUM_PARAMETER_TENSORS];
};

// ADAMW_VEC consecutive parameters per thread: m, v and the master weights move as 16-byte loads and stores,
// the bf16 grads and params as 8-byte ones (fp32 build: 16). Same arithmetic per parameter as the naive kernel;
// a quarter of the instructions per byte, which is what a bandwidth-bound update needs (doc/kernels.md).
constexpr int ADAMW_VEC = 4;
template <class T>
struct alignas(ADAMW_VEC * sizeof(T)) Vec4 {
    T v[ADAMW_VEC];
};

static __global__ void adamw_flash_kernel(float* master, floatX* params, const floatX* grads, float* m, float* v,
                                   ParamLayoutDevice layout, AdamWStep s) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    const size_t n = layout.offset[layout.count];
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * ADAMW_VEC;
    if (i0 >= n || !adamw_clip(s)) return;
    int t = 0;
    while (i0 >= layout.offset[t + 1]) t++;  // which tensor: <= 16 compares
    if (i0 + ADAMW_VEC > n) {  // the last n % ADAMW_VEC parameters, one at a time
        for (size_t i = i0; i < n; i++) {
            while (i >= layout.offset[t + 1]) t++;
            adamw_one(master, params, grads, m, v, i, s, layout.wd[t]);
        }
        return;
    }
    Vec4<float> mv = *reinterpret_cast<const Vec4<float>*>(m + i0), vv = *reinterpret_cast<const Vec4<float>*>(v + i0);
    const Vec4<floatX> gv = *reinterpret_cast<const Vec4<floatX>*>(grads + i0);
    Vec4<float> pv;
    if (master) pv = *reinterpret_cast<const Vec4<float>*>(master + i0);
    else for (int e = 0; e < ADAMW_VEC; e++) pv.v[e] = to_float(params[i0 + e]);
    Vec4<floatX> out;
    for (int e = 0; e < ADAMW_VEC; e++) {
        while (i0 + e >= layout.offset[t + 1]) t++;  // a tensor may end inside the group
        pv.v[e] = adamw_math(to_float(gv.v[e]), mv.v[e], vv.v[e], pv.v[e], s, layout.wd[t]);
        out.v[e] = from_float<floatX>(pv.v[e]);
    }
    *reinterpret_cast<Vec4<float>*>(m + i0) = mv;
    *reinterpret_cast<Vec4<float>*>(v + i0) = vv;
    if (master) *reinterpret_cast<Vec4<float>*>(master + i0) = pv;
    *reinterpret_cast<Vec4<floatX>*>(params + i0) = out;
}

inline void adamw_update_flash(float* master, floatX* params, const floatX* grads, float* m, float* v,
                               const ParamLayout& layout, const AdamWHyper& hp, cudaStream_t stream) {
    adamw_check(master);
    if (!aligned16(m) || !aligned16(v) || (master && !aligned16(master)) || !aligned16(params) || !aligned16(grads))
        fail("adamw_update_flash: parameter, gradient and optimizer buffers must be 16-byte aligned");
    ParamLayoutDevice d{};
    d.count = layout.count;
    for (int t = 0; t <= layout.count; t++) d.offset[t] = layout.offset[t];
    for (int t = 0; t < layout.count; t++) d.wd[t] = layout.decay[t] ? hp.weight_decay : 0.0f;
    const size_t n = layout.total();
    if (n == 0) return;
    launch_dependent(adamw_flash_kernel, grid_for(ceil_div<size_t>(n, ADAMW_VEC), 256), 256, 0, stream,
        master, params, grads, m, v, d, adamw_step_constants(hp));
}

// ---------------------------------------------------------------------------------------------------------
// Global gradient norm (squared). Partial sums per block (a fixed grid: the same split every run), then
// one block adds the partials in a fixed order: deterministic.

constexpr int NORM_BLOCKS = 512, NORM_THREADS = 512;

inline size_t global_norm_workspace_bytes(Variant v) {
    return ws_round((size_t)(v == Variant::naive ? NUM_PARAMETER_TENSORS : 1) * NORM_BLOCKS * sizeof(float));
}

static __global__ void __launch_bounds__(NORM_THREADS)
    norm_squared_partial_kernel(float* partial, const floatX* g, size_t n) {
    float s = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = to_float(g[i]);
        s += x * x;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

static __global__ void __launch_bounds__(NORM_THREADS) norm_squared_final_kernel(float* out, const float* partial, int count) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    float s = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) *out = s;
}

inline void global_norm_squared_naive(float* out, void* ws, const floatX* grads, const ParamLayout& layout,
                                      cudaStream_t stream) {
    float* partial = WorkspaceCarver(ws).take<float>((size_t)NUM_PARAMETER_TENSORS * NORM_BLOCKS);  // (16, NORM_BLOCKS)
    for (int t = 0; t < layout.count; t++) {  // one launch per tensor
        norm_squared_partial_kernel<<<NORM_BLOCKS, NORM_THREADS, 0, stream>>>(
            partial + (size_t)t * NORM_BLOCKS, grads + layout.offset[t], layout.offset[t + 1] - layout.offset[t]);
        cudaCheckLaunch();
    }
    norm_squared_final_kernel<<<1, NORM_THREADS, 0, stream>>>(out, partial, layout.count * NORM_BLOCKS);
    cudaCheckLaunch();
}

// flash: 16-byte loads, a grid-stride loop over whole chunks of X128; the last n % X128 go to block 0.
static __global__ void __launch_bounds__(NORM_THREADS)
    norm_squared_partial_flash_kernel(float* partial, const floatX* g, size_t n) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    const size_t chunks = n / X128;
    float s = 0.0f;
    for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += (size_t)gridDim.x * blockDim.x) {
        const Packed128<floatX> x = load128(g + c * X128);
        for (int e = 0; e < X128; e++) s += to_float(x[e]) * to_float(x[e]);
    }
    if (blockIdx.x == 0 && threadIdx.x < n % X128) {
        const float x = to_float(g[chunks * X128 + threadIdx.x]);
        s += x * x;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

inline void global_norm_squared_flash(float* out, void* ws, const floatX* grads, const ParamLayout& layout,
                                      cudaStream_t stream) {
    if (!aligned16(grads)) fail("global_norm_squared_flash: gradients must be 16-byte aligned");
    float* partial = WorkspaceCarver(ws).take<float>(NORM_BLOCKS);  // (NORM_BLOCKS)
    launch_dependent(norm_squared_partial_flash_kernel, NORM_BLOCKS, NORM_THREADS, 0, stream,
        partial, grads, layout.total());
    launch_dependent(norm_squared_final_kernel, 1, NORM_THREADS, 0, stream, out, partial, NORM_BLOCKS);
}

}  // namespace flashgpt2
