// prepro_tinyshakespeare: TinyShakespeare -> GPT-2 tokens in llm.c's .bin format, plus llm.c's tokenizer file.
//
//   usage: prepro_tinyshakespeare SRC_DIR OUT_DIR TOKENIZER_BIN
//     SRC_DIR holds tinyshakespeare/input.txt, gpt2/encoder.json, gpt2/vocab.bpe (data/get_sources.sh finds it)
//     writes OUT_DIR/tiny_shakespeare_val.bin, OUT_DIR/tiny_shakespeare_train.bin and TOKENIZER_BIN
//
// The split follows llm.c's dev/data/tinyshakespeare.py: every speech (text between blank lines) is treated
// as its own document, so the text is cut at each "\n\n" and every section is preceded by <|endoftext|>
// (50256). The "\n\n" stays with the section before it (the last section has none). The first 32,768 tokens
// are the validation split, the rest the training split. On the standard input.txt this gives 338,028 tokens
// starting 50256 5962 22307 25 198 ("<|endoftext|>First Citizen:\n"); test/cpu/test_data.cpp checks it.
// Nothing is half-written: the tokenizer file is written atomically, then OUT_DIR as a whole (data/prepro.h).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "data/prepro.h"
#include "llmc/bpe.h"
#include "llmc/error.h"
#include "llmc/tokenizer.h"

using namespace flashgpt2;

constexpr size_t VAL_TOKENS = 32768;

// EOT + the section's tokens, for each "\n\n"-separated section (see the header).
static std::vector<uint16_t> tokenize_documents(const BPE& bpe, const std::string& text, const std::string& where) {
    check_utf8(text, where);  // once for the whole text, so the error names the file and the byte
    std::vector<uint16_t> tokens;
    const std::string sep = "\n\n";
    size_t pos = 0;
    for (;;) {
        const size_t cut = text.find(sep, pos);
        const bool last = cut == std::string::npos;
        const std::string section = last ? text.substr(pos) : text.substr(pos, cut + sep.size() - pos);
        tokens.push_back(BPE::EOT);
        prepro::append_ids(tokens, bpe.encode(section, /*allow_special=*/false, where));
        if (last) break;
        pos = cut + sep.size();
    }
    return tokens;
}

int main(int argc, char** argv) {
    return run_main([&] {
        if (argc != 4) fail("usage: %s SRC_DIR OUT_DIR TOKENIZER_BIN", argv[0]);
        const std::string src = argv[1], out = argv[2], tok_path = argv[3];
        const auto t0 = std::chrono::steady_clock::now();

        const BPE bpe = load_gpt2_bpe(src);
        prepro::check_vocab_fits(bpe, src + "/gpt2/encoder.json");
        const std::string input_path = src + "/tinyshakespeare/input.txt";
        const std::string text = read_file(input_path);
        const std::vector<uint16_t> tokens = tokenize_documents(bpe, text, input_path);
        if (tokens.size() <= VAL_TOKENS)
            fail("%s: only %zu tokens, need more than %zu for a validation split", input_path.c_str(), tokens.size(), VAL_TOKENS);

        const size_t n_train = tokens.size() - VAL_TOKENS;
        prepro::check_replaceable(out, "tiny_shakespeare_");  // before the first write, so a refusal writes nothing
        write_tokenizer_bin(tok_path, bpe, BPE::EOT);
        prepro::write_token_dir(out, "tiny_shakespeare_", {{"tiny_shakespeare_val.bin", tokens.data(), VAL_TOKENS},
                                                         {"tiny_shakespeare_train.bin", tokens.data() + VAL_TOKENS, n_train}});

        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("%s: %zu bytes -> %zu tokens in %.2f s\n", input_path.c_str(), text.size(), tokens.size(), s);
        printf("  %s/tiny_shakespeare_val.bin    %zu tokens\n", out.c_str(), VAL_TOKENS);
        printf("  %s/tiny_shakespeare_train.bin  %zu tokens\n", out.c_str(), n_train);
        printf("  %s  %d tokens\n", tok_path.c_str(), bpe.vocab_size());
        return 0;
    });
}
