// dev/memory_wall: the memory wall, measured on the GPU it runs on. FlashAttention's argument (Dao et al. 2022,
// arXiv:2205.14135) is that attention is bound by the trips between HBM and on-chip SRAM, not by arithmetic. This
// program puts this card's numbers on both sides of that sentence, then places llmc's naive and flash attention
// forwards on a roofline (Williams, Waterman and Patterson 2009, "Roofline", CACM 52(4)):
//   1. the hierarchy: HBM read, write and copy bandwidth over buffers far larger than the L2; L2 read bandwidth over
//      a buffer well inside it; shared memory (SRAM) read and write bandwidth of all SMs at once; the bf16
//      tensor-core matmul rate (cuBLASLt, 8192³, random data) and the fp32 CUDA-core FMA rate.
//   2. the roofline: each attention forward is timed; its FLOPs (the FlashAttention count 4·B·H·T²·D/2) over its
//      HBM bytes is its arithmetic intensity I (FLOP per byte), and min(peak, I × HBM bandwidth) is the most the
//      card can do at that intensity. The bytes are Nsight Compute's (--bytes, from the script) when given, else
//      the traffic model of attention_bytes() below.
// The bandwidth kernels make 16-byte accesses and count only the bytes they ask for. Every timing is
// dev/harness.cuh's benchmark() (CUDA events, warm-up, median, L2 flushed before each run), setup outside it.
//   ./build/memory_wall [--out PAGE.md] [--csv FILE.csv] [--bytes NCU_BYTES]
//   ./build/memory_wall --list-shapes                        the attention shapes, one "B,NH,T,HS" per line
//   ./build/memory_wall --once naive|flash --shape B,NH,T,HS one forward and no other kernel (what ncu profiles)
// NCU_BYTES has lines "naive|flash B NH T HS read_bytes write_bytes" (scripts/bench/71_memory_wall.sh writes it).
#if defined(ENABLE_FP32)
#error "dev/memory_wall.cu is built with -DENABLE_BF16: its matmul and flash attention are bf16"
#endif
#define EIGEN_NO_CUDA  // dev/attention/problem.cuh brings the (host-only) oracle's headers along
#include <algorithm>
#include <cstdarg>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dev/attention/attention.cuh"  // attention_forward_flops
#include "dev/attention/problem.cuh"    // Shape, DeviceBuffer
#include "dev/harness.cuh"              // benchmark, bf16_bits
#include "llmc/attention.cuh"
#include "llmc/fileio.h"
#include "llmc/profile.h"  // utc_timestamp
#include "llmc/sampler.h"  // Rng

using namespace flashgpt2;
using dev::DeviceBuffer;
using dev::Shape;

constexpr int THREADS = 256;  // per block, every measuring kernel
const Shape kShapes[] = {{8, 12, 1024, 64}, {4, 12, 4096, 64}, {1, 12, 16384, 64}};  // GPT-2's heads, long T
const harness::BenchOpts kOpts{2, 5, 30, 0.2};  // warm-up 2, then 5 to 30 timed runs within 0.2 s: the median
constexpr uint64_t SEED = 42;                   // of the random matmul and attention inputs, printed

// ---------------------------------------------------------------------------------------------------------
// HBM and L2: a grid-stride walk over n float4s. Neighbouring threads take neighbouring float4s, so a warp's
// 32 lanes touch 512 contiguous bytes. Each trip issues UNROLL loads before it uses any, keeping several 16-byte
// requests per thread in flight: one at a time cannot cover HBM's latency.
constexpr int UNROLL = 4;

// Walks src `passes` times. COPY: each vector is stored to dst at the same index. Otherwise the values are summed
// and each block's sum goes to sink[blockIdx.x], so no load can be dropped as unused. __ldcg caches in L2 only,
// never in the SM's L1: a second pass over the same addresses cannot be served by L1.
template <bool COPY>
__global__ void stream_kernel(float* sink, float4* dst, const float4* src, size_t n, int passes) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    float acc[UNROLL] = {};
    auto use = [&](const float4& v, size_t j, int u) {
        if constexpr (COPY) dst[j] = v;
        else acc[u] += (v.x + v.y) + (v.z + v.w);
    };
    for (int p = 0; p < passes; p++) {
        size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
            float4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) v[u] = __ldcg(src + i + u * stride);
#pragma unroll
            for (int u = 0; u < UNROLL; u++) use(v[u], i + u * stride, u);
        }
        for (; i < n; i += stride) use(__ldcg(src + i), i, 0);  // this thread's last few vectors
    }
    if constexpr (!COPY) {
        float s = 0.0f;
#pragma unroll
        for (int u = 0; u < UNROLL; u++) s += acc[u];
        s = block_sum(s);  // every thread of the block reaches this: no early return above
        if (threadIdx.x == 0) sink[blockIdx.x] = s;
    }
}

// Fills dst with nonzero values that vary along it. A store waits for nothing, so there is no unrolling.
__global__ void write_kernel(float4* dst, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float f = (float)(i & 1023) + 1.0f;
        dst[i] = make_float4(f, f, f, f);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Shared memory (SRAM): each block reads (or writes) a 32 KB buffer of its own over and over, nothing else.
// At each step the block's threads touch blockDim.x consecutive float4s, a window that slides on by blockDim.x
// and wraps around the buffer. So a warp's access is one aligned 512-byte run, lane l at float4 l of it: 32 lanes
// × 16 bytes cover the 32 four-byte banks exactly 4 times, the fewest transactions a 16-byte warp access can
// take, i.e. no bank conflicts. blockDim.x is unknown when compiling: the compiler cannot see that the window
// comes back to the same addresses, so it cannot keep the values in registers instead of loading them.
constexpr int SMEM_VECS = 2048, SMEM_UNROLL = 8, SMEM_ITERS = 2048;
static_assert((SMEM_VECS & (SMEM_VECS - 1)) == 0, "the window wraps with a mask");

__device__ __forceinline__ int smem_slot(int step) {  // the float4 this thread touches at `step`
    return (step * blockDim.x + threadIdx.x) & (SMEM_VECS - 1);
}

__global__ void smem_read_kernel(float* sink, int iters) {
    __shared__ float4 buf[SMEM_VECS];
    for (int i = threadIdx.x; i < SMEM_VECS; i += blockDim.x) buf[i] = make_float4(i + 1.0f, 1.0f, 2.0f, 3.0f);
    __syncthreads();  // the buffer is filled before any thread reads what another thread wrote
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int u = 0; u < SMEM_UNROLL; u++) {
            const float4 v = buf[smem_slot(it * SMEM_UNROLL + u)];
            acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
        }
    }
    sink[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = (acc.x + acc.y) + (acc.z + acc.w);
}

__global__ void smem_write_kernel(float* sink, int iters) {
    __shared__ float4 buf[SMEM_VECS];
    float4 val = make_float4(threadIdx.x + 1.0f, 1.0f, 2.0f, 3.0f);
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int u = 0; u < SMEM_UNROLL; u++) buf[smem_slot(it * SMEM_UNROLL + u)] = val;
        val.x += 1.0f;
    }
    __syncthreads();  // every warp's stores are done before a thread reads a slot another warp wrote
    sink[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = buf[threadIdx.x % SMEM_VECS].x;  // keeps the stores live
}

// ---------------------------------------------------------------------------------------------------------
// fp32 FMA on the CUDA cores, registers only: FMA_CHAINS independent chains x = x·a + b per thread hide the FMA's
// latency; the long unrolled body keeps loop bookkeeping a small share of the issued instructions (a scheduler
// issues one warp instruction per clock, and every non-FMA one takes an FMA's slot). a, b are arguments, so the
// compiler cannot fold the chains; with a < 1 they converge to b / (1 - a) = 1, never overflowing.
constexpr int FMA_CHAINS = 8, FMA_UNROLL = 16, FMA_ITERS = 2048;

__global__ void fma_kernel(float* sink, int iters, float a, float b) {
    float x[FMA_CHAINS];
#pragma unroll
    for (int c = 0; c < FMA_CHAINS; c++) x[c] = threadIdx.x * 1e-3f + c;
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int r = 0; r < FMA_UNROLL; r++)
#pragma unroll
            for (int c = 0; c < FMA_CHAINS; c++) x[c] = fmaf(x[c], a, b);
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < FMA_CHAINS; c++) s += x[c];
    sink[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// ---------------------------------------------------------------------------------------------------------
// host: the hierarchy

struct Hierarchy {
    cudaDeviceProp prop{};
    std::string date;           // when it was measured (utc_timestamp)
    int sm_mhz = 0;             // peak SM clock
    double hbm_theory = 0;      // GB/s: memory clock × bus width × 2 (double data rate), 0 when not reported
    size_t hbm_buffer = 0, l2_buffer = 0;  // bytes each test walks
    double hbm_read = 0, hbm_write = 0, hbm_copy = 0, l2_read = 0, smem_read = 0, smem_write = 0;  // GB/s
    double bf16_tflops = 0, fp32_tflops = 0;
    double roof() const { return std::max({hbm_read, hbm_write, hbm_copy}); }  // GB/s: the roofline's slope
    double sram_bytes() const { return (double)prop.sharedMemPerMultiprocessor * prop.multiProcessorCount; }
    double smem_theory() const { return 128.0 * sm_mhz * 1e6 * prop.multiProcessorCount / 1e9; }  // 32 banks × 4 B
};

constexpr int L2_PASSES = 128, MATMUL_N = 8192;

inline double gbps(double bytes, double ms) { return bytes / (ms * 1e6); }

// benchmark()'s median for one kernel launch; the launch error, if any, is caught right after each launch.
template <class Launch>
double median_ms(Launch launch, cudaStream_t stream) {
    return harness::benchmark([&] { launch(); cudaCheckLaunch(); }, stream, kOpts).median_ms;
}

// Blocks of THREADS that are resident on the whole card at once: one full wave, every SM busy, no tail.
template <class Kernel>
int resident_blocks(Kernel kernel, const cudaDeviceProp& prop) {
    int per_sm = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, 0));
    if (per_sm < 1) fail("a %d-thread block of a measuring kernel does not fit on one SM", THREADS);
    return per_sm * prop.multiProcessorCount;
}

void measure_hbm_and_l2(Hierarchy& h, cudaStream_t stream) {
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    const size_t l2 = (size_t)h.prop.l2CacheSize;
    // two buffers (the copy's source and destination) of up to 4 GiB each: ~80× an H100's L2, so the few MB the
    // flush leaves dirty in L2, or that a write test leaves there at its end, are about 1% of what is timed
    const size_t bytes = std::min<size_t>(4ull << 30, free_b / 4) / 16 * 16, n = bytes / 16;
    if (bytes < 16 * l2) fail("HBM test: %.2f GB free is too little for two buffers of 16× the L2", free_b / 1e9);
    h.hbm_buffer = bytes;
    DeviceBuffer a(bytes, "HBM test source"), b(bytes, "HBM test destination");
    float4* src = static_cast<float4*>(a.p);
    float4* dst = static_cast<float4*>(b.p);
    const int gr = resident_blocks(stream_kernel<false>, h.prop), gw = resident_blocks(write_kernel, h.prop),
              gc = resident_blocks(stream_kernel<true>, h.prop);
    DeviceBuffer sink((size_t)gr * sizeof(float), "sink");
    float* s = static_cast<float*>(sink.p);
    write_kernel<<<gw, THREADS, 0, stream>>>(src, n);  // the source holds nonzero data before it is read
    cudaCheckLaunch();
    auto ms = [&](auto launch) { return median_ms(launch, stream); };
    h.hbm_write = gbps(bytes, ms([&] { write_kernel<<<gw, THREADS, 0, stream>>>(dst, n); }));
    h.hbm_read = gbps(bytes, ms([&] { stream_kernel<false><<<gr, THREADS, 0, stream>>>(s, nullptr, src, n, 1); }));
    h.hbm_copy = gbps(2.0 * bytes, ms([&] { stream_kernel<true><<<gc, THREADS, 0, stream>>>(s, dst, src, n, 1); }));
    printf("HBM: read %.0f GB/s, write %.0f GB/s, copy %.0f GB/s (%.2f GB buffers)\n", h.hbm_read, h.hbm_write,
           h.hbm_copy, bytes / 1e9);

    // L2: a quarter of it (well inside, whatever the replacement policy does), read 1 + L2_PASSES times after the
    // flush, minus the time of 1 pass: the first pass comes from HBM in both, the L2_PASSES others from L2
    h.l2_buffer = l2 / 4 / 16 * 16;
    const size_t nl2 = h.l2_buffer / 16;
    auto read = [&](int passes) { stream_kernel<false><<<gr, THREADS, 0, stream>>>(s, nullptr, src, nl2, passes); };
    const double many = ms([&] { read(1 + L2_PASSES); }), one = ms([&] { read(1); });
    if (many <= one) fail("L2 test: %d passes took no longer than 1 (%.4f ms vs %.4f ms)", 1 + L2_PASSES, many, one);
    h.l2_read = gbps((double)L2_PASSES * h.l2_buffer, many - one);
    printf("L2: read %.0f GB/s (%.1f MB buffer, warm)\n", h.l2_read, h.l2_buffer / 1e6);
}

void measure_sram_and_fma(Hierarchy& h, cudaStream_t stream) {
    for (auto k : {smem_read_kernel, smem_write_kernel})  // the SM's on-chip memory as shared, as much as it takes
        cudaCheck(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
    const int gr = resident_blocks(smem_read_kernel, h.prop), gw = resident_blocks(smem_write_kernel, h.prop),
              gf = resident_blocks(fma_kernel, h.prop);
    DeviceBuffer sink((size_t)std::max({gr, gw, gf}) * THREADS * sizeof(float), "sink");
    float* s = static_cast<float*>(sink.p);
    const double per_thread = (double)SMEM_ITERS * SMEM_UNROLL * 16;  // bytes each thread reads or writes
    const double rd = median_ms([&] { smem_read_kernel<<<gr, THREADS, 0, stream>>>(s, SMEM_ITERS); }, stream);
    const double wr = median_ms([&] { smem_write_kernel<<<gw, THREADS, 0, stream>>>(s, SMEM_ITERS); }, stream);
    h.smem_read = gbps(per_thread * gr * THREADS, rd);
    h.smem_write = gbps(per_thread * gw * THREADS, wr);
    printf("shared memory: read %.0f GB/s, write %.0f GB/s (all %d SMs)\n", h.smem_read, h.smem_write,
           h.prop.multiProcessorCount);
    const double flops = 2.0 * FMA_CHAINS * FMA_UNROLL * FMA_ITERS * gf * THREADS;
    const double fma = median_ms([&] { fma_kernel<<<gf, THREADS, 0, stream>>>(s, FMA_ITERS, 0.999f, 0.001f); }, stream);
    h.fp32_tflops = flops / (fma * 1e9);
    printf("fp32 FMA: %.1f TFLOP/s\n", h.fp32_tflops);
}

// Uniform in [-1, 1), rounded to bf16, from llmc's Rng. Never zeros: a matmul of zeros can run faster than one of
// real data (less switching, less power, higher clocks), so a peak measured on them would flatter the card.
void upload_random_bf16(void* dst, size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<uint16_t> h(n);
    for (uint16_t& x : h) x = harness::bf16_bits(2.0f * rng.next_f32() - 1.0f);
    cudaCheck(cudaMemcpy(dst, h.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
}

// bf16 in, fp32 accumulate, through llmc's own cuBLASLt call (the flash matmul's): column-major D (n,n) = Aᵀ B.
void measure_matmul(Hierarchy& h, uint64_t seed, cudaStream_t stream) {
    const int n = MATMUL_N;
    const size_t nn = (size_t)n * n;
    DeviceBuffer a(nn * sizeof(floatX), "matmul A"), b(nn * sizeof(floatX), "matmul B");
    DeviceBuffer d(nn * sizeof(floatX), "matmul D");
    upload_random_bf16(a.p, nn, seed);
    upload_random_bf16(b.p, nn, seed + 1);
    auto A = static_cast<const floatX*>(a.p), B = static_cast<const floatX*>(b.p);
    auto D = static_cast<floatX*>(d.p);
    const harness::Timing t = harness::benchmark([&] {
        cublaslt_matmul(D, A, B, n, n, n, true, false, n, n, n, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0,
                        stream);
    }, stream, {3, 10, 10, 0.0});  // three warm-ups, then exactly ten timed runs
    h.bf16_tflops = 2.0 * n * n * (double)n / (t.median_ms * 1e9);
    printf("bf16 matmul %d^3: %.0f TFLOP/s (median of %d)\n", n, h.bf16_tflops, t.reps);
}

// ---------------------------------------------------------------------------------------------------------
// host: attention on the roofline

struct AttnRow {
    AttnRow(std::string k, Shape shape) : kernel(std::move(k)), s(shape) {}
    std::string kernel;        // "naive" or "flash"
    Shape s;
    std::string engine;        // the flash engine that ran
    std::string status = "ok"; // else why the row has no time
    double ms = 0, flops = 0, min_bytes = 0, model_bytes = 0, ncu_read = -1, ncu_write = -1;
    bool measured() const { return ncu_read >= 0 && ncu_read + ncu_write > 0; }
    double bytes() const { return measured() ? ncu_read + ncu_write : model_bytes; }
};

// HBM bytes of one causal forward, bf16 tensors (2 bytes), btc = B·T·C elements, tt = B·NH·T² scores:
//   minimum: every input read once, every output written once: qkv 6·btc, out 2·btc, plus flash's lse (4 bytes
//            per row) or naive's P (2·tt: it is an output, the backward reads it).
//   model:   flash = the minimum (a K/V tile is re-read by every query block, from L2). naive = each kernel reads
//            its inputs and writes its outputs once: permute qkv -> q,k,v 12·btc; S = Q Kᵀ reads q,k 4·btc and
//            writes S in fp32 4·tt; softmax reads S's causal half 2·tt, writes P 2·tt; O = P V reads P 2·tt and
//            v 2·btc, writes 2·btc; unpermute 4·btc. In all 24·btc + 10·tt.
void attention_bytes(AttnRow& r) {
    const Shape& s = r.s;
    const double btc = (double)s.B * s.T * s.NH * s.HS, tt = (double)s.B * s.NH * s.T * s.T;
    const bool naive = r.kernel == "naive";
    r.min_bytes = 8 * btc + (naive ? 2 * tt : 4.0 * s.B * s.NH * s.T);
    r.model_bytes = naive ? 24 * btc + 10 * tt : r.min_bytes;
}

// Allocates and fills one forward's buffers, then launches it once (`timed` false: under ncu, nothing else runs)
// or times it. An Error (a buffer that does not fit, no engine for the shape) is the row's status in a full run.
void run_attention(AttnRow& r, uint64_t seed, cudaStream_t stream, bool timed) {
    const Shape& s = r.s;
    const bool naive = r.kernel == "naive";
    const int C = s.NH * s.HS;
    const size_t btc = (size_t)s.B * s.T * C, tt = (size_t)s.B * s.NH * s.T * s.T;
    r.flops = attention_forward_flops(s.B, s.NH, s.T, s.HS);
    attention_bytes(r);
    if (!naive) r.engine = engine_name(attention_engine(AttnEngine::best, Pass::forward, s.HS));
    DeviceBuffer qkv(3 * btc * sizeof(floatX), "qkv"), out(btc * sizeof(floatX), "out");
    DeviceBuffer lse(naive ? 0 : (size_t)s.B * s.NH * s.T * sizeof(float), "lse");
    DeviceBuffer att(naive ? tt * sizeof(floatX) : 0, "P (B,NH,T,T)");
    DeviceBuffer ws(naive ? attention_workspace_bytes(Variant::naive, s.B, s.T, C, s.NH) : 0, "naive workspace");
    upload_random_bf16(qkv.p, 3 * btc, seed);
    auto launch = [&] {
        const floatX* in = static_cast<const floatX*>(qkv.p);
        floatX* o = static_cast<floatX*>(out.p);
        if (naive) attention_forward_naive(o, static_cast<floatX*>(att.p), ws.p, in, s.B, s.T, C, s.NH, stream);
        else attention_forward_flash(o, static_cast<float*>(lse.p), in, s.B, s.T, C, s.NH, AttnEngine::best, stream);
    };
    if (!timed) {
        launch();
        cudaCheck(cudaStreamSynchronize(stream));
        return;
    }
    r.ms = harness::benchmark(launch, stream, kOpts).median_ms;
    printf("attention %s %s: %.3f ms, %.1f TFLOP/s\n", r.kernel.c_str(), s.str().c_str(), r.ms, r.flops / (r.ms * 1e9));
}

// NCU_BYTES: "naive|flash B NH T HS read_bytes write_bytes" per line; '#' lines and blank lines are skipped.
using NcuBytes = std::map<std::tuple<std::string, int, int, int, int>, std::pair<double, double>>;  // read, write
NcuBytes read_ncu_bytes(const std::string& path) {
    std::istringstream in(read_file(path));
    NcuBytes m;
    std::string line, extra, k;
    for (int no = 1; std::getline(in, line); no++) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream ls(line);
        int B, NH, T, HS;
        double rd, wr;
        const bool ok = (ls >> k >> B >> NH >> T >> HS >> rd >> wr) && !(ls >> extra);
        if (!ok || (k != "naive" && k != "flash") || rd < 0 || wr < 0)
            fail("%s:%d: expected 'naive|flash B NH T HS read_bytes write_bytes', got '%s'", path.c_str(), no,
                 line.c_str());
        m[{k, B, NH, T, HS}] = {rd, wr};
    }
    return m;
}

// ---------------------------------------------------------------------------------------------------------
// the page

void appendf(std::string& out, const char* fmt, ...) {  // printf onto the end of `out`, any length
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    std::vector<char> buf(vsnprintf(nullptr, 0, fmt, ap) + 1);
    vsnprintf(buf.data(), buf.size(), fmt, again);
    va_end(again);
    va_end(ap);
    out += buf.data();
}

std::string fmt_bytes(double b) {
    char s[32];
    snprintf(s, sizeof s, b >= 1e9 ? "%.2f GB" : "%.1f MB", b >= 1e9 ? b / 1e9 : b / 1e6);
    return s;
}

const char* bound(const AttnRow& r, const Hierarchy& h) {
    return r.flops / r.bytes() * h.roof() / 1e3 < h.bf16_tflops ? "memory" : "compute";
}
double attainable_tflops(const AttnRow& r, const Hierarchy& h) {
    return std::min(h.bf16_tflops, r.flops / r.bytes() * h.roof() / 1e3);  // FLOP/byte × GB/s = GFLOP/s
}

std::string page(const Hierarchy& h, const std::vector<AttnRow>& rows, const std::string& cmd, bool have_ncu) {
    const cudaDeviceProp& p = h.prop;
    const int sms = p.multiProcessorCount;
    std::string md;
    appendf(md, "**The memory wall**, measured on this card by `./build/memory_wall` (`make memory-wall` runs it and "
                "splices this block into doc/memory_wall.md).  \nCard: %s, %d SMs · %s · `%s`\n\n",
            p.name, sms, h.date.c_str(), cmd.c_str());
    appendf(md, "The memory hierarchy of this card (capacities from cudaDeviceProp in binary units, bandwidths in "
                "decimal GB/s = 10⁹ bytes moved per second; each figure the median of several runs):\n\n");
    appendf(md, "| level | capacity | measured | how |\n|---|--:|--:|---|\n");
    appendf(md, "| HBM | %.1f GiB | read %.0f GB/s · write %.0f · copy %.0f | two %.2f GB buffers, 16-byte "
                "accesses, L2 flushed before each run; copy counts read + write",
            p.totalGlobalMem / 1073741824.0, h.hbm_read, h.hbm_write, h.hbm_copy, h.hbm_buffer / 1e9);
    if (h.hbm_theory > 0) appendf(md, "; theoretical %.0f GB/s (memory clock × bus width × 2)", h.hbm_theory);
    appendf(md, " |\n| L2 | %.0f MiB | read %.0f GB/s | a %.1f MB buffer read %d times, warm, around L1 "
                "(`ld.global.cg`) |\n", p.l2CacheSize / 1048576.0, h.l2_read, h.l2_buffer / 1e6, L2_PASSES);
    appendf(md, "| shared memory (SRAM) | %zu KiB/SM × %d = %.1f MiB | read %.0f GB/s · write %.0f | every SM "
                "re-reading (re-writing) 32 KB of its own, conflict-free 16-byte accesses; theoretical %.0f GB/s "
                "(32 banks × 4 bytes per clock per SM at %d MHz) |\n",
            p.sharedMemPerMultiprocessor / 1024, sms, h.sram_bytes() / 1048576.0, h.smem_read, h.smem_write,
            h.smem_theory(), h.sm_mhz);
    appendf(md, "| registers | %d KiB/SM × %d = %.1f MiB | not measured | operands of every instruction |\n",
            p.regsPerMultiprocessor * 4 / 1024, sms, p.regsPerMultiprocessor * 4.0 * sms / 1048576.0);
    appendf(md, "| tensor cores, bf16 | | %.0f TFLOP/s | cuBLASLt %d³ matmul, bf16 in, fp32 accumulate, random data, "
                "median of 10 after 3 warm-ups |\n", h.bf16_tflops, MATMUL_N);
    appendf(md, "| CUDA cores, fp32 | | %.1f TFLOP/s | register-only FMA chains, 2 FLOPs per FMA |\n\n", h.fp32_tflops);
    appendf(md, "SRAM against HBM: %.1f× the read bandwidth, 1/%.0f of the capacity. Ridge point (bf16 peak over "
                "bandwidth): %.0f FLOP per HBM byte, %.0f per SRAM byte.\n\n",
            h.smem_read / h.hbm_read, p.totalGlobalMem / h.sram_bytes(), h.bf16_tflops * 1e3 / h.roof(),
            h.bf16_tflops * 1e3 / h.smem_read);

    appendf(md, "Naive and flash attention on the roofline: causal forward, bf16, FLOPs by the FlashAttention count "
                "4·B·H·T²·D/2 (the naive kernels compute the masked half too, uncounted). Minimum bytes: every input "
                "read once, every output written once (qkv, out, and lse or, for naive, P, which its backward "
                "reads). Model: flash = the minimum; naive = the minimum + S and P's round trips through HBM "
                "(8·B·H·T² bytes: S written in fp32 and read back over its causal half, P read back by P·V) + the "
                "layout copies around them (16·B·T·C bytes). Intensity = FLOPs / HBM bytes, Nsight Compute's where "
                "measured, else the model's; attainable = min(%.0f TFLOP/s, intensity × %.0f GB/s), the measured "
                "bf16 peak and the best HBM figure above. %s\n\n",
            h.bf16_tflops, h.roof(),
            have_ncu ? "Measured bytes: `ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum` over all kernels "
                       "of one forward, caches flushed first; writes still in L2 when a kernel ends are not counted."
                     : "No Nsight Compute bytes were given (--bytes): the intensities are the model's.");
    appendf(md, "| kernel | shape (B,H,T,D) | ms | TFLOP/s | HBM bytes, ncu (read + write) | model | minimum | "
                "FLOP/byte | attainable TFLOP/s | %% of attainable | bound |\n");
    appendf(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n");
    for (const AttnRow& r : rows) {
        const std::string name = r.kernel + (r.engine.empty() ? "" : " (" + r.engine + ")");
        if (r.status != "ok") {
            appendf(md, "| %s | %s | %s | | | | | | | | |\n", name.c_str(), r.s.str().c_str(), r.status.c_str());
            continue;
        }
        const double tf = r.flops / (r.ms * 1e9), att = attainable_tflops(r, h);
        const std::string ncu = r.measured() ? fmt_bytes(r.ncu_read + r.ncu_write) + " (" + fmt_bytes(r.ncu_read) +
                                                   " + " + fmt_bytes(r.ncu_write) + ")"
                                             : std::string("not measured");
        appendf(md, "| %s | %s | %.3f | %.1f | %s | %s | %s | %.1f%s | %.1f | %.0f%% | %s |\n", name.c_str(),
                r.s.str().c_str(), r.ms, tf, ncu.c_str(), fmt_bytes(r.model_bytes).c_str(),
                fmt_bytes(r.min_bytes).c_str(), r.flops / r.bytes(), r.measured() ? "" : " (model)", att,
                100 * tf / att, bound(r, h));
    }
    return md;
}

std::string csv(const Hierarchy& h, const std::vector<AttnRow>& rows, const std::string& cmd) {
    std::string out;
    appendf(out, "# memory wall; card: %s, date: %s, command: %s\nitem,shape,metric,value,unit\n", h.prop.name,
            h.date.c_str(), cmd.c_str());
    const std::pair<const char*, double> figures[] = {
        {"hbm,,read", h.hbm_read}, {"hbm,,write", h.hbm_write}, {"hbm,,copy", h.hbm_copy}, {"l2,,read", h.l2_read},
        {"smem,,read", h.smem_read}, {"smem,,write", h.smem_write}};
    for (const auto& [what, v] : figures) appendf(out, "%s,%.1f,GB/s\n", what, v);
    appendf(out, "tensor_bf16,,matmul,%.1f,TFLOP/s\nfp32_fma,,fma,%.2f,TFLOP/s\n", h.bf16_tflops, h.fp32_tflops);
    for (const AttnRow& r : rows) {
        if (r.status != "ok") continue;
        const std::string item = "attention_" + r.kernel, shape = "\"" + r.s.str() + "\"";
        const std::pair<const char*, double> m[] = {
            {"ms", r.ms}, {"tflops", r.flops / (r.ms * 1e9)}, {"ncu_read_bytes", r.ncu_read},
            {"ncu_write_bytes", r.ncu_write}, {"model_bytes", r.model_bytes}, {"min_bytes", r.min_bytes},
            {"flop_per_byte", r.flops / r.bytes()}, {"attainable_tflops", attainable_tflops(r, h)}};
        for (const auto& [metric, v] : m)
            if (v >= 0) appendf(out, "%s,%s,%s,%.6g,\n", item.c_str(), shape.c_str(), metric, v);
    }
    return out;
}

// ---------------------------------------------------------------------------------------------------------
// main

Shape parse_shape(const char* s) {
    Shape x{};
    char tail;
    if (sscanf(s, "%d,%d,%d,%d%c", &x.B, &x.NH, &x.T, &x.HS, &tail) != 4)
        fail("--shape: '%s' is not B,NH,T,HS (e.g. 8,12,1024,64)", s);
    if (x.B < 1 || x.B > 4096 || x.NH < 1 || x.NH > 256 || x.T < 1 || x.T > (1 << 20) || x.HS < 1 || x.HS > 256)
        fail("--shape: %s is out of range (B 1..4096, NH 1..256, T 1..2^20, HS 1..256)", s);
    return x;
}

const char* USAGE =
    "usage: ./build/memory_wall [--out PAGE.md] [--csv FILE.csv] [--bytes NCU_BYTES]\n"
    "       ./build/memory_wall --list-shapes\n"
    "       ./build/memory_wall --once naive|flash --shape B,NH,T,HS\n"
    "Measures this GPU's memory hierarchy and places naive and flash attention on its roofline (doc/memory_wall.md).\n";

// The card's fixed facts: cudaDeviceProp, the peak SM clock, the theoretical HBM bandwidth.
Hierarchy describe_card() {
    Hierarchy h;
    int dev, mem_khz = 0, bus_bits = 0, sm_khz = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&h.prop, dev));
    cudaCheck(cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, dev));
    cudaCheck(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev));
    cudaCheck(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
    h.sm_mhz = sm_khz / 1000;
    h.hbm_theory = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    h.date = utc_timestamp();
    return h;
}

void print_summary(const Hierarchy& h, const std::vector<AttnRow>& rows) {
    printf("summary: HBM %.0f GB/s (read), L2 %.0f GB/s, SRAM %.0f GB/s = %.1fx HBM; bf16 %.0f TFLOP/s, fp32 %.1f; "
           "ridge %.0f FLOP per HBM byte\n", h.hbm_read, h.l2_read, h.smem_read, h.smem_read / h.hbm_read,
           h.bf16_tflops, h.fp32_tflops, h.bf16_tflops * 1e3 / h.roof());
    for (const AttnRow& r : rows) {
        if (r.status != "ok") continue;
        const double tf = r.flops / (r.ms * 1e9);
        printf("summary: %-5s %-16s %8.3f ms %6.1f TFLOP/s %7.1f FLOP/byte (%s) %s-bound, %3.0f%% of attainable\n",
               r.kernel.c_str(), r.s.str().c_str(), r.ms, tf, r.flops / r.bytes(), r.measured() ? "ncu" : "model",
               bound(r, h), 100 * tf / attainable_tflops(r, h));
    }
}

int main(int argc, char** argv) {
    return run_main([&] {
        std::string out_md, out_csv, bytes_file, once, shape, cmd = "./build/memory_wall";
        for (int i = 1; i < argc; i++) cmd += std::string(" ") + argv[i];
        for (int i = 1; i < argc; i++) {
            const std::string a = argv[i];
            if (a == "-h" || a == "--help") {
                printf("%s", USAGE);
                return 0;
            }
            if (a == "--list-shapes") {
                for (const Shape& s : kShapes) printf("%d,%d,%d,%d\n", s.B, s.NH, s.T, s.HS);
                return 0;
            }
            std::string* value = a == "--out" ? &out_md : a == "--csv" ? &out_csv : a == "--bytes" ? &bytes_file
                               : a == "--once" ? &once : a == "--shape" ? &shape : nullptr;
            if (!value) fail("unknown argument '%s' (see --help)", a.c_str());
            if (i + 1 >= argc) fail("%s needs a value (see --help)", a.c_str());
            *value = argv[++i];
        }
        if (!once.empty() && once != "naive" && once != "flash")
            fail("--once: '%s' is not naive or flash", once.c_str());
        if (once.empty() != shape.empty()) fail("--once and --shape go together (see --help)");
        const Shape once_shape = shape.empty() ? Shape{} : parse_shape(shape.c_str());
        const NcuBytes ncu = bytes_file.empty() ? NcuBytes{} : read_ncu_bytes(bytes_file);
        int gpus = 0;
        if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0)
            fail("no CUDA GPU found (memory_wall measures the one it runs on)");
        cudaStream_t stream;
        cudaCheck(cudaStreamCreate(&stream));

        if (!once.empty()) {  // one forward, nothing else: every kernel ncu sees is this forward's
            AttnRow r(once, once_shape);
            run_attention(r, SEED, stream, false);
            fprintf(stderr, "ran %s %s once (seed %llu)\n", once.c_str(), r.s.str().c_str(), (unsigned long long)SEED);
            return 0;
        }
        Hierarchy h = describe_card();
        printf("memory_wall on %s, seed %llu\n", h.prop.name, (unsigned long long)SEED);
        measure_hbm_and_l2(h, stream);
        measure_sram_and_fma(h, stream);
        measure_matmul(h, SEED, stream);
        std::vector<AttnRow> rows;
        for (const Shape& s : kShapes)
            for (const char* k : {"naive", "flash"}) {
                AttnRow r(k, s);
                try {
                    run_attention(r, SEED, stream, true);
                } catch (const Error& e) {
                    r.status = std::string("not run: ") + e.what();
                    printf("attention %s %s: %s\n", k, s.str().c_str(), r.status.c_str());
                }
                const auto it = ncu.find({r.kernel, s.B, s.NH, s.T, s.HS});
                if (it != ncu.end()) std::tie(r.ncu_read, r.ncu_write) = it->second;
                rows.push_back(r);
            }

        const std::string md = page(h, rows, cmd, !ncu.empty());
        if (out_md.empty()) printf("\n%s\n", md.c_str());
        else write_file_atomic(out_md, md);
        if (!out_csv.empty()) write_file_atomic(out_csv, csv(h, rows, cmd));
        for (const std::string& f : {out_md, out_csv})
            if (!f.empty()) printf("wrote %s\n", f.c_str());
        print_summary(h, rows);
        const bool all_ran = std::all_of(rows.begin(), rows.end(), [](const AttnRow& r) { return r.status == "ok"; });
        return all_ran ? 0 : 1;
    });
}
