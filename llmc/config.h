// GPT-2's shape, in one place: the config, its checks, the -e dN presets, the 16 parameter tensors (llm.c's
// order, their sizes and which ones AdamW decays) and the cost of a token. Host-only, shared by the Eigen
// reference (llmc/ref), both trainers, the checkpoint code and the tests.
#pragma once
#include <array>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "llmc/error.h"

namespace flashgpt2 {

struct GPT2Config {
    int max_seq_len = 1024;         // maxT: positions in wpe
    int vocab_size = 50257;         // V: real tokens
    int padded_vocab_size = 50304;  // Vp: V rounded up (to a multiple of 128 in llm.c) for aligned matmuls
    int num_layers = 12;            // L
    int num_heads = 12;             // NH
    int channels = 768;             // C
};

inline GPT2Config gpt2_124M() { return GPT2Config{}; }

inline bool same_config(const GPT2Config& a, const GPT2Config& b) {
    return a.max_seq_len == b.max_seq_len && a.vocab_size == b.vocab_size && a.padded_vocab_size == b.padded_vocab_size &&
           a.num_layers == b.num_layers && a.num_heads == b.num_heads && a.channels == b.channels;
}

inline std::string config_str(const GPT2Config& c) {
    char s[160];
    snprintf(s, sizeof s, "L=%d NH=%d C=%d maxT=%d V=%d Vp=%d", c.num_layers, c.num_heads, c.channels, c.max_seq_len,
             c.vocab_size, c.padded_vocab_size);
    return s;
}

// Throws unless the config describes a model that can exist: positive sizes, V <= Vp, heads dividing
// channels, and nothing absurd (the bounds are far beyond any GPT-2 yet small enough that sizes fit).
// `where` names the source (a file, a flag) in the message.
inline void validate_config(const GPT2Config& k, const char* where) {
    if (k.max_seq_len <= 0 || k.vocab_size <= 0 || k.padded_vocab_size <= 0 || k.num_layers <= 0 ||
        k.num_heads <= 0 || k.channels <= 0)
        fail("%s: every config field must be positive (maxT %d, V %d, Vp %d, L %d, NH %d, C %d)", where,
             k.max_seq_len, k.vocab_size, k.padded_vocab_size, k.num_layers, k.num_heads, k.channels);
    if (k.max_seq_len > (1 << 20) || k.padded_vocab_size > (1 << 24) || k.num_layers > 1024 || k.channels > (1 << 16))
        fail("%s: absurd config (maxT %d, Vp %d, L %d, C %d): limits are 2^20, 2^24, 1024, 2^16", where,
             k.max_seq_len, k.padded_vocab_size, k.num_layers, k.channels);
    if (k.padded_vocab_size < k.vocab_size)
        fail("%s: padded vocab %d is smaller than vocab %d", where, k.padded_vocab_size, k.vocab_size);
    if (k.channels % k.num_heads != 0)
        fail("%s: channels %d are not divisible by heads %d", where, k.channels, k.num_heads);
}

// -e dN: GPT-2's shapes by depth, head size 64 throughout (d12 = GPT-2 small 124M, d24 = medium, d36 = large,
// d48 = XL); below 12 layers one head per layer, llm.c's "d6 = 384 channels, 6 heads" pattern. nullopt when
// `init` is not of the form dN (then it names a checkpoint file); an Error for a depth with no GPT-2 shape.
inline std::optional<GPT2Config> config_from_depth(const std::string& init) {
    if (init.size() < 2 || init.size() > 4 || init[0] != 'd' ||
        init.find_first_not_of("0123456789", 1) != std::string::npos)
        return std::nullopt;
    const int depth = std::atoi(init.c_str() + 1);  // at most 3 digits: no overflow
    GPT2Config c;  // maxT 1024, V 50257, Vp 50304
    c.num_layers = depth;
    if (depth >= 1 && depth <= 12) c.num_heads = depth;
    else if (depth == 24) c.num_heads = 16;
    else if (depth == 36) c.num_heads = 20;
    else if (depth == 48) c.num_heads = 25;
    else fail("-e %s: no GPT-2 shape for depth %d (use d1..d12, d24, d36, d48, or a checkpoint file)", init.c_str(), depth);
    c.channels = 64 * c.num_heads;
    return c;
}

// ---- the 16 parameter tensors, in llm.c order: the order of a checkpoint and of the flat parameter buffer ----
enum ParamTensor {
    WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB,
    NUM_PARAMETER_TENSORS
};
constexpr std::array<const char*, NUM_PARAMETER_TENSORS> PARAMETER_NAMES = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

// Element count of each tensor. Shapes:
//   wte (Vp, C)   wpe (maxT, C)   ln1w/ln1b (L, C)   qkvw (L, 3C, C)   qkvb (L, 3C)
//   attprojw (L, C, C)   attprojb (L, C)   ln2w/ln2b (L, C)   fcw (L, 4C, C)   fcb (L, 4C)
//   fcprojw (L, C, 4C)   fcprojb (L, C)   lnfw/lnfb (C)
inline std::array<size_t, NUM_PARAMETER_TENSORS> parameter_sizes(const GPT2Config& c) {
    const size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, maxT = c.max_seq_len;
    return {Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
            L * C,  L * C,    L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
}

inline size_t num_parameters(const GPT2Config& c) {
    size_t n = 0;
    for (size_t s : parameter_sizes(c)) n += s;
    return n;
}

// True for the tensors AdamW decays: the 2-D weight matrices (embeddings and the four matmul weights), as in
// GPT-2 training; biases and layernorm gains and shifts are not decayed.
inline bool parameter_decays(int i) {
    switch (i) {
        case WTE: case WPE: case QKVW: case ATTPROJW: case FCW: case FCPROJW: return true;
        default: return false;
    }
}

// ---- cost ----
// Training FLOPs per token: 6 per parameter (forward 2, backward 4) plus causal attention's QK^T and PV: per
// token and layer 2·T·C in the forward once the masked half is dropped (each query sees (T+1)/2 keys on average,
// two matmuls of 2·C FLOPs per key), times 3 for forward + backward: 6·L·C·T. The PaLM/nanoGPT count (12·L·C·T)
// charges the masked half too; at T = 32K attention is most of the cost, so the count matters there. GPT-2 124M
// at T = 1024: ≈ 803 MFLOP per token.
inline double flops_per_token(const GPT2Config& c, int T) {
    return 6.0 * (double)num_parameters(c) + 6.0 * c.num_layers * c.channels * (double)T;
}

}  // namespace flashgpt2
