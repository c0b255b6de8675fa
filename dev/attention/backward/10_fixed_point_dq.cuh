// Backward rung 10 — one fused kernel for dQ, dK and dV, dQ's shares summed as integers: any order, the same bits.
//
// The idea: rungs 7 and 8 showed that the fused kernel's five tile products are worth having, and that what
// lost was the fixed order of dQ's adds: block j waits for block j+1's add to each tile, and the SMs wait with
// it. The order is only needed because floating-point addition is not associative. Integers are: each block's
// share of dQ_i is turned into round(2^e_i x), with a power-of-two scale per query row fixed beforehand from a
// bound on |dQ_i| (llmc/attention/wgmma_backward_fixed_dq.cuh derives it), and added with integer atomics. No
// counters, no waits, any schedule, and the sum is the same integer every run (fixed-point accumulation, as
// reproducible reductions do; e.g. Demmel and Nguyen, "Fast reproducible floating-point summation", 2013).
// What changed from rung 6 (whose warp-specialized kernel this is, with DqBy::consumers): both consumer warpgroups
// take every step (one of them idles through its first, all-masked, tile), each stores its dS^T to shared
// memory, the two meet at a named barrier, and each issues one more wgmma, dS K_j over the block's 128 keys for
// half of dQ_i's columns, while its dK runs; then it adds that share as int32 atomics (16 KB per 128 keys, half
// of rung 7's per key). Around the kernel: a pre-pass (lse·log2(e), D and |dO_i| per row, the head's max |K|
// and |V|, the integer sums zeroed) and a last pass (integers -> bf16 dQ). No dQ kernel: 5 products per (Q_i, K_j)
// pair where rungs 5, 6 and 9 do 7.
// What is still slow: it is the fastest rung at (1,12,32768,64) and (4,16,8192,128), level at 16K, slower at short
// T (its pre-pass and last pass move O(T) bytes); at 32K the fifth product costs 1.5 ms, the rounding 0.8, the
// atomics 0.08, and the step's base, with the consumers meeting at the barrier every step, 8.5 where rung 5's
// dK/dV kernel takes 6.0 (its page takes the step apart). The trainer's engine does not take it yet.
// Measured: the "Measured" block of doc/attention/backward/10_fixed_point_dq.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 10
#pragma once

#include "dev/attention/attention.cuh"
#include "llmc/attention/wgmma_backward_ws.cuh"  // the kernel (DqBy::consumers) and its launch

namespace ladder::b10 {
inline bool supports(int HS) { return HS == 64 || HS == 128; }  // and an sm_90a device, as rung 5
inline size_t workspace_bytes(int B, int NH, int T, int HS) { return flashgpt2::fixed_dq::workspace_bytes(B, NH, T, HS); }
}  // namespace ladder::b10

inline void attention_backward_fixed_point_dq(const AttnBwdParams& p) {
    flashgpt2::attention_backward_flash_wgmma_fused<flashgpt2::DqBy::consumers>(p.dqkv, p.workspace, p.dout, p.qkv, p.out, p.lse, p.B, p.T, p.NH,
                                                    p.HS, p.stream);
}
