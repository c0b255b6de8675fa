// tokenizer: GPT-2's tokenizer on the command line, text to ids and back.
//
//   build/tokenizer encode [--allow-special] [--bpe DIR]  < text.txt  > ids.txt
//   build/tokenizer decode [--tokenizer FILE]              < ids.txt   > text.txt
//
// encode reads UTF-8 text on stdin and writes its GPT-2 token ids (llmc/bpe.h) on stdout, separated by spaces,
// with one newline at the end. The text "<|endoftext|>" is ordinary text unless --allow-special makes it the
// special token 50256 (tiktoken's encode_ordinary and encode(allowed_special) behave the same two ways).
// decode reads whitespace-separated ids on stdin and writes exactly the bytes they stand for, adding nothing,
// so `encode | decode` gives back the input byte for byte. It reads llm.c's tokenizer file (llmc/tokenizer.h,
// written by `make data`), the one the trainers print their samples with.
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/args.h"
#include "llmc/bpe.h"
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/tokenizer.h"

using namespace flashgpt2;

namespace {

const char* USAGE = R"(usage: tokenizer encode [--allow-special] [--bpe DIR]   < text  > ids
       tokenizer decode [--tokenizer FILE]               < ids   > text
  encode            UTF-8 text -> GPT-2 token ids, space-separated, one newline at the end
  decode            whitespace-separated ids -> the exact bytes they stand for
  --allow-special   encode the text <|endoftext|> as the special token 50256 (else it is ordinary text)
  --bpe DIR         folder with gpt2/encoder.json and gpt2/vocab.bpe   [as data/get_sources.sh finds it]
  --tokenizer FILE  llm.c's tokenizer file   [data/gpt2_tokenizer.bin, written by make data]
)";

void write_stdout(const std::string& bytes) {
    if ((!bytes.empty() && fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size()) || fflush(stdout) != 0)
        fail("stdout: write failed");
}

std::string encode(const std::string& text, const std::string& bpe_dir, bool allow_special) {
    const BPE bpe = load_gpt2_bpe(bpe_dir);
    std::string out;
    for (int id : bpe.encode(text, allow_special, "stdin")) {
        if (!out.empty()) out += ' ';
        out += std::to_string(id);
    }
    return out + "\n";
}

// The ids of whitespace-separated decimal words; Error naming the first bad one and its place.
std::vector<int> parse_ids(const std::string& text, uint32_t vocab_size) {
    std::vector<int> ids;
    size_t i = 0;
    auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; };
    while (i < text.size()) {
        if (space(text[i])) {
            i++;
            continue;
        }
        const size_t start = i;
        while (i < text.size() && !space(text[i])) i++;
        const std::string word = text.substr(start, i - start);
        long long id = -1;
        const bool digits = word.size() <= 9 && word.find_first_not_of("0123456789") == std::string::npos;
        if (digits) id = std::stoll(word);
        if (!digits || id >= vocab_size)
            fail("stdin: id #%zu (byte %zu) is '%s', not a token id: ids are 0..%u", ids.size() + 1, start,
                 word.size() > 20 ? (word.substr(0, 20) + "...").c_str() : word.c_str(), vocab_size - 1);
        ids.push_back((int)id);
    }
    return ids;
}

}  // namespace

int main(int argc, char** argv) {
    return run_main([&] {
        bool allow_special = false;
        std::string bpe_dir, tokenizer = "data/gpt2_tokenizer.bin";
        args::Flags f;
        f.flag("--allow-special", [&] { allow_special = true; });
        f.value("--bpe", [&](const std::string& v) { bpe_dir = v; });
        f.value("--tokenizer", [&](const std::string& v) { tokenizer = v; });
        if (!f.parse(argc, argv)) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (f.positional.size() != 1 || (f.positional[0] != "encode" && f.positional[0] != "decode"))
            fail("expected one command, encode or decode (see --help)");
        const std::string input = read_stream(stdin, "stdin");
        if (f.positional[0] == "encode") {
            write_stdout(encode(input, bpe_dir, allow_special));
        } else {
            const Tokenizer tok = Tokenizer::load(tokenizer);
            write_stdout(tok.decode(parse_ids(input, tok.vocab_size)));
        }
        return 0;
    });
}
