// The oracle, part 4: the optimizer. AdamW (Loshchilov & Hutter, "Decoupled Weight Decay
// Regularization", 2019) with bias correction, as llm.c applies it, plus global-norm gradient clipping.
//   m = b1 m + (1-b1) g          v = b2 v + (1-b2) g^2          (fp32 state, whatever S is)
//   mhat = m / (1 - b1^t)        vhat = v / (1 - b2^t)           (t = 1 on the first step)
//   p -= lr (mhat / (sqrt(vhat) + eps) + wd p)                   (wd only on tensors parameter_decays(i))
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "llmc/config.h"
#include "llmc/error.h"

namespace flashgpt2::ref {

struct AdamW {
    float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
};

// One AdamW step over all num_parameters(cfg) parameters of the flat buffers; t counts steps from 1.
template <class S>
void adamw_update(S* params, const S* grads, float* m, float* v, const GPT2Config& cfg, const AdamW& hp, int t) {
    if (t < 1) fail("adamw_update: step t=%d must start at 1 (bias correction divides by 1 - beta^t)", t);
    const float c1 = 1.0f - std::pow(hp.beta1, (float)t), c2 = 1.0f - std::pow(hp.beta2, (float)t);
    const auto sizes = parameter_sizes(cfg);
    size_t off = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const float wd = parameter_decays(i) ? hp.weight_decay : 0.0f;
        const long n = (long)sizes[i];
#pragma omp parallel for
        for (long j = 0; j < n; j++) {
            const size_t k = off + j;
            const float g = (float)grads[k];
            m[k] = hp.beta1 * m[k] + (1.0f - hp.beta1) * g;
            v[k] = hp.beta2 * v[k] + (1.0f - hp.beta2) * g * g;
            const float mhat = m[k] / c1, vhat = v[k] / c2;
            params[k] -= (S)(hp.lr * (mhat / (std::sqrt(vhat) + hp.eps) + wd * (float)params[k]));
        }
        off += sizes[i];
    }
}

template <class S>
void adamw_update(std::vector<S>& params, const std::vector<S>& grads, std::vector<float>& m, std::vector<float>& v,
                  const GPT2Config& cfg, const AdamW& hp, int t) {
    const size_t n = num_parameters(cfg);
    if (params.size() != n || grads.size() != n || m.size() != n || v.size() != n)
        fail("adamw_update: buffers hold %zu/%zu/%zu/%zu values, the model has %zu parameters", params.size(),
             grads.size(), m.size(), v.size(), n);
    adamw_update(params.data(), grads.data(), m.data(), v.data(), cfg, hp, t);
}

// sqrt(sum of g^2) over every gradient, summed in double so that millions of terms lose nothing. The sum is
// cut into fixed blocks whose partial sums are added in block order, so the result has the same bits for any
// number of threads (an OpenMP reduction adds the threads' partials in whatever order they finish): a run
// resumed on another machine, or beside other work, clips by exactly the same norm.
constexpr size_t NORM_BLOCK = 1 << 14;

template <class S>
S global_grad_norm(const S* grads, size_t n) {
    const long blocks = (long)((n + NORM_BLOCK - 1) / NORM_BLOCK);
    std::vector<double> partial(blocks, 0.0);
#pragma omp parallel for schedule(static)
    for (long b = 0; b < blocks; b++) {
        const size_t end = std::min(n, (size_t)(b + 1) * NORM_BLOCK);
        double s = 0.0;
        for (size_t i = (size_t)b * NORM_BLOCK; i < end; i++) s += (double)grads[i] * (double)grads[i];
        partial[b] = s;
    }
    double sum = 0.0;
    for (double s : partial) sum += s;
    return (S)std::sqrt(sum);
}

template <class S>
S global_grad_norm(const std::vector<S>& grads) {
    return global_grad_norm(grads.data(), grads.size());
}

// Scales all gradients by max_norm / norm when their global norm exceeds max_norm (llm.c's rule);
// returns the norm measured before clipping. max_norm <= 0 disables clipping.
template <class S>
S clip_grads(S* grads, size_t n, S max_norm) {
    const S norm = global_grad_norm(grads, n);
    if (max_norm > 0 && norm > max_norm) {
        const S scale = max_norm / norm;
        for (size_t i = 0; i < n; i++) grads[i] *= scale;
    }
    return norm;
}

template <class S>
S clip_grads(std::vector<S>& grads, S max_norm) {
    return clip_grads(grads.data(), grads.size(), max_norm);
}

}  // namespace flashgpt2::ref
