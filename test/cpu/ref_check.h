// Helpers for the reference-model tests: random inputs and a finite-difference gradient check.
//
// Finite differences, central, in double: dL/dx ≈ (L(x+h) - L(x-h)) / 2h with h = 1e-5.
// The truncation error is O(h^2 L''') ≈ 1e-10 and the rounding error O(eps |L| / h) ≈ 1e-16 * 10 / 1e-5
// ≈ 1e-10, for inputs and gradients of order one, so a correct backward pass agrees to ~1e-8..1e-7
// relative; 1e-6 leaves margin while a wrong sign, index or factor gives an error of order 1.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "llmc/sampler.h"

namespace flashgpt2::test {

constexpr double FD_STEP = 1e-5;
constexpr double FD_TOL = 1e-6;

// n values ~ shift + scale * N(0, 1): shifted away from zero mean, as every project test is.
inline std::vector<double> random_vec(size_t n, Rng& rng, double shift = 0.3, double scale = 1.0) {
    std::vector<double> v(n);
    for (auto& x : v) x = shift + scale * rng.next_normal();
    return v;
}

inline std::vector<int> random_tokens(size_t n, int V, Rng& rng) {
    std::vector<int> v(n);
    for (auto& x : v) x = (int)(rng.next_u32() % (uint32_t)V);
    return v;
}

template <class T>
std::vector<T> nan_vec(size_t n) {  // poisoned output buffer: an element left unwritten stays NaN
    return std::vector<T>(n, std::numeric_limits<T>::quiet_NaN());
}

inline bool all_finite(const std::vector<double>& v) {
    return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

// ‖a - b‖ / ‖b‖; NaN anywhere makes it NaN, which fails every `<= tol` check.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return std::sqrt(num) / std::sqrt(den);
}

// Compares analytic[i] with the central difference of loss() w.r.t. x[i] for the entries in `idx`
// (every entry when idx is empty). x is perturbed in place and restored. Fails when the relative error
// exceeds tol, or when the finite-difference gradient is all zero (the check would then prove nothing).
inline void check_grad(const std::string& what, std::vector<double>& x, const std::vector<double>& analytic,
                       const std::function<double()>& loss, std::vector<size_t> idx = {}, double tol = FD_TOL) {
    REQUIRE(analytic.size() == x.size());
    if (idx.empty())
        for (size_t i = 0; i < x.size(); i++) idx.push_back(i);
    std::vector<double> a, fd;
    for (size_t i : idx) {
        const double saved = x[i];
        x[i] = saved + FD_STEP;
        const double up = loss();
        x[i] = saved - FD_STEP;
        const double down = loss();
        x[i] = saved;
        fd.push_back((up - down) / (2 * FD_STEP));
        a.push_back(analytic[i]);
    }
    double fd_norm = 0;
    for (double g : fd) fd_norm += g * g;
    const double err = rel_error(a, fd);
    INFO(what << ": relative error " << err << " over " << idx.size() << " entries, |fd| " << std::sqrt(fd_norm));
    CHECK(std::sqrt(fd_norm) > 1e-8);
    CHECK(err <= tol);
}

// Subtracts the values a gradient buffer held before a backward pass: the functions accumulate (+=).
inline std::vector<double> minus(const std::vector<double>& after, const std::vector<double>& before) {
    std::vector<double> d(after.size());
    for (size_t i = 0; i < d.size(); i++) d[i] = after[i] - before[i];
    return d;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
    return s;
}

}  // namespace flashgpt2::test
