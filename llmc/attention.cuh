// Causal multi-head self-attention: qkv (B,T,3,NH,HS) -> out (B,T,NH,HS), softmax scale 1/sqrt(HS).
//
// naive: standard attention (llm.c's own): permute q, k, v to (B,NH,T,HS); S = Q K^T into HBM, (B,NH,T,T);
//        P = softmax(scale * S) into HBM, (B,NH,T,T), kept until the backward; O = P V; unpermute. The
//        backward reads P back: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP) / rowsum(P)), dQ = dS K,
//        dK = dS^T Q, each (B,NH,T,T) intermediate a round trip through HBM. GEMMs are cuBLAS batched.
//        Precision as the flash kernels: S and dP in fp32 (the GEMMs accumulate in fp32 and write fp32), P and
//        dS in floatX, because they feed the next GEMM. (llm.c's kernels store S and dP in bf16: the softmax
//        amplifies S's rounding and dP - rowsum(P dP) cancels, so those gradients are noisier than the flash
//        ones, and a naive and a flash training run drift apart: doc/kernels.md.)
// flash: tiled online softmax: S and P live only in registers/shared memory, one tile at a time; the forward
//        saves lse = log sum exp of each row (B,NH,T); the backward recomputes P = exp(S - lse) tile by tile
//        (FlashAttention-2). Q, K, V are read straight from qkv by strides and out is written as (B,T,NH,HS):
//        no permutes. Three engines, one file per engine and pass in llmc/attention/:
//          fp32   fp32_{forward,backward}.cuh    CUDA-core arithmetic, any build, HS 16/32/64/128
//          mma    mma_{forward,backward}.cuh     bf16 tensor cores through mma.sync (sm_80 on), HS 64
//          wgmma  wgmma_{forward,backward}.cuh   Hopper's warpgroup tensor cores + TMA (sm_90a), HS 64
//                                                and 128
//        `--attention flash` runs the best engine this build, card and head size allow, for each pass;
//        `--attention flash:<engine>` asks for one, and an engine that cannot run is an error, never a silent
//        fallback. attention_engine() below is the one place that decides; the trainer prints what it chose.
//
// Sizes: the naive path runs any HS; the flash path what its engine runs (attention_check_shape).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include <string>

#include "llmc/attention/common.cuh"
#include "llmc/attention/fp32_backward.cuh"
#include "llmc/attention/fp32_forward.cuh"
#include "llmc/error.h"
#include "llmc/kernel_common.cuh"
#include "llmc/layer.h"
#include "llmc/matmul.cuh"
#if !defined(ENABLE_FP32)  // the tensor-core engines are bf16: the BF16 build's
#include "llmc/attention/mma_backward.cuh"
#include "llmc/attention/mma_forward.cuh"
#include "llmc/attention/wgmma_backward_ws.cuh"  // (and wgmma_backward.cuh)
#include "llmc/attention/wgmma_forward.cuh"
#endif

namespace flashgpt2 {

// ---------------------------------------------------------------------------------------------------------
// sizes and checks

// ---- the flash engines --------------------------------------------------------------------------------------
// `best` is a request only: attention_engine() turns it into the engine that runs.
enum class AttnEngine { best, fp32, mma, wgmma };
constexpr AttnEngine ATTN_ENGINES[] = {AttnEngine::wgmma, AttnEngine::mma, AttnEngine::fp32};  // best first

inline const char* engine_name(AttnEngine e) {
    switch (e) {
        case AttnEngine::fp32: return "fp32";
        case AttnEngine::mma: return "mma";
        case AttnEngine::wgmma: return "wgmma";
        default: return "best";
    }
}
// "fp32" | "mma" | "wgmma" (what follows "flash:" on the command line); anything else is an Error.
inline AttnEngine parse_engine(const std::string& s, const std::string& what) {
    for (AttnEngine e : ATTN_ENGINES)
        if (s == engine_name(e)) return e;
    fail("%s: unknown attention engine '%s' (expected flash, flash:wgmma, flash:mma or flash:fp32)", what.c_str(),
         s.c_str());
}

// Why `e` cannot run `pass` at head size HS in this build on this device, or nullptr when it can.
inline const char* attention_engine_unsupported(AttnEngine e, Pass pass, int HS) {
    switch (e) {
        case AttnEngine::fp32: return attention_flash_fp32_supports(HS) ? nullptr : "it runs head sizes 16, 32, 64 and 128";
#if defined(ENABLE_FP32)
        case AttnEngine::mma:
        case AttnEngine::wgmma: return "it is bf16: it needs the BF16 build (PRECISION=BF16)";
#else
        case AttnEngine::mma: return attention_flash_mma_supports(HS) ? nullptr : "it runs head size 64 only";
        case AttnEngine::wgmma:
            if (!hopper::sm90a_available()) return "it needs an H100/H200 and a binary built for it (GPU_ARCH=90: sm_90a)";
            if (pass == Pass::forward)
                return attention_forward_flash_wgmma_supports(HS) ? nullptr : "its forward runs head sizes 64 and 128";
            return attention_backward_flash_wgmma_supports(HS) ? nullptr : "its backward runs head sizes 64 and 128";
#endif
        default: return "it is not an engine";
    }
}

// The engine that runs `pass` for this request at head size HS: the requested one, or with `best` the first of
// ATTN_ENGINES that can run. An engine that cannot run is an Error saying why and which ones can.
inline AttnEngine attention_engine(AttnEngine request, Pass pass, int HS) {
    if (request != AttnEngine::best) {
        const char* why = attention_engine_unsupported(request, pass, HS);
        if (!why) return request;
        std::string can;
        for (AttnEngine e : ATTN_ENGINES)
            if (!attention_engine_unsupported(e, pass, HS)) can += std::string(can.empty() ? "" : ", ") + engine_name(e);
        fail("--attention flash:%s: the %s engine cannot run the attention %s at head size %d here: %s (engines "
             "that can: %s)", engine_name(request), engine_name(request), pass_name(pass), HS, why,
             can.empty() ? "none; use --attention naive" : can.c_str());
    }
    for (AttnEngine e : ATTN_ENGINES)
        if (!attention_engine_unsupported(e, pass, HS)) return e;
    fail("attention_flash: no flash engine runs head size %d (the fp32 engine takes 16, 32, 64 or 128); use "
         "--attention naive", HS);
}

inline void attention_check_shape(Variant v, AttnEngine engine, int C, int NH) {
    if (NH <= 0 || C % NH != 0) fail("attention: channels %d are not divisible by heads %d", C, NH);
    if (v == Variant::flash)
        for (Pass pass : {Pass::forward, Pass::backward}) attention_engine(engine, pass, C / NH);
}

// The flash kernels put the B*NH heads in gridDim.y, which holds at most 65,535.
inline void attention_check_heads(int B, int NH) {
    if ((long long)B * NH > 65535)
        fail("attention_flash: B*NH = %lld heads, more than the 65,535 the flash kernels' grid takes: lower -b",
             (long long)B * NH);
}

inline size_t attention_saved_bytes(Variant v, int B, int T, int NH) {
    return v == Variant::naive ? (size_t)B * NH * T * T * sizeof(floatX)  // P (B,NH,T,T)
                               : (size_t)B * NH * T * sizeof(float);      // lse (B,NH,T)
}

inline size_t attention_workspace_bytes(Variant v, int B, int T, int C, int NH) {
    const size_t btc = ws_round((size_t)B * T * C * sizeof(floatX)), tt = (size_t)B * NH * T * T;
    if (v == Variant::naive)  // q,k,v + O/dO permuted + dq,dk,dv; S/dP in fp32; dS
        return 7 * btc + ws_round(tt * sizeof(float)) + ws_round(tt * sizeof(floatX));
    size_t d = attention_backward_d_floats(B, NH, T) * sizeof(float);  // D = rowsum(dO * O), per row and tile
#if !defined(ENABLE_FP32)
    if (NH > 0 && C % NH == 0) d = std::max(d, attention_backward_flash_wgmma_workspace_bytes(B, T, NH, C / NH));
#endif
    return ws_round(d);
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

// dS = scale * P * (dP - sum_j P dP / sum_j P); 0 above the diagonal. The exact P sums to 1 over a row, and then
// every row of dS sums to 0; the stored P is rounded (to bf16 in the BF16 build) and sums to 1 + e, |e| up to a
// few 2^-9. Dividing by sum_j P keeps dS's rows summing to 0: without it e times dP's part common to the row
// (large when q, k, v share a mean) lands in dS, and where dQ is a difference of a few keys (T = 2: dQ =
// dS_0 (K_0 - K_1)) that is several percent of it.
static __global__ void attention_softmax_backward_naive_kernel(floatX* dpreatt, const float* datt, const floatX* att,
                                                               float scale, int rows, int T) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int i = row % T;
    const floatX* p = att + (size_t)row * T;
    const float* dp = datt + (size_t)row * T;
    floatX* ds = dpreatt + (size_t)row * T;
    float dot = 0.0f, sum = 0.0f;
    for (int j = lane; j <= i; j += 32) dot += to_float(p[j]) * dp[j], sum += to_float(p[j]);
    dot = warp_sum(dot) / warp_sum(sum);
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
    attention_check_shape(Variant::naive, AttnEngine::best, C, NH);
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
    attention_check_shape(Variant::naive, AttnEngine::best, C, NH);
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
// flash: the one dispatch, forward and backward. `engine` is the request (best, or one engine); the engine that
// runs is attention_engine()'s answer for this pass.

inline void attention_forward_flash(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                                    AttnEngine engine, cudaStream_t stream) {
    if (NH <= 0 || C % NH != 0) fail("attention: channels %d are not divisible by heads %d", C, NH);
    attention_check_heads(B, NH);
    const int HS = C / NH;
    switch (attention_engine(engine, Pass::forward, HS)) {
#if !defined(ENABLE_FP32)
        case AttnEngine::wgmma: {
            if (!aligned16(qkv) || !aligned16(out)) fail("attention_forward_flash (wgmma): qkv and out must be 16-byte aligned");
            WgmmaAttentionParams p;  // q, k, v: (B,T,3,NH,HS) read in place; out: (B,T,NH,HS)
            p.q = qkv, p.k = qkv + C, p.v = qkv + 2 * C;
            p.in = HeadStrides{(long long)T * 3 * C, HS, 3LL * C};
            p.o = out, p.out = HeadStrides{(long long)T * C, HS, C};
            p.lse = lse, p.B = B, p.NH = NH, p.T = T, p.HS = HS, p.stream = stream;
            return attention_forward_flash_wgmma(p);
        }
        case AttnEngine::mma: return attention_forward_flash_mma(out, lse, qkv, B, T, NH, HS, stream);
#endif
        default: return attention_forward_flash_fp32(out, lse, qkv, B, T, NH, HS, stream);
    }
}

inline void attention_backward_flash(floatX* dqkv, void* ws, const floatX* dout, const floatX* qkv, const floatX* out,
                                     const float* lse, int B, int T, int C, int NH, AttnEngine engine,
                                     cudaStream_t stream) {
    if (NH <= 0 || C % NH != 0) fail("attention: channels %d are not divisible by heads %d", C, NH);
    attention_check_heads(B, NH);
    const int HS = C / NH;
    float* D = WorkspaceCarver(ws).take<float>(attention_backward_d_floats(B, NH, T));  // rowsum(dO * O)
    switch (attention_engine(engine, Pass::backward, HS)) {  // each computes D (or its own rows) itself, then dQ, dK, dV
#if !defined(ENABLE_FP32)
        case AttnEngine::wgmma: return attention_backward_flash_wgmma(dqkv, ws, dout, qkv, out, lse, B, T, NH, HS, stream);
        case AttnEngine::mma: return attention_backward_flash_mma(dqkv, D, dout, qkv, out, lse, B, T, NH, HS, stream);
#endif
        default: return attention_backward_flash_fp32(dqkv, D, dout, qkv, out, lse, B, T, NH, HS, stream);
    }
}

}  // namespace flashgpt2
