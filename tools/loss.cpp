// loss: a checkpoint's mean loss on one fixed batch of a token file, on the CPU (the Eigen model, llmc/ref/gpt2.h).
//
//   build/loss --model CKPT --tokens FILE [-b B] [-t T]      prints "loss 5.123456"
//
// The batch is the token file's first, as DataLoader cuts it: inputs are its first B*T tokens, targets the same
// tokens shifted by one. scripts/torch/hf_check.py puts this number beside transformers' loss for the same batch
// on the model `make export-hf` wrote. It needs neither PCRE2 nor the tokenizer, so it builds wherever Eigen is.
#include <cstdio>
#include <string>

#include "llmc/args.h"
#include "llmc/dataloader.h"
#include "llmc/error.h"
#include "llmc/ref/ref.h"
#include "tools/model_file.h"

using namespace flashgpt2;

namespace {

const char* USAGE = R"(usage: loss --model CKPT --tokens FILE [-b B] [-t T]
  --model CKPT    llm.c checkpoint (fp32, or bf16 read as fp32)
  --tokens FILE   llm.c token file; its first (B, T) batch is evaluated
  -b B, -t T      the batch's shape   [4, 64]
)";

}  // namespace

int main(int argc, char** argv) {
    return run_main([&] {
        std::string model_path, tokens;
        int B = 4, T = 64;
        args::Flags f;
        f.value("--model", [&](const std::string& v) { model_path = v; });
        f.value("--tokens", [&](const std::string& v) { tokens = v; });
        f.value("-b", [&](const std::string& v) { B = (int)args::parse_int("-b", v, 1, 1 << 16); });
        f.value("-t", [&](const std::string& v) { T = (int)args::parse_int("-t", v, 1, 1 << 20); });
        if (!f.parse(argc, argv)) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (model_path.empty() || tokens.empty() || !f.positional.empty()) fail("give --model and --tokens (see --help)");
        ref::GPT2<float> model = load_ref_model(model_path);
        if (T > model.config.max_seq_len) fail("-t: T=%d exceeds the model's max_seq_len %d", T, model.config.max_seq_len);
        DataLoader data(tokens, B, T, /*shuffle=*/false, 0, model.config.vocab_size);
        data.next_batch();
        printf("loss %.6f\n", model.forward(data.inputs.data(), data.targets.data(), B, T));
        fprintf(stderr, "(the first B=%d x T=%d batch of %s)\n", B, T, tokens.c_str());
        return 0;
    });
}
