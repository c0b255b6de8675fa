// Rung 5 — tensor cores: the FlashAttention-2 loop of rung 4, with both matmuls on bf16 tensor cores.
//
// The idea (Dao 2023, FlashAttention-2, arXiv:2307.08691, §3.1–3.3): the same online-softmax loop over
// key/value tiles K_j, V_j as rung 4, but S = Q_i K_jᵀ and O += P V_j are computed by the warp-wide
// tensor-core instruction mma.sync.m16n8k16 (bf16 inputs, fp32 accumulators). One warp owns 16 query
// rows and the whole head dimension, so the row statistics m, l never leave the warp. Three things make
// it a tensor-core kernel rather than a scalar one:
//   * ldmatrix: one instruction loads a 16×16 bf16 tile from shared memory straight into the register
//     fragment layout mma expects (and with .trans, the transposed layout V needs).
//   * P stays in registers: the fp32 accumulator fragment of S (thread holds rows g, g+8 and columns
//     2t, 2t+1 of every 8-column slice) has exactly the shape of the A-operand fragment of the next mma,
//     so P is converted to bf16 in place and fed to P V_j with no shared-memory round trip.
//   * exp2 with the scale folded in: p = 2^(s·scale·log2e − m·scale·log2e) is one FFMA + one MUFU.EX2.
// What changed from rung 4: fp32 CUDA-core dot products → bf16 mma.sync; Q_i lives in registers for the
// whole loop; rows of shared memory are padded by 16 bytes so ldmatrix reads are bank-conflict free
// (rung 6 replaces the padding by an XOR swizzle and overlaps the loads with cp.async).
// Tiles: Br = 64 query rows (4 warps × 16), Bc = 64 keys; K_j, V_j are loaded synchronously each step.
// Query tiles run heaviest first (the last tile of a causal head sees the most keys).
//
// Measured: the "Measured" block of doc/attention/5_tensor_cores.md, written by `make bench-attention`.
// Command: ./dev/attention/runner fwd 5 64 12 1024 64
#pragma once
#include <cstdint>
#include "dev/attention/attention.cuh"
#include "llmc/attention/fragment.cuh"
#include "llmc/common.cuh"
#include "llmc/ptx/mma_sync.cuh"

namespace ladder::r5 {

using bf16 = __nv_bfloat16;

// ---- small PTX wrappers (rung 6 reuses them) ---------------------------------------------------------
// smem_u32 (a shared-memory address as the 32-bit value PTX wants) and ldmatrix_x4 / ldmatrix_x4_trans live in
// llmc/ptx/mma_sync.cuh, shared with the trainer's backward. ldmatrix_x4: four 8×8 bf16 matrices from shared
// memory; lane l gives the address of row (l % 8) of matrix l / 8 and receives row l / 4, columns 2(l % 4),
// 2(l % 4)+1 of each matrix (the mma fragment layout). The .trans form hands lane l column l / 4 instead.
using flashgpt2::mma::ldmatrix_x4;
using flashgpt2::mma::ldmatrix_x4_trans;
using flashgpt2::mma::smem_u32;

// D (16×8 fp32) += A (16×16 bf16, row-major fragment) · B (16×8 bf16, column-major fragment).
// Fragments (g = lane / 4, t = lane % 4): a = {(g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)},
// b = {(k 2t.., n g), (k 2t+8.., n g)}, d = {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- the softmax pieces, on the accumulator fragment layout -------------------------------------------
// causal_mask, online_softmax, scale_rows, p_fragment (P~ straight into the next mma's A operand) and
// write_rows (O / l, lse) live in llmc/attention/fragment.cuh: the trainer's Hopper kernel uses them too.
// Read them there; they work on the accumulator layout described in the comment on mma_bf16_16816 above.
using flashgpt2::frag::causal_mask;
using flashgpt2::frag::fast_exp2;
using flashgpt2::LOG2E;
using flashgpt2::frag::online_softmax;
using flashgpt2::frag::p_fragment;
using flashgpt2::frag::pack_bf16;
using flashgpt2::frag::scale_rows;
using flashgpt2::frag::write_rows;

// ---- the kernel ---------------------------------------------------------------------------------------
// ROWS×HS bf16 tile from a head (rows from row0; rows ≥ T become zeros) into padded shared memory
// (row stride HS + 8 elements: consecutive rows start 16 bytes apart in the bank cycle, so the 8 row
// addresses of one ldmatrix matrix fall in 8 different 16-byte bank groups).
template <int ROWS, int HS, int NTHREADS>
__device__ __forceinline__ void load_tile_padded(bf16* smem, const bf16* head, int row0, int T) {
    constexpr int CHUNKS = HS / 8;  // 16-byte chunks per row
    for (int x = threadIdx.x; x < ROWS * CHUNKS; x += NTHREADS) {
        const int r = x / CHUNKS, c = x % CHUNKS;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row0 + r < T) v = *reinterpret_cast<const uint4*>(head + (size_t)(row0 + r) * HS + 8 * c);
        *reinterpret_cast<uint4*>(smem + r * (HS + 8) + 8 * c) = v;
    }
}

template <int HS, int NWARPS, int BC>
__global__ void __launch_bounds__(NWARPS * 32)
attention_forward_tc_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                            bf16* __restrict__ o, float* __restrict__ lse, int T, float scale) {
    constexpr int BR = 16 * NWARPS, LD = HS + 8, NTHREADS = NWARPS * 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* Qs = reinterpret_cast<bf16*>(smem_raw);  // (Br, HS + 8)   Q_i
    bf16* Ks = Qs + BR * LD;                        // (Bc, HS + 8)   K_j
    bf16* Vs = Ks + BC * LD;                        // (Bc, HS + 8)   V_j

    const int i = gridDim.x - 1 - blockIdx.x;  // query tile: heaviest (most keys) first
    const int bh = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t head = head_offset(bh, T, HS);
    const int q0 = i * BR;                              // first query row of this block
    const int row_g = q0 + 16 * warp + lane / 4;        // query row of this thread's fragment row g
    const float scale_log2 = scale * LOG2E;

    load_tile_padded<BR, HS, NTHREADS>(Qs, q + head, q0, T);
    __syncthreads();  // Q_i is in shared memory for every warp
    uint32_t qf[HS / 16][4];  // this warp's 16 rows of Q_i as mma A fragments, one per 16 columns
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++)
        ldmatrix_x4(qf[kk], smem_u32(Qs + (16 * warp + lane % 16) * LD + 16 * kk + 8 * (lane / 16)));

    float oacc[HS / 8][4] = {};  // (16, HS) slab of O_i, accumulator layout
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int n_tiles = ceil_div(min(q0 + BR, T), BC);  // key tiles holding a key ≤ the last valid query
    for (int j = 0; j < n_tiles; j++) {
        __syncthreads();  // every warp is done reading K_{j-1}, V_{j-1} (and Q_i's tile) before we overwrite
        load_tile_padded<BC, HS, NTHREADS>(Ks, k + head, j * BC, T);
        load_tile_padded<BC, HS, NTHREADS>(Vs, v + head, j * BC, T);
        __syncthreads();  // K_j, V_j are in shared memory for every warp

        // S = Q_i K_jᵀ for this warp's 16 rows: B[k][n] = K_j[n][k], so K_j's rows load without transpose.
        float s[BC / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++)
#pragma unroll
            for (int nn = 0; nn < BC / 16; nn++) {
                uint32_t b[4];  // b[0], b[1]: keys 16nn..+7;  b[2], b[3]: keys 16nn+8..+15
                ldmatrix_x4(b, smem_u32(Ks + (16 * nn + lane % 8 + 8 * (lane / 16)) * LD + 16 * kk +
                                        8 * ((lane / 8) % 2)));
                mma_bf16_16816(s[2 * nn], qf[kk], b[0], b[1]);
                mma_bf16_16816(s[2 * nn + 1], qf[kk], b[2], b[3]);
            }
        // Only tiles reaching past this warp's first row need the mask (the diagonal, and partial T).
        if (j * BC + BC - 1 > q0 + 16 * warp) causal_mask(s, row_g, j * BC, lane);

        float alpha[2];
        online_softmax(s, m, l, alpha, scale_log2);
        scale_rows(oacc, alpha);

        // O += P~ V_j: P~ straight from registers; B[k][n] = V_j[k][n] is column access → ldmatrix.trans.
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t a[4];
            p_fragment(a, s, kk);
#pragma unroll
            for (int nn = 0; nn < HS / 16; nn++) {
                uint32_t b[4];  // b[0], b[1]: columns 16nn..+7;  b[2], b[3]: columns 16nn+8..+15
                ldmatrix_x4_trans(b, smem_u32(Vs + (16 * kk + lane % 16) * LD + 16 * nn + 8 * (lane / 16)));
                mma_bf16_16816(oacc[2 * nn], a, b[0], b[1]);
                mma_bf16_16816(oacc[2 * nn + 1], a, b[2], b[3]);
            }
        }
    }
    write_rows(oacc, l, m, o + head, lse + (size_t)bh * T, row_g, T, HS, scale, lane);
}

template <int HS>
void launch(const AttnFwdParams& p) {
    constexpr int NWARPS = 4, BR = 16 * NWARPS, BC = 64;
    constexpr size_t smem = (size_t)(BR + 2 * BC) * (HS + 8) * sizeof(bf16);  // 27.6 KB (HS 64), 52 KB (128)
    auto kernel = attention_forward_tc_kernel<HS, NWARPS, BC>;
    allow_shared_memory(kernel, smem);
    const dim3 grid(ceil_div(p.T, BR), p.B * p.NH);
    kernel<<<grid, NWARPS * 32, smem, p.stream>>>(
        static_cast<const bf16*>(p.q), static_cast<const bf16*>(p.k), static_cast<const bf16*>(p.v),
        static_cast<bf16*>(p.o), p.lse, p.T, 1.0f / sqrtf((float)p.HS));
    cudaCheckLaunch();
}

inline bool supports(int HS) { return HS == 64 || HS == 128; }

}  // namespace ladder::r5

inline void attention_forward_tensor_cores(const AttnFwdParams& p) {
    if (p.HS == 64) ladder::r5::launch<64>(p);
    else if (p.HS == 128) ladder::r5::launch<128>(p);
    else flashgpt2::fail("attention_forward_tensor_cores: head size %d not supported (64, 128)", p.HS);
}
