// Causal multi-head self-attention: qkv (B,T,3,NH,HS) -> out (B,T,NH,HS), softmax scale 1/sqrt(HS).
//
// naive: standard attention (llm.c's own): permute q, k, v to (B,NH,T,HS); S = Q K^T into HBM, (B,NH,T,T);
//        P = softmax(scale * S) into HBM, (B,NH,T,T), kept until the backward; O = P V; unpermute. The
//        backward reads P back: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = dS K,
//        dK = dS^T Q, each (B,NH,T,T) intermediate a round trip through HBM. GEMMs are cuBLAS batched.
//        Precision as the flash kernels: S and dP in fp32 (the GEMMs accumulate in fp32 and write fp32), P and
//        dS in floatX, because they feed the next GEMM. (llm.c's kernels store S and dP in bf16: the softmax
//        amplifies S's rounding and dP - rowsum(P dP) cancels, so those gradients are noisier than the flash
//        ones, and a naive and a flash training run drift apart: doc/kernels.md.)
// flash: tiled online softmax (attention_flash.cuh, attention_flash_mma.cuh; on an H100/H200 the BF16 forward
//        is attention_hopper.cuh, the dev ladder's rung 8, and the backward attention_backward_hopper.cuh;
//        elsewhere the backward is attention_backward.cuh, on mma.sync): S and P live only in
//        registers/shared memory, one tile at a time; the forward saves lse = log sum exp of each row
//        (B,NH,T); the backward recomputes P = exp(S - lse) tile by tile (FlashAttention-2).
//        Q, K, V are read straight from qkv by strides and out is written as (B,T,NH,HS): no permutes.
//
// Sizes: the naive path runs any HS; the flash path HS in {16, 32, 64, 128} (attention_check_shape).
#pragma once
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "llmc/error.h"
#include "llmc/kernel_common.cuh"
#include "llmc/matmul.cuh"
#include "llmc/attention_flash.cuh"
#if !defined(ENABLE_FP32)
#include "llmc/attention_flash_mma.cuh"
#include "llmc/attention_hopper.cuh"
#include "llmc/attention_backward.cuh"
#include "llmc/attention_backward_hopper.cuh"
#endif

namespace flashgpt2 {

// ---------------------------------------------------------------------------------------------------------
// sizes and checks

inline void attention_check_shape(Variant v, int C, int NH) {
    if (NH <= 0 || C % NH != 0) fail("attention: channels %d are not divisible by heads %d", C, NH);
    const int HS = C / NH;
    if (v == Variant::flash && !attention_flash_supports(HS))
        fail("attention_flash: head size %d (channels %d / heads %d) is not supported: use 16, 32, 64 or 128, "
             "or --attention naive", HS, C, NH);
}

inline size_t attention_saved_bytes(Variant v, int B, int T, int NH) {
    return v == Variant::naive ? (size_t)B * NH * T * T * sizeof(floatX)  // P (B,NH,T,T)
                               : (size_t)B * NH * T * sizeof(float);      // lse (B,NH,T)
}

inline size_t attention_workspace_bytes(Variant v, int B, int T, int C, int NH) {
    const size_t btc = ws_round((size_t)B * T * C * sizeof(floatX)), tt = (size_t)B * NH * T * T;
    if (v == Variant::naive)  // q,k,v + O/dO permuted + dq,dk,dv; S/dP in fp32; dS
        return 7 * btc + ws_round(tt * sizeof(float)) + ws_round(tt * sizeof(floatX));
    return ws_round(attention_backward_d_floats(B, NH, T) * sizeof(float));  // D = rowsum(dO * O), per row and tile
}

// ---------------------------------------------------------------------------------------------------------
// naive: layout changes

// qkv (B,T,3,NH,HS) -> q, k, v (B,NH,T,HS); one thread per element of q.
static __global__ void attention_permute_kernel(floatX* q, floatX* k, floatX* v, const floatX* qkv, int B, int T, int NH,
                                         int HS) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T * HS) return;
    const int d = idx % HS, t = (idx / HS) % T, h = (idx / ((size_t)HS * T)) % NH, b = idx / ((size_t)HS * T * NH);
    const size_t src = ((size_t)b * T + t) * 3 * NH * HS + (size_t)h * HS + d;
    q[idx] = qkv[src];
    k[idx] = qkv[src + (size_t)NH * HS];
    v[idx] = qkv[src + 2 * (size_t)NH * HS];
}

// The reverse of attention_permute_kernel: dq, dk, dv (B,NH,T,HS) -> dqkv (B,T,3,NH,HS).
static __global__ void attention_permute_backward_kernel(floatX* dqkv, const floatX* dq, const floatX* dk, const floatX* dv,
                                                  int B, int T, int NH, int HS) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T * HS) return;
    const int d = idx % HS, t = (idx / HS) % T, h = (idx / ((size_t)HS * T)) % NH, b = idx / ((size_t)HS * T * NH);
    const size_t dst = ((size_t)b * T + t) * 3 * NH * HS + (size_t)h * HS + d;
    dqkv[dst] = dq[idx];
    dqkv[dst + (size_t)NH * HS] = dk[idx];
    dqkv[dst + 2 * (size_t)NH * HS] = dv[idx];
}

// (B,NH,T,HS) <-> (B,T,NH,HS); one thread per element. TO_HEADS: (B,T,NH,HS) -> (B,NH,T,HS).
template <bool TO_HEADS>
__global__ void attention_unpermute_kernel(floatX* dst, const floatX* src, int B, int T, int NH, int HS) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // index into the (B,NH,T,HS) tensor
    if (idx >= (size_t)B * NH * T * HS) return;
    const int d = idx % HS, t = (idx / HS) % T, h = (idx / ((size_t)HS * T)) % NH, b = idx / ((size_t)HS * T * NH);
    const size_t other = (((size_t)b * T + t) * NH + h) * HS + d;
    if (TO_HEADS) dst[idx] = src[other];
    else dst[other] = src[idx];
}

// ---------------------------------------------------------------------------------------------------------
// naive: softmax and its backward over (B*NH*T) rows of length T; one warp per row, causal (j <= i).

static __global__ void attention_softmax_naive_kernel(floatX* att, const float* preatt, float scale, int rows, int T) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves; no block barrier below
    const int i = row % T;    // query position: keys 0..i are visible
    const float* s = preatt + (size_t)row * T;
    floatX* p = att + (size_t)row * T;
    float m = -INFINITY;
    for (int j = lane; j <= i; j += 32) m = fmaxf(m, scale * s[j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j <= i; j += 32) l += expf(scale * s[j] - m);
    l = warp_sum(l);
    for (int j = lane; j < T; j += 32) p[j] = from_float<floatX>(j <= i ? expf(scale * s[j] - m) / l : 0.0f);
}

// dS = scale * P * (dP - sum_j P dP); 0 above the diagonal.
static __global__ void attention_softmax_backward_naive_kernel(floatX* dpreatt, const float* datt, const floatX* att,
                                                               float scale, int rows, int T) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int i = row % T;
    const floatX* p = att + (size_t)row * T;
    const float* dp = datt + (size_t)row * T;
    floatX* ds = dpreatt + (size_t)row * T;
    float dot = 0.0f;
    for (int j = lane; j <= i; j += 32) dot += to_float(p[j]) * dp[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) ds[j] = from_float<floatX>(j <= i ? scale * to_float(p[j]) * (dp[j] - dot) : 0.0f);
}

// Column-major batched GEMM, one per (b, h): C (m,n) = op(A) (m,k) @ op(B) (k,n); strides per batch. A and B
// are floatX, the sums fp32; C is floatX or float (cuBLAS writes the fp32 sums without rounding them).
template <typename OutT>
inline void attention_batched_gemm(bool ta, bool tb, int m, int n, int k, const floatX* a, int lda, size_t sa,
                                   const floatX* b, int ldb, size_t sb, OutT* c, int ldc, size_t sc, int batch,
                                   cudaStream_t stream) {
    static_assert(std::is_same_v<OutT, floatX> || std::is_same_v<OutT, float>);
    const cudaDataType_t c_type = std::is_same_v<OutT, float> ? CUDA_R_32F : CUDA_FLOATX;
    Blas& bl = blas();
    cublasCheck(cublasSetStream(bl.handle, stream));
    const float one = 1.0f, zero = 0.0f;
    cublasCheck(cublasGemmStridedBatchedEx(bl.handle, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           m, n, k, &one, a, CUDA_FLOATX, lda, (long long)sa, b, CUDA_FLOATX, ldb,
                                           (long long)sb, &zero, c, c_type, ldc, (long long)sc, batch,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------------------------------------------------
// naive forward / backward

inline void attention_forward_naive(floatX* out, floatX* att, void* ws, const floatX* qkv, int B, int T, int C, int NH,
                                    cudaStream_t stream) {
    attention_check_shape(Variant::naive, C, NH);
    const int HS = C / NH, BH = B * NH;
    const size_t btc = (size_t)B * T * C, tt = (size_t)T * T, ths = (size_t)T * HS;
    WorkspaceCarver carve(ws);
    floatX* q = carve.take<floatX>(btc);                  // (B,NH,T,HS)
    floatX* k = carve.take<floatX>(btc);                  // (B,NH,T,HS)
    floatX* v = carve.take<floatX>(btc);                  // (B,NH,T,HS)
    float* preatt = carve.take<float>((size_t)BH * tt);   // (B,NH,T,T)  S = Q K^T, in HBM
    floatX* vaccum = carve.take<floatX>(btc);             // (B,NH,T,HS) O = P V before the unpermute

    attention_permute_kernel<<<grid_for(btc, 256), 256, 0, stream>>>(q, k, v, qkv, B, T, NH, HS);
    cudaCheckLaunch();
    // S^T (T,T) col-major = (k as (HS,T))^T @ (q as (HS,T)), i.e. S = Q K^T row-major
    attention_batched_gemm(true, false, T, T, HS, k, HS, ths, q, HS, ths, preatt, T, tt, BH, stream);
    const int rows = BH * T;
    attention_softmax_naive_kernel<<<ceil_div(rows, 8), 256, 0, stream>>>(att, preatt, 1.0f / sqrtf((float)HS), rows, T);
    cudaCheckLaunch();
    // O^T (HS,T) = (v as (HS,T)) @ (att as (T,T) col-major = P^T), i.e. O = P V row-major
    attention_batched_gemm(false, false, HS, T, T, v, HS, ths, att, T, tt, vaccum, HS, ths, BH, stream);
    attention_unpermute_kernel<false><<<grid_for(btc, 256), 256, 0, stream>>>(out, vaccum, B, T, NH, HS);
    cudaCheckLaunch();
}

inline void attention_backward_naive(floatX* dqkv, void* ws, const floatX* dout, const floatX* qkv, const floatX* att,
                                     int B, int T, int C, int NH, cudaStream_t stream) {
    attention_check_shape(Variant::naive, C, NH);
    const int HS = C / NH, BH = B * NH;
    const size_t btc = (size_t)B * T * C, tt = (size_t)T * T, ths = (size_t)T * HS;
    WorkspaceCarver carve(ws);
    floatX* q = carve.take<floatX>(btc);                // (B,NH,T,HS)
    floatX* k = carve.take<floatX>(btc);                // (B,NH,T,HS)
    floatX* v = carve.take<floatX>(btc);                // (B,NH,T,HS)
    float* datt = carve.take<float>((size_t)BH * tt);   // (B,NH,T,T)  dP
    floatX* dpreatt = carve.take<floatX>((size_t)BH * tt); // (B,NH,T,T) dS
    floatX* dvaccum = carve.take<floatX>(btc);          // (B,NH,T,HS) dO permuted
    floatX* dq = carve.take<floatX>(btc);               // (B,NH,T,HS)
    floatX* dk = carve.take<floatX>(btc);               // (B,NH,T,HS)
    floatX* dv = carve.take<floatX>(btc);               // (B,NH,T,HS)

    attention_permute_kernel<<<grid_for(btc, 256), 256, 0, stream>>>(q, k, v, qkv, B, T, NH, HS);
    cudaCheckLaunch();
    attention_unpermute_kernel<true><<<grid_for(btc, 256), 256, 0, stream>>>(dvaccum, dout, B, T, NH, HS);
    cudaCheckLaunch();
    // dP = dO V^T  (as S = Q K^T above, with dO for Q and V for K)
    attention_batched_gemm(true, false, T, T, HS, v, HS, ths, dvaccum, HS, ths, datt, T, tt, BH, stream);
    // dV = P^T dO:  dV^T (HS,T) = (dO as (HS,T)) @ (att as col-major P^T)^T
    attention_batched_gemm(false, true, HS, T, T, dvaccum, HS, ths, att, T, tt, dv, HS, ths, BH, stream);
    const int rows = BH * T;
    attention_softmax_backward_naive_kernel<<<ceil_div(rows, 8), 256, 0, stream>>>(dpreatt, datt, att,
                                                                                   1.0f / sqrtf((float)HS), rows, T);
    cudaCheckLaunch();
    // dQ = dS K:  dQ^T (HS,T) = (k as (HS,T)) @ (dS as col-major dS^T)
    attention_batched_gemm(false, false, HS, T, T, k, HS, ths, dpreatt, T, tt, dq, HS, ths, BH, stream);
    // dK = dS^T Q:  dK^T (HS,T) = (q as (HS,T)) @ (dS as col-major dS^T)^T
    attention_batched_gemm(false, true, HS, T, T, q, HS, ths, dpreatt, T, tt, dk, HS, ths, BH, stream);
    attention_permute_backward_kernel<<<grid_for(btc, 256), 256, 0, stream>>>(dqkv, dq, dk, dv, B, T, NH, HS);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------------------------
// flash dispatch: BF16 build with HS 64 -> tensor-core kernels (attention_flash_mma.cuh); otherwise the
// fp32-arithmetic tiled kernels (attention_flash.cuh). force_scalar lets the tests run the latter anywhere.

inline bool attention_flash_uses_mma(int HS, bool force_scalar) {
#if !defined(ENABLE_FP32)
    return !force_scalar && attention_flash_mma_supports(HS);
#else
    (void)HS, (void)force_scalar;
    return false;
#endif
}

// The forward has one more, first choice: BF16 build, an sm_90a binary on an sm_90 device (checked once per
// process), HS 64 or 128 and 16-byte aligned buffers -> the Hopper kernel (attention_hopper.cuh: wgmma +
// TMA, q, k, v read in place from qkv through 4-D tensor maps, out written as (B,T,NH,HS)). It writes lse
// exactly as the other flash forwards do, so every flash backward reads it. allow_hopper = false (or the
// environment variable FLASHGPT2_ATTENTION_HOPPER=0, for side-by-side timing) runs the fallbacks instead.
inline bool attention_forward_uses_hopper(int HS, const void* qkv, const void* out, bool force_scalar,
                                          bool allow_hopper) {
#if !defined(ENABLE_FP32)
    static const bool env_off = [] {
        const char* e = std::getenv("FLASHGPT2_ATTENTION_HOPPER");
        return e && e[0] == '0' && !e[1];
    }();
    return !force_scalar && allow_hopper && !env_off && aligned16(qkv) && aligned16(out) &&
           attention_hopper_supports(HS);
#else
    (void)HS, (void)qkv, (void)out, (void)force_scalar, (void)allow_hopper;
    return false;
#endif
}

// The backward's first choice, by the same rule: the Hopper wgmma backward (attention_backward_hopper.cuh),
// head size 64 only; then the mma.sync one.
inline bool attention_backward_uses_hopper(int HS, const void* qkv, const void* out, const void* dout,
                                           const void* dqkv, bool force_scalar) {
#if !defined(ENABLE_FP32)
    return attention_forward_uses_hopper(HS, qkv, out, force_scalar, true) && aligned16(dout) && aligned16(dqkv) &&
           attention_backward_hopper_supports(HS);
#else
    (void)HS, (void)qkv, (void)out, (void)dout, (void)dqkv, (void)force_scalar;
    return false;
#endif
}

inline void attention_forward_flash(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                                    cudaStream_t stream, bool force_scalar = false, bool allow_hopper = true) {
    attention_check_shape(Variant::flash, C, NH);
    const int HS = C / NH;
#if !defined(ENABLE_FP32)
    if (attention_forward_uses_hopper(HS, qkv, out, force_scalar, allow_hopper)) {
        AttentionHopperParams p;  // q, k, v: (B,T,3,NH,HS) read in place; out: (B,T,NH,HS)
        p.q = qkv, p.k = qkv + C, p.v = qkv + 2 * C;
        p.in = HeadStrides{(long long)T * 3 * C, HS, 3LL * C};
        p.o = out, p.out = HeadStrides{(long long)T * C, HS, C};
        p.lse = lse, p.B = B, p.NH = NH, p.T = T, p.HS = HS, p.stream = stream;
        return attention_forward_hopper(p);
    }
    if (attention_flash_uses_mma(HS, force_scalar)) return attention_forward_flash_mma(out, lse, qkv, B, T, NH, HS, stream);
#else
    (void)allow_hopper;
#endif
    attention_forward_flash_scalar(out, lse, qkv, B, T, NH, HS, stream);
}

inline void attention_backward_flash(floatX* dqkv, void* ws, const floatX* dout, const floatX* qkv, const floatX* out,
                                     const float* lse, int B, int T, int C, int NH, cudaStream_t stream,
                                     bool force_scalar = false) {
    attention_check_shape(Variant::flash, C, NH);
    const int HS = C / NH;
    float* D = WorkspaceCarver(ws).take<float>(attention_backward_d_floats(B, NH, T));  // rowsum(dO * O)
#if !defined(ENABLE_FP32)
    // both compute D themselves, fused into their dQ kernel
    if (attention_backward_uses_hopper(HS, qkv, out, dout, dqkv, force_scalar))
        return attention_backward_flash_hopper(dqkv, D, dout, qkv, out, lse, B, T, NH, HS, stream);
    if (attention_flash_uses_mma(HS, force_scalar))
        return attention_backward_flash_mma(dqkv, D, dout, qkv, out, lse, B, T, NH, HS, stream);
#endif
    attention_flash_backward_preprocess(D, dout, out, B, T, NH, HS, stream);
    attention_backward_flash_scalar(dqkv, dout, qkv, lse, D, B, T, NH, HS, stream);
}

}  // namespace flashgpt2
