// The MLP's GELU matmuls: the wgmma engine (llmc/matmul/wgmma_gelu.cuh) against cuBLASLt with the same fused
// epilogue (GELU_AUX_BIAS forward, DGELU backward) and against cuBLASLt's plain GEMM of the same shape (the bias
// epilogue forward, none backward): what the epilogue costs each of them. A third row per shape adds the bias
// gradient of the layer that made pre, dbias += colsum(dpre): summed by the engine in its epilogue, and
// by the column-sum kernel (llmc/matmul.cuh) reading dpre back after cuBLASLt.
//   ./build/matmul_gelu_bench [--out FILE]        validates every shape, then times the GPT-2 ones
//   --time-only (no validation: for experiments that skip part of the product), --first (d12 B=16 only: for ncu),
//   --odd (validates the odd shapes only, times nothing: small enough for compute-sanitizer)
// Validation: sampled rows (the first, the last and 62 random ones), every column, against the double-precision
// oracle (llmc/ref); both GPU paths are judged, and the engine must meet the project's bf16 rule with cuBLASLt
// in the naive kernel's place (max error ≤ 2 × cuBLASLt's + half an ulp). Outputs are poisoned with NaN first.
// Timing: dev/harness.cuh's benchmark (CUDA events, L2 flushed before each run, median).
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>
#include "dev/harness.cuh"
#include "llmc/matmul.cuh"
#include "llmc/matmul/wgmma_gelu.cuh"
#include "llmc/peak.h"
#include "llmc/profile.h"
#include "llmc/ref/layers.h"

using namespace flashgpt2;
namespace hn = flashgpt2::harness;
using bf16 = __nv_bfloat16;

struct Shape {
    int M, N, K;
    const char* what;
};

struct Buffers {
    std::vector<uint16_t> a, w, bias, pre_in;  // host copies (bf16 bits)
    bf16 *da, *dw, *dbias, *dpre_in, *dout, *dpre;
    float* ws;  // the column sums' partials (matmul_backward_workspace_bytes)
};

static bf16* upload(const std::vector<uint16_t>& h) {
    bf16* d;
    cudaCheck(cudaMalloc(&d, h.size() * 2));
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    return d;
}
static std::vector<float> download(const bf16* d, size_t n) {
    std::vector<uint16_t> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) f[i] = hn::bf16_to_float(h[i]);
    return f;
}

static Buffers make_buffers(const Shape& s, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    Buffers b;
    auto fill = [&](std::vector<uint16_t>& v, size_t n, float scale) {
        v.resize(n);
        for (auto& x : v) x = hn::bf16_bits(scale * u(rng));
    };
    fill(b.a, (size_t)s.M * s.K, 1.0f);
    fill(b.w, (size_t)s.N * s.K, 2.0f / std::sqrt((float)s.K));  // pre of order 1: GELU's curved part
    fill(b.bias, s.N, 0.5f);
    fill(b.pre_in, (size_t)s.M * s.N, 3.0f);
    b.da = upload(b.a), b.dw = upload(b.w), b.dbias = upload(b.bias), b.dpre_in = upload(b.pre_in);
    cudaCheck(cudaMalloc(&b.dout, (size_t)s.M * s.N * 2));
    cudaCheck(cudaMalloc(&b.dpre, (size_t)s.M * s.N * 2));
    cudaCheck(cudaMalloc(&b.ws, matmul_backward_workspace_bytes(Variant::flash, s.M, s.N, s.N)));
    return b;
}
static void free_buffers(Buffers& b) {
    for (bf16* p : {b.da, b.dw, b.dbias, b.dpre_in, b.dout, b.dpre}) cudaCheck(cudaFree(p));
    cudaCheck(cudaFree(b.ws));
}

// The two passes, by engine. Forward: w is (N, K); backward: the same w bytes read as (K, N), dout = a.
static void run_forward(bool engine, const Shape& s, Buffers& b, bool fused = true) {
    if (engine) matmul_forward_gelu_wgmma(b.dout, b.dpre, b.da, b.dw, b.dbias, s.M, s.N, s.K, 0);
    else matmul_forward_flash(b.dout, b.da, b.dw, b.dbias, s.M, s.K, s.N, fused ? b.dpre : nullptr, 0,
                              MatmulEngine::cublaslt);  // (the default engine on Hopper is the wgmma one)
}
static void run_backward(bool engine, const Shape& s, Buffers& b, bool fused = true) {
    if (engine) matmul_backward_dgelu_wgmma(b.dout, nullptr, b.dpre_in, b.da, b.dw, s.M, s.N, s.K, 0);
    else  // column-major: dpre^T (N, M) = (w as (N,K) col-major) @ (dout as (K,M))
        cublaslt_matmul(b.dout, b.dw, b.da, s.N, s.M, s.K, false, false, s.N, s.K, s.N, 0.0f,
                        fused ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT, nullptr,
                        fused ? b.dpre_in : nullptr, s.N, 0);
}

// The backward and the bias gradient (into b.dbias, which is only timed): the engine's slice sums, then their
// column sum; or the pass, then the column sum of dpre.
static void run_backward_dbias(bool engine, const Shape& s, Buffers& b, bool fused = true) {
    if (engine) {  // the workspace carved as matmul_backward_flash carves it
        const int slices = dgelu_colsum_slices(s.M);
        WorkspaceCarver carve(b.ws);
        float* sums = carve.take<float>((size_t)slices * s.N);  // (M / 64, N)
        matmul_backward_dgelu_wgmma(b.dout, sums, b.dpre_in, b.da, b.dw, s.M, s.N, s.K, 0);
        colsum_flash(b.dbias, carve.p, sums, slices, s.N, 0);
    } else {
        run_backward(false, s, b, fused);
        colsum_flash(b.dbias, b.ws, (const bf16*)b.dout, s.M, s.N, 0);
    }
}

// Validates one pass of one shape; returns false on failure.
static bool validate(const Shape& s, Buffers& b, bool backward, std::mt19937& rng) {
    std::vector<int> rows = {0, s.M - 1};
    std::uniform_int_distribution<int> pick(0, s.M - 1);
    while ((int)rows.size() < std::min(s.M, 64)) rows.push_back(pick(rng));
    // the oracle (llmc/ref, in double) on the sampled rows, as the GPU tests call it
    const int R = (int)rows.size();
    auto as_double = [](uint16_t u) { return (double)hn::bf16_to_float(u); };
    std::vector<double> a_rows((size_t)R * s.K), w((size_t)s.N * s.K), ref_out((size_t)R * s.N), ref_pre((size_t)R * s.N);
    for (int i = 0; i < R; i++)
        for (int k = 0; k < s.K; k++) a_rows[(size_t)i * s.K + k] = as_double(b.a[(size_t)rows[i] * s.K + k]);
    for (int c = 0; c < s.N; c++)  // as (N, K): the forward's layout; the backward reads the same bytes as (K, N)
        for (int k = 0; k < s.K; k++)
            w[(size_t)c * s.K + k] = as_double(backward ? b.w[(size_t)k * s.N + c] : b.w[(size_t)c * s.K + k]);
    if (backward) {  // dpre = (dout w) * gelu'(pre); ref::gelu_backward adds into its output
        std::vector<double> lin((size_t)R * s.N), pre_rows((size_t)R * s.N);
        ref::matmul_forward<double>(lin.data(), a_rows.data(), w.data(), nullptr, R, s.K, s.N);
        for (int i = 0; i < R; i++)
            for (int c = 0; c < s.N; c++) pre_rows[(size_t)i * s.N + c] = as_double(b.pre_in[(size_t)rows[i] * s.N + c]);
        std::fill(ref_out.begin(), ref_out.end(), 0.0);
        ref::gelu_backward<double>(ref_out.data(), pre_rows.data(), lin.data(), R * s.N);
    } else {  // pre = a w^T + bias, out = gelu(pre)
        std::vector<double> bias(s.N);
        for (int c = 0; c < s.N; c++) bias[c] = as_double(b.bias[c]);
        ref::matmul_forward<double>(ref_pre.data(), a_rows.data(), w.data(), bias.data(), R, s.K, s.N);
        ref::gelu_forward<double>(ref_out.data(), ref_pre.data(), R * s.N);
    }
    rule::ErrorStats err[2][2];  // [engine][out, pre]
    for (int engine = 0; engine < 2; engine++) {
        hn::poison(b.dout, (size_t)s.M * s.N * 2, 0);
        hn::poison(b.dpre, (size_t)s.M * s.N * 2, 0);
        backward ? run_backward(engine, s, b) : run_forward(engine, s, b);
        cudaCheck(cudaDeviceSynchronize());
        for (int t = 0; t < (backward ? 1 : 2); t++) {
            const std::vector<float> got = download(t == 0 ? b.dout : b.dpre, (size_t)s.M * s.N);
            rule::ErrorAccumulator acc;
            for (float g : got)
                if (!std::isfinite(g)) acc.s.nonfinite++;  // anywhere in the output, sampled or not
            for (size_t i = 0; i < rows.size(); i++)
                for (int c = 0; c < s.N; c++)
                    acc.add(got[(size_t)rows[i] * s.N + c], (t == 0 ? ref_out : ref_pre)[i * s.N + c], i * s.N + c);
            err[engine][t] = acc.finish();
        }
    }
    bool ok = true;
    for (int t = 0; t < (backward ? 1 : 2); t++) {
        const bool pass = rule::bf16_ok(err[1][t], err[0][t], true);
        ok = ok && pass;
        printf("  %-8s %-4s M %6d N %5d K %5d  %zu rows: wgmma max %.3e rel %.2e | cuBLASLt max %.3e rel %.2e  %s\n",
               backward ? "backward" : "forward", t == 0 ? "out" : "pre", s.M, s.N, s.K, rows.size(), err[1][t].max_abs,
               err[1][t].rel, err[0][t].max_abs, err[0][t].rel, pass ? "ok" : "FAIL");
    }
    return ok;
}

static int bench_main(int argc, char** argv) {
    std::string out_path;
    bool validate_first = true, only_first = false, only_odd = false;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc) out_path = argv[++i];
        else if (a == "--time-only") validate_first = false;   // experiments that do not compute the product
        else if (a == "--first") only_first = true;            // the first GPT-2 shape only (for a profiler)
        else if (a == "--odd") only_odd = true;                // the odd shapes' validation only (for a sanitizer)
        else fail("usage: %s [--out FILE] [--time-only] [--first] [--odd]", argv[0]);
    }
    if (!matmul_gelu_wgmma_supports(8, 8)) fail("matmul_gelu_bench: needs an sm_90a build on an H100/H200");
    std::mt19937 rng(1234);
    const std::vector<Shape> odd = {{1, 8, 8, "odd"}, {74, 384, 96, "odd"}, {300, 264, 200, "odd"},
                                    {1000, 520, 776, "odd"},
                                    {4100, 1160, 776, "odd"}};  // 165 tiles: a second one for some blocks on 132 SMs
    const std::vector<Shape> gpt2 = {{16384, 3072, 768, "d12 B=16"}, {65536, 3072, 768, "d12 B=64"},
                                     {16384, 4096, 1024, "d24 B=16"}, {8192, 6400, 1600, "d48 B=8"}};
    bool ok = true;
    printf("validation (bf16 rule, cuBLASLt in the naive kernel's place):\n");
    for (int list = 0; list < (only_odd ? 1 : 2); list++)  // the odd shapes, then the GPT-2 ones
        for (const Shape& s : list == 0 ? odd : gpt2) {
            if (!validate_first) break;
            Buffers b = make_buffers(s, rng);
            ok = validate(s, b, false, rng) && ok;
            ok = validate(s, b, true, rng) && ok;
            free_buffers(b);
        }
    if (!ok) {
        printf("validation FAILED: not timed\n");
        return 1;
    }
    if (only_odd) return 0;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    std::string table = std::string("The MLP's GELU matmuls, bf16: the wgmma engine (llmc/matmul/wgmma_gelu.cuh) against "
        "cuBLASLt with the same fused epilogue (GELU_AUX_BIAS, DGELU) and cuBLASLt's plain GEMM of the shape (bias "
        "only; none); \"backward + colsum(dpre)\" adds the bias gradient of pre, summed by the engine in its epilogue and "
        "by llmc's column-sum kernel after cuBLASLt. Card: ") + prop.name + " · " + utc_timestamp() + " · `make bench-matmul` (dev/matmul/gelu_bench.cu)"
        "; CUDA events, median, L2 flushed before each run; % of the " + PEAK_BF16_NAME + ".\n\n"
        "| shape (M, N, K) | model | pass | wgmma (ms) | cuBLASLt fused (ms) | cuBLASLt plain (ms) | wgmma TFLOP/s | "
        "% of peak | fused ÷ wgmma |\n|---|---|---|--:|--:|--:|--:|--:|--:|\n";
    for (const Shape& s : gpt2) {
        if (only_first && &s != &gpt2[0]) break;
        Buffers b = make_buffers(s, rng);
        for (int pass = 0; pass < 3; pass++) {  // forward, backward, backward + the bias gradient of pre
            double ms[3];
            for (int v = 0; v < 3; v++) {  // wgmma, cuBLASLt fused, cuBLASLt plain
                auto launch = [&] {
                    if (pass == 0) run_forward(v == 0, s, b, v < 2);
                    else if (pass == 1) run_backward(v == 0, s, b, v < 2);
                    else run_backward_dbias(v == 0, s, b, v < 2);
                };
                ms[v] = hn::benchmark(launch, 0).median_ms;
            }
            char line[256];
            const double tflops = 2.0 * s.M * s.N * s.K / (ms[0] * 1e9);
            snprintf(line, sizeof line, "| (%d, %d, %d) | %s | %s | %.4f | %.4f | %.4f | %.0f | %.0f%% | %.2f× |\n",
                     s.M, s.N, s.K, s.what,
                     pass == 0 ? "forward (GELU, bias)" : pass == 1 ? "backward (DGELU)" : "backward + colsum(dpre)",
                     ms[0], ms[1], ms[2],
                     tflops, 100.0 * tflops / PEAK_BF16_TFLOPS, ms[1] / ms[0]);
            table += line;
            if (pass == 2) {  // what the engine did before it summed its tiles: the pass, then the column sum of dpre
                const double sep = hn::benchmark([&] {
                    run_backward(true, s, b);
                    colsum_flash(b.dbias, b.ws, (const bf16*)b.dout, s.M, s.N, 0);
                }, 0).median_ms;
                printf("  %s: wgmma then the column sum of dpre %.4f ms, with the slice sums %.4f ms\n", s.what, sep, ms[0]);
            }
        }
        free_buffers(b);
    }
    printf("\n%s", table.c_str());
    if (!out_path.empty()) write_file_atomic(out_path, table);
    return 0;
}

// Bad arguments and a card without sm_90a: one line and exit status 1 (run_main), not an abort.
int main(int argc, char** argv) { return run_main([&] { return bench_main(argc, argv); }); }
