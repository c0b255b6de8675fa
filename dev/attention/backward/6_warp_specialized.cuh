// Backward rung 6 — warp specialization: rung 5's dK/dV kernel with a TMA producer and two consumer warpgroups
// (FlashAttention-3's structure, Shah et al. 2024, arXiv:2407.08608, §3.1). At head size 64 it is no faster than
// rung 5 (llmc/attention/wgmma_backward.cuh, whose dQ kernel and dK/dV step, wgmma_backward::dkdv_step, it
// reuses); at head size 128 it is, and there the trainer's engine runs its dK/dV kernel, which lives in
// llmc/attention/wgmma_backward_ws.cuh: this rung is a thin adapter that runs it at both head sizes.
//
// The idea: rung 5's dK/dV blocks (one warpgroup, 3 per SM) load with cp.async and meet at a block barrier
// every step. Here a producer warp issues TMA copies of Q_i, dO_i into a 4-slot ring guarded by full/empty
// mbarriers, two consumer warpgroups (128 keys) never meet at a barrier, setmaxnreg gives them 240 registers,
// and the grid is persistent (one block per SM, items heaviest first in L2-sized sections, each block's next
// one from a counter as in the forward's scheduler; the next item's K_j, V_j land while the last one's dK, dV
// are stored).
//
// Why it does not win at head size 64 (our reading, not profiled): once ptxas stopped serializing rung 5's
// wgmmas (see its engine's header), its 3 blocks per SM keep 12 warps of math in flight, and a block's barrier
// stalls only one of the three; here 8 consumer warps do the math, and the copies the producer takes off their
// hands were cheap. The measurements, and the variants tried on the way: doc/attention/backward/6_warp_specialized.md.
// Head size 128 is where that reading is put to the test: there rung 5 too holds only two warpgroups per SM (two
// blocks, for their shared memory), so both run 8 warps of math, and here the two share each Q_i, dO_i tile
// (half the copies and L2 reads per key) and never meet at a block barrier; it measured faster there, which
// is why the engine takes it at that head size. A (64, 128) tile is two 64-column
// TMA boxes, one per swizzle panel; the ring has 2 slots so that a block fits in 227 KB.
// The producer is one warp: lane 0 issues the TMA copies, and all 32 lanes store the tile's lse and D into the
// slot (its page says why a consumer warp syncs its lanes before releasing a slot). Same products in the same
// order as rung 5: the same bits.
// Measured: the "Measured" block of doc/attention/backward/6_warp_specialized.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 6
#pragma once

#include "dev/attention/attention.cuh"
#include "llmc/attention/wgmma_backward_ws.cuh"  // the kernel: the engine's dK/dV kernel at head size 128

namespace flashgpt2 {

// Rung 5's dQ kernel, then the warp-specialized dK/dV kernel (llmc/attention/wgmma_backward_ws.cuh), at both
// head sizes (the engine takes this pair at 128 only).
inline void attention_backward_flash_hopper_ws(floatX* dqkv, float* D, const floatX* dout, const floatX* qkv,
                                               const floatX* out, const float* lse, int B, int T, int NH, int HS,
                                               cudaStream_t stream) {
    attention_backward_flash_wgmma_check("attention_backward_flash_hopper_ws", dqkv, dout, qkv, out, B, NH, HS);
    attention_backward_flash_wgmma_dq(dqkv, D, dout, qkv, out, lse, B, T, NH, HS, stream);
    attention_backward_flash_wgmma_dkdv_ws(dqkv, D, dout, qkv, B, T, NH, HS, stream);
}

}  // namespace flashgpt2

namespace ladder::b6 {
inline bool supports(int HS) { return HS == 64 || HS == 128; }  // and an sm_90a device, as rung 5
inline size_t workspace_bytes(int B, int NH, int T, int) { return flashgpt2::attention_backward_d_floats(B, NH, T) * sizeof(float); }
}  // namespace ladder::b6

inline void attention_backward_warp_specialized(const AttnBwdParams& p) {
    flashgpt2::attention_backward_flash_hopper_ws(p.dqkv, (float*)p.workspace, p.dout, p.qkv, p.out, p.lse, p.B, p.T,
                                                  p.NH, p.HS, p.stream);
}
