// prepro_text: your own text -> GPT-2 tokens in llm.c's .bin format, ready for both trainers (`make data TEXT=...`).
//
//   usage: prepro_text [flags] TEXT OUT_DIR
//     TEXT     a UTF-8 text file, or a folder: every file below it, in sorted path order (names starting with '.'
//              are skipped, so a .git folder is too)
//     OUT_DIR  the dataset folder, e.g. data/mytext; its last name (mytext) names the files inside:
//              mytext_val.bin and mytext_train.bin, or mytext_train_000001.bin, ... when train is over
//              --shard-tokens (llm.c's fineweb shards are 10^8 tokens; so are ours)
//
// Documents: a file is a document, and inside a file the text <|endoftext|> ends one too (that is how
// TinyStories' .txt files mark their stories), so every document is preceded by the <|endoftext|> token 50256,
// as llm.c's data scripts do. Nothing else cuts a file: a novel in one file is one document.
// Split: the first --val share of all tokens (counted in that order) is the validation split, the rest train
// (as llm.c's TinyShakespeare split takes the first tokens). Each split must hold one batch of B*T+1 tokens.
// Nothing is half-written: OUT_DIR is written whole or not at all (data/prepro.h). The tokens are held in memory
// (2 bytes each, about half the text's size), so the input is limited to MAX_TEXT_BYTES.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "data/prepro.h"
#include "llmc/args.h"
#include "llmc/bpe.h"
#include "llmc/error.h"
#include "llmc/tokenizer.h"

using namespace flashgpt2;
namespace fs = std::filesystem;

namespace {

constexpr size_t MAX_TEXT_BYTES = size_t(4) << 30;
constexpr size_t PIECE_BYTES = size_t(1) << 20;  // the text is encoded in ~1 MB pieces, for the progress line
constexpr size_t GPU_DEFAULT_BATCH = 16 * 1024 + 1;  // the CUDA trainer's default B*T+1 (train_options.h)

const char* USAGE = R"(usage: prepro_text [flags] TEXT OUT_DIR
  TEXT              a UTF-8 file, or a folder of them (all files below it, sorted; names starting with '.' skipped)
  OUT_DIR           dataset folder, e.g. data/mytext: mytext_val.bin, mytext_train.bin (or _train_000001.bin ...)
  --val FRAC        share of the tokens for validation, taken from the start   [0.1]
  -b B, -t T        each split must hold one batch of B*T+1 tokens (the CPU trainer's defaults) [8, 64]
  --shard-tokens N  train tokens per file; more are cut into numbered shards   [100000000]
  --bpe DIR         folder with gpt2/encoder.json and gpt2/vocab.bpe   [as data/get_sources.sh finds it]
  --tokenizer-out F also write llm.c's tokenizer file (what the trainers print samples with) to F
  -h, --help        this text
)";

struct Options {
    std::string text, out_dir, bpe_dir, tokenizer_out;
    double val = 0.1;
    long long B = 8, T = 64, shard_tokens = 100000000;
};

// The input files, in the order their tokens are concatenated.
std::vector<std::string> input_files(const std::string& path) {
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) return {path};
    if (!fs::is_directory(path, ec)) fail("%s: no such file or folder", path.c_str());
    std::vector<std::string> files;
    auto it = fs::recursive_directory_iterator(path, fs::directory_options::none, ec);
    if (ec) fail("%s: cannot read the folder: %s", path.c_str(), ec.message().c_str());
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) fail("%s: cannot read the folder: %s", path.c_str(), ec.message().c_str());
        std::error_code e;
        if (it->path().filename().string()[0] == '.') {
            if (it->is_directory(e)) it.disable_recursion_pending();
            continue;
        }
        if (it->is_regular_file(e)) files.push_back(it->path().string());
    }
    if (files.empty()) fail("%s: the folder holds no files", path.c_str());
    std::sort(files.begin(), files.end());
    return files;
}

// Validation tokens out of n: the --val share, rounded.
size_t val_tokens(size_t n, double val) { return (size_t)std::llround(val * (double)n); }

// The fewest tokens for which both splits hold `batch` tokens (searched upward from just below the estimate).
size_t min_total_tokens(size_t batch, double val) {
    size_t n = (size_t)std::max(0.0, std::floor(((double)batch - 0.5) / std::min(val, 1 - val)) - 2);
    while (val_tokens(n, val) < batch || n - val_tokens(n, val) < batch) n++;
    return n;
}

// The size of every input file together; Error for an unreadable one, an empty input or too much text.
size_t total_bytes(const std::vector<std::string>& files, const std::string& what) {
    size_t total = 0;
    for (const std::string& f : files) {
        std::error_code ec;
        const auto size = fs::file_size(f, ec);
        if (ec) fail("%s: cannot read: %s", f.c_str(), ec.message().c_str());
        total += (size_t)size;
    }
    if (total == 0) fail("%s: empty input: no text to tokenize", what.c_str());
    if (total > MAX_TEXT_BYTES)
        fail("%s: %.1f GB of text, more than this tool's %.1f GB (it holds the tokens in memory): use a part of it",
             what.c_str(), total / 1e9, MAX_TEXT_BYTES / 1e9);
    return total;
}

// Every document's tokens, each after <|endoftext|>, with a progress line on large inputs.
std::vector<uint16_t> tokenize(const BPE& bpe, const std::vector<std::string>& files, size_t total) {
    std::vector<uint16_t> tokens;
    tokens.reserve(total / 3);  // English is ~4 bytes a token
    prepro::Progress progress("tokenizing", (double)total, 32e6);
    size_t done = 0;
    for (const std::string& f : files) {
        const std::string text = read_file(f);
        check_utf8(text, f);  // names the file and the byte offset of the first bad sequence
        if (text.empty()) continue;
        if (text.rfind(BPE::EOT_TEXT, 0) != 0) tokens.push_back(BPE::EOT);  // the document's start, unless written
        prepro::encode_in_pieces(bpe, text, /*allow_special=*/true, PIECE_BYTES, tokens, [&](size_t bytes) {
            progress.update((double)(done + bytes), std::to_string(tokens.size()) + " tokens");
        });
        done += text.size();
    }
    return tokens;
}

// The train split's files: one, or numbered shards of nearly equal size, none over shard_tokens.
std::vector<prepro::TokenFile> train_files(const std::string& name, const uint16_t* data, size_t n, size_t shard_tokens) {
    const size_t k = (n + shard_tokens - 1) / shard_tokens;
    if (k <= 1) return {{name + "_train.bin", data, n}};
    std::vector<prepro::TokenFile> files;
    for (size_t i = 0; i < k; i++) {
        char file[64];
        snprintf(file, sizeof file, "_train_%06zu.bin", i + 1);
        files.push_back({name + file, data + i * n / k, (i + 1) * n / k - i * n / k});
    }
    return files;
}

void check_name(const std::string& name, const std::string& out_dir) {
    const bool ok = !name.empty() && name[0] != '.' &&
                    std::all_of(name.begin(), name.end(), [](char c) { return isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.'; });
    if (!ok) fail("%s: the dataset name '%s' may use only letters, digits, '_', '-' and '.' (not first)", out_dir.c_str(), name.c_str());
}

int run(const Options& o) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string out_dir = o.out_dir;
    while (out_dir.size() > 1 && out_dir.back() == '/') out_dir.pop_back();
    const std::string name = fs::path(out_dir).filename().string();
    check_name(name, out_dir);
    prepro::check_replaceable(out_dir, name + "_");  // refuse before any work

    const std::vector<std::string> files = input_files(o.text);
    const size_t bytes = total_bytes(files, o.text);
    const BPE bpe = load_gpt2_bpe(o.bpe_dir);
    prepro::check_vocab_fits(bpe, "GPT-2's encoder.json");
    const std::vector<uint16_t> tokens = tokenize(bpe, files, bytes);

    const size_t batch = (size_t)(o.B * o.T + 1), n = tokens.size(), n_val = val_tokens(n, o.val);
    if (n_val < batch || n - n_val < batch)
        fail("%s: %zu tokens, too few: the val share %g gives %zu val and %zu train tokens, and each split needs one "
             "batch of B*T+1 = %zu (B=%lld, T=%lld). Give at least %zu tokens (about %zu KB of English), a larger "
             "--val, or a smaller -b/-t", o.text.c_str(), n, o.val, n_val, n - n_val, batch, o.B, o.T,
             min_total_tokens(batch, o.val), min_total_tokens(batch, o.val) * 4 / 1000 + 1);
    std::vector<prepro::TokenFile> out = {{name + "_val.bin", tokens.data(), n_val}};
    for (const prepro::TokenFile& f : train_files(name, tokens.data() + n_val, n - n_val, (size_t)o.shard_tokens)) {
        if (f.n < batch) fail("--shard-tokens %lld: a %zu-token shard is smaller than one batch (%zu)", o.shard_tokens, f.n, batch);
        out.push_back(f);
    }
    if (!o.tokenizer_out.empty()) write_tokenizer_bin(o.tokenizer_out, bpe, BPE::EOT);
    prepro::write_token_dir(out_dir, name + "_", out);

    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("%s: %zu file%s, %zu bytes -> %zu tokens in %.2f s\n", o.text.c_str(), files.size(),
           files.size() == 1 ? "" : "s", bytes, n, s);
    for (const prepro::TokenFile& f : out) printf("  %s/%s  %zu tokens\n", out_dir.c_str(), f.name.c_str(), f.n);
    if (!o.tokenizer_out.empty()) printf("  %s  %d tokens\n", o.tokenizer_out.c_str(), bpe.vocab_size());
    if (n_val < GPU_DEFAULT_BATCH || n - n_val < GPU_DEFAULT_BATCH)
        printf("note: a split holds fewer than %zu tokens, the GPU trainer's default batch (B=16, T=1024): give it a "
               "smaller one, e.g. TRAIN_ARGS=\"-b 4 -t 256\"\n", GPU_DEFAULT_BATCH);
    printf("train on it: make train DATA=%s\n", out_dir.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return run_main([&] {
        Options o;
        args::Flags f;
        f.value("--val", [&](const std::string& v) { o.val = args::parse_float("--val", v, 1e-6, 1 - 1e-6); });
        f.value("-b", [&](const std::string& v) { o.B = args::parse_int("-b", v, 1, 1 << 16); });
        f.value("-t", [&](const std::string& v) { o.T = args::parse_int("-t", v, 1, 1 << 20); });
        f.value("--shard-tokens", [&](const std::string& v) { o.shard_tokens = args::parse_int("--shard-tokens", v, 1, INT32_MAX); });
        f.value("--bpe", [&](const std::string& v) { o.bpe_dir = v; });
        f.value("--tokenizer-out", [&](const std::string& v) { o.tokenizer_out = v; });
        if (!f.parse(argc, argv)) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (f.positional.size() != 2) fail("expected TEXT and OUT_DIR, got %zu words (see --help)", f.positional.size());
        o.text = f.positional[0], o.out_dir = f.positional[1];
        return run(o);
    });
}
