// The CPU model of a checkpoint, for the tools that run one (tools/sample.cpp, tools/loss.cpp): an llm.c model
// file (llmc/checkpoint.h: fp32, or bf16 widened exactly) loaded into the Eigen reference model (llmc/ref).
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"
#include "llmc/ref/ref.h"

namespace flashgpt2 {

// The model in path, saying on stderr what was loaded (stdout stays the tool's own output).
inline ref::GPT2<float> load_ref_model(const std::string& path) {
    std::vector<float> params;
    const GPT2Config c = load_checkpoint(path, params);
    ref::GPT2<float> m(c);
    m.params = std::move(params);
    fprintf(stderr, "model: %s (L=%d NH=%d C=%d maxT=%d V=%d, %.2fM parameters)\n", path.c_str(), c.num_layers,
            c.num_heads, c.channels, c.max_seq_len, c.vocab_size, num_parameters(c) / 1e6);
    return m;
}

}  // namespace flashgpt2
