// The dev/ ladders' harness, written once: validate() decides whether a kernel's outputs are right,
// benchmark() times it, parse_sdpa_log() reads the PyTorch anchors measured in the same GPU session.
// The attention forward ladder (dev/attention/runner.cu) uses all three; a backward ladder reuses them
// unchanged (more tensors to check, the same rules; sdpa_bench.py's bwd columns are parsed too).
//
// The rule is the project's one correctness rule, llmc/correctness.h (the same functions the GPU tests use):
//   fp32  relative error ‖got − ref‖ / ‖ref‖ <= 1e-5 against a double reference
//   bf16  the FlashAttention rule: max |got − ref| at most 2× that of the naive kernel run in the same
//         precision on the same inputs, plus half an ulp; the naive bf16 kernel itself within the sanity bound
// Every tensor is copied back whole and scanned: a NaN or inf anywhere fails (outputs are poisoned with NaN
// before the kernel runs, so an element it never wrote fails too), even where the reference checks a subset.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>
#include "llmc/common.cuh"
#include "llmc/correctness.h"
#include "llmc/error.h"

namespace flashgpt2::harness {

// ---- bf16 on the host: bit conversions, round to nearest even (what __float2bfloat16 does) ----
inline uint16_t bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays a (quiet) NaN
    u += 0x7fffu + ((u >> 16) & 1u);                       // add half an ulp, ties go to the even neighbour
    return (uint16_t)(u >> 16);
}
inline float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float round_bf16(float f) { return bf16_to_float(bf16_bits(f)); }

// Fill a device buffer with NaN: every byte 0xFF is a NaN both as fp32 (0xFFFFFFFF) and as bf16 (0xFFFF).
inline void poison(void* dptr, size_t bytes, cudaStream_t stream) {
    cudaCheck(cudaMemsetAsync(dptr, 0xFF, bytes, stream));
}

// ---- comparing one tensor with its reference ----
using Range = std::pair<size_t, size_t>;  // [begin, end) element indices the reference computed

struct TensorCheck {
    std::string name;
    std::vector<float> got;      // the whole tensor from the device, as float
    const double* ref;           // same length as got; only elements inside `ranges` are compared
    std::vector<Range> ranges;   // which elements the reference filled (all of them on small problems)
    bool stored_bf16 = true;     // under the bf16 rule: the kernel stores this tensor in bf16 (o) or fp32 (lse)
    double input_err = 0;        // under the bf16 rule: error the kernel inherits from a rounded input that the
                                 // naive kernel does not read (the flash backward's bf16 O), added to the atol
};

using Compared = rule::ErrorStats;  // plus the tensor's name and size, below

struct NamedCompared {
    std::string name;
    size_t total = 0;  // elements in the tensor
    Compared c;
};

inline NamedCompared compare(const TensorCheck& t) {
    rule::ErrorAccumulator acc;
    for (const Range& r : t.ranges)
        for (size_t i = r.first; i < r.second; i++) acc.add(t.got[i], t.ref[i], i);
    NamedCompared n{t.name, t.got.size(), acc.finish()};
    n.c.nonfinite = 0;  // the whole tensor is scanned, not only the compared ranges
    for (float x : t.got) n.c.nonfinite += !std::isfinite(x);
    return n;
}

// ---- the rules ----
enum class Rule {
    Fp32,         // fp32 kernel vs double reference
    Bf16,         // bf16 kernel vs the naive bf16 kernel's error on the same inputs (FlashAttention rule)
    Bf16Baseline  // the naive bf16 kernel itself: the baseline the Bf16 rule leans on
};

struct Verdict {
    bool ok = true;
    std::vector<Compared> tensors;
};

// Compares each tensor, applies `rule`, prints one line per tensor. For Rule::Bf16, `baseline` holds the
// naive bf16 kernel's Compared for the same tensors on the same inputs (same order).
inline Verdict validate(const std::string& label, const std::vector<TensorCheck>& checks, Rule rule,
                        const std::vector<Compared>* baseline = nullptr) {
    if (rule == Rule::Bf16 && (!baseline || baseline->size() != checks.size()))
        fail("validate %s: the bf16 rule needs the naive bf16 kernel's errors for the same tensors", label.c_str());
    Verdict v;
    for (size_t t = 0; t < checks.size(); t++) {
        const NamedCompared n = compare(checks[t]);
        const Compared& c = n.c;
        bool ok;
        char rule_txt[160];
        if (rule == Rule::Fp32) {
            ok = rule::fp32_ok(c);
            snprintf(rule_txt, sizeof rule_txt, "rel %.2e <= %.0e", c.rel, rule::FP32_REL_TOL);
        } else if (rule == Rule::Bf16) {
            const Compared& naive = (*baseline)[t];
            ok = rule::bf16_ok(c, naive, checks[t].stored_bf16, checks[t].input_err);
            snprintf(rule_txt, sizeof rule_txt, "max %.2e <= 2 x naive-bf16 %.2e + atol %.1e, rel %.1e <= %.0e",
                     c.max_abs, naive.max_abs, rule::half_ulp(c.max_ref, checks[t].stored_bf16) + checks[t].input_err,
                     c.rel, rule::BF16_SANITY_REL);
        } else {
            ok = rule::bf16_sane(c);
            snprintf(rule_txt, sizeof rule_txt, "rel %.2e <= %.0e (the sanity bound)", c.rel, rule::BF16_SANITY_REL);
        }
        printf("  %-5s %s  %s  (max|err| %.2e at %zu, rel %.2e, %zu of %zu checked%s)\n", n.name.c_str(),
               ok ? "ok  " : "FAIL", rule_txt, c.max_abs, c.worst, c.rel, c.checked, n.total,
               c.nonfinite ? ", NaN/inf present" : "");
        if (c.nonfinite) printf("        %zu NaN/inf elements: unwritten (poison) or a real NaN\n", c.nonfinite);
        if (c.checked == 0) printf("        nothing was compared: the reference covered no element\n");
        v.ok = v.ok && ok;
        v.tensors.push_back(c);
    }
    printf("  %s: %s\n", label.c_str(), v.ok ? "PASS" : "FAIL");
    return v;
}

// ---- timing ----
struct BenchOpts {
    int warmup = 2;        // untimed runs first (first-call setup, clocks up, caches of descriptors)
    int min_reps = 3;      // at least this many timed runs...
    int max_reps = 100;    // ...at most this many...
    double budget_s = 1.0; // ...and stop adding runs once the timed loop has taken this long
};

struct Timing {
    double median_ms = 0, min_ms = 0;
    int reps = 0;
};

// Before each timed run a buffer twice the size of L2 is written, outside the timed region, so the run
// starts with cold caches as it would inside a model (inputs come from HBM, not from the previous run).
class L2Flusher {
  public:
    L2Flusher() {
        int dev, l2 = 0;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
        bytes_ = std::max<size_t>(2 * (size_t)l2, 1 << 20);
        cudaCheck(cudaMalloc(&buf_, bytes_));
    }
    ~L2Flusher() { cudaFree(buf_); }
    L2Flusher(const L2Flusher&) = delete;
    L2Flusher& operator=(const L2Flusher&) = delete;
    void flush(cudaStream_t stream, int value) { cudaCheck(cudaMemsetAsync(buf_, value & 0xff, bytes_, stream)); }

  private:
    void* buf_ = nullptr;
    size_t bytes_ = 0;
};

// Times `launch` (which must only enqueue work on `stream`) with CUDA events: warm-up, then L2 flush +
// timed run, repeated; returns the median. Slow kernels get fewer runs (time-bounded), never fewer than
// min_reps. Errors inside the launches surface at the synchronizations here.
inline Timing benchmark(const std::function<void()>& launch, cudaStream_t stream, const BenchOpts& opts = {}) {
    static L2Flusher flusher;
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    for (int i = 0; i < opts.warmup; i++) launch();
    cudaCheck(cudaStreamSynchronize(stream));
    std::vector<float> ms;
    const auto t0 = std::chrono::steady_clock::now();
    while ((int)ms.size() < opts.max_reps) {
        flusher.flush(stream, (int)ms.size());
        cudaCheck(cudaEventRecord(start, stream));
        launch();
        cudaCheck(cudaEventRecord(stop, stream));
        cudaCheck(cudaEventSynchronize(stop));
        float t;
        cudaCheck(cudaEventElapsedTime(&t, start, stop));
        ms.push_back(t);
        const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if ((int)ms.size() >= opts.min_reps && spent >= opts.budget_s) break;
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    std::vector<float> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    Timing r;
    r.reps = (int)sorted.size();
    r.min_ms = sorted.front();
    const size_t n = sorted.size();
    r.median_ms = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    return r;
}

// ---- anchors: scripts/torch/sdpa_bench.py's output, run in the same GPU session ----
// Its rows look like "  (8, 12, 1024, 64)      flash    0.123     164.0    0.456 ...":
// shape, backend, fwd ms, fwd TF/s, bwd ms, bwd TF/s, fwd+bwd TF/s; "failed: ..." rows are skipped.
struct AnchorRow {
    double fwd_ms = 0, fwd_tflops = 0, bwd_ms = 0, bwd_tflops = 0;
};
struct Anchors {
    std::string header;  // its first line: torch version and device name
    std::map<std::tuple<int, int, int, int, std::string>, AnchorRow> rows;  // (B, H, T, D, backend)
    const AnchorRow* find(int B, int H, int T, int D, const std::string& backend) const {
        auto it = rows.find(std::make_tuple(B, H, T, D, backend));
        return it == rows.end() ? nullptr : &it->second;
    }
};

inline Anchors parse_sdpa_log(const std::string& path) {
    std::ifstream in(path);
    if (!in) fail("--anchors %s: cannot open the file", path.c_str());
    Anchors a;
    std::string line;
    bool first = true;
    while (std::getline(in, line)) {
        if (first) { a.header = line; first = false; }
        const size_t open = line.find('('), close = line.find(')');
        if (open == std::string::npos || close == std::string::npos || close < open) continue;
        int B, H, T, D;
        char tail;
        if (sscanf(line.substr(open, close - open + 1).c_str(), "(%d, %d, %d, %d%c", &B, &H, &T, &D, &tail) != 5 ||
            tail != ')')
            continue;
        std::istringstream rest(line.substr(close + 1));
        std::string backend;
        AnchorRow r;
        if (!(rest >> backend >> r.fwd_ms >> r.fwd_tflops)) continue;  // "failed: ..." rows end up here
        if (!(rest >> r.bwd_ms >> r.bwd_tflops)) r.bwd_ms = r.bwd_tflops = 0;
        a.rows[std::make_tuple(B, H, T, D, backend)] = r;
    }
    if (a.rows.empty()) fail("--anchors %s: no SDPA rows found (expected the output of sdpa_bench.py)", path.c_str());
    return a;
}

}  // namespace flashgpt2::harness
