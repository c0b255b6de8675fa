// sample: text from a checkpoint on the CPU, no training (the Eigen model, llmc/ref/gpt2.h); `make sample` runs it.
//
//   build/sample --model CKPT [--prompt TEXT] [-g N] [--top-k K] [--temperature X] [--seed S]
//
// The prompt (GPT-2 BPE; the text <|endoftext|> in it is the special token) is printed, then N tokens
// drawn one at a time, each from the model's next-token logits by llmc/sampler.h's sample_top_k with one
// Rng(--seed). An empty prompt starts from <|endoftext|> alone, i.e. a new document. Each step reruns the model on
// the whole context (no KV cache: the CPU model is small); once the context is longer than the model's
// max_seq_len, the model sees its last max_seq_len tokens. A GPU sampler with the same flags, the same Rng and the
// same draw per token gives the same text wherever its logits round the same way.
// The text goes to stdout; what model was loaded goes to stderr, so `build/sample ... > out.txt` keeps only text.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/args.h"
#include "llmc/bpe.h"
#include "llmc/error.h"
#include "llmc/ref/ref.h"
#include "tools/model_file.h"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"

using namespace flashgpt2;

namespace {

const char* USAGE = R"(usage: sample --model CKPT [--prompt TEXT] [-g N] [--top-k K] [--temperature X] [--seed S]
  --model CKPT      llm.c checkpoint (fp32 or bf16), e.g. checkpoints/cpu_model.bin or log/model_00000250.bin
  --prompt TEXT     text to continue ('' : start a new document after <|endoftext|>)   ['']
  -g N              tokens to generate                                   [64]
  --top-k K         sample among the K most likely tokens (0: all)       [40]
  --temperature X   softmax temperature (0: always the most likely)      [1]
  --seed S          the sampling generator's seed                        [42]
  --tokenizer FILE  llm.c's tokenizer file, to print tokens   [data/gpt2_tokenizer.bin]
  --bpe DIR         folder with gpt2/encoder.json and gpt2/vocab.bpe, to encode the prompt [as data/get_sources.sh finds it]
)";

struct Options {
    std::string model, prompt, tokenizer = "data/gpt2_tokenizer.bin", bpe_dir;
    int gen_tokens = 64, top_k = 40;
    float temperature = 1.0f;
    unsigned long long seed = 42;
};

// The context generation starts from: the prompt's tokens, or <|endoftext|> alone for an empty prompt.
std::vector<int> prompt_tokens(const Options& o, const GPT2Config& cfg) {
    if (o.prompt.empty()) return {BPE::EOT};
    const BPE bpe = load_gpt2_bpe(o.bpe_dir);
    std::vector<int> ids = bpe.encode(o.prompt, /*allow_special=*/true, "--prompt");
    if ((int)ids.size() > cfg.max_seq_len)
        fail("--prompt: %zu tokens, more than the model's max_seq_len %d", ids.size(), cfg.max_seq_len);
    for (int id : ids)
        if (id >= cfg.vocab_size) fail("--prompt: token %d is outside the model's vocabulary of %d", id, cfg.vocab_size);
    return ids;
}

int sample(const Options& o) {
    if (o.model.empty()) fail("--model: a checkpoint is required (see --help)");
    ref::GPT2<float> model = load_ref_model(o.model);
    const GPT2Config& cfg = model.config;
    const Tokenizer tok = Tokenizer::load(o.tokenizer);
    std::vector<int> ids = prompt_tokens(o, cfg);
    fprintf(stderr, "sampling %d tokens: top-k %d, temperature %g, seed %llu\n", o.gen_tokens, o.top_k,
            o.temperature, o.seed);
    if ((int)ids.size() + o.gen_tokens - 1 > cfg.max_seq_len)
        fprintf(stderr, "note: past %d tokens the model sees only the last %d (its max_seq_len)\n", cfg.max_seq_len,
                cfg.max_seq_len);
    fputs(o.prompt.c_str(), stdout);
    Rng rng(o.seed);
    for (int i = 0; i < o.gen_tokens; i++) {
        const int len = std::min((int)ids.size(), cfg.max_seq_len);
        model.forward(ids.data() + ids.size() - len, nullptr, 1, len);
        const int next = sample_top_k(model.logits_at(0, len - 1), cfg.vocab_size, o.top_k, o.temperature, rng);
        if (next >= (int)tok.vocab_size) fail("%s: the model drew token %d, beyond its %u tokens", o.tokenizer.c_str(), next, tok.vocab_size);
        ids.push_back(next);
        const std::string bytes = tok.decode(next);  // may be part of a UTF-8 character: the bytes join up
        if (fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() || fflush(stdout) != 0) fail("stdout: write failed");
    }
    fputc('\n', stdout);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return run_main([&] {
        Options o;
        args::Flags f;
        f.value("--model", [&](const std::string& v) { o.model = v; });
        f.value("--prompt", [&](const std::string& v) { o.prompt = v; });
        f.value("-g", [&](const std::string& v) { o.gen_tokens = (int)args::parse_int("-g", v, 0, 1 << 20); });
        f.value("--top-k", [&](const std::string& v) { o.top_k = (int)args::parse_int("--top-k", v, 0, 1 << 30); });
        f.value("--temperature", [&](const std::string& v) { o.temperature = (float)args::parse_float("--temperature", v, 0, 100); });
        f.value("--seed", [&](const std::string& v) { o.seed = (unsigned long long)args::parse_int("--seed", v, 0, INT64_MAX); });
        f.value("--tokenizer", [&](const std::string& v) { o.tokenizer = v; });
        f.value("--bpe", [&](const std::string& v) { o.bpe_dir = v; });
        if (!f.parse(argc, argv)) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (!f.positional.empty()) fail("%s: unexpected word (flags only; see --help)", f.positional[0].c_str());
        return sample(o);
    });
}
