// Backward rung 3 — FlashAttention-2's backward: D first, then two kernels parallel over tiles, no atomics.
//
// The idea (Dao 2023, arXiv:2307.08691, §3.2 and Algorithm 2): rung 2 has one block per head and re-reads
// and re-writes dQ in HBM for every key tile. FlashAttention-2 (1) computes D_i = rowsum(dO_i ∘ O_i) once, in a
// pre-pass, instead of once per (i, j) tile pair; (2) parallelizes over key blocks: one block per K_j, V_j
// holds dK_j, dV_j in registers and loops over the Q_i that see them, so B·NH·T/Bc blocks fill the card;
// (3) sends dQ elsewhere. FlashAttention-2 adds each block's dQ_i share into HBM with atomics, so two runs sum
// in different orders and give different bits. The trainer's rule is determinism (bit-exact resume), so here
// dQ gets a kernel of its own: one block per Q_i, looping over its visible K_j and recomputing S, P, dP and dS
// there (two more tile products per tile pair, on chip, rather than T/Bc partial dQ tiles through HBM).
//     pre-pass      D (B, NH, T) = rowsum(dO ∘ O), one warp per row
//     dK/dV kernel  per K_j: for each visible Q_i: P, dV_j += Pᵀ dO_i, dP, dS, dK_j += scale · dSᵀ Q_i
//     dQ kernel     per Q_i: for each visible K_j: P, dP, dS, dQ_i += scale · dS K_j
// Each output element is owned by one thread and summed in one fixed order. This is llmc's fp32 engine
// (llmc/attention/fp32_backward.cuh: `--attention flash:fp32`), fp32 arithmetic on the CUDA cores; this file
// is its adapter. What is still slow: every product is a scalar fp32 FMA loop, at 1/12 of the bf16 tensor
// cores' rate; rung 4 moves them onto the tensor cores.
// Measured: the "Measured" block of doc/attention/backward/3_flash2.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 3
#pragma once
#include "dev/attention/attention.cuh"
#include "llmc/attention.cuh"

namespace ladder::b3 {
inline bool supports(int HS) { return flashgpt2::attention_flash_fp32_supports(HS); }
inline size_t workspace_bytes(int B, int NH, int T, int) { return flashgpt2::attention_backward_d_floats(B, NH, T) * sizeof(float); }
}  // namespace ladder::b3

inline void attention_backward_flash2(const AttnBwdParams& p) {
    flashgpt2::attention_backward_flash_fp32(p.dqkv, (float*)p.workspace, p.dout, p.qkv, p.out, p.lse, p.B, p.T, p.NH,
                                             p.HS, p.stream);
}
