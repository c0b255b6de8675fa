// LayerNorm over the channels of each row: out = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + 1e-5).
// mean and rstd (fp32, one per row) are saved for the backward.
//
// naive: the textbook passes, each its own kernel reading the row from HBM again: mean (a thread per row),
//        variance (a thread per row), normalize (a thread per element). The backward likewise: row sums,
//        then dinp, then dw/db with a thread per column looping over every row.
// flash: one warp per row, the row read from HBM once into shared memory; mean, variance and the output
//        come from there. residual_layernorm_forward_flash also fuses the residual add before it: the
//        sum is written out (the residual stream) and normalized in the same pass. The backward is one
//        kernel too: each warp reads its row (by cp.async into shared memory, the next row's copies in
//        flight while this one computes), writes dinp, and accumulates dw, db and the column sums of dinp
//        (a bias gradient, when asked for) per block; a small second kernel sums the per-block partials in a
//        fixed order (deterministic, no atomics).
//
// Shared-memory layout of a warp's row cache (and of the backward's accumulators): the X128 floats of the lane's
// it-th 16-byte chunk are X128/4 float4s, the q-th at float4 index (it*X128/4 + q)*32 + lane. A warp's 32 lanes
// move 32 consecutive float4s with one instruction each (512 bytes: the minimum 4 wavefronts, no conflicts), a
// quarter of the instructions of 4-byte slots.
#pragma once
#include "llmc/error.h"
#include "llmc/kernel_common.cuh"
#include "llmc/ptx/mma_sync.cuh"  // cp.async: the backward's next row

namespace flashgpt2 {

constexpr float LN_EPS = 1e-5f;

// ---------------------------------------------------------------------------------------------------------
// naive

static __global__ void layernorm_mean_naive_kernel(float* mean, const floatX* inp, int N, int C) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;  // one row per thread
    if (n >= N) return;
    const floatX* x = inp + (size_t)n * C;
    float s = 0.0f;
    for (int c = 0; c < C; c++) s += to_float(x[c]);
    mean[n] = s / C;
}

static __global__ void layernorm_rstd_naive_kernel(float* rstd, const float* mean, const floatX* inp, int N, int C) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;  // one row per thread, reading the row again
    if (n >= N) return;
    const floatX* x = inp + (size_t)n * C;
    float m = mean[n], v = 0.0f;
    for (int c = 0; c < C; c++) {
        float d = to_float(x[c]) - m;
        v += d * d;
    }
    rstd[n] = 1.0f / sqrtf(v / C + LN_EPS);
}

static __global__ void layernorm_normalize_naive_kernel(floatX* out, const float* mean, const float* rstd, const floatX* inp,
                                                 const floatX* w, const floatX* b, int N, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // one element per thread, reading it a third time
    if (idx >= (size_t)N * C) return;
    int n = (int)(idx / C), c = (int)(idx % C);
    float norm = (to_float(inp[idx]) - mean[n]) * rstd[n];
    out[idx] = from_float<floatX>(norm * to_float(w[c]) + to_float(b[c]));
}

inline void layernorm_forward_naive(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* w,
                                    const floatX* b, int N, int C, cudaStream_t stream) {
    layernorm_mean_naive_kernel<<<ceil_div(N, 256), 256, 0, stream>>>(mean, inp, N, C);
    cudaCheckLaunch();
    layernorm_rstd_naive_kernel<<<ceil_div(N, 256), 256, 0, stream>>>(rstd, mean, inp, N, C);
    cudaCheckLaunch();
    layernorm_normalize_naive_kernel<<<grid_for((size_t)N * C, 256), 256, 0, stream>>>(out, mean, rstd, inp, w, b, N, C);
    cudaCheckLaunch();
}

// Backward, pass 1: per row, the two means the dinp formula needs.
//   dnorm = dout * w;  m1 = mean(dnorm);  m2 = mean(dnorm * norm)
static __global__ void layernorm_backward_rowsums_naive_kernel(float* m1, float* m2, const floatX* dout, const floatX* inp,
                                                        const floatX* w, const float* mean, const float* rstd, int N,
                                                        int C) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float s1 = 0.0f, s2 = 0.0f;
    for (int c = 0; c < C; c++) {
        size_t i = (size_t)n * C + c;
        float norm = (to_float(inp[i]) - mean[n]) * rstd[n];
        float dnorm = to_float(dout[i]) * to_float(w[c]);
        s1 += dnorm;
        s2 += dnorm * norm;
    }
    m1[n] = s1 / C;
    m2[n] = s2 / C;
}

// Backward, pass 2: dinp += (dnorm - m1 - norm * m2) * rstd, one element per thread.
static __global__ void layernorm_backward_dinp_naive_kernel(floatX* dinp, const float* m1, const float* m2,
                                                     const floatX* dout, const floatX* inp, const floatX* w,
                                                     const float* mean, const float* rstd, int N, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    int n = (int)(idx / C), c = (int)(idx % C);
    float norm = (to_float(inp[idx]) - mean[n]) * rstd[n];
    float dnorm = to_float(dout[idx]) * to_float(w[c]);
    dinp[idx] = from_float<floatX>(to_float(dinp[idx]) + (dnorm - m1[n] - norm * m2[n]) * rstd[n]);
}

// Backward, pass 3: dw[c] += sum_n dout*norm, db[c] += sum_n dout, one column per thread.
static __global__ void layernorm_backward_dwdb_naive_kernel(floatX* dw, floatX* db, const floatX* dout, const floatX* inp,
                                                     const float* mean, const float* rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int n = 0; n < N; n++) {
        size_t i = (size_t)n * C + c;
        float g = to_float(dout[i]);
        sw += g * (to_float(inp[i]) - mean[n]) * rstd[n];
        sb += g;
    }
    dw[c] = from_float<floatX>(to_float(dw[c]) + sw);
    db[c] = from_float<floatX>(to_float(db[c]) + sb);
}

inline void layernorm_backward_naive(floatX* dinp, floatX* dw, floatX* db, floatX* dsum, void* ws,
                                     const floatX* dout, const floatX* inp, const floatX* w, const float* mean,
                                     const float* rstd, int N, int C, cudaStream_t stream) {
    WorkspaceCarver carve(ws);
    float* m1 = carve.take<float>(N);  // (N) mean(dnorm)
    float* m2 = carve.take<float>(N);  // (N) mean(dnorm * norm)
    layernorm_backward_rowsums_naive_kernel<<<ceil_div(N, 256), 256, 0, stream>>>(m1, m2, dout, inp, w, mean, rstd, N, C);
    cudaCheckLaunch();
    layernorm_backward_dinp_naive_kernel<<<grid_for((size_t)N * C, 256), 256, 0, stream>>>(dinp, m1, m2, dout, inp, w,
                                                                                          mean, rstd, N, C);
    cudaCheckLaunch();
    layernorm_backward_dwdb_naive_kernel<<<ceil_div(C, 256), 256, 0, stream>>>(dw, db, dout, inp, mean, rstd, N, C);
    cudaCheckLaunch();
    if (dsum) colsum_naive(dsum, dinp, N, C, stream);  // pass 4: dsum += the column sums of the finished dinp
}

// ---------------------------------------------------------------------------------------------------------
// flash

constexpr int LN_WARPS = 4;              // forward: rows per block (one warp each)
constexpr int LN_BWD_WARPS = 8;          // backward: warps per block, each taking a row at a time
constexpr int LN_BWD_MAX_BLOCKS = 384;   // backward grid: rows are strided over at most this many blocks (one wave
                                         // of 3 per SM on a 132-SM H100/H200), and never more than one wave (2 per
                                         // SM when the row is held in registers)

// Floats one warp's row cache needs: C rounded up to whole 32-lane x 16-byte sweeps.
__host__ __device__ inline int ln_row_slots(int C) { return ceil_div(C, 32 * X128) * 32 * X128; }
static_assert(X128 % 4 == 0, "a 16-byte chunk of floatX is a whole number of float4s");
__device__ __forceinline__ int ln_quad(int it, int q, int lane) { return (it * (X128 / 4) + q) * 32 + lane; }
__device__ __forceinline__ int ln_slot(int it, int e, int lane) { return ln_quad(it, e / 4, lane) * 4 + e % 4; }
// The float4 that holds elements 4q..4q+3 of the lane's it-th chunk, in a row cache or accumulator at `a`.
__device__ __forceinline__ float4& ln_quad_ref(float* a, int it, int q, int lane) {
    return reinterpret_cast<float4*>(a)[ln_quad(it, q, lane)];
}

constexpr size_t LN_MAX_SMEM = 227 * 1024;  // shared memory one block may take (sm_80 on)

inline void ln_check(const char* who, int C, size_t smem) {
    if (C % X128 != 0) fail("%s: channels %d must be a multiple of %d", who, C, X128);
    if (smem > LN_MAX_SMEM) fail("%s: channels %d need %zu bytes of shared memory (limit 227 KiB)", who, C, smem);
}

// RESIDUAL: x = inp1 + inp2 is written to residual_out and normalized; else x = inp1.
template <bool RESIDUAL>
__global__ void __launch_bounds__(LN_WARPS * 32)
    layernorm_forward_flash_kernel(floatX* residual_out, floatX* out, float* mean, float* rstd, const floatX* inp1,
                                   const floatX* inp2, const floatX* w, const floatX* b, int N, int C) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    extern __shared__ float smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n = blockIdx.x * LN_WARPS + warp;
    if (n >= N) return;  // whole warp leaves together; the kernel has no block-wide barrier
    float* x = smem + (size_t)warp * ln_row_slots(C);  // this warp's row, in lane-private slots
    const size_t row = (size_t)n * C;
    const int sweeps = ceil_div(C, 32 * X128);

    // The one read of the row from HBM.
    float sum = 0.0f;
    for (int it = 0; it < sweeps; it++) {
        int c = (it * 32 + lane) * X128;
        if (c >= C) break;
        Packed128<floatX> a = load128(inp1 + row + c);
        if (RESIDUAL) {
            Packed128<floatX> bb = load128(inp2 + row + c);
            for (int e = 0; e < X128; e++) a[e] = from_float<floatX>(to_float(a[e]) + to_float(bb[e]));
            store128(residual_out + row + c, a);  // the residual stream, rounded as stored
        }
        for (int q = 0; q < X128 / 4; q++) {
            const float4 v = make_float4(to_float(a[4 * q]), to_float(a[4 * q + 1]), to_float(a[4 * q + 2]), to_float(a[4 * q + 3]));
            ln_quad_ref(x, it, q, lane) = v;
            sum += v.x, sum += v.y, sum += v.z, sum += v.w;  // the elements' order, one at a time
        }
    }
    const float m = warp_sum(sum) / C;
    float var = 0.0f;  // two-pass variance, from shared memory: exact and free of cancellation
    for (int it = 0; it < sweeps; it++) {
        if ((it * 32 + lane) * X128 >= C) break;
        for (int q = 0; q < X128 / 4; q++) {
            const float4 v = ln_quad_ref(x, it, q, lane);
            const float d[4] = {v.x - m, v.y - m, v.z - m, v.w - m};
            for (int k = 0; k < 4; k++) var += d[k] * d[k];
        }
    }
    const float s = rsqrtf(warp_sum(var) / C + LN_EPS);
    for (int it = 0; it < sweeps; it++) {
        int c = (it * 32 + lane) * X128;
        if (c >= C) break;
        Packed128<floatX> wv = load128(w + c), bv = load128(b + c), o;
        for (int q = 0; q < X128 / 4; q++) {
            const float4 v = ln_quad_ref(x, it, q, lane);
            const float f[4] = {v.x, v.y, v.z, v.w};
            for (int k = 0; k < 4; k++) {
                const int e = 4 * q + k;
                o[e] = from_float<floatX>((f[k] - m) * s * to_float(wv[e]) + to_float(bv[e]));
            }
        }
        store128(out + row + c, o);
    }
    if (lane == 0) { mean[n] = m; rstd[n] = s; }
}

template <bool RESIDUAL>
inline void layernorm_forward_flash_launch(floatX* residual_out, floatX* out, float* mean, float* rstd,
                                           const floatX* inp1, const floatX* inp2, const floatX* w, const floatX* b,
                                           int N, int C, cudaStream_t stream) {
    const size_t smem = (size_t)LN_WARPS * ln_row_slots(C) * sizeof(float);
    ln_check("layernorm_forward_flash", C, smem);
    if (!aligned16(out) || !aligned16(inp1) || !aligned16(w) || !aligned16(b) ||
        (RESIDUAL && (!aligned16(inp2) || !aligned16(residual_out))))
        fail("layernorm_forward_flash: buffers must be 16-byte aligned");
    auto kernel = layernorm_forward_flash_kernel<RESIDUAL>;
    allow_shared_memory(kernel, smem);
    launch_dependent(kernel, ceil_div(N, LN_WARPS), LN_WARPS * 32, smem, stream,
        residual_out, out, mean, rstd, inp1, inp2, w, b, N, C);
}

inline void layernorm_forward_flash(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* w,
                                    const floatX* b, int N, int C, cudaStream_t stream) {
    layernorm_forward_flash_launch<false>(nullptr, out, mean, rstd, inp, nullptr, w, b, N, C, stream);
}

// residual_out = inp1 + inp2 and out = layernorm(residual_out), in one pass over HBM.
inline void residual_layernorm_forward_flash(floatX* residual_out, floatX* out, float* mean, float* rstd,
                                             const floatX* inp1, const floatX* inp2, const floatX* w, const floatX* b,
                                             int N, int C, cudaStream_t stream) {
    layernorm_forward_flash_launch<true>(residual_out, out, mean, rstd, inp1, inp2, w, b, N, C, stream);
}

// The backward's shared memory: acc_ds, acc_dw, acc_db for each warp of a block (C <= 2304 fit in 227 KiB); rows
// of up to LN_BWD_RS sweeps also two row buffers per warp, over acc_dw and acc_db and past them.
constexpr int LN_BWD_RS = 3;                                // rows of up to 3 sweeps: C <= 768 (BF16), 384 (FP32)
constexpr int LN_BWD_ROW_CHUNKS = 2 * 3 * LN_BWD_RS * 32;   // a warp's two buffers of dout, inp, dinp, 16 B chunks
inline size_t layernorm_backward_flash_smem(int C) {
    const size_t region = (size_t)LN_BWD_WARPS * ln_row_slots(C) * sizeof(float);  // one accumulator per warp
    if (ceil_div(C, 32 * X128) > LN_BWD_RS) return 3 * region;
    return region + std::max(2 * region, (size_t)LN_BWD_WARPS * LN_BWD_ROW_CHUNKS * 16);
}

inline int ln_bwd_blocks(int N) { return std::min(LN_BWD_MAX_BLOCKS, ceil_div(N, LN_BWD_WARPS)); }
// The grid a launch takes: ln_bwd_blocks(N), cut to one wave, the blocks an SM holds at this C (the occupancy
// calculator, after the shared-memory opt-in) times the SMs. Wider rows hold fewer blocks per SM (two at C =
// 1024), and a grid of 1.45 waves left most SMs idle for its last 0.45 (doc/kernels.md). The rows' order in each
// block's sums depends on the grid, so the bits are those of this GPU's SM count.
template <class Kernel>
inline int ln_bwd_grid(Kernel kernel, int N, size_t smem) {
    int per_sm = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, LN_BWD_WARPS * 32, smem));
    return std::max(1, std::min(ln_bwd_blocks(N), per_sm * sm_count()));
}

inline size_t layernorm_backward_workspace_bytes(Variant v, int N, int C) {
    if (v == Variant::naive) return 2 * ws_round((size_t)N * sizeof(float));
    return 3 * ws_round((size_t)ln_bwd_blocks(N) * C * sizeof(float));
}

// A warp's column accumulators for the X128 columns of one 16-byte chunk (chunk it of this lane), moved between
// registers and the shared-memory layout above.
__device__ __forceinline__ void ln_acc_load(float (&a)[X128], float* acc, int it, int lane) {
    for (int q = 0; q < X128 / 4; q++) {
        const float4 v = ln_quad_ref(acc, it, q, lane);
        a[4 * q] = v.x, a[4 * q + 1] = v.y, a[4 * q + 2] = v.z, a[4 * q + 3] = v.w;
    }
}
__device__ __forceinline__ void ln_acc_store(float* acc, int it, int lane, const float (&a)[X128]) {
    for (int q = 0; q < X128 / 4; q++) ln_quad_ref(acc, it, q, lane) = make_float4(a[4 * q], a[4 * q + 1], a[4 * q + 2], a[4 * q + 3]);
}

// The arithmetic of one 16-byte chunk of a row: pass 1 adds dout*norm and dout into the chunk's dw and db
// accumulators and the row sums s1 = sum of dnorm, s2 = sum of dnorm*norm; pass 2, once s1 and s2 are known,
// adds the row's dinp into d and the result into the chunk's column sums of dinp (ds).
__device__ __forceinline__ void ln_bwd_sums(const Packed128<floatX>& g, const Packed128<floatX>& xv,
                                            const Packed128<floatX>& wv, float m, float s, float (&dw)[X128],
                                            float (&db)[X128], float& s1, float& s2) {
    for (int e = 0; e < X128; e++) {
        const float norm = (to_float(xv[e]) - m) * s, gf = to_float(g[e]), dnorm = gf * to_float(wv[e]);
        dw[e] += gf * norm;
        db[e] += gf;
        s1 += dnorm;
        s2 += dnorm * norm;
    }
}
__device__ __forceinline__ void ln_bwd_dinp(Packed128<floatX>& d, const Packed128<floatX>& g,
                                            const Packed128<floatX>& xv, const Packed128<floatX>& wv, float m,
                                            float s, float m1, float m2, float (&ds)[X128]) {
    for (int e = 0; e < X128; e++) {
        const float norm = (to_float(xv[e]) - m) * s, dnorm = to_float(g[e]) * to_float(wv[e]);
        d[e] = from_float<floatX>(to_float(d[e]) + (dnorm - m1 - norm * m2) * s);
        ds[e] += to_float(d[e]);  // the column sum of dinp as stored
    }
}

// Each warp takes rows n = warp_global, + G*LN_BWD_WARPS, ...: it reads its row's dout and inp, adds
// dout*norm, dout into its own dw/db accumulators and the row sums s1, s2; then it writes dinp and adds it into
// a third accumulator, the column sums of dinp. dinp is the gradient of the residual stream here, and its column
// sums are the bias gradient of the matmul whose output joined the stream (attproj after ln2, fcproj after the
// next block's ln1 or lnf), which so needs no column sum of its own. At the end the block sums its warps (fixed
// order) into partial[a][blockIdx.x] (3, G, C).
// RS > 0 (rows of up to RS sweeps of 32 lanes x 16 bytes: C <= 768 in the BF16 build, 384 in FP32): the lane's
// columns' dw and db accumulators (48 floats at C = 768) live in registers, two 8-warp blocks an SM; only the
// column sums of dinp are added in shared memory. The lane's part of the row (dout, inp and the dinp it adds
// to) comes by cp.async into one of the warp's two row buffers, and the next row's copies are issued before this
// row is used: each warp has two rows in flight, and a row's wait for HBM overlaps the row before. That is faster
// than all three accumulators in shared memory at three blocks an SM (fewer shared-memory round trips a row, and
// 264 blocks share 16384 rows more evenly than 384), and than the third accumulator in registers too, which
// spills (doc/kernels.md has the timings).
// RS = 0 (any C): the accumulators live in shared memory (9 KB per warp at C = 768, so three blocks an SM), a
// sweep of the row at a time, and the row read a second time (from L1/L2) to write dinp.
// Both do the same arithmetic in the same order. (Caching the row in shared memory too, with 4-warp blocks, was
// slower: doc/kernels.md.)
template <int RS>
static __global__ void __launch_bounds__(LN_BWD_WARPS * 32, RS > 0 ? 2 : 3)
    layernorm_backward_flash_kernel(floatX* dinp, float* partial, const floatX* dout, const floatX* inp,
                                    const floatX* w, const float* mean, const float* rstd, int N, int C) {
    static_assert(RS == 0 || RS == LN_BWD_RS, "the row buffers (LN_BWD_ROW_CHUNKS) are sized for LN_BWD_RS sweeps");
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    extern __shared__ float smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int slots = ln_row_slots(C), sweeps = ceil_div(C, 32 * X128);
    // Three regions of LN_BWD_WARPS accumulators each: the column sums of dinp first, then dw and db.
    float* acc_ds = smem + (size_t)(0 * LN_BWD_WARPS + warp) * slots;  // (C) this warp's column sums of dinp
    float* acc_dw = smem + (size_t)(1 * LN_BWD_WARPS + warp) * slots;  // (C) this warp's running dw
    float* acc_db = smem + (size_t)(2 * LN_BWD_WARPS + warp) * slots;  // (C) this warp's running db
    // Each lane zeroes the accumulator slots it will read back itself, so no lane waits on another's writes.
    const float zeros[X128] = {};

    if constexpr (RS > 0) {
        // This warp's two row buffers, (2, 3, RS, 32) 16-byte chunks: buffer b, array a (dout, inp, dinp), the
        // lane's it-th chunk. They lie over the dw and db regions, which the loop leaves alone (its dw and db are
        // in registers) and the end of the kernel takes back.
        Packed128<floatX>* rows =
            reinterpret_cast<Packed128<floatX>*>(smem + (size_t)LN_BWD_WARPS * slots) + (size_t)warp * LN_BWD_ROW_CHUNKS;
        auto chunk = [&](int b, int a, int it) -> Packed128<floatX>& {
            return rows[((b * 3 + a) * RS + it) * 32 + lane];
        };
        const floatX* src[3] = {dout, inp, dinp};
        // Row n's copies into buffer b, each lane its own chunks (so it waits for those alone, no barrier); past
        // the last row an empty group, so that every row waits for the same count.
        auto fetch = [&](int n, int b) {
            if (n < N) {
#pragma unroll
                for (int it = 0; it < RS; it++) {
                    const int c = (it * 32 + lane) * X128;
                    if (c >= C) continue;
                    for (int a = 0; a < 3; a++)
                        mma::cp_async_16(mma::smem_u32(&chunk(b, a, it)), src[a] + (size_t)n * C + c, 16);
                }
            }
            mma::cp_async_commit();
        };
        float dw[RS][X128] = {}, db[RS][X128] = {};  // this lane's columns' dw and db accumulators
        Packed128<floatX> wv[RS];                    // and their weights, read once
#pragma unroll
        for (int it = 0; it < RS; it++) {
            const int c = (it * 32 + lane) * X128;
            if (c < C) wv[it] = load128(w + c);
        }
        for (int it = 0; it < sweeps; it++) ln_acc_store(acc_ds, it, lane, zeros);  // the slots this lane adds to
        const int stride = gridDim.x * LN_BWD_WARPS;
        int n = blockIdx.x * LN_BWD_WARPS + warp, b = 0;
        fetch(n, 0);
        float m_next = n < N ? mean[n] : 0.0f, s_next = n < N ? rstd[n] : 0.0f;
        for (; n < N; n += stride, b ^= 1) {
            const size_t row = (size_t)n * C;
            const float m = m_next, s = s_next;
            // The next row's copies go out before this row is used: HBM's latency is paid while this row computes.
            // They overwrite the buffer the previous row was read from, whose values this lane has already used.
            fetch(n + stride, b ^ 1);
            if (n + stride < N) m_next = mean[n + stride], s_next = rstd[n + stride];
            mma::cp_async_wait<1>();  // this row's copies (this lane's: the only chunks it reads) have landed
            float s1 = 0.0f, s2 = 0.0f;  // sum of dnorm, sum of dnorm * norm over the row
#pragma unroll
            for (int it = 0; it < RS; it++) {
                if ((it * 32 + lane) * X128 >= C) continue;
                const Packed128<floatX> g = chunk(b, 0, it), xv = chunk(b, 1, it);  // 16-byte shared-memory reads
                ln_bwd_sums(g, xv, wv[it], m, s, dw[it], db[it], s1, s2);
            }
            const float m1 = warp_sum(s1) / C, m2 = warp_sum(s2) / C;
#pragma unroll
            for (int it = 0; it < RS; it++) {
                const int c = (it * 32 + lane) * X128;
                if (c >= C) continue;
                float ds[X128];
                Packed128<floatX> d = chunk(b, 2, it), g = chunk(b, 0, it), xv = chunk(b, 1, it);
                ln_acc_load(ds, acc_ds, it, lane);
                ln_bwd_dinp(d, g, xv, wv[it], m, s, m1, m2, ds);
                ln_acc_store(acc_ds, it, lane, ds);
                store128(dinp + row + c, d);
            }
        }
        mma::cp_async_wait<0>();  // (only empty groups are left)
        __syncthreads();  // every warp is done with its row buffers before they become the dw and db accumulators
#pragma unroll
        for (int it = 0; it < RS; it++) {
            if (it >= sweeps) break;
            ln_acc_store(acc_dw, it, lane, dw[it]), ln_acc_store(acc_db, it, lane, db[it]);
        }
    } else {
        for (int it = 0; it < sweeps; it++)  // the slots this lane adds to
            ln_acc_store(acc_dw, it, lane, zeros), ln_acc_store(acc_db, it, lane, zeros), ln_acc_store(acc_ds, it, lane, zeros);
        for (int n = blockIdx.x * LN_BWD_WARPS + warp; n < N; n += gridDim.x * LN_BWD_WARPS) {
            const size_t row = (size_t)n * C;
            const float m = mean[n], s = rstd[n];
            float s1 = 0.0f, s2 = 0.0f;
            for (int it = 0; it < sweeps; it++) {
                const int c = (it * 32 + lane) * X128;
                if (c >= C) break;
                float dw[X128], db[X128];
                ln_acc_load(dw, acc_dw, it, lane), ln_acc_load(db, acc_db, it, lane);
                ln_bwd_sums(load128(dout + row + c), load128(inp + row + c), load128(w + c), m, s, dw, db, s1, s2);
                ln_acc_store(acc_dw, it, lane, dw), ln_acc_store(acc_db, it, lane, db);
            }
            const float m1 = warp_sum(s1) / C, m2 = warp_sum(s2) / C;
            for (int it = 0; it < sweeps; it++) {  // the second read of the row: cache hits
                const int c = (it * 32 + lane) * X128;
                if (c >= C) break;
                float ds[X128];
                ln_acc_load(ds, acc_ds, it, lane);
                Packed128<floatX> d = load128(dinp + row + c);
                ln_bwd_dinp(d, load128(dout + row + c), load128(inp + row + c), load128(w + c), m, s, m1, m2, ds);
                ln_acc_store(acc_ds, it, lane, ds);
                store128(dinp + row + c, d);
            }
        }
    }
    __syncthreads();  // every warp's accumulators are final before threads read other warps' accumulators
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const int it = c / (32 * X128), lane_c = (c / X128) % 32, e = c % X128, k = ln_slot(it, e, lane_c);
        for (int a = 0; a < 3; a++) {  // dw, db, the column sums of dinp: regions 1, 2, 0
            const int region = (a + 1) % 3;
            float sum = 0.0f;
            for (int wi = 0; wi < LN_BWD_WARPS; wi++)  // fixed order
                sum += smem[(size_t)(region * LN_BWD_WARPS + wi) * slots + k];
            partial[((size_t)a * gridDim.x + blockIdx.x) * C + c] = sum;
        }
    }
}

// out[a][c] += sum over blocks of partial[a][., c] for a = dw, db, dsum (dsum may be null: not written). A block
// of 32 x LN_RED_ROWS threads per 32 columns of one array a = blockIdx.y: lane -> column (coalesced reads), thread
// row y sums blocks y, y + LN_RED_ROWS, ..., then row 0 adds the LN_RED_ROWS sums in order. Fixed order
// throughout: deterministic. (One block per array, not one for all three: three times the blocks, each a third
// of the chain of loads and adds.)
constexpr int LN_RED_ROWS = 16;
static __global__ void __launch_bounds__(32 * LN_RED_ROWS)
    layernorm_backward_reduce_kernel(floatX* dw, floatX* db, floatX* dsum, const float* partial, int G, int C) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    __shared__ float sums[LN_RED_ROWS][32];
    const int lane = threadIdx.x % 32, y = threadIdx.x / 32, c = blockIdx.x * 32 + lane, a = blockIdx.y;
    float sum = 0.0f;
    if (c < C)
        for (int g = y; g < G; g += LN_RED_ROWS) sum += partial[((size_t)a * G + g) * C + c];
    sums[y][lane] = sum;
    __syncthreads();  // every row's sums are in shared memory before row 0 adds them
    if (y != 0 || c >= C) return;
    floatX* out = a == 0 ? dw : a == 1 ? db : dsum;
    sum = 0.0f;
    for (int r = 0; r < LN_RED_ROWS; r++) sum += sums[r][lane];
    out[c] = from_float<floatX>(to_float(out[c]) + sum);
}

// dinp (N,C) += ..., dw, db (C) += ...; dsum (C) += the column sums of the finished dinp (null: not wanted).
inline void layernorm_backward_flash(floatX* dinp, floatX* dw, floatX* db, floatX* dsum, void* ws,
                                     const floatX* dout, const floatX* inp, const floatX* w, const float* mean,
                                     const float* rstd, int N, int C, cudaStream_t stream) {
    const size_t smem = layernorm_backward_flash_smem(C);
    ln_check("layernorm_backward_flash", C, smem);
    if (!aligned16(dinp) || !aligned16(dout) || !aligned16(inp) || !aligned16(w))
        fail("layernorm_backward_flash: buffers must be 16-byte aligned");
    constexpr int RS = LN_BWD_RS;
    auto kernel = ceil_div(C, 32 * X128) <= RS ? layernorm_backward_flash_kernel<RS> : layernorm_backward_flash_kernel<0>;
    allow_shared_memory(kernel, smem);
    const int G = ln_bwd_grid(kernel, N, smem);  // <= ln_bwd_blocks(N): the workspace's size
    float* partial = WorkspaceCarver(ws).take<float>((size_t)3 * G * C);  // (3, G, C): dw, db, dsum
    launch_dependent(kernel, G, LN_BWD_WARPS * 32, smem, stream, dinp, partial, dout, inp, w, mean, rstd, N, C);
    launch_dependent(layernorm_backward_reduce_kernel, dim3(ceil_div(C, 32), dsum ? 3 : 2), 32 * LN_RED_ROWS, 0, stream,
                     dw, db, dsum, partial, G, C);
}

}  // namespace flashgpt2
