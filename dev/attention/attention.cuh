// The attention ladders' shared interface. Every rung in dev/attention/forward/N_<name>.cuh implements
// `void attention_forward_<name>(const AttnFwdParams&)`, every rung in dev/attention/backward/N_<name>.cuh
// `void attention_backward_<name>(const AttnBwdParams&)`, and each gets one line in its table of
// dev/attention/runner.cu (RUNGS, RUNGS_BWD), which validates it against the CPU oracle and then times it.
//
// The problem every rung solves: causal self-attention for B·NH independent heads,
//     S = Q Kᵀ / sqrt(HS)   with S[i][j] = -inf for j > i (a query never sees the future)
//     P = softmax(S) row by row,   O = P V,   lse[i] = log Σ_j exp(S[i][j])
// lse (natural log, fp32) is what a FlashAttention backward needs to rebuild P = exp(S - lse) on chip
// without ever storing the T×T matrix.
#pragma once
#include <cstddef>
#include "llmc/common.cuh"
#include "llmc/error.h"
#include "llmc/kernel_common.cuh"  // to_float, from_float

enum class DType { F32, BF16 };

struct AttnFwdParams {          // one causal attention forward, softmax scale 1/sqrt(HS)
    const void* q; const void* k; const void* v;  // (B, NH, T, HS) contiguous, dtype of the rung
    void* o;                                      // (B, NH, T, HS) output
    float* lse;                                   // (B, NH, T) logsumexp of the scaled scores (natural log), for the backward
    int B, NH, T, HS;
    void* workspace;                              // rung-specific scratch, workspace_bytes() large, or nullptr
    cudaStream_t stream;
};

struct Rung {
    int id; const char* file; const char* name; DType dtype;
    bool (*supports)(int HS);                                  // e.g. HS == 64 || HS == 128
    size_t (*workspace_bytes)(int B, int NH, int T, int HS);   // nullptr = none
    void (*run)(const AttnFwdParams&);                          // launches only: no allocation, no sync
};

inline const char* dtype_name(DType t) { return t == DType::F32 ? "fp32" : "bf16"; }
inline size_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

// FLOPs by the FlashAttention convention: two matmuls (Q Kᵀ and P V) of 2·T·T·HS FLOPs per head, halved
// because the causal mask removes half of each. Every rung is scored with this same count, whatever it
// really computes (the naive rung computes the masked half too), so TFLOP/s compare like for like.
inline double attention_forward_flops(int B, int NH, int T, int HS) {
    return 4.0 * B * NH * (double)T * T * HS / 2.0;
}

// ---- the backward ladder ----
// The backward rungs work in the trainer's layouts and precision (llmc/attention/common.cuh): they read the
// forward's tensors as the trainer saves them and write dqkv as its matmul backward reads it, so that a rung
// that is a production engine is a thin adapter over llmc/. Storage is floatX (bf16 in the default build);
// a rung's DType names its arithmetic (fp32 on the CUDA cores, or bf16 on the tensor cores).
struct AttnBwdParams {
    floatX* dqkv;                 // (B, T, 3, NH, HS) output: dQ, dK, dV side by side
    const floatX* dout;           // (B, T, NH, HS) dO
    const floatX* qkv;            // (B, T, 3, NH, HS) Q, K, V as the forward read them
    const floatX* out;            // (B, T, NH, HS) O of the flash forward (what D_i = rowsum(dO_i ∘ O_i) reads)
    const float* lse;             // (B, NH, T) the flash forward's logsumexp
    const floatX* att;            // (B, NH, T, T) P of the naive forward: read by the naive rung only
    int B, NH, T, HS;
    void* workspace;              // rung-specific scratch, workspace_bytes() large, or nullptr
    cudaStream_t stream;
};

struct BwdRung {
    int id; const char* file; const char* name; DType dtype;   // dtype: the arithmetic (storage is floatX)
    bool (*supports)(int HS);
    size_t (*workspace_bytes)(int B, int NH, int T, int HS);   // nullptr = none
    void (*run)(const AttnBwdParams&);                          // launches only: no allocation, no sync
};

// The backward's FLOPs by the FlashAttention convention: 2.5 × the forward's, five T×T×HS matmuls (S again,
// dP, dV, dQ, dK) to the forward's two, causal half. The naive rung, which reads P instead of recomputing S,
// is scored with the same count, as the forward ladder scores every rung with one count.
inline double attention_backward_flops(int B, int NH, int T, int HS) { return 2.5 * attention_forward_flops(B, NH, T, HS); }

namespace ladder {

// Element conversions (llmc's), so one templated kernel serves fp32 and bf16 storage. Arithmetic is always fp32.
using flashgpt2::from_float;
using flashgpt2::to_float;

// Head offset: element (b, h, t, d) of a (B, NH, T, HS) tensor is at ((b·NH + h)·T + t)·HS + d. Rungs
// flatten (b, h) into one index bh, so a head starts at bh·T·HS; size_t because B·NH·T·HS passes 2^31.
__device__ __forceinline__ size_t head_offset(int bh, int T, int HS) { return (size_t)bh * T * HS; }

}  // namespace ladder
