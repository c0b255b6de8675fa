// GPT-2 model shape and the layout of its 16 parameter tensors, in llm.c's order.
// Shared by the Eigen reference (llmc/ref), the CPU trainer, the CUDA trainer and the checkpoint code.
#pragma once
#include <array>
#include <cstddef>

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

constexpr int NUM_PARAMETER_TENSORS = 16;

// Names in llm.c order: the order of tensors in a checkpoint and in the flat parameter buffer.
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

// True for the tensors AdamW decays (the 2-D weight matrices); biases and layernorm gains are not, as in GPT-2
// training: wte, wpe, qkvw, attprojw, fcw, fcprojw are decayed.
inline bool parameter_decays(int i) { return i == 0 || i == 1 || i == 4 || i == 6 || i == 10 || i == 12; }

}  // namespace flashgpt2
