// Random numbers and token sampling, shared by the CPU and CUDA trainers (sampling) and the tests (random
// inputs). The init and the data order use llm.c's streams instead (llmc/torch_rng.h).
//
// Rng is xorshift64* (Marsaglia's xorshift with a multiplicative output scramble, as described by
// Vigna, "An experimental exploration of Marsaglia's xorshift generators", 2016). Its whole state is
// one uint64_t, so a checkpoint can store it and a resumed run draws exactly the same numbers.
// sample_top_k draws the next token from logits: temperature scales them, top-k keeps the k largest.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "llmc/error.h"

namespace flashgpt2 {

struct Rng {
    uint64_t state;

    // The seed is scrambled by one splitmix64 step so that nearby seeds (0, 1, 2...) start far apart;
    // xorshift's state must never be 0, so that one value is replaced.
    explicit Rng(uint64_t seed) {
        uint64_t z = seed + 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        state = z ^ (z >> 31);
        if (state == 0) state = 0x9E3779B97F4A7C15ull;
    }

    uint32_t next_u32() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        return (uint32_t)((state * 0x2545F4914F6CDD1Dull) >> 32);
    }

    // Uniform in [0, 1): the top 24 bits, so every value is exactly representable in float.
    float next_f32() { return (float)(next_u32() >> 8) * (1.0f / 16777216.0f); }

    // Standard normal by Box-Muller (one of the pair is used; simple beats fast here: tests only).
    double next_normal() {
        double u1 = ((double)next_u32() + 1.0) / 4294967296.0;  // (0, 1]: log is finite
        double u2 = (double)next_u32() / 4294967296.0;          // [0, 1)
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    }
};

// Draws a token id from logits[0..V). temperature <= 0 means greedy: the arg max (lowest id on ties).
// Otherwise p_i ∝ exp(logits_i / temperature) over the k largest logits (k <= 0 or k >= V: all of them).
inline int sample_top_k(const float* logits, int V, int k, float temperature, Rng& rng) {
    if (V <= 0) fail("sample_top_k: vocabulary size must be positive, got %d", V);
    for (int i = 0; i < V; i++)
        if (std::isnan(logits[i])) fail("sample_top_k: logit %d is NaN (the model diverged)", i);
    if (temperature <= 0.0f) return (int)(std::max_element(logits, logits + V) - logits);

    // Candidate ids, the k best first (ties broken by the lower id, so the result is deterministic).
    std::vector<int> ids(V);
    std::iota(ids.begin(), ids.end(), 0);
    const int n = (k <= 0 || k >= V) ? V : k;
    auto better = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), better);
    if (!std::isfinite(logits[ids[0]])) return ids[0];  // a +inf logit wins outright (all -inf: any will do)

    // Softmax over the candidates, shifted by the largest logit so that exp never overflows.
    std::vector<double> w(n);
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        w[i] = std::exp((double(logits[ids[i]]) - double(logits[ids[0]])) / temperature);
        total += w[i];
    }
    double u = rng.next_f32() * total, cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += w[i];
        if (u < cum) return ids[i];
    }
    return ids[n - 1];  // u landed on the rounding error at the very top
}

}  // namespace flashgpt2
