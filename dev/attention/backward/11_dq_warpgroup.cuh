// Backward rung 11 — the fused kernel with a warpgroup of its own for dQ: the consumers never wait for each other.
//
// The idea: rung 10's step taken apart shows its base, dS^T stored and the consumers meeting at a named barrier
// every step, costing 8.5 ms at (1,12,32768,64) where both consumers with nothing fused take 6.6. The barrier
// holds the two consumer warpgroups in lockstep, so they compute their softmax at the same time and leave the
// tensor cores idle together; apart, one's exp2 runs while the other's products do (FlashAttention-3, Shah et
// al. 2024, §3.2, schedules that overlap on purpose in its forward). The meeting is only needed because each
// consumer makes half of dQ_i from both consumers' dS. So dQ moves to a fourth warpgroup (FlashAttention-3's
// backward gives dQ's adds a warp of their own, §3.3): each consumer stores its dS^T into a ring of two buffers
// and arrives at the buffer's mbarrier; the dQ warpgroup waits there, issues dS K_j over the block's 128 keys
// (64 queries x 64, one accumulator), frees the buffer and scales, rounds and adds the share as rung 10 does.
// A consumer waits only for a free buffer, two steps back.
// What changed from rung 10: the dQ warpgroup (72 registers a thread; the consumers' 240 become 208, setmaxnreg),
// an mbarrier pair per dS buffer instead of the named barrier, the row scales loaded by the dQ warpgroup from
// global memory while it waits (it is off the consumers' path), and the second consumer's first, all-masked tile
// skipped again (it hands over a zero dS^T instead of running the step). Head size 64 only: at 128 the four
// roles' registers do not fit the SM's (the page counts them: the consumers alone need 224 a thread there).
// What is still slow: it passes cuDNN at (1,12,32768,64) and (4,12,4096,64) and trails it at (1,12,16384,64); at
// T = 1024 the pre-pass and last pass (O(T) bytes) make it slower than rung 9 (its page has the figures).
// Measured: the "Measured" block of doc/attention/backward/11_dq_warpgroup.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 11
#pragma once

#include "dev/attention/attention.cuh"
#include "llmc/attention/wgmma_backward_ws.cuh"  // the kernel (DqBy::warpgroup) and its launch

namespace ladder::b11 {
inline bool supports(int HS) { return HS == 64; }  // and an sm_90a device, as rung 5
inline size_t workspace_bytes(int B, int NH, int T, int HS) { return flashgpt2::fixed_dq::workspace_bytes(B, NH, T, HS); }
}  // namespace ladder::b11

inline void attention_backward_dq_warpgroup(const AttnBwdParams& p) {
    flashgpt2::attention_backward_flash_wgmma_fused<flashgpt2::DqBy::warpgroup>(p.dqkv, p.workspace, p.dout, p.qkv,
                                                                             p.out, p.lse, p.B, p.T, p.NH, p.HS,
                                                                             p.stream);
}
