// import_hf: a local Hugging Face GPT-2 folder -> an llm.c checkpoint (`make import-hf HF=dir OUT=ckpt.bin`),
// llmc/hf_gpt2.h. Both trainers start from the result (-e ckpt.bin), and build/sample samples from it.
//
//   build/import_hf HF_DIR OUT_CKPT
//
// HF_DIR holds config.json and model.safetensors (what save_pretrained writes, or a downloaded GPT-2 such as
// openai-community/gpt2). The padded vocabulary rows llm.c adds are zeros.
#include <cstdio>
#include <string>

#include "llmc/args.h"
#include "llmc/checkpoint.h"
#include "llmc/error.h"
#include "llmc/hf_gpt2.h"

using namespace flashgpt2;

int main(int argc, char** argv) {
    return run_main([&] {
        args::Flags f;
        if (!f.parse(argc, argv)) {
            puts("usage: import_hf HF_DIR OUT_CKPT\n"
                 "  HF_DIR    folder with config.json and model.safetensors (a GPT-2)\n"
                 "  OUT_CKPT  llm.c checkpoint to write (bf16 when every tensor is BF16, else fp32)");
            return 0;
        }
        if (f.positional.size() != 2) fail("expected HF_DIR and OUT_CKPT, got %zu words (see --help)", f.positional.size());
        hf::import_hf(f.positional[0], f.positional[1]);
        const CheckpointHeader h = read_checkpoint_header(f.positional[1]);
        printf("%s -> %s (%s, L=%d NH=%d C=%d maxT=%d V=%d Vp=%d)\n", f.positional[0].c_str(), f.positional[1].c_str(),
               h.version == CHECKPOINT_VERSION_BF16 ? "bf16" : "fp32", h.config.num_layers, h.config.num_heads,
               h.config.channels, h.config.max_seq_len, h.config.vocab_size, h.config.padded_vocab_size);
        return 0;
    });
}
