// Rung 7 — Hopper: wgmma tensor cores fed by TMA, a producer warpgroup and consumer warpgroups that
// communicate through mbarriers, and the softmax of one tile overlapped with the matmuls of its neighbours.
//
// The idea (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608): on H100/H200, mma.sync (rungs 5–6)
// reaches only about two thirds of the tensor cores' peak; the full rate needs the asynchronous warpgroup
// instruction wgmma, whose operands come straight from shared memory. Then the rest of the kernel must keep
// up with it:
//   * §3.1 warp specialization. Warpgroup 0 is the producer: one thread issues TMA copies (whole Q_i, K_j,
//     V_j tiles per instruction, zero-filled past T, already in the swizzled layout wgmma reads) into a
//     ring of STAGES shared-memory slots. The NC consumer warpgroups each own 64 query rows of Q_i and only
//     compute. "full" mbarriers say a slot has landed, "empty" mbarriers that every consumer warp is done
//     with it. setmaxnreg moves registers from the producer (24) to the consumers (240 or 160).
//   * §3.2 intra-warpgroup overlap: in step j a consumer issues S_j = Q_i K_jᵀ and O += P_{j-1} V_{j-1} as
//     two asynchronous wgmma groups, waits only for S_j, and runs the softmax of S_j (the exps: MUFU, a unit
//     the tensor cores do not use) while P_{j-1} V_{j-1} is still in flight. Only then does it wait for the
//     P·V group, rescale O by exp(m_old − m_new) and turn S_j into P_j.
//   * P stays in registers as in rung 5: the S accumulator fragment is the A-operand fragment of the
//     register-sourced wgmma (per warp the same layout as mma.sync's), so P_j V_j needs no shared memory.
//     V is read "MN-major" (transposed by the descriptor) since its head-dim columns are contiguous.
//   * Persistent grid with a dynamic tile scheduler: one block per SM loops over (head, query-tile) work
//     items taken from an atomic counter, heaviest query tiles first within sections of heads whose K, V fit
//     in L2. Q has two slots like K and V: the producer loads the next item's Q_i and first K/V tiles while
//     the consumers are still finishing the current one (block start-up and epilogue latencies are hidden).
//   * Softmax scale folded into exp2 as in rung 5.
// What changed from rung 6: mma.sync + ldmatrix + cp.async issued by every warp → wgmma + TMA with one
// producer thread; synchronous per-step matmuls → two wgmma groups in flight with the softmax between them;
// one block per tile → persistent blocks. Not here (yet): ping-pong scheduling between the two consumer
// warpgroups (FA3 §3.1, named barriers) and an FP8 path.
//
// Measured: the "Measured" block of doc/attention/7_hopper_wgmma.md, written by `make bench-attention`.
// Command: ./dev/attention/runner fwd 7 64 12 1024 64   (tile choice: FLASHGPT2_R7_TILE=0 or 1, see below)
//
// Promoted to llmc/attention/wgmma_forward.cuh: the configuration, shared-memory layout, producer, scheduler and the
// two wgmma products live there, this rung's consumer loop is consumer_overlap in
// llmc/attention/wgmma_forward_consumers.cuh, and the PTX wrappers are llmc/ptx/hopper.cuh. The ladder runs that
// code (the trainer's BF16 forward runs it too, with rung 8's loop and q, k, v read in place from its qkv
// buffer); this file only adapts the ladder's interface to it. Tile choices: attention_forward_hopper().
#pragma once
#include <cstdlib>
#include "dev/attention/attention.cuh"
#include "llmc/attention/wgmma_forward.cuh"

namespace ladder::r7 {

// The promoted pieces under the names the ladder's Hopper files (rung 8, hopper_ptx_selftest.cu) use.
namespace hp = flashgpt2::hopper;
using flashgpt2::hopper::sm90a_available;
using flashgpt2::wgmma_attention::Cfg;
using flashgpt2::wgmma_attention::pv_gemm;
using flashgpt2::wgmma_attention::qk_gemm;
using flashgpt2::wgmma_attention::Smem;
using flashgpt2::wgmma_attention::to_p;

// The head sizes it is built for (whether this card runs sm_90a code is checked when it launches: a clear error
// elsewhere, so `runner --list` needs no GPU).
inline bool supports(int HS) { return HS == 64 || HS == 128; }

// The ladder's contiguous (B, NH, T, HS) tensors as the Hopper kernel's strided view. tile: -1 = by T.
inline flashgpt2::WgmmaAttentionParams hopper_params(const AttnFwdParams& p, int tile) {
    const flashgpt2::HeadStrides contiguous{(long long)p.NH * p.T * p.HS, (long long)p.T * p.HS, p.HS};
    flashgpt2::WgmmaAttentionParams h;
    h.q = static_cast<const __nv_bfloat16*>(p.q), h.k = static_cast<const __nv_bfloat16*>(p.k);
    h.v = static_cast<const __nv_bfloat16*>(p.v), h.in = contiguous;
    h.o = static_cast<__nv_bfloat16*>(p.o), h.out = contiguous, h.lse = p.lse;
    h.B = p.B, h.NH = p.NH, h.T = p.T, h.HS = p.HS, h.tile = tile, h.stream = p.stream;
    return h;
}

// Tile override for the tuning sweep: the environment variable `name` = 0 (2 consumer warpgroups, Br 128)
// or 1 (3 consumers, Br 192) forces the HS 64 tile; unset: the T-based default (Br 192 from T = 2048).
inline int tile_from_env(const char* name) {
    const char* e = std::getenv(name);
    return e && (e[0] == '0' || e[0] == '1') && !e[1] ? e[0] - '0' : -1;
}

}  // namespace ladder::r7

inline void attention_forward_hopper_wgmma(const AttnFwdParams& p) {
    static const int tile = ladder::r7::tile_from_env("FLASHGPT2_R7_TILE");
    flashgpt2::attention_forward_flash_wgmma<flashgpt2::HopperLoop::overlap>(ladder::r7::hopper_params(p, tile));
}
