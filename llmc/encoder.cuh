// Encoder: token embedding + position embedding. out[b,t,:] = wte[inp[b,t],:] + wpe[t,:].
//
// naive: one thread per output element; the backward scatters dout into dwte/dwpe with atomicAdd. Tokens
//        repeat (" the", "\n"), so many threads add into the same dwte row: the order of those float adds
//        varies from run to run, and so do the last bits of the result. That is the lesson: atomics are
//        easy, but they cost determinism. The atomics add into fp32 copies of dwte and dwpe (a workspace,
//        zeroed first) and a second pass adds those into the gradients: atomics on bf16 itself would round
//        every one of the hundreds of adds into a frequent token's row and lose its gradient's low bits.
// flash: one thread per 16 bytes in the forward. The backward is deterministic: sort the positions by token
//        (a stable radix sort keeps each token's positions in ascending order), then one block per run of
//        equal tokens sums that token's dout rows in a fixed order, in fp32, and adds once into dwte.
//        dwpe[t] sums over b in order, one thread per (t, c).
#pragma once
#include <cub/device/device_radix_sort.cuh>

#include "llmc/error.h"
#include "llmc/kernel_common.cuh"

namespace flashgpt2 {

// ---- forward ----

static __global__ void encoder_forward_naive_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                             int N, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // one element of out (N, C)
    if (idx >= (size_t)N * C) return;
    int n = (int)(idx / C), c = (int)(idx % C), t = n % T;
    out[idx] = from_float<floatX>(to_float(wte[(size_t)inp[n] * C + c]) + to_float(wpe[(size_t)t * C + c]));
}

static __global__ void encoder_forward_flash_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                             int N, int T, int C) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;  // first of X128 elements
    if (idx >= (size_t)N * C) return;
    int n = (int)(idx / C), c = (int)(idx % C), t = n % T;  // C % X128 == 0: the 16 bytes stay in one row
    Packed128<floatX> e = load128(wte + (size_t)inp[n] * C + c), p = load128(wpe + (size_t)t * C + c), o;
    for (int k = 0; k < X128; k++) o[k] = from_float<floatX>(to_float(e[k]) + to_float(p[k]));
    store128(out + idx, o);
}

inline void encoder_forward_naive(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T,
                                  int C, cudaStream_t stream) {
    const int block = 256;
    encoder_forward_naive_kernel<<<grid_for((size_t)B * T * C, block), block, 0, stream>>>(out, inp, wte, wpe, B * T, T, C);
    cudaCheckLaunch();
}

inline void encoder_forward_flash(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T,
                                  int C, cudaStream_t stream) {
    if (C % X128 != 0) fail("encoder_forward_flash: channels %d must be a multiple of %d", C, X128);
    if (!aligned16(out) || !aligned16(wte) || !aligned16(wpe)) fail("encoder_forward_flash: buffers must be 16-byte aligned");
    const int block = 256;
    launch_dependent(encoder_forward_flash_kernel, grid_for((size_t)B * T * C / X128, block), block, 0, stream,
        out, inp, wte, wpe, B * T, T, C);
}

// ---- backward, naive: atomics ----

static __global__ void encoder_backward_naive_kernel(float* dwte32, float* dwpe32, const floatX* dout, const int* inp,
                                                     int N, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // one element of dout (N, C)
    if (idx >= (size_t)N * C) return;
    int n = (int)(idx / C), c = (int)(idx % C), t = n % T;
    float g = to_float(dout[idx]);
    atomicAdd(dwte32 + (size_t)inp[n] * C + c, g);  // many n share a token: the add order is up to the hardware
    atomicAdd(dwpe32 + (size_t)t * C + c, g);       // B threads add into each (t, c)
}

// grad += sum, one thread per element.
static __global__ void encoder_backward_naive_add_kernel(floatX* grad, const float* sum, size_t n) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) grad[idx] = from_float<floatX>(to_float(grad[idx]) + sum[idx]);
}

inline void encoder_backward_naive(floatX* dwte, floatX* dwpe, void* ws, const floatX* dout, const int* inp, int B,
                                   int T, int C, int Vp, cudaStream_t stream) {
    const size_t nwte = (size_t)Vp * C, nwpe = (size_t)T * C;
    WorkspaceCarver carve(ws);
    float* dwte32 = carve.take<float>(nwte);  // (Vp, C) this batch's dwte, fp32
    float* dwpe32 = carve.take<float>(nwpe);  // (T, C)  this batch's dwpe, fp32
    cudaCheck(cudaMemsetAsync(dwte32, 0, nwte * sizeof(float), stream));
    cudaCheck(cudaMemsetAsync(dwpe32, 0, nwpe * sizeof(float), stream));
    const int block = 256;
    encoder_backward_naive_kernel<<<grid_for((size_t)B * T * C, block), block, 0, stream>>>(dwte32, dwpe32, dout, inp,
                                                                                          B * T, T, C);
    cudaCheckLaunch();
    encoder_backward_naive_add_kernel<<<grid_for(nwte, block), block, 0, stream>>>(dwte, dwte32, nwte);
    cudaCheckLaunch();
    encoder_backward_naive_add_kernel<<<grid_for(nwpe, block), block, 0, stream>>>(dwpe, dwpe32, nwpe);
    cudaCheckLaunch();
}

// ---- backward, flash: sort by token, then a fixed-order sum per token ----

// Bits that hold every token id < Vp (16 for GPT-2's 50304): the radix sort only looks at those.
inline int encoder_sort_bits(int Vp) {
    int bits = 1;
    while ((1 << bits) < Vp) bits++;
    return bits;
}

inline size_t encoder_sort_temp_bytes(int N, int Vp) {
    size_t bytes = 0;
    cudaCheck(cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const int*)nullptr, (int*)nullptr, (const int*)nullptr,
                                              (int*)nullptr, N, 0, encoder_sort_bits(Vp)));
    return bytes;
}

inline size_t encoder_backward_workspace_bytes(Variant v, int B, int T, int C, int Vp) {
    if (v == Variant::naive) return ws_round((size_t)Vp * C * sizeof(float)) + ws_round((size_t)T * C * sizeof(float));
    const size_t N = (size_t)B * T;
    return 4 * ws_round(N * sizeof(int)) + ws_round(encoder_sort_temp_bytes((int)N, Vp));
}

static __global__ void encoder_sort_init_kernel(int* keys, int* positions, const int* inp, int N) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) { keys[n] = inp[n]; positions[n] = n; }
}

// One block per sorted position i; only the block at the start of a run of equal tokens works. It finds the
// run's end by binary search (the keys are sorted), sums dout over the run and adds the sum into dwte once. A
// frequent token (" the", "\n") owns thousands of positions at 32K tokens per step, and this one block is then
// the kernel's time, so it splits the run S ways: thread (s, g) sums the 16 bytes of channels g over the run's
// rows s, s + S, s + 2S, ... in ascending order, then each channel's S partial sums are added in the order
// s = 0, 1, ..., S-1. A fixed order, so the same bits on every run (other bits than one pass over the run).
// S x (groups of one pass) is the block: encoder_wte_segments() below.
constexpr int ENCODER_WTE_THREADS = 1024;
__host__ __device__ inline int encoder_wte_groups(int C) { return C / X128 < 128 ? C / X128 : 128; }  // per pass
__host__ __device__ inline int encoder_wte_segments(int C) { return ENCODER_WTE_THREADS / encoder_wte_groups(C); }
static __global__ void __launch_bounds__(ENCODER_WTE_THREADS)
    encoder_backward_wte_kernel(floatX* dwte, const floatX* dout, const int* tokens_sorted,
                                const int* positions_sorted, int N, int C) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    __shared__ float part[ENCODER_WTE_THREADS * X128];  // (S, groups x X128) partial sums of one pass
    const int i = blockIdx.x;
    const int token = tokens_sorted[i];
    if (i > 0 && tokens_sorted[i - 1] == token) return;  // not the first position of this token (the whole block)
    int lo = i + 1, hi = N;  // -> the first j > i whose token differs (or N)
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (tokens_sorted[mid] == token) lo = mid + 1;
        else hi = mid;
    }
    const int end = lo;
    const int G = C / X128, gb = encoder_wte_groups(C), S = encoder_wte_segments(C);
    const int s = threadIdx.x / gb, g = threadIdx.x % gb;  // this thread's segment and group (s = S: idle)
    for (int g0 = 0; g0 < G; g0 += gb) {  // one pass: groups g0 .. g0 + gb - 1
        float acc[X128] = {};
        if (s < S && g0 + g < G) {
            const floatX* col = dout + (size_t)(g0 + g) * X128;
#pragma unroll 4
            for (int j = i + s; j < end; j += S) {
                const Packed128<floatX> x = load128(col + (size_t)positions_sorted[j] * C);
#pragma unroll
                for (int e = 0; e < X128; e++) acc[e] += to_float(x[e]);
            }
#pragma unroll
            for (int e = 0; e < X128; e++) part[s * gb * X128 + g * X128 + e] = acc[e];
        }
        __syncthreads();  // every segment's partial sums of this pass are in part
        for (int e = threadIdx.x; e < gb * X128 && g0 * X128 + e < C; e += blockDim.x) {
            float sum = 0.0f;
            for (int k = 0; k < S; k++) sum += part[k * gb * X128 + e];
            floatX* d = dwte + (size_t)token * C + g0 * X128 + e;
            *d = from_float<floatX>(to_float(*d) + sum);
        }
        __syncthreads();  // part is read before the next pass writes it
    }
}

static __global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    pdl_begin();  // launched by launch_dependent (llmc/common.cuh)
    int idx = blockIdx.x * blockDim.x + threadIdx.x;  // one element (t, c) of dwpe
    if (idx >= T * C) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += to_float(dout[(size_t)b * T * C + idx]);
    dwpe[idx] = from_float<floatX>(to_float(dwpe[idx]) + sum);
}

inline void encoder_backward_flash(floatX* dwte, floatX* dwpe, void* ws, const floatX* dout, const int* inp, int B,
                                   int T, int C, int Vp, cudaStream_t stream) {
    const int N = B * T;
    WorkspaceCarver carve(ws);
    int* keys = carve.take<int>(N);           // (N) token of each position
    int* positions = carve.take<int>(N);      // (N) 0..N-1
    int* keys_sorted = carve.take<int>(N);    // (N) tokens, ascending
    int* positions_sorted = carve.take<int>(N);  // (N) positions, ascending within each token (stable sort)
    size_t temp_bytes = encoder_sort_temp_bytes(N, Vp);
    void* temp = carve.take<char>(temp_bytes);

    launch_dependent(encoder_sort_init_kernel, ceil_div(N, 256), 256, 0, stream, keys, positions, inp, N);
    cudaCheck(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys_sorted, positions, positions_sorted, N, 0,
                                              encoder_sort_bits(Vp), stream));
    launch_dependent(encoder_backward_wte_kernel, N, ENCODER_WTE_THREADS, 0, stream,
        dwte, dout, keys_sorted, positions_sorted, N, C);
    launch_dependent(encoder_backward_wpe_kernel, ceil_div(T * C, 256), 256, 0, stream, dwpe, dout, B, T, C);
}

}  // namespace flashgpt2
