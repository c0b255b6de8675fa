// Helpers for the per-layer GPU tests: device buffers that start poisoned, uploads that round through floatX
// (so the oracle sees exactly the values the GPU sees), and the project's one correctness rule
// (llmc/correctness.h: fp32 rel <= 1e-5; bf16 the FlashAttention rule, flash max error <= 2x the naive kernel's
// in the same precision + half an ulp; NaN or Inf anywhere fails) applied to a naive/flash pair.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

#include "llmc/correctness.h"
#include "llmc/dataloader.h"  // write_token_file
#include "llmc/fileio.h"
#include "llmc/kernels.h"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"   // TOKENIZER_MAGIC

namespace flashgpt2::gtest {

// A fresh temporary directory for one test (checkpoints, logs), removed with everything in it at the end.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& tag) {
        path = std::filesystem::temp_directory_path() / ("flashgpt2_test_" + tag + "_" + std::to_string(getpid()));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string operator/(const std::string& name) const { return (path / name).string(); }
};

#if defined(ENABLE_FP32)
constexpr bool BF16_BUILD = false;
#else
constexpr bool BF16_BUILD = true;
#endif

// Is this device one the wgmma engine must run on (an sm_90 GPU; the build targets sm_90a by default)? Asked
// of the device, not of the engine's own check, so a check that wrongly says no fails the tests.
inline bool device_is_sm90() {
    int dev = 0, major = 0, minor = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0;
}

// ---- host conversions through the storage type ----
inline floatX to_x(double v) {
#if defined(ENABLE_FP32)
    return (float)v;
#else
    return __float2bfloat16((float)v);
#endif
}
#if !defined(ENABLE_FP32)
inline double from_x(__nv_bfloat16 v) { return (double)__bfloat162float(v); }
#endif
inline double from_x(float v) { return v; }
inline double from_x(int v) { return v; }

// ---- a device buffer that starts poisoned: every byte 0xFF is NaN in fp32 and bf16 (and -1 as int) ----
template <class T>
struct Dev {
    T* p = nullptr;
    size_t n = 0;
    explicit Dev(size_t count) : n(count) {
        cudaCheck(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
        poison();
    }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    ~Dev() { cudaFree(p); }
    void poison() { cudaCheck(cudaMemset(p, 0xFF, n * sizeof(T))); }
    operator T*() const { return p; }
};

// Uploads v converted to T (floatX, float or int).
template <class T, class V>
void put(Dev<T>& d, const std::vector<V>& v) {
    REQUIRE(v.size() == d.n);
    std::vector<T> h(v.size());
    for (size_t i = 0; i < v.size(); i++) {
        if constexpr (std::is_same_v<T, floatX>) h[i] = to_x((double)v[i]);
        else h[i] = (T)v[i];
    }
    cudaCheck(cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// Downloads, as doubles (synchronizes: also surfaces any asynchronous kernel error).
template <class T>
std::vector<double> get(const Dev<T>& d) {
    cudaCheck(cudaDeviceSynchronize());
    std::vector<T> h(d.n);
    cudaCheck(cudaMemcpy(h.data(), d.p, d.n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<double> v(d.n);
    for (size_t i = 0; i < d.n; i++) v[i] = from_x(h[i]);
    return v;
}

// The raw bytes, for bit-exact determinism checks.
template <class T>
std::vector<unsigned char> bytes(const Dev<T>& d) {
    cudaCheck(cudaDeviceSynchronize());
    std::vector<unsigned char> h(d.n * sizeof(T));
    cudaCheck(cudaMemcpy(h.data(), d.p, h.size(), cudaMemcpyDeviceToHost));
    return h;
}

// ---- random inputs: shift + scale * N(0,1), then rounded through the storage type ----
inline std::vector<double> random_x(size_t n, Rng& rng, double shift = 0.3, double scale = 1.0) {
    std::vector<double> v(n);
    for (auto& x : v) x = from_x(to_x(shift + scale * rng.next_normal()));
    return v;
}
inline std::vector<double> random_f(size_t n, Rng& rng, double shift = 0.3, double scale = 1.0) {
    std::vector<double> v(n);
    for (auto& x : v) x = (double)(float)(shift + scale * rng.next_normal());
    return v;
}
inline std::vector<int> random_tokens(size_t n, int V, Rng& rng) {
    std::vector<int> v(n);
    for (auto& x : v) x = (int)(rng.next_u32() % (uint32_t)V);
    return v;
}

// ---- files for whole training runs (train()): token data and a tokenizer ----
// n random tokens of a V-token vocabulary, as a token file (llmc/dataloader.h's format).
inline void write_random_tokens(const std::string& path, size_t n, int V, uint64_t seed) {
    Rng rng(seed);
    std::vector<uint16_t> t(n);
    for (auto& x : t) x = (uint16_t)(rng.next_u32() % (uint32_t)V);
    write_token_file(path, t);
}
// A tokenizer file for a V-token vocabulary: token i is one letter, EOT the last id.
inline void write_letter_tokenizer(const std::string& path, int V) {
    std::string data(256 * sizeof(uint32_t), '\0');
    const uint32_t h[4] = {TOKENIZER_MAGIC, 2, (uint32_t)V, (uint32_t)V - 1};
    memcpy(&data[0], h, sizeof h);
    for (int i = 0; i < V; i++) {
        data += (char)1;
        data += (char)('a' + i % 26);
    }
    write_file_atomic(path, data);
}

// Values as the storage type holds them (for an oracle input that came out of a GPU kernel).
inline std::vector<double> rounded_x(std::vector<double> v) {
    for (auto& x : v) x = from_x(to_x(x));
    return v;
}

// ---- errors: the measure and the rule of llmc/correctness.h ----
inline rule::ErrorStats error_of(const std::vector<double>& a, const std::vector<double>& ref) {
    rule::ErrorAccumulator acc;
    for (size_t i = 0; i < a.size(); i++) acc.add(a[i], ref[i], i);
    return acc.finish();
}

// The rule for one output tensor computed by the naive and the flash kernel; `inherited`: error the flash
// kernel inherits from a rounded input the naive one does not read (llmc/correctness.h).
inline void check_naive_flash(const std::string& what, const std::vector<double>& naive,
                              const std::vector<double>& flash, const std::vector<double>& ref, double inherited = 0) {
    REQUIRE(naive.size() == ref.size());
    REQUIRE(flash.size() == ref.size());
    REQUIRE(!ref.empty());
    const rule::ErrorStats en = error_of(naive, ref), ef = error_of(flash, ref);
    INFO(what << " [" << PRECISION_NAME << "]: naive rel " << en.rel << " max " << en.max_abs << " | flash rel "
              << ef.rel << " max " << ef.max_abs << " | max|ref| " << en.max_ref);
    CHECK(rule::finite(en));
    CHECK(rule::finite(ef));
    if (!BF16_BUILD) {
        CHECK(rule::fp32_ok(en));
        CHECK(rule::fp32_ok(ef));
    } else {
        CHECK(rule::bf16_sane(en));
        CHECK(rule::bf16_ok(ef, en, /*stored_bf16=*/true, inherited));
    }
}

// An output only one kernel produces, stored in fp32 in both builds (lse). tol_bf16: stated at the call.
inline void check_single(const std::string& what, const std::vector<double>& got, const std::vector<double>& ref,
                         double tol_bf16) {
    REQUIRE(got.size() == ref.size());
    const rule::ErrorStats e = error_of(got, ref);
    INFO(what << " [" << PRECISION_NAME << "]: rel " << e.rel << " max " << e.max_abs);
    CHECK(rule::finite(e));
    CHECK(e.rel <= (BF16_BUILD ? tol_bf16 : rule::FP32_REL_TOL));
}

// The context a layer op runs in, for a test: the kernel set, the default stream, and a workspace when the op
// needs one.
inline OpContext ops(const KernelSet& ks, void* ws = nullptr) { return OpContext{ks, 0, ws}; }

// A seed per check: fresh inputs everywhere, reproducible when a check fails.
inline uint64_t seed_for(const std::string& what) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (char c : what) h = (h ^ (unsigned char)c) * 1099511628211ull;
    return h;
}

}  // namespace flashgpt2::gtest
