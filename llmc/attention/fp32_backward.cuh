// Flash attention backward with fp32 arithmetic on the CUDA cores (the engine of fp32_forward.cuh; read that
// first). Deterministic (no atomics): D = rowsum(dO * O) first, then two kernels that each recompute
// P = exp(S - lse) tile by tile and never store it (FlashAttention-2's backward, Dao 2023, Alg. 2):
//     dK/dV kernel, one block per K/V block, looping over the Q blocks that see it:
//         dV_j += P^T dO_i;  dP = dO_i V_j^T;  dS = P * (dP - D_i);  dK_j += scale * dS^T Q_i
//     dQ kernel, one block per Q block, looping over its visible K/V blocks:
//         dQ_i += scale * dS K_j
// Each output element is owned by exactly one thread, so every sum runs in one fixed order.
#pragma once
#include <cmath>

#include "llmc/attention/common.cuh"
#include "llmc/attention/fp32_forward.cuh"  // the tile sizes and the tile loader
#include "llmc/error.h"
#include "llmc/kernel_common.cuh"

namespace flashgpt2 {

// D (B,NH,T) = rowsum(dO * O), one warp per row (b, h, t).
static __global__ void attention_backward_fp32_preprocess_kernel(float* D, const floatX* dout, const floatX* out, int B,
                                                                  int T, int NH, int HS) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= B * NH * T) return;  // whole warp; no block barrier
    const int t = row % T, h = (row / T) % NH, b = row / (T * NH);
    float s = 0.0f;
    for (int d = lane; d < HS; d += 32) {
        const size_t x = out_index(b, t, h, d, T, NH, HS);
        s += to_float(dout[x]) * to_float(out[x]);
    }
    s = warp_sum(s);
    if (lane == 0) D[row] = s;
}

inline void attention_backward_fp32_preprocess(float* D, const floatX* dout, const floatX* out, int B, int T, int NH,
                                                int HS, cudaStream_t stream) {
    const int rows = B * NH * T;
    attention_backward_fp32_preprocess_kernel<<<ceil_div(rows, 8), 256, 0, stream>>>(D, dout, out, B, T, NH, HS);
    cudaCheckLaunch();
}

// One block per (b, h, K/V block of Bc rows); 4 threads per key row. Writes dK, dV of its keys.
template <int HS>
__global__ void __launch_bounds__(FA_THREADS)
    attention_backward_flash_fp32_dkdv_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                          const float* D, int B, int T, int NH) {
    constexpr int DPT = HS / 4;
    __shared__ float sQ[FA_BR * HS], sdO[FA_BR * HS];  // Q_i, dO_i (Br, HS)
    __shared__ float sL[FA_BR], sD[FA_BR];              // lse_i, D_i (Br)
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int j0 = blockIdx.x * FA_BC;
    const int r = threadIdx.x / 4, sub = threadIdx.x % 4, j = j0 + r;  // this thread's key row j
    const float scale = 1.0f / sqrtf((float)HS);

    float kr[DPT], vr[DPT], dk[DPT], dv[DPT];
    for (int k = 0; k < DPT; k++) {
        const int d = sub + 4 * k;
        kr[k] = j < T ? to_float(qkv[qkv_index(b, j, 1, h, d, T, NH, HS)]) : 0.0f;
        vr[k] = j < T ? to_float(qkv[qkv_index(b, j, 2, h, d, T, NH, HS)]) : 0.0f;
        dk[k] = dv[k] = 0.0f;
    }
    // causal: queries i >= j0 see this block (FA_BR == FA_BC, so Q blocks start at j0)
    for (int i0 = j0; i0 < T; i0 += FA_BR) {
        __syncthreads();  // every thread is done with the previous Q_i, dO_i tile before it is overwritten
        fa_load_tile<HS, FA_BR>(sQ, qkv, 0, b, h, i0, T, NH);
        for (int e = threadIdx.x; e < FA_BR * HS; e += blockDim.x) {
            const int rr = e / HS, d = e % HS, t = i0 + rr;
            sdO[e] = t < T ? to_float(dout[out_index(b, t, h, d, T, NH, HS)]) : 0.0f;
        }
        for (int rr = threadIdx.x; rr < FA_BR; rr += blockDim.x) {
            const int t = i0 + rr;
            sL[rr] = t < T ? lse[(size_t)bh * T + t] : 0.0f;
            sD[rr] = t < T ? D[(size_t)bh * T + t] : 0.0f;
        }
        __syncthreads();  // the tile is in shared memory before anyone reads it

        for (int ii = 0; ii < FA_BR; ii++) {
            const int i = i0 + ii;
            float sp = 0.0f, dpp = 0.0f;
            for (int k = 0; k < DPT; k++) {
                sp += sQ[ii * HS + sub + 4 * k] * kr[k];
                dpp += sdO[ii * HS + sub + 4 * k] * vr[k];
            }
            const float s = quad_sum(sp) * scale, dp = quad_sum(dpp);
            const float p = (j <= i && i < T && j < T) ? expf(s - sL[ii]) : 0.0f;  // P recomputed from lse
            const float ds = p * (dp - sD[ii]);
            for (int k = 0; k < DPT; k++) {
                dv[k] += p * sdO[ii * HS + sub + 4 * k];
                dk[k] += ds * sQ[ii * HS + sub + 4 * k];
            }
        }
    }
    if (j < T)
        for (int k = 0; k < DPT; k++) {
            const int d = sub + 4 * k;
            dqkv[qkv_index(b, j, 1, h, d, T, NH, HS)] = from_float<floatX>(dk[k] * scale);
            dqkv[qkv_index(b, j, 2, h, d, T, NH, HS)] = from_float<floatX>(dv[k]);
        }
}

// One block per (b, h, Q block of Br rows); 4 threads per query row. Writes dQ of its queries.
template <int HS>
__global__ void __launch_bounds__(FA_THREADS)
    attention_backward_flash_fp32_dq_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                        const float* D, int B, int T, int NH) {
    constexpr int DPT = HS / 4;
    __shared__ float sK[FA_BC * HS], sV[FA_BC * HS];  // K_j, V_j (Bc, HS)
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BR;
    const int r = threadIdx.x / 4, sub = threadIdx.x % 4, i = q0 + r;
    const float scale = 1.0f / sqrtf((float)HS);

    float qr[DPT], dor[DPT], dq[DPT];
    for (int k = 0; k < DPT; k++) {
        const int d = sub + 4 * k;
        qr[k] = i < T ? to_float(qkv[qkv_index(b, i, 0, h, d, T, NH, HS)]) : 0.0f;
        dor[k] = i < T ? to_float(dout[out_index(b, i, h, d, T, NH, HS)]) : 0.0f;
        dq[k] = 0.0f;
    }
    const float li = i < T ? lse[(size_t)bh * T + i] : 0.0f, Di = i < T ? D[(size_t)bh * T + i] : 0.0f;

    const int kv_end = min(T, q0 + FA_BR);
    for (int j0 = 0; j0 < kv_end; j0 += FA_BC) {
        __syncthreads();  // every thread is done with the previous K_j, V_j before they are overwritten
        fa_load_tile<HS, FA_BC>(sK, qkv, 1, b, h, j0, T, NH);
        fa_load_tile<HS, FA_BC>(sV, qkv, 2, b, h, j0, T, NH);
        __syncthreads();  // the tile is in shared memory before anyone reads it
        for (int jj = 0; jj < FA_BC; jj++) {
            const int j = j0 + jj;
            float sp = 0.0f, dpp = 0.0f;
            for (int k = 0; k < DPT; k++) {
                sp += qr[k] * sK[jj * HS + sub + 4 * k];
                dpp += dor[k] * sV[jj * HS + sub + 4 * k];
            }
            const float s = quad_sum(sp) * scale, dp = quad_sum(dpp);
            const float p = (j <= i && j < T && i < T) ? expf(s - li) : 0.0f;
            const float ds = p * (dp - Di);
            for (int k = 0; k < DPT; k++) dq[k] += ds * sK[jj * HS + sub + 4 * k];
        }
    }
    if (i < T)
        for (int k = 0; k < DPT; k++)
            dqkv[qkv_index(b, i, 0, h, sub + 4 * k, T, NH, HS)] = from_float<floatX>(dq[k] * scale);
}

template <int HS>
inline void attention_backward_flash_fp32_launch(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                                 const float* D, int B, int T, int NH, cudaStream_t stream) {
    dim3 grid_kv(ceil_div(T, FA_BC), B * NH), grid_q(ceil_div(T, FA_BR), B * NH);
    attention_backward_flash_fp32_dkdv_kernel<HS><<<grid_kv, FA_THREADS, 0, stream>>>(dqkv, dout, qkv, lse, D, B, T, NH);
    cudaCheckLaunch();
    attention_backward_flash_fp32_dq_kernel<HS><<<grid_q, FA_THREADS, 0, stream>>>(dqkv, dout, qkv, lse, D, B, T, NH);
    cudaCheckLaunch();
}

// dqkv (B,T,3,NH,HS) = the gradient of causal attention given dout (B,T,NH,HS), the forward's out and lse;
// D: attention_backward_d_floats() of workspace, filled here with rowsum(dO * O) before the two kernels run.
inline void attention_backward_flash_fp32(floatX* dqkv, float* D, const floatX* dout, const floatX* qkv,
                                          const floatX* out, const float* lse, int B, int T, int NH, int HS,
                                          cudaStream_t stream) {
    attention_backward_fp32_preprocess(D, dout, out, B, T, NH, HS, stream);
    switch (HS) {
        case 16: return attention_backward_flash_fp32_launch<16>(dqkv, dout, qkv, lse, D, B, T, NH, stream);
        case 32: return attention_backward_flash_fp32_launch<32>(dqkv, dout, qkv, lse, D, B, T, NH, stream);
        case 64: return attention_backward_flash_fp32_launch<64>(dqkv, dout, qkv, lse, D, B, T, NH, stream);
        case 128: return attention_backward_flash_fp32_launch<128>(dqkv, dout, qkv, lse, D, B, T, NH, stream);
        default: fail("attention_backward_flash_fp32: head size %d is not supported", HS);
    }
}

}  // namespace flashgpt2
