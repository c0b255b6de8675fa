// GPT-2's random initialization, as llm.c's gpt2_build_from_random: weights ~ N(0, 0.02), the two projections
// back into the residual stream (attprojw, fcprojw) scaled by 1/sqrt(2L), biases 0, layernorm gains 1; wte's
// padding rows (V..Vp) stay 0. The draws are llm.c's too (llmc/torch_rng.h), in its order: wte, wpe, then
// layer by layer qkvw, attprojw, fcw, fcprojw. So a seed gives llm.c's initial weights for that seed, and the
// GPU trainer, the CPU trainer and the oracle (llmc/ref) all start from the same weights. Host code only.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "llmc/config.h"
#include "llmc/error.h"
#include "llmc/torch_rng.h"

namespace flashgpt2 {

// Fills params (num_parameters(c) values, llm.c's tensor order) with GPT-2's initial weights for `seed`.
template <class S>
void init_gpt2_weights(S* params, const GPT2Config& c, uint64_t seed) {
    if (seed > UINT32_MAX) fail("init: seed %llu does not fit the generator's 32 bits", (unsigned long long)seed);
    std::mt19937 g((uint32_t)seed);
    const auto sizes = parameter_sizes(c);
    std::array<S*, NUM_PARAMETER_TENSORS> p;
    S* base = params;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) p[i] = base, base += sizes[i];
    const size_t L = c.num_layers;
    const float proj_std = 0.02f * (1.0f / sqrtf(2.0f * (float)L));
    std::fill(params, base, S(0));
    for (int i : {LN1W, LN2W, LNFW}) std::fill(p[i], p[i] + sizes[i], S(1));
    std::vector<float> x;
    auto draw = [&](S* dst, size_t n, float std) {  // n normals into dst
        x.resize(n);
        torch_normal(x.data(), n, 0.0f, std, g);
        std::copy(x.begin(), x.end(), dst);
    };
    draw(p[WTE], (size_t)c.vocab_size * c.channels, 0.02f);
    draw(p[WPE], sizes[WPE], 0.02f);
    for (size_t l = 0; l < L; l++)
        for (int i : {QKVW, ATTPROJW, FCW, FCPROJW}) {
            const size_t n = sizes[i] / L;  // layer l's slice
            draw(p[i] + l * n, n, (i == ATTPROJW || i == FCPROJW) ? proj_std : 0.02f);
        }
}

inline std::vector<float> gpt2_initial_weights(const GPT2Config& c, uint64_t seed) {
    std::vector<float> params(num_parameters(c));
    init_gpt2_weights(params.data(), c, seed);
    return params;
}

// The same weights for a model with a longer position table (config `to`, whose max_seq_len exceeds `from`'s and
// is otherwise the same): every tensor copied, wpe's first from.max_seq_len rows too, and its new rows drawn as
// GPT-2's init draws wpe (N(0, 0.02), llm.c's stream for `seed`). This is how `--max-seq-len N` extends a
// checkpoint trained at a shorter T: the new positions start as a fresh model's.
inline std::vector<float> extend_position_table(const std::vector<float>& params, const GPT2Config& from,
                                                const GPT2Config& to, uint64_t seed) {
    GPT2Config same = to;
    same.max_seq_len = from.max_seq_len;
    if (!same_config(same, from) || to.max_seq_len < from.max_seq_len)
        fail("extend_position_table: %s cannot become %s", config_str(from).c_str(), config_str(to).c_str());
    if (params.size() != num_parameters(from))
        fail("extend_position_table: %zu values for a model of %zu parameters", params.size(), num_parameters(from));
    std::vector<float> out = gpt2_initial_weights(to, seed);  // the new wpe rows come from here
    const auto a = parameter_sizes(from), b = parameter_sizes(to);
    size_t ia = 0, ib = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        std::copy(params.begin() + ia, params.begin() + ia + a[i], out.begin() + ib);  // wpe: its first rows
        ia += a[i], ib += b[i];
    }
    return out;
}

}  // namespace flashgpt2
