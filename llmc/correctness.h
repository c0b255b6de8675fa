// The one correctness rule of the project (doc/design.md, "Correctness"): how a kernel's output is judged
// against the oracle (flashgpt2::ref, in double). The GPU tests (test/gpu/gpu_check.h) and the dev runners
// (dev/harness.cuh) both judge with these functions; they differ only in how they print.
//
//   error measure  rel = ‖got − ref‖₂ / ‖ref‖₂ and max = max |got − ref|, over the elements the oracle computed;
//                  NaN or Inf anywhere in the output fails (outputs start poisoned with NaN, so an element the
//                  kernel never wrote fails too).
//   fp32           rel <= 1e-5. fp32 rounds at 2^-24 ≈ 6e-8 per operation; the longest sums (C = 768..3072
//                  channels, up to 32K keys, 50K classes) grow that by ~sqrt(n) for random-sign rounding errors,
//                  to a few 1e-6 at most; a wrong index, mask, scale or stale max is off by 1e-3 or more.
//   bf16           the FlashAttention rule (Dao et al. 2022, §4): the flash kernel's max error is at most twice
//                  the naive kernel's max error in the same precision on the same inputs, plus half an ulp of
//                  the tensor's largest |ref| in its storage precision (two kernels that each round their output
//                  once differ by that rounding even when both are exact before it), plus any error the flash
//                  kernel inherits from a rounded input the naive one does not read (stated by the caller).
//                  Both kernels must also be within rel 5e-2 (~25 bf16 roundings of 2^-9): a sanity bound that
//                  catches a kernel that is wrong rather than imprecise (the naive kernels' exactness itself is
//                  proven by the FP32 build, where they are the same code in fp32).
//   whole model    the same measure and the same 2x rule on the loss and all 16 parameter gradients of a GPT-2
//                  step (test/gpu/test_model.cu), with room for errors that compound through L layers and the
//                  50K-class softmax: fp32 rel <= 1e-4 per gradient tensor (2e-5 on the loss, a mean that
//                  averages down); bf16 atol 1% of the tensor's max |ref|, sanity rel 15%, loss atol 0.01 nats.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>

namespace flashgpt2::rule {

constexpr double FP32_REL_TOL = 1e-5;
constexpr double BF16_SANITY_REL = 5e-2;
// the whole model (see above)
constexpr double MODEL_FP32_GRAD_REL_TOL = 1e-4, MODEL_FP32_LOSS_REL_TOL = 2e-5;
constexpr double MODEL_BF16_ATOL_FRAC = 1e-2, MODEL_BF16_SANITY_REL = 0.15, MODEL_BF16_LOSS_ATOL = 0.01;

// The error of one output tensor against its reference.
struct ErrorStats {
    size_t checked = 0, nonfinite = 0;  // elements compared; NaN/Inf found (anywhere in the output)
    size_t worst = 0;                   // index of the largest |got − ref|
    double rel = 0, max_abs = 0, max_ref = 0;
};

// Accumulates one (got, ref) pair into s; call finish() when every pair is in.
struct ErrorAccumulator {
    ErrorStats s;
    double num = 0, den = 0;
    void add(double got, double ref, size_t index) {
        if (!std::isfinite(got)) s.nonfinite++;
        const double d = std::fabs(got - ref);
        if (!(d <= s.max_abs)) s.max_abs = d, s.worst = index;  // `!(<=)`: a NaN difference wins
        s.max_ref = std::max(s.max_ref, std::fabs(ref));
        num += d * d;
        den += ref * ref;
        s.checked++;
    }
    ErrorStats finish() {
        s.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
        return s;
    }
};

// Half an ulp at max_ref in the storage precision: bf16 keeps 8 significant bits, fp32 24.
inline double half_ulp(double max_ref, bool stored_bf16) {
    if (max_ref <= 0) return 0;
    const int mantissa_bits = stored_bf16 ? 7 : 23;  // ulp(x) = 2^(floor(log2 x) − mantissa bits)
    return std::ldexp(1.0, (int)std::floor(std::log2(max_ref)) - mantissa_bits - 1);
}

inline bool finite(const ErrorStats& e) { return e.nonfinite == 0 && e.checked > 0; }
inline bool fp32_ok(const ErrorStats& e) { return finite(e) && e.rel <= FP32_REL_TOL; }
inline bool bf16_sane(const ErrorStats& e) { return finite(e) && e.rel <= BF16_SANITY_REL; }
// The bf16 rule's bound on the flash kernel's max error.
inline double bf16_bound(const ErrorStats& naive, double max_ref, bool stored_bf16, double inherited = 0) {
    return 2 * naive.max_abs + half_ulp(max_ref, stored_bf16) + inherited;
}
inline bool bf16_ok(const ErrorStats& flash, const ErrorStats& naive, bool stored_bf16, double inherited = 0) {
    return bf16_sane(flash) && flash.max_abs <= bf16_bound(naive, flash.max_ref, stored_bf16, inherited);
}

}  // namespace flashgpt2::rule
