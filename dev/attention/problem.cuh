// What both attention runners (the forward ladder's and the backward's) share: a problem shape and the command-line
// words that name one, the anchor shapes the tables report, device buffers that free themselves, the card's name,
// and the CPU oracle of the forward (llmc/ref/attention.h in double) on the heads a check covers.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "llmc/args.h"
#include "llmc/common.cuh"
#include "llmc/error.h"
#include "llmc/ref/attention.h"
#include "llmc/ref/attention_sampled.h"

namespace flashgpt2::dev {

struct Shape {
    int B, NH, T, HS;
    std::string str() const {
        char b[64];
        snprintf(b, sizeof b, "(%d,%d,%d,%d)", B, NH, T, HS);
        return b;
    }
    size_t elems() const { return (size_t)B * NH * T * HS; }  // of q, k, v, o: (B, NH, T, HS)
    size_t rows() const { return (size_t)B * NH * T; }        // of lse: (B, NH, T)
};
// The words after `runner fwd V` or `runner bwd V`: [B NH T HS] [--seed S]. No shape: the pass validates its own
// list of edge shapes. Elements is the pass's largest buffer in units of B·NH·T·HS (1 for the forward's q, k, v,
// o; 3 for the backward's), which the runner's 32-bit offsets keep below 2^31.
struct ShapeArgs {
    uint64_t seed;              // --seed S, else a random one (printed, so a failure can be rerun)
    std::optional<Shape> shape;  // all four of B NH T HS, or none
};
inline ShapeArgs parse_shape_args(const char* pass, int argc, char** argv, int elements) {  // argv[1] = V
    ShapeArgs a{std::random_device{}(), std::nullopt};
    std::vector<int> pos;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) a.seed = (uint64_t)args::parse_int("--seed", argv[++i], 0, 2147483647);
        else pos.push_back((int)args::parse_int(std::string(pass) + " B/NH/T/HS", argv[i], 1, 1 << 24));
    }
    if (pos.empty()) return a;
    if (pos.size() != 4) fail("%s: give all four of B NH T HS, or none", pass);
    const Shape s{pos[0], pos[1], pos[2], pos[3]};
    if ((size_t)s.B * s.NH > 65535) fail("%s: B·NH = %zu exceeds 65535 (the rungs put it in grid.y)", pass, (size_t)s.B * s.NH);
    const std::string times = elements == 1 ? "" : std::to_string(elements) + "·";
    if (elements * s.elems() >= (1ull << 31))
        fail("%s: %sB·NH·T·HS = %zu elements: this runner stays below 2^31", pass, times.c_str(), elements * s.elems());
    a.shape = s;
    return a;
}

// The shapes both ladders are benchmarked on (issue 17's): GPT-2 small's heads at T = 1K to 32K, and head size 128.
const Shape kAnchorShapes[] = {{8, 12, 1024, 64},  {64, 12, 1024, 64},  {4, 12, 4096, 64}, {1, 12, 16384, 64},
                               {1, 12, 32768, 64}, {16, 16, 2048, 128}, {4, 16, 8192, 128}};


// ---- device memory that frees itself; a failed allocation is an Error (the bench skips that rung) ----
struct DeviceBuffer {
    void* p = nullptr;
    explicit DeviceBuffer(size_t bytes, const char* what = "buffer") {
        if (bytes == 0) return;
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
            (void)cudaGetLastError();  // clear the (non-sticky) allocation error
            p = nullptr;
            fail("%s: cannot allocate %.2f GB on the GPU", what, bytes / 1e9);
        }
    }
    ~DeviceBuffer() { if (p) cudaFree(p); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// ---- the oracle: llmc/ref's standard attention in double, on the heads we check ----
// The reference takes llm.c's qkv layout (B, T, 3C); we pack the n checked heads as the n heads of one
// batch row (C = n·HS), so its OpenMP loop over heads runs them in parallel. lse comes from its scores.
template <class S>
std::vector<S> pack_heads(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                          const std::vector<float>& v, const std::vector<int>& heads) {
    const int n = (int)heads.size(), T = s.T, HS = s.HS, C = n * s.HS;
    std::vector<S> qkv((size_t)T * 3 * C);  // (1, T, 3C)
    for (int hh = 0; hh < n; hh++)
        for (int t = 0; t < T; t++)
            for (int d = 0; d < HS; d++) {
                const size_t src = ((size_t)heads[hh] * T + t) * HS + d, dst = (size_t)t * 3 * C + hh * HS + d;
                qkv[dst] = q[src];
                qkv[dst + C] = k[src];
                qkv[dst + 2 * C] = v[src];
            }
    return qkv;
}
inline void oracle(const Shape& s, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
            const std::vector<int>& heads, std::vector<double>& o_ref, std::vector<double>& lse_ref) {
    const int n = (int)heads.size(), T = s.T, HS = s.HS, C = n * s.HS;
    const std::vector<double> qkv = pack_heads<double>(s, q, k, v, heads);   // (1, T, 3C)
    std::vector<double> out((size_t)T * C);                                   // (1, T, C)
    std::vector<double> preatt((size_t)n * T * T), att((size_t)n * T * T);    // (1, n, T, T) each
    ref::attention_forward<double>(out.data(), preatt.data(), att.data(), qkv.data(), 1, T, C, n);
    o_ref.assign(s.elems(), 0.0);
    lse_ref.assign(s.rows(), 0.0);
    for (int hh = 0; hh < n; hh++)
        for (int t = 0; t < T; t++) {
            const size_t row = (size_t)heads[hh] * T + t;
            for (int d = 0; d < HS; d++) o_ref[row * HS + d] = out[(size_t)t * C + hh * HS + d];
            const double* sc = &preatt[((size_t)hh * T + t) * T];  // scaled scores of row t; causal prefix 0..t
            double m = sc[0], sum = 0;
            for (int t2 = 1; t2 <= t; t2++) m = std::max(m, sc[t2]);
            for (int t2 = 0; t2 <= t; t2++) sum += std::exp(sc[t2] - m);
            lse_ref[row] = m + std::log(sum);
        }
}

// The oracle's budget per check: ~3e10 double multiply-adds (a whole head's two T×T×HS matmuls) and 4 GB of
// T×T buffers. heads_to_check: how many whole heads fit it, all of them on small problems, at least one.
constexpr double kOracleFma = 3e10, kOracleBytes = 4e9;
inline int heads_to_check(const Shape& s) {
    const double fma_per_head = 2.0 * s.T * s.T * s.HS, bytes_per_head = 2.0 * s.T * s.T * sizeof(double);
    const double n = std::min({(double)s.B * s.NH, 48.0, std::floor(kOracleFma / fma_per_head), std::floor(kOracleBytes / bytes_per_head)});
    return std::max(1, (int)n);
}
// Where even one whole head is beyond the budget (T >= 16384 at head size 64), the forward's oracle checks
// sampled query rows instead (the backward's runner samples from T = 4096 on: its oracle costs more per row).
inline bool oracle_samples_rows(const Shape& s) {
    return 2.0 * s.T * s.T * s.HS > kOracleFma || 2.0 * s.T * s.T * sizeof(double) > kOracleBytes;
}
// The sampled query rows (T > 128): both sides of the 64- and 128-row tile edges, the ends, the middle, and 24 at
// random (repeats allowed).
inline std::vector<int> sampled_rows(int T, std::mt19937_64& rng) {
    std::vector<int> rows = {0, 1, 63, 64, 127, 128, T / 2, T - 2, T - 1};
    for (int k = 0; k < 24; k++) rows.push_back((int)(rng() % (uint64_t)T));
    return rows;
}
// O and lse of the checked heads at the sampled rows only (llmc/ref/attention_sampled.h: each head's rows in
// parallel, no T×T buffer), written into o_ref, lse_ref at their places in (B, NH, T, HS) and (B, NH, T).
inline void oracle_rows(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v, const std::vector<int>& heads, const std::vector<int>& rows,
                        std::vector<double>& o_ref, std::vector<double>& lse_ref) {
    const int n = (int)heads.size(), T = s.T, HS = s.HS, C = n * s.HS;
    const std::vector<float> qkv = pack_heads<float>(s, q, k, v, heads);  // (1, T, 3C), as oracle() packs them
    const std::vector<float> dout((size_t)T * C, 0.0f);                   // (1, T, C): only o and lse are used
    std::vector<int> packed(n);
    for (int hh = 0; hh < n; hh++) packed[hh] = hh;
    const ref::SampledAttention a = ref::attention_sampled(qkv.data(), dout.data(), T, C, n, packed, rows, {});
    o_ref.assign(s.elems(), 0.0);
    lse_ref.assign(s.rows(), 0.0);
    for (int hh = 0; hh < n; hh++)
        for (size_t r = 0; r < rows.size(); r++) {
            const size_t row = (size_t)heads[hh] * T + rows[r], sample = (size_t)hh * rows.size() + r;
            for (int d = 0; d < HS; d++) o_ref[row * HS + d] = a.o[sample * HS + d];
            lse_ref[row] = a.lse[sample];
        }
}

inline std::string card_name() {
    int dev;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    return prop.name;
}

}  // namespace flashgpt2::dev
