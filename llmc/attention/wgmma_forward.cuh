// The Hopper (H100/H200, sm_90a) flash attention forward, engine `wgmma`: the BF16 build's best forward for head
// sizes 64 and 128 there, promoted from the dev ladder (dev/attention/forward/7_hopper_wgmma.cuh and 8_pingpong.cuh
// explain every piece; read those first). In short (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608):
//   * wgmma tensor cores (operands from shared memory, or P from registers), fed by TMA copies in the
//     128-byte swizzled layout; llmc/ptx/hopper.cuh wraps each instruction.
//   * warp specialization: warpgroup 0 is the producer (one thread issues every TMA copy into a ring of
//     K/V slots and two Q slots), the NC consumer warpgroups own 64 query rows of Q_i each and only compute;
//     "full"/"empty" mbarriers pass the slots back and forth; setmaxnreg moves registers to the consumers.
//   * in each step a consumer issues S_j = Q_i K_jᵀ and O += P_{j-1} V_{j-1} as two asynchronous groups and
//     runs the softmax of S_j while the P·V group is still on the tensor cores.
//   * persistent blocks take (head, query tile) work items from an atomic counter, heaviest first within
//     sections of heads whose K, V fit in L2.
// Two consumer loops (wgmma_forward_consumers.cuh; the rest, wgmma_forward_pipeline.cuh, is shared): `overlap` is
// rung 7's; `pingpong` is rung 8's (the consumer warpgroups take turns at the tensor cores through named barriers,
// item boundaries are pipelined, the O rescale is conditional). kTrainerLoop below is the ONE line that picks the
// trainer's.
//
// Layouts: Q, K, V, O are (B, NH, T, HS) tensors with any element strides for batch, head and token (HS
// contiguous), so the same kernel reads the ladder's contiguous heads and the trainer's q, k, v straight
// out of its (B, T, 3, NH, HS) qkv buffer, and writes O as (B, T, NH, HS). lse (B, NH, T), fp32, natural
// log of Σ_j exp(S_ij / sqrt(HS)): what every flash backward rebuilds P from.
// Launch rule: no allocation, no synchronization (the tensor maps are encoded on the host per call, a
// cheap host computation; the work counter resets itself at the end of each launch). Two launches must not
// run concurrently (on two streams): they would share the counter.
#pragma once
#include <algorithm>
#include <cmath>

#include "llmc/attention/wgmma_forward_consumers.cuh"
#include "llmc/attention/wgmma_forward_pipeline.cuh"
#include "llmc/common.cuh"
#include "llmc/error.h"
#include "llmc/ptx/hopper.cuh"

namespace flashgpt2 {

// Which consumer loop a launch uses: rung 7's (two wgmma groups overlapped with the softmax inside each
// warpgroup) or rung 8's (additionally, warpgroups take turns at the tensor cores).
enum class HopperLoop { overlap, pingpong };
// The trainer's choice, made from dev/attention/runner's measurements of rungs 7 and 8:
constexpr HopperLoop kTrainerLoop = HopperLoop::pingpong;

namespace wgmma_attention {

// The kernel body: barriers set up, then warpgroup 0 produces and the others consume with loop L.
template <class C, HopperLoop L>
__device__ __forceinline__ void forward_body(const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                             const CUtensorMap* tm_v, const Problem& pr) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = hp::smem_u32(smem_raw);
    const Smem<C> sm{(raw + 1023) & ~1023u};
    volatile int* tile_slot = reinterpret_cast<volatile int*>(smem_raw + (sm.base - raw) + C::TILE_OFF);
    if (threadIdx.x == 0) init_barriers(sm);
    __syncthreads();  // the barriers are initialized before any thread waits on or arrives at them
    if (threadIdx.x < 128) producer<C>(tm_q, tm_k, tm_v, sm, tile_slot, pr);
    else if constexpr (L == HopperLoop::pingpong) consumer_pingpong<C>(sm, tile_slot, pr);
    else consumer_overlap<C>(sm, tile_slot, pr);
#else
    (void)tm_q, (void)tm_k, (void)tm_v, (void)pr;  // no sm_90a code: launches are refused on the host
#endif
}

// Two kernels, one per loop, so profilers and SASS dumps tell them apart by name.
template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
attention_forward_flash_wgmma_overlap_kernel(const __grid_constant__ CUtensorMap tm_q,
                                        const __grid_constant__ CUtensorMap tm_k,
                                        const __grid_constant__ CUtensorMap tm_v, const Problem pr) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    forward_body<C, HopperLoop::overlap>(&tm_q, &tm_k, &tm_v, pr);
}
template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
attention_forward_flash_wgmma_pingpong_kernel(const __grid_constant__ CUtensorMap tm_q,
                                         const __grid_constant__ CUtensorMap tm_k,
                                         const __grid_constant__ CUtensorMap tm_v, const Problem pr) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    forward_body<C, HopperLoop::pingpong>(&tm_q, &tm_k, &tm_v, pr);
}

template <class C, HopperLoop L>
void launch(const WgmmaAttentionParams& p) {
    void (*kernel)(CUtensorMap, CUtensorMap, CUtensorMap, Problem) = nullptr;
    if constexpr (L == HopperLoop::pingpong) kernel = attention_forward_flash_wgmma_pingpong_kernel<C>;
    else kernel = attention_forward_flash_wgmma_overlap_kernel<C>;  // (only the chosen loop is instantiated)
    const int num_sms = sm_count();
    allow_shared_memory(kernel, C::SMEM);
    const int BH = p.B * p.NH, total = ceil_div(p.T, C::BR) * BH;
    const HeadStrides& s = p.in;
    const CUtensorMap mq = hp::make_strided_head_map(p.q, p.B, p.NH, p.T, p.HS, s.b, s.h, s.t, C::BR);
    const CUtensorMap mk = hp::make_strided_head_map(p.k, p.B, p.NH, p.T, p.HS, s.b, s.h, s.t, C::BC);
    const CUtensorMap mv = hp::make_strided_head_map(p.v, p.B, p.NH, p.T, p.HS, s.b, s.h, s.t, C::BC);
    const int section_heads = l2_section_heads(p.T, p.HS);  // heads whose K and V fit in L2 together
    const Problem pr{p.o, p.out.b, p.out.h, p.out.t, p.lse, p.T, p.NH, BH, section_heads, 1.0f / sqrtf((float)p.HS)};
    launch_dependent(kernel, std::min(total, num_sms), C::THREADS, C::SMEM, p.stream, mq, mk, mv, pr);
}

}  // namespace wgmma_attention

// Can this engine's forward run here: an sm_90a build on an sm_90 device, and head size 64 or 128? (The device
// check runs once per process.)
inline bool attention_forward_flash_wgmma_supports(int HS) { return (HS == 64 || HS == 128) && hopper::sm90a_available(); }

// Causal attention forward on Hopper with consumer loop L. Tile choices: HS 64: 2 consumer warpgroups (Br
// 128) below T = 2048, 3 (Br 192, FlashAttention-3's hdim-64 shape) from there on (measured split, rung 7;
// p.tile forces one); both Bc 128, 3 stages. HS 128: 2 consumers, Bc 128, 2 stages (S, P and O of 64 rows
// need ~200 registers: no room for 3). Launches only: no allocation, no synchronization.
template <HopperLoop L = kTrainerLoop>
void attention_forward_flash_wgmma(const WgmmaAttentionParams& p) {
    namespace ha = wgmma_attention;
    if (!attention_forward_flash_wgmma_supports(p.HS))
        fail("attention_forward_flash_wgmma: needs an sm_90a build on an H100/H200 and head size 64 or 128 (HS = %d)",
             p.HS);
    if (p.T <= 0 || p.B <= 0 || p.NH <= 0)
        fail("attention_forward_flash_wgmma: empty problem (B %d, NH %d, T %d)", p.B, p.NH, p.T);
    if (p.HS == 64) {
        if (p.tile == 1 || (p.tile < 0 && p.T >= 2048)) ha::launch<ha::Cfg<64, 3, 128, 3>, L>(p);
        else ha::launch<ha::Cfg<64, 2, 128, 3>, L>(p);
    } else {
        ha::launch<ha::Cfg<128, 2, 128, 2>, L>(p);
    }
}

}  // namespace flashgpt2
