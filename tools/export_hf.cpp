// export_hf: an llm.c checkpoint -> a Hugging Face GPT-2 folder (`make export-hf CKPT=... OUT=dir`), llmc/hf_gpt2.h.
//
//   build/export_hf [--bpe DIR] CKPT OUT_DIR
//
// OUT_DIR gets model.safetensors and config.json, which transformers' GPT2LMHeadModel.from_pretrained(OUT_DIR)
// loads, and, from the GPT-2 vocabulary files in DIR (gpt2/encoder.json, gpt2/vocab.bpe), vocab.json and merges.txt
// for GPT2TokenizerFast.from_pretrained(OUT_DIR). Other files already in OUT_DIR are left alone.
#include <cstdio>
#include <string>

#include "llmc/args.h"
#include "llmc/error.h"
#include "llmc/hf_gpt2.h"

using namespace flashgpt2;

int main(int argc, char** argv) {
    return run_main([&] {
        std::string bpe_dir;
        args::Flags f;
        f.value("--bpe", [&](const std::string& v) { bpe_dir = v; });
        if (!f.parse(argc, argv)) {
            puts("usage: export_hf [--bpe DIR] CKPT OUT_DIR\n"
                 "  CKPT      llm.c checkpoint (fp32 -> F32 tensors, bf16 -> BF16 tensors)\n"
                 "  OUT_DIR   folder for config.json and model.safetensors (created when missing)\n"
                 "  --bpe DIR also copy DIR/gpt2/encoder.json and vocab.bpe there as vocab.json and merges.txt");
            return 0;
        }
        if (f.positional.size() != 2) fail("expected CKPT and OUT_DIR, got %zu words (see --help)", f.positional.size());
        const std::string& ckpt = f.positional[0], &out = f.positional[1];
        const std::string note = hf::export_hf(ckpt, out, bpe_dir);
        if (!note.empty()) fprintf(stderr, "%s\n", note.c_str());
        printf("%s -> %s/model.safetensors, %s/config.json%s\n", ckpt.c_str(), out.c_str(), out.c_str(),
               bpe_dir.empty() ? "" : " (and vocab.json, merges.txt)");
        printf("load it: GPT2LMHeadModel.from_pretrained(\"%s\")\n", out.c_str());
        return 0;
    });
}
