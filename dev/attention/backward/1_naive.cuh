// Backward rung 1 — naive: P read back from HBM, every (T, T) intermediate a kernel's output in HBM.
//
// The idea: the chain rule through "standard attention" (FlashAttention, Dao et al. 2022, arXiv:2205.14135,
// Algorithm 3), one step per kernel. The forward saved P = softmax(S), (B, NH, T, T); then
//     dV = Pᵀ dO                       a batched matmul (cuBLAS), P read from HBM
//     dP = dO Vᵀ                       a batched matmul, written to HBM in fp32: (B, NH, T, T)
//     dS = scale · P ∘ (dP − rowsum(dP ∘ P) / rowsum(P))   one warp per row, P and dP read from HBM, dS written
//                                      (B, NH, T, T); the stored P is rounded (llmc/attention.cuh: why the division)
//     dQ = dS K,  dK = dSᵀ Q           two batched matmuls reading dS from HBM
// (the softmax's backward needs rowsum(dP ∘ P), which equals rowsum(dO ∘ O): rung 3 uses the second form).
// Five T×T matrices' worth of HBM traffic per head where the flash rungs move none; at T = 32768 the saved P
// alone is 12 heads × 2 GiB. This is the trainer's own naive backward (llmc/attention.cuh), and the baseline
// whose error every other rung is judged against (doc/design.md, "Correctness").
// Measured: the "Measured" block of doc/attention/backward/1_naive.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 1
#pragma once
#include "dev/attention/attention.cuh"
#include "llmc/attention.cuh"

namespace ladder::b1 {
inline bool supports(int HS) { return HS > 0; }
inline size_t workspace_bytes(int B, int NH, int T, int HS) {
    return flashgpt2::attention_workspace_bytes(flashgpt2::Variant::naive, B, T, NH * HS, NH);
}
}  // namespace ladder::b1

inline void attention_backward_naive(const AttnBwdParams& p) {
    flashgpt2::attention_backward_naive(p.dqkv, p.workspace, p.dout, p.qkv, p.att, p.B, p.T, p.NH * p.HS, p.NH, p.stream);
}
