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
// Measured (H200, bf16, causal): not measured yet.
// Command: ./dev/attention/runner fwd 5 64 12 1024 64
#pragma once
#include <cstdint>
#include "dev/attention/attention.cuh"
#include "llmc/common.cuh"

namespace ladder::r5 {

using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;

// ---- small PTX wrappers (rung 6 reuses them) ---------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8×8 bf16 matrices from shared memory; lane l gives the address of row (l % 8) of matrix l / 8,
// and receives row l / 4, columns 2(l % 4), 2(l % 4)+1 of each matrix (the mma fragment layout).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
// The same, each matrix transposed on the way: lane l receives column l / 4, rows 2(l % 4), 2(l % 4)+1.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

// D (16×8 fp32) += A (16×16 bf16, row-major fragment) · B (16×8 bf16, column-major fragment).
// Fragments (g = lane / 4, t = lane % 4): a = {(g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)},
// b = {(k 2t.., n g), (k 2t+8.., n g)}, d = {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats → one register of two bf16 (lo in the low half: the lower column index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// 2^x on the special-function unit (one MUFU.EX2; 2^-inf = +0).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// ---- the softmax pieces, on the accumulator fragment layout -------------------------------------------
// A tile of scores in accumulator layout: s[c][0..1] are row g, columns 8c+2t, 8c+2t+1; s[c][2..3] are row
// g+8, same columns. The four lanes of a quad (same g) together hold complete rows. mma.sync's m16n8 and
// Hopper wgmma's m64nN accumulators both have this per-warp layout, so rungs 6 and 7 reuse these.

// Causal mask: -inf where key > query. row_g: query index of row g; key0: key index of column 0.
template <int NC>
__device__ __forceinline__ void causal_mask(float (&s)[NC][4], int row_g, int key0, int lane) {
    const int col = key0 + 2 * (lane % 4);
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            if (col + 8 * c + (r & 1) > row_g + 8 * (r >> 1)) s[c][r] = -INFINITY;
}

// One step of the online softmax (Milakov & Gimelshein 2018; FlashAttention-2 Alg. 1, lines 8–10) for the
// thread's two rows. In: raw scores s, running max m (score units) and thread-partial sum l. Out: s holds
// P~ = exp(scale·(s − m_new)), computed as 2^(s·scale·log2e − m_new·scale·log2e); alpha = exp(scale·(m_old
// − m_new)) is the factor the caller applies to its O accumulator; l ← alpha·l + Σ P~ (this thread's part:
// the quad's four partial sums are added once, at the end, since alpha is the same for all four).
template <int NC>
__device__ __forceinline__ void online_softmax(float (&s)[NC][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                               float scale_log2) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int c = 0; c < NC; c++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[c][0], s[c][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[c][2], s[c][3]));
    }
    float neg_ms[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));  // the row's max over its quad
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        // A row with every score masked so far has max -inf: use 0 so that exps are 0, never inf - inf.
        const float m_use = mx[h] == -INFINITY ? 0.f : mx[h];
        alpha[h] = fast_exp2((m[h] - m_use) * scale_log2);  // first tile: m = -inf → alpha = 0
        m[h] = mx[h];
        neg_ms[h] = -m_use * scale_log2;
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            s[c][r] = fast_exp2(fmaf(s[c][r], scale_log2, neg_ms[r >> 1]));
            sum[r >> 1] += s[c][r];
        }
    l[0] = l[0] * alpha[0] + sum[0];
    l[1] = l[1] * alpha[1] + sum[1];
}

// O accumulator rows scaled by alpha (row g: [.][0..1], row g+8: [.][2..3]).
template <int NC>
__device__ __forceinline__ void scale_rows(float (&o)[NC][4], const float (&alpha)[2]) {
#pragma unroll
    for (int c = 0; c < NC; c++) {
        o[c][0] *= alpha[0]; o[c][1] *= alpha[0];
        o[c][2] *= alpha[1]; o[c][3] *= alpha[1];
    }
}

// P~ as the A operand of the P·V mma for keys 16kk..16kk+15: slices 2kk and 2kk+1 of the S fragment.
template <int NC>
__device__ __forceinline__ void p_fragment(uint32_t (&a)[4], const float (&s)[NC][4], int kk) {
    a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Epilogue for one warp's 16 rows: O / l → bf16, lse = m·scale + ln l (natural log). Rows ≥ T are skipped.
// o_head / lse_head point at the head's row 0; row_g is the query index of fragment row g.
template <int NC>
__device__ __forceinline__ void write_rows(const float (&o)[NC][4], float (&l)[2], const float (&m)[2], bf16* o_head,
                                           float* lse_head, int row_g, int T, int HS, float scale, int lane) {
    const int t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);  // the quad's partial sums: the row's full l
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        const int row = row_g + 8 * h;
        if (row >= T) continue;
        const float inv_l = 1.f / l[h];
        bf16* dst = o_head + (size_t)row * HS + 2 * t;
#pragma unroll
        for (int c = 0; c < NC; c++)
            *reinterpret_cast<__nv_bfloat162*>(dst + 8 * c) =
                __floats2bfloat162_rn(o[c][2 * h] * inv_l, o[c][2 * h + 1] * inv_l);
        if (t == 0) lse_head[row] = m[h] * scale + logf(l[h]);
    }
}

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
    const float scale_log2 = scale * kLog2e;

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
    static bool configured = false;  // opt in to > 48 KB of dynamic shared memory, once
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
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
