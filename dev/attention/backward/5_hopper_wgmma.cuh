// Backward rung 5 — Hopper: rung 4's two kernels with every tile product one warpgroup wgmma.
//
// The idea (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608, §3; PTX ISA, "Asynchronous Warpgroup Level
// Matrix Multiply-Accumulate"): on an H100/H200 one wgmma per warpgroup (4 warps) computes a 64×64×16 product
// and reads its operands straight from shared memory through a descriptor, asynchronously: issue, commit,
// wait. What changed from rung 4: the same tiles (Br = Bc = 64), the same cp.async double buffering into the same
// swizzled tiles (our swizzle is the hardware's 128-byte one) and the same register math for P, dP and dS, but
// no ldmatrix and no B fragments in registers; one product of a pair is in flight while the registers of the
// other are worked on; the dQ kernel writes lse and D per 64-query tile so that a dK/dV step copies them with
// no bounds checks (with checked loads, ptxas serialized the wgmmas). Same products in the same order as rung 4:
// the same bits. This is llmc's wgmma engine (llmc/attention/wgmma_backward.cuh: the trainer's backward on an
// H100/H200) in its head-by-head grid order (the engine takes rung 9's where the grid is short), head sizes 64
// and 128 (a (64, 128) tile is two 128-byte swizzle panels; dQ, dK and dV are n = 128 wgmmas); this file is its
// adapter. What is still slow: at long T it trails cuDNN (its Measured
// block says by how much); the dK/dV kernel's blocks meet at a barrier every step (rung 6 removes that, and
// does not win); at head size 128 only 2 blocks (2 warpgroups) fit an SM.
// Measured: the "Measured" block of doc/attention/backward/5_hopper_wgmma.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 5
#pragma once
#include "dev/attention/attention.cuh"
#include "llmc/attention.cuh"

namespace ladder::b5 {
// head sizes 64 and 128, and an sm_90a device (the engine says so when it is not)
inline bool supports(int HS) { return HS == 64 || HS == 128; }
inline size_t workspace_bytes(int B, int NH, int T, int) { return flashgpt2::attention_backward_d_floats(B, NH, T) * sizeof(float); }
}  // namespace ladder::b5

inline void attention_backward_hopper_wgmma(const AttnBwdParams& p) {  // always head by head (rung 9: the other order)
    using namespace flashgpt2;
    attention_backward_flash_wgmma_check("attention_backward_hopper_wgmma", p.dqkv, p.dout, p.qkv, p.out, p.B, p.NH, p.HS);
    attention_backward_flash_wgmma_in<GridOrder::head_major>(p.dqkv, (float*)p.workspace, p.dout, p.qkv, p.out, p.lse,
                                                             p.B, p.T, p.NH, p.HS, p.stream);
}
