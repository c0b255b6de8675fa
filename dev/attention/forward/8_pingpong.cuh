// Rung 8 — ping-pong: rung 7's Hopper kernel with the consumer warpgroups taking turns at the tensor cores,
// item boundaries pipelined like ordinary steps, and a leaner softmax.
//
// Why (Nsight Compute on rung 7 at (64,12,1024,64), doc/attention/8_pingpong.md: the tensor pipe busy about a
// third of the time, few warps ready per scheduler, "latency issues"). At head size 64 the
// exponentials cost as much as the matmuls (one MUFU.EX2 per score at 16/clock/SM vs 256 tensor FLOPs per
// score at ~4096/clock/SM), so the kernel is fast only if one warpgroup's softmax runs while another's
// matmuls occupy the tensor cores. In rung 7 both consumers start every item together, so they tend to
// issue their matmuls together and then do their softmaxes together: tensor cores and MUFU idle in turn.
// Three changes, each a known technique:
//   1. Ping-pong (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608, §3.1 "pingpong scheduling"): the
//      consumers issue their wgmmas in strict round-robin order, enforced by named barriers (bar.sync /
//      bar.arrive, one per warpgroup). Warpgroup w waits for its turn, issues S_j = Q_i K_jᵀ and
//      O += P_{j-1} V_{j-1}, and hands the turn to warpgroup w+1; its softmax then runs while w+1's matmuls
//      run. Rung 7's intra-warpgroup overlap (§3.2) stays as it is inside each turn.
//   2. Item boundaries as ordinary steps: in rung 7 each work item began with a lone S_0 (nothing to overlap)
//      and ended with a lone P·V and the epilogue. Here the last P·V of item n and the first S of item n+1
//      are issued in ONE turn, the softmax of S_0 overlaps that P·V, and item n's epilogue (O / l, stores,
//      lse) is written while the other warpgroup has the tensor cores. At T = 1024 an item is only ~4.5
//      steps, so this removes about one un-overlapped step per item.
//   3. Fewer instructions on the softmax path: (a) the O rescale is skipped unless some row's max grew by
//      more than 2^8 in the exp2 domain (the conditional rescaling of FlashAttention's Blackwell kernels:
//      with a stale max m the exps are ≤ 2^8, harmless in fp32 and bf16, and O/l and lse = m·scale + ln l
//      stay exact because l and O use the same m); this removes 0.5 FMUL per score and the rescale from
//      the critical path between the P·V wait and the next turn. (b) row max and row sum as trees instead
//      of rung 5's 32-long serial chains (more independent instructions for the scheduler). (c) the causal
//      mask is decided per warp (16 rows), not per warpgroup (64 rows).
// Reused from rung 7 unchanged: the configuration and shared-memory layout, the producer (TMA + mbarriers
// + dynamic scheduler, heaviest tiles first in L2 sections), the two wgmma products, the tensor maps.
//
// Measured: the "Measured" block of doc/attention/8_pingpong.md, written by `make bench-attention`.
// Command: ./dev/attention/runner fwd 8 64 12 1024 64   (tile choice: FLASHGPT2_R8_TILE=0 or 1: 2 consumer
//          warpgroups, Br 128, or 3, Br 192, turns rotating among three; default 0 below T = 2048)
//
// Promoted to llmc/attention/wgmma_forward.cuh: this rung's consumer loop (Turns, softmax_step, the pipelined item
// boundaries) is consumer_pingpong in llmc/attention/wgmma_forward_consumers.cuh, and it is the trainer's BF16
// attention forward on an H100/H200 (kTrainerLoop in llmc/attention/wgmma_forward.cuh: the one line that would
// switch the trainer back to rung 7's loop). This file only adapts the ladder's interface to it.
#pragma once
#include "dev/attention/forward/7_hopper_wgmma.cuh"

namespace ladder::r8 {
inline bool supports(int HS) { return r7::supports(HS); }
}  // namespace ladder::r8

inline void attention_forward_pingpong(const AttnFwdParams& p) {
    static const int tile = ladder::r7::tile_from_env("FLASHGPT2_R8_TILE");
    flashgpt2::attention_forward_flash_wgmma<flashgpt2::HopperLoop::pingpong>(ladder::r7::hopper_params(p, tile));
}
