// The random streams of PyTorch's CPU generator, as llm.c draws them: with them, a run from random init with
// --seed 42 starts from the same weights as llm.c's train_gpt2cu (which seeds its init generator with 42) and
// reads its training batches in the same order (llm.c seeds its data shuffler with 42 too). Then our val curve
// and llm.c's differ only by arithmetic, not by a different draw of init and data order.
//
// The facts, from llm.c's llmc/rand.h and llmc/dataloader.h (their behaviour, reimplemented here):
//   - the generator is MT19937 (Matsumoto & Nishimura 1998), seeded by the standard 32-bit init: exactly
//     std::mt19937, whose raw outputs equal PyTorch's torch.manual_seed stream;
//   - a uniform float is the low 24 bits of one output times 2^-24;
//   - normal_(n >= 16) draws n uniforms first, then Box-Muller on blocks of 16: for t < 8, u1 = 1 - x[t],
//     u2 = x[t+8], r = sqrt(-2 log(u1 + 1e-12)), theta = 2 pi u2, x[t] = r cos theta, x[t+8] = r sin theta; when n is
//     not a multiple of 16 the last 16 values are drawn again and transformed once more. n < 16 uses pairs of
//     53-bit uniforms from two outputs each (u1 = angle, u2 = radius), cos for one value and sin for the next;
//   - a permutation is Fisher-Yates from the top: for i = n-1 down to 1, swap i with j = output % (i + 1).
// PyTorch publishes test values for seed 137 (the first outputs, 16 normals); test/cpu/test_train_utils.cpp
// checks them.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace flashgpt2 {

inline float torch_uniform(std::mt19937& g) { return (float)(g() & 0xFFFFFFu) * (1.0f / 16777216.0f); }

inline double torch_uniform53(std::mt19937& g) {
    const uint64_t hi = g(), lo = g();
    return (double)(((hi << 32) | lo) & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// x[0..16) uniforms -> 16 normals with the given mean and std, in place.
inline void torch_box_muller16(float* x, float mean, float std) {
    for (int t = 0; t < 8; t++) {
        const float u1 = 1.0f - x[t], u2 = x[t + 8];  // u1 in (0, 1]: the log is finite
        const float r = sqrtf(-2.0f * logf((float)(u1 + 1e-12))), theta = (float)(2.0 * M_PI * u2);
        x[t] = r * cosf(theta) * std + mean;
        x[t + 8] = r * sinf(theta) * std + mean;
    }
}

// n draws from N(mean, std^2), the values torch.Tensor.normal_ gives on the CPU.
inline void torch_normal(float* x, size_t n, float mean, float std, std::mt19937& g) {
    if (n >= 16) {
        for (size_t i = 0; i < n; i++) x[i] = torch_uniform(g);
        for (size_t i = 0; i + 16 <= n; i += 16) torch_box_muller16(x + i, mean, std);
        if (n % 16 != 0) {  // the tail: the last 16 values again, from fresh uniforms
            for (size_t i = n - 16; i < n; i++) x[i] = torch_uniform(g);
            torch_box_muller16(x + n - 16, mean, std);
        }
        return;
    }
    for (size_t i = 0; i < n; i += 2) {
        const float u1 = (float)torch_uniform53(g), u2 = (float)torch_uniform53(g);
        const float r = sqrtf(-2.0f * logf((float)((1.0f - u2) + 1e-12))), theta = (float)(2.0 * M_PI * u1);
        x[i] = r * cosf(theta) * std + mean;
        if (i + 1 < n) x[i + 1] = (float)((double)(r * sinf(theta)) * std + mean);  // the second value in double
    }
}

// Shuffles p in place (Fisher-Yates from the top, llm.c's random_permutation).
inline void torch_permute(std::vector<size_t>& p, std::mt19937& g) {
    for (size_t i = p.size(); i-- > 1;) std::swap(p[i], p[g() % (i + 1)]);
}

}  // namespace flashgpt2
