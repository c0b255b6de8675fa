// Tests of `make data`'s output (data/tinyshakespeare/*.bin, written by data/prepro_tinyshakespeare.cpp) and of
// the prep tool on bad input. Assumes `make data` ran (`make test` depends on it); runs from the repository root.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <sys/wait.h>
#include <vector>

#include "llmc/bpe.h"
#include "llmc/dataloader.h"
#include "llmc/tokenizer.h"
#include "test/cpu/data_helpers.h"

using namespace flashgpt2;
using namespace flashgpt2::testing;

namespace {

const char* VAL = "data/tinyshakespeare/tiny_shakespeare_val.bin";
const char* TRAIN = "data/tinyshakespeare/tiny_shakespeare_train.bin";
const char* TOOL = "./build/prepro_tinyshakespeare";

// Runs the prep tool on a source dir; returns its exit code and its stderr.
std::pair<int, std::string> run_tool(const std::string& src, const std::string& out_dir, const std::string& tok) {
    REQUIRE_MESSAGE(std::filesystem::exists(TOOL), "build the prep tool first: make data");
    const std::string err = out_dir + ".stderr";
    const std::string cmd = std::string(TOOL) + " '" + src + "' '" + out_dir + "' '" + tok + "' >/dev/null 2>'" + err + "'";
    const int status = system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(err)};
}

}  // namespace

TEST_CASE("data: TinyShakespeare has 338,028 tokens split 32,768 val / 305,260 train") {
    const std::vector<uint16_t> val = read_token_file(VAL), train = read_token_file(TRAIN);
    CHECK(val.size() == 32768);
    CHECK(train.size() == 305260);
    CHECK(val.size() + train.size() == 338028);
    REQUIRE(val.size() >= 5);
    CHECK(std::vector<uint16_t>(val.begin(), val.begin() + 5) == std::vector<uint16_t>{50256, 5962, 22307, 25, 198});
}

TEST_CASE("data: decoding val then train without the inserted <|endoftext|> gives input.txt byte for byte") {
    const std::string input = read_file(source_dir() + "/tinyshakespeare/input.txt");
    const Tokenizer tok = Tokenizer::load("data/gpt2_tokenizer.bin");
    std::vector<uint16_t> all = read_token_file(VAL);
    const std::vector<uint16_t> train = read_token_file(TRAIN);
    all.insert(all.end(), train.begin(), train.end());
    std::string text;
    size_t eots = 0;
    for (uint16_t id : all) {
        if (id == tok.eot_token) {
            eots++;
            continue;
        }
        text += tok.decode(id);
    }
    CHECK(text.size() == input.size());
    CHECK(text == input);
    // One <|endoftext|> before the text and one after every "\n\n" (non-overlapping, as str.split counts them).
    size_t seps = 0;
    for (size_t p = input.find("\n\n"); p != std::string::npos; p = input.find("\n\n", p + 2)) seps++;
    CHECK(eots == seps + 1);
}

TEST_CASE("data: the prep tool turns a small source dir into the documented layout") {
    TempDir d;
    // A tiny source dir: the real vocabulary (symlinked), a made-up text with three documents.
    std::filesystem::create_directories(d / "src/gpt2");
    std::filesystem::create_symlink(std::filesystem::absolute(source_dir() + "/gpt2/encoder.json"), d / "src/gpt2/encoder.json");
    std::filesystem::create_symlink(std::filesystem::absolute(source_dir() + "/gpt2/vocab.bpe"), d / "src/gpt2/vocab.bpe");
    std::string text;
    for (int i = 0; i < 4000; i++) text += "Speech number " + std::to_string(i) + ", with words.\n\nNext:\n";
    write_bytes(d / "src/tinyshakespeare/input.txt", text);
    auto [rc, err] = run_tool(d / "src", d / "out", d / "tok.bin");
    REQUIRE_MESSAGE(rc == 0, err);
    const std::vector<uint16_t> val = read_token_file(d / "out/tiny_shakespeare_val.bin");
    const std::vector<uint16_t> train = read_token_file(d / "out/tiny_shakespeare_train.bin");
    CHECK(val.size() == 32768);
    // Expected stream: EOT + encode(section + "\n\n") per section, the last without "\n\n".
    const BPE& bpe = gpt2_bpe();
    std::vector<int> want;
    size_t pos = 0;
    for (;;) {
        const size_t cut = text.find("\n\n", pos);
        want.push_back(50256);
        const std::vector<int> ids = bpe.encode(cut == std::string::npos ? text.substr(pos) : text.substr(pos, cut + 2 - pos));
        want.insert(want.end(), ids.begin(), ids.end());
        if (cut == std::string::npos) break;
        pos = cut + 2;
    }
    std::vector<int> got(val.begin(), val.end());
    got.insert(got.end(), train.begin(), train.end());
    CHECK(got == want);
    CHECK(Tokenizer::load(d / "tok.bin").vocab_size == 50257);
}

TEST_CASE("data: the prep tool fails with one clear line on bad sources, writing nothing") {
    TempDir d;
    std::filesystem::create_directories(d / "src/gpt2");
    std::filesystem::create_symlink(std::filesystem::absolute(source_dir() + "/gpt2/encoder.json"), d / "src/gpt2/encoder.json");
    std::filesystem::create_symlink(std::filesystem::absolute(source_dir() + "/gpt2/vocab.bpe"), d / "src/gpt2/vocab.bpe");

    SUBCASE("missing input.txt") {
        auto [rc, err] = run_tool(d / "src", d / "out", d / "tok.bin");
        CHECK(rc == 1);
        CHECK(contains(err, "error: " + (d / "src/tinyshakespeare/input.txt")));
    }
    SUBCASE("non-UTF-8 input.txt") {
        write_bytes(d / "src/tinyshakespeare/input.txt", "First Citizen:\nBefore we \xff proceed\n");
        auto [rc, err] = run_tool(d / "src", d / "out", d / "tok.bin");
        CHECK(rc == 1);
        CHECK(contains(err, "error: " + (d / "src/tinyshakespeare/input.txt") + ": invalid UTF-8 at byte 25"));
    }
    SUBCASE("text too short for a validation split") {
        write_bytes(d / "src/tinyshakespeare/input.txt", "First Citizen:\n");
        auto [rc, err] = run_tool(d / "src", d / "out", d / "tok.bin");
        CHECK(rc == 1);
        CHECK(contains(err, "validation split"));
    }
    SUBCASE("broken encoder.json") {
        std::filesystem::remove(d / "src/gpt2/encoder.json");
        write_bytes(d / "src/gpt2/encoder.json", "{\"a\": 0,");
        write_bytes(d / "src/tinyshakespeare/input.txt", "hello\n");
        auto [rc, err] = run_tool(d / "src", d / "out", d / "tok.bin");
        CHECK(rc == 1);
        CHECK(contains(err, "error: " + (d / "src/gpt2/encoder.json")));
    }
    // One line of output, and no output file (not even a .tmp) left behind.
    CHECK(!std::filesystem::exists(d / "out/tiny_shakespeare_val.bin"));
    CHECK(!std::filesystem::exists(d / "out/tiny_shakespeare_val.bin.tmp"));
    CHECK(!std::filesystem::exists(d / "tok.bin"));
}

TEST_CASE("data: make's source lookup prefers DATA_MIRROR, then ../shared/data, then data/raw") {
    auto dir_with = [](const std::string& env) {
        FILE* p = popen((env + " bash data/get_sources.sh dir").c_str(), "r");
        REQUIRE(p != nullptr);
        char buf[4096] = {};
        REQUIRE(fgets(buf, sizeof buf, p) != nullptr);
        pclose(p);
        std::string s(buf);
        if (!s.empty() && s.back() == '\n') s.pop_back();
        return s;
    };
    CHECK(dir_with("DATA_MIRROR=/some/mirror/") == "/some/mirror");
    const bool shared = std::filesystem::exists("../shared/data/tinyshakespeare/input.txt") &&
                        std::filesystem::exists("../shared/data/gpt2/encoder.json") &&
                        std::filesystem::exists("../shared/data/gpt2/vocab.bpe");
    CHECK(dir_with("env -u DATA_MIRROR") == (shared ? "../shared/data" : "data/raw"));
    // A missing file in a mirror is an error naming it (only data/raw is ever downloaded into).
    TempDir d;
    const std::string cmd = "bash data/get_sources.sh fetch '" + d.path + "' '" + (d / "gpt2/vocab.bpe") + "' 2>/dev/null";
    CHECK(WEXITSTATUS(system(cmd.c_str())) == 1);
}
