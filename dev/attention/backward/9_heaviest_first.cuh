// Backward rung 9 — rung 5's two kernels, their blocks in another order: heaviest first across heads.
//
// The idea (Graham 1969, longest processing time first; the forward's scheduler, rung 7 of the forward
// ladder, and FlashAttention-3's tile scheduler do the same): causal blocks are unequal. Key block j of the
// dK/dV kernel visits the n − j query tiles that see it (n = T/64), query tile i of the dQ kernel visits i + 1
// key tiles. The hardware starts a grid's blocks in index order as SMs free up, so the index order is the
// schedule. Rung 5's grid is (tiles, B·NH): head 0's blocks, heaviest first, then head 1's, and so on, so the
// last head's heaviest blocks start near the end of the kernel and run on while the other SMs have nothing
// left; at (1,12,16384,64) that is 12 heads of 256 blocks on 132 SMs.
// What changed from rung 5: only the order. A 1-D grid of tiles·B·NH blocks; block b takes item b of
// llmc/attention/schedule.h's order: every head's heaviest block, then every head's next, ..., in sections of
// heads whose re-read tiles (Q and dO for dK/dV, K and V for dQ) fit in L2 together, the last section not a
// short one (balanced_section_heads). Each block does exactly rung 5's work in rung 5's order: the same bits
// (the runner checks it).
// What is still slow: whatever rung 5's kernels themselves cost (its page); the order removes the tail only, and
// where a grid is many waves long it measured slower than rung 5's (its page), so the trainer's engine takes this
// order only where the dK/dV grid is under 16 waves (attention_backward_flash_wgmma_order).
// Measured: the "Measured" block of doc/attention/backward/9_heaviest_first.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 9
#pragma once
#include "dev/attention/attention.cuh"
#include "llmc/attention.cuh"

namespace ladder::b9 {
// rung 5's head sizes (64 and 128) and device (sm_90a); the engine says so when it is not
inline bool supports(int HS) { return HS == 64 || HS == 128; }
inline size_t workspace_bytes(int B, int NH, int T, int) { return flashgpt2::attention_backward_d_floats(B, NH, T) * sizeof(float); }
}  // namespace ladder::b9

inline void attention_backward_heaviest_first(const AttnBwdParams& p) {
    using namespace flashgpt2;
    attention_backward_flash_wgmma_check("attention_backward_heaviest_first", p.dqkv, p.dout, p.qkv, p.out, p.B, p.NH,
                                         p.HS);
    attention_backward_flash_wgmma_in<GridOrder::heaviest_first>(p.dqkv, static_cast<float*>(p.workspace), p.dout, p.qkv,
                                                                 p.out, p.lse, p.B, p.T, p.NH, p.HS, p.stream);
}
