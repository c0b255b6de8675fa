// Backward rung 4 — tensor cores: rung 3's two kernels with every tile product on bf16 mma.sync.
//
// The idea (FlashAttention-2, Dao 2023, §3.1; the forward's rung 5 did the same for the forward): the seven
// tile products of rung 3 (S, dP and dQ in the dQ kernel; Sᵀ, dPᵀ, dV and dK in the dK/dV kernel) become
// warp-wide mma.sync.m16n8k16 instructions, bf16 in, fp32 accumulated. What changed from rung 3:
//   * the pre-pass is fused into the dQ kernel (D_i is computed there and written for the dK/dV kernel);
//   * the dK/dV kernel works transposed (rows = keys), so Pᵀ and dSᵀ come out of one mma's accumulators in
//     exactly the register layout of the next mma's A operand: they never touch shared memory;
//   * every tile travels global -> shared by cp.async, double-buffered, in a swizzled layout that ldmatrix
//     reads without bank conflicts;
//   * only tiles that cross the diagonal apply the causal mask.
// This is llmc's mma engine (llmc/attention/mma_backward.cuh: `--attention flash:mma`, the trainer's backward on
// cards before Hopper), head size 64; this file is its adapter, with its two dK/dV block sizes (8 warps = 128
// keys, the default; 4 warps = 64 keys). What is still slow: each warp's mma.sync loop issues many small
// instructions and reads its B operands through registers; rung 5 gives each product to one Hopper wgmma.
// Measured: the "Measured" block of doc/attention/backward/4_tensor_cores.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 4
#pragma once
#include "dev/attention/attention.cuh"
#include "llmc/attention.cuh"

namespace ladder::b4 {
inline bool supports(int HS) { return flashgpt2::attention_flash_mma_supports(HS); }
inline size_t workspace_bytes(int B, int NH, int T, int) { return flashgpt2::attention_backward_d_floats(B, NH, T) * sizeof(float); }
template <int WARPS>
inline void run(const AttnBwdParams& p) {
    flashgpt2::attention_backward_flash_mma(p.dqkv, (float*)p.workspace, p.dout, p.qkv, p.out, p.lse, p.B, p.T, p.NH,
                                            p.HS, p.stream, WARPS);
}
}  // namespace ladder::b4

inline void attention_backward_tensor_cores(const AttnBwdParams& p) { ladder::b4::run<flashgpt2::FB_DKDV_WARPS>(p); }
inline void attention_backward_tensor_cores_4warps(const AttnBwdParams& p) { ladder::b4::run<4>(p); }
