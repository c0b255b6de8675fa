// Backward rung 12 — the dQ kernel warp-specialized too: the forward's pipeline running the dQ pass.
//
// The idea: rung 6 made the dK/dV kernel warp-specialized (a TMA producer, two consumer warpgroups, a persistent
// grid) and kept rung 5's dQ kernel: one warpgroup of 64 queries a block, cp.async and a block barrier every
// step. At head size 128 that dQ kernel took as long as the dK/dV kernel (runner `bwd 12` times the two apart)
// for three tile products against four. The dQ pass is the forward with another middle: a block owns query rows,
// walks the key tiles, computes S = Q_i K_j^T and ends each step with a product against the keys' side (dQ_i +=
// dS K_j where the forward has O_i += P V_j). So this rung runs it on the forward's machinery (rung 8 of the
// forward ladder: a producer warp, two consumer warpgroups of 64 rows that take turns at the tensor cores, items
// heaviest first from a counter), with dP_j = dO_i V_j^T issued beside S_j, and dS = P∘(dP - D_i) in place of
// the online softmax (FlashAttention-2, Dao 2023, Alg. 2; FlashAttention-3, Shah et al. 2024, §3.1, for the
// warp specialization).
// What changed from rung 6: only the dQ kernel (llmc/attention/wgmma_backward_dq_ws.cuh); the dK/dV kernel is
// rung 6's, reading the lse·log2(e) and D rows this dQ kernel writes, as it read rung 5's.
// What is still slow: 0.91-0.94x cuDNN at head size 128. Two kernels run 7 tile products per (Q_i, K_j) pair where
// the FlashAttention count credits 5, so this pair is near its ceiling (the page counts it); an item's last dQ
// product is not overlapped with the next item's first.
// Measured: the "Measured" block of doc/attention/backward/12_dq_warp_specialized.md, written by `make bench-attention`.
// Command: ./dev/attention/runner bwd 12
#pragma once

#include "dev/attention/attention.cuh"
#include "llmc/attention/wgmma_backward_dq_ws.cuh"  // the dQ kernel
#include "llmc/attention/wgmma_backward_ws.cuh"     // rung 6's dK/dV kernel

namespace ladder::b12 {
inline bool supports(int HS) { return HS == 64 || HS == 128; }  // and an sm_90a device, as rung 5
inline size_t workspace_bytes(int B, int NH, int T, int) {
    return flashgpt2::attention_backward_d_floats(B, NH, T) * sizeof(float);
}
}  // namespace ladder::b12

inline void attention_backward_dq_warp_specialized(const AttnBwdParams& p) {
    using namespace flashgpt2;
    attention_backward_flash_wgmma_check("attention_backward_dq_warp_specialized", p.dqkv, p.dout, p.qkv, p.out, p.B,
                                         p.NH, p.HS);
    float* D = static_cast<float*>(p.workspace);
    attention_backward_flash_wgmma_dq_ws(p.dqkv, D, p.dout, p.qkv, p.out, p.lse, p.B, p.T, p.NH, p.HS, p.stream);
    attention_backward_flash_wgmma_dkdv_ws(p.dqkv, D, p.dout, p.qkv, p.B, p.T, p.NH, p.HS, p.stream);
}
