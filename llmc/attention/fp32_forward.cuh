// Flash attention forward with fp32 arithmetic on the CUDA cores: the FP32 build's engine, and in the BF16 build
// the engine for head sizes the tensor-core engines do not take (`--attention flash:fp32` asks for it anywhere).
// FlashAttention-2's algorithm (Dao 2023, Alg. 1), written plainly: one block per (b, h, Q block of Br = 32 rows);
// 4 threads per query row, each owning HS/4 of the head dimensions (d = sub, sub+4, ...: neighbouring threads read
// neighbouring shared-memory words):
//     for each K_j, V_j tile (Bc = 32 keys, causal: only tiles with keys <= the block's last query):
//         S = Q_i K_j^T * scale                   (a dot product per key, reduced over the 4 threads)
//         m_new = max(m, rowmax(S));  P = exp(S - m_new)
//         l = l * exp(m - m_new) + rowsum(P);  O = O * exp(m - m_new) + P V_j;  m = m_new
//     O /= l;  lse = m + log(l)       (lse, (B,NH,T) fp32, is all the backward needs besides Q, K, V, O)
// The backward is fp32_backward.cuh.
#pragma once
#include <cmath>

#include "llmc/attention/common.cuh"
#include "llmc/error.h"
#include "llmc/kernel_common.cuh"

namespace flashgpt2 {

// The head sizes this engine is compiled for (both passes).
inline bool attention_flash_fp32_supports(int HS) { return HS == 16 || HS == 32 || HS == 64 || HS == 128; }

constexpr int FA_BR = 32, FA_BC = 32;  // rows of Q per block, rows of K/V per tile
constexpr int FA_THREADS = 4 * FA_BR;  // 4 threads per row

// Sum over the 4 threads of a row (lanes 4r..4r+3 of the warp).
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

// Loads rows [r0, r0+ROWS) of q, k or v for (b, h) into s (ROWS, HS) fp32; rows >= T become 0.
template <int HS, int ROWS>
__device__ __forceinline__ void fa_load_tile(float* s, const floatX* qkv, int which, int b, int h, int r0, int T,
                                             int NH) {
    for (int e = threadIdx.x; e < ROWS * HS; e += blockDim.x) {
        const int r = e / HS, d = e % HS, t = r0 + r;
        s[e] = t < T ? to_float(qkv[qkv_index(b, t, which, h, d, T, NH, HS)]) : 0.0f;
    }
}

template <int HS>
__global__ void __launch_bounds__(FA_THREADS)
    attention_forward_flash_fp32_kernel(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH) {
    constexpr int DPT = HS / 4;  // head dims per thread
    __shared__ float sK[FA_BC * HS], sV[FA_BC * HS];  // K_j, V_j (Bc, HS)
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BR;  // the longest (latest) Q blocks start first
    const int r = threadIdx.x / 4, sub = threadIdx.x % 4, i = q0 + r;  // this thread's query row i
    const float scale = 1.0f / sqrtf((float)HS);

    float q[DPT], o[DPT];
    for (int k = 0; k < DPT; k++) {
        q[k] = i < T ? to_float(qkv[qkv_index(b, i, 0, h, sub + 4 * k, T, NH, HS)]) * scale : 0.0f;
        o[k] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;

    const int kv_end = min(T, q0 + FA_BR);  // causal: keys beyond the block's last query are never seen
    for (int j0 = 0; j0 < kv_end; j0 += FA_BC) {
        __syncthreads();  // every thread is done with the previous K_j, V_j before they are overwritten
        fa_load_tile<HS, FA_BC>(sK, qkv, 1, b, h, j0, T, NH);
        fa_load_tile<HS, FA_BC>(sV, qkv, 2, b, h, j0, T, NH);
        __syncthreads();  // the tile is in shared memory before anyone reads it

        float s[FA_BC];  // S = Q_i K_j^T (this row), masked
        float m_tile = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < FA_BC; jj++) {
            float part = 0.0f;
            for (int k = 0; k < DPT; k++) part += q[k] * sK[jj * HS + sub + 4 * k];
            const int j = j0 + jj;
            const float dot = quad_sum(part);  // all 32 lanes shuffle: never inside a lane-dependent branch
            s[jj] = (j <= i && j < T) ? dot : -INFINITY;
            m_tile = fmaxf(m_tile, s[jj]);
        }
        const float m_new = fmaxf(m, m_tile);  // finite: key 0 is in the first tile and visible to every row
        const float alpha = expf(m - m_new);   // 0 on the first tile (m = -inf)
        l *= alpha;
        for (int k = 0; k < DPT; k++) o[k] *= alpha;
#pragma unroll
        for (int jj = 0; jj < FA_BC; jj++) {
            const float p = expf(s[jj] - m_new);  // 0 where masked
            l += p;
            for (int k = 0; k < DPT; k++) o[k] += p * sV[jj * HS + sub + 4 * k];
        }
        m = m_new;
    }
    if (i < T) {
        for (int k = 0; k < DPT; k++) out[out_index(b, i, h, sub + 4 * k, T, NH, HS)] = from_float<floatX>(o[k] / l);
        if (sub == 0) lse[(size_t)bh * T + i] = m + logf(l);
    }
}

template <int HS>
inline void attention_forward_flash_fp32_launch(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH,
                                                cudaStream_t stream) {
    dim3 grid(ceil_div(T, FA_BR), B * NH);
    attention_forward_flash_fp32_kernel<HS><<<grid, FA_THREADS, 0, stream>>>(out, lse, qkv, B, T, NH);
    cudaCheckLaunch();
}

// out (B,T,NH,HS) and lse (B,NH,T) of causal attention over qkv (B,T,3,NH,HS).
inline void attention_forward_flash_fp32(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int HS,
                                         cudaStream_t stream) {
    switch (HS) {
        case 16: return attention_forward_flash_fp32_launch<16>(out, lse, qkv, B, T, NH, stream);
        case 32: return attention_forward_flash_fp32_launch<32>(out, lse, qkv, B, T, NH, stream);
        case 64: return attention_forward_flash_fp32_launch<64>(out, lse, qkv, B, T, NH, stream);
        case 128: return attention_forward_flash_fp32_launch<128>(out, lse, qkv, B, T, NH, stream);
        default: fail("attention_forward_flash_fp32: head size %d is not supported", HS);
    }
}

}  // namespace flashgpt2
