// Tests of `make data TEXT=...` (data/prepro_text.cpp, data/prepro.h): the layout it writes, documents and the val
// share, numbered shards, the Makefile's glue to both trainers, encoding in pieces, and every kind of bad input,
// each of which must leave nothing half-written. The expected token streams come from the BPE alone (its own
// tests check it against GPT-2's), assembled here as the tool's header describes them.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "data/prepro.h"
#include "llmc/bpe.h"
#include "llmc/dataloader.h"
#include "test/cpu/data_helpers.h"

using namespace flashgpt2;
using namespace flashgpt2::testing;
using std::string;
using std::vector;
namespace fs = std::filesystem;

namespace {

CommandResult prepro_text(const string& args) { return run_command(tool("prepro_text") + " " + args); }

string q(const string& s) { return "'" + s + "'"; }

vector<int> concat(const vector<vector<int>>& parts) {
    vector<int> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

vector<int> tokens_of(const string& path) {
    const vector<uint16_t> t = read_token_file(path);
    return vector<int>(t.begin(), t.end());
}

// A text of ~n lines mixing what GPT-2's split regex treats differently: words, numbers, punctuation, contractions,
// runs of spaces and newlines, non-ASCII letters and an emoji.
string mixed_text(std::mt19937& g, int n) {
    const char* pieces[] = {"word", " word", "  ", "\n", "\n\n", " \n", "7", " 42", "'s", "'ll", ",", "!?", "\t",
                            "caf\xC3\xA9", " \xF0\x9F\x98\x80", "\xE6\x97\xA5\xE6\x9C\xAC", "x\ny", ".\n", "A"};
    string s;
    for (int i = 0; i < n; i++) s += pieces[g() % (sizeof pieces / sizeof pieces[0])];
    return s;
}

}  // namespace

TEST_CASE("data text: a file becomes <name>_val.bin + <name>_train.bin: <|endoftext|>, GPT-2's ids, the first 10% val") {
    TempDir d;
    string text;
    for (int i = 0; i < 3000; i++) text += "Line " + std::to_string(i) + " of my own text, na\xC3\xAFve and short.\n";
    write_bytes(d / "mytext.txt", text);
    const auto r = prepro_text(q(d / "mytext.txt") + " " + q(d / "out/mytext"));
    REQUIRE_MESSAGE(r.rc == 0, r.err);
    CHECK(contains(r.out, "train on it: make train DATA=" + (d / "out/mytext")));

    const vector<int> want = concat({{BPE::EOT}, gpt2_bpe().encode(text, /*allow_special=*/true)});
    const vector<int> val = tokens_of(d / "out/mytext/mytext_val.bin"), train = tokens_of(d / "out/mytext/mytext_train.bin");
    const size_t n_val = (size_t)(0.1 * want.size() + 0.5);  // the share, rounded to nearest
    CHECK(val.size() == n_val);
    CHECK(concat({val, train}) == want);
    CHECK(vector<fs::path>(fs::directory_iterator(d / "out/mytext"), {}).size() == 2);  // nothing else in the folder
    CHECK(!fs::exists(d / "out/mytext.tmp"));
}

TEST_CASE("data text: a folder is its files in sorted order, each a document; <|endoftext|> in a file ends one too") {
    TempDir d;
    write_bytes(d / "in/b.txt", "Bee one<|endoftext|>Bee two");
    write_bytes(d / "in/a/z.txt", "<|endoftext|>Zed starts with the marker");
    write_bytes(d / "in/a/c.txt", "Sea\n");
    write_bytes(d / "in/empty.txt", "");
    write_bytes(d / "in/.hidden.txt", "not read");
    write_bytes(d / "in/.git/objects.txt", "not read either");
    const auto r = prepro_text("--val 0.5 -b 1 -t 2 " + q(d / "in") + " " + q(d / "out/docs"));
    REQUIRE_MESSAGE(r.rc == 0, r.err);
    CHECK(contains(r.out, "4 files"));  // a/c.txt a/z.txt b.txt empty.txt, not the dot names
    const BPE& bpe = gpt2_bpe();
    const vector<int> want = concat({{BPE::EOT}, bpe.encode("Sea\n"),                          // a/c.txt
                                     {BPE::EOT}, bpe.encode("Zed starts with the marker"),     // a/z.txt: one EOT, not two
                                     {BPE::EOT}, bpe.encode("Bee one"), {BPE::EOT}, bpe.encode("Bee two")});  // b.txt
    CHECK(concat({tokens_of(d / "out/docs/docs_val.bin"), tokens_of(d / "out/docs/docs_train.bin")}) == want);
}

TEST_CASE("data text: a large train split becomes numbered shards of nearly equal size, all read by -i <name>_train*") {
    TempDir d;
    string text;
    for (int i = 0; i < 2000; i++) text += "Shard test line " + std::to_string(i) + ".\n";
    write_bytes(d / "big.txt", text);
    const auto r = prepro_text("--shard-tokens 4000 " + q(d / "big.txt") + " " + q(d / "out/big"));
    REQUIRE_MESSAGE(r.rc == 0, r.err);
    const vector<int> want = concat({{BPE::EOT}, gpt2_bpe().encode(text)});
    const size_t n_val = (size_t)(0.1 * want.size() + 0.5), n_train = want.size() - n_val;
    const size_t k = (n_train + 3999) / 4000;
    REQUIRE(k >= 3);
    CHECK(!fs::exists(d / "out/big/big_train.bin"));
    vector<int> all = tokens_of(d / "out/big/big_val.bin");
    for (size_t i = 1; i <= k; i++) {
        char name[64];
        snprintf(name, sizeof name, "out/big/big_train_%06zu.bin", i);
        const vector<int> shard = tokens_of(d / name);
        CHECK(shard.size() <= 4000);
        CHECK(shard.size() >= n_train / k);
        all.insert(all.end(), shard.begin(), shard.end());
    }
    CHECK(!fs::exists(d / ("out/big/big_train_" + string(5, '0') + std::to_string(k + 1) + ".bin")));
    CHECK(all == want);
    // the trainers' -i glob (what the Makefile's DATA=... passes) finds every shard
    DataLoader loader(d / "out/big/big_train*.bin", 4, 32);
    CHECK(loader.files().size() == k);
}

TEST_CASE("data text: make data TEXT=... then make train DATA=... trains the CPU model on it") {
    TempDir d;
    string text;
    for (int i = 0; i < 600; i++) text += "The make glue, line " + std::to_string(i) + ". It's plain text.\n";
    write_bytes(d / "My Text.txt", text);  // a space in the path: TEXT reaches the tool through the environment
    const string name = "flashgpt2_test_" + std::to_string(getpid());
    const auto made = run_command("make --no-print-directory data TEXT=" + q(d / "My Text.txt") + " NAME=" + name);
    REQUIRE_MESSAGE(made.rc == 0, made.err);
    CHECK(fs::exists("data/" + name + "/" + name + "_val.bin"));
    const auto trained = run_command("make --no-print-directory train DATA=data/" + name + " TRAIN_ARGS=\"-x 2 -g 4 -b 2 -t 16 -m 1 -o " +
                                     (d / "run") + "\"");
    fs::remove_all("data/" + name);
    REQUIRE_MESSAGE(trained.rc == 0, trained.err);
    CHECK(contains(trained.out, "step    2/2"));
    CHECK(fs::exists(d / "run/model_00000002.bin"));
    const auto wrong = run_command("make --no-print-directory train DATA=" + q(d / "nothing-here"));
    CHECK(wrong.rc != 0);
    CHECK(contains(wrong.err, "no single <name>_val.bin there (make data TEXT=... writes a dataset folder)"));
}

TEST_CASE("data text: bad input is one clear error line, and nothing is half-written") {
    TempDir d;
    auto one_error_line = [](const CommandResult& r) {
        CHECK(r.rc == 1);
        CHECK(r.err.rfind("error: ", 0) == 0);
        CHECK(r.err.find('\n') == r.err.size() - 1);
    };
    SUBCASE("non-UTF-8 in the second file of a folder: its name and byte offset") {
        write_bytes(d / "in/1.txt", string(3000, 'a'));
        write_bytes(d / "in/2.txt", "fine text, then \xC3\x28 a broken sequence");
        const auto r = prepro_text(q(d / "in") + " " + q(d / "out/x"));
        one_error_line(r);
        CHECK(contains(r.err, (d / "in/2.txt") + ": invalid UTF-8 at byte 16"));
    }
    SUBCASE("empty input: an empty file, a folder of empty files, a folder with no files") {
        write_bytes(d / "e.txt", "");
        one_error_line(prepro_text(q(d / "e.txt") + " " + q(d / "out/x")));
        CHECK(contains(prepro_text(q(d / "e.txt") + " " + q(d / "out/x")).err, "empty input"));
        write_bytes(d / "in/a.txt", "");
        write_bytes(d / "in/b.txt", "");
        CHECK(contains(prepro_text(q(d / "in") + " " + q(d / "out/x")).err, "empty input"));
        fs::create_directories(d / "none");
        CHECK(contains(prepro_text(q(d / "none") + " " + q(d / "out/x")).err, "the folder holds no files"));
    }
    SUBCASE("too little text for one batch: how many tokens, and the minimum") {
        write_bytes(d / "s.txt", "Hello world, this is short.");
        const auto r = prepro_text(q(d / "s.txt") + " " + q(d / "out/x"));
        one_error_line(r);
        const size_t n = 1 + gpt2_bpe().encode("Hello world, this is short.").size();
        CHECK(contains(r.err, std::to_string(n) + " tokens, too few"));
        CHECK(contains(r.err, "B*T+1 = 513 (B=8, T=64)"));
        // the least N with round(0.1 N) >= 513 and N - round(0.1 N) >= 513: 0.1 * 5125 = 512.5 rounds up to 513
        CHECK(contains(r.err, "Give at least 5125 tokens"));
    }
    SUBCASE("an output folder that holds someone else's files is refused, and left alone") {
        write_bytes(d / "s.txt", string(30000, 'z'));
        write_bytes(d / "out/x/notes.txt", "mine");
        const auto r = prepro_text(q(d / "s.txt") + " " + q(d / "out/x"));
        one_error_line(r);
        CHECK(contains(r.err, "holds notes.txt, which is not this dataset's (x_*.bin)"));
        CHECK(read_file(d / "out/x/notes.txt") == "mine");
    }
    SUBCASE("no such input, a bad name, a bad flag") {
        one_error_line(prepro_text(q(d / "missing.txt") + " " + q(d / "out/x")));
        CHECK(contains(prepro_text(q(d / "missing.txt") + " " + q(d / "out/x")).err, "no such file or folder"));
        write_bytes(d / "s.txt", string(30000, 'z'));
        CHECK(contains(prepro_text(q(d / "s.txt") + " " + q(d / "out/b@d")).err, "may use only letters"));
        CHECK(contains(prepro_text("--val 1.5 " + q(d / "s.txt") + " " + q(d / "out/x")).err, "--val: 1.5 is out of range"));
    }
    // nothing was written: no dataset folder, no .tmp folder
    CHECK(!fs::exists(d / "out/x/x_val.bin"));
    CHECK(!fs::exists(d / "out/x.tmp"));
}

TEST_CASE("data text: a run that fails keeps the previous dataset; one that succeeds replaces it whole") {
    TempDir d;
    string text;
    for (int i = 0; i < 2000; i++) text += "Version one, line " + std::to_string(i) + ".\n";
    write_bytes(d / "t.txt", text);
    REQUIRE(prepro_text("--shard-tokens 4000 " + q(d / "t.txt") + " " + q(d / "out/t")).rc == 0);
    const string val_before = read_file(d / "out/t/t_val.bin");
    write_bytes(d / "t.txt", text + "\xFF");
    CHECK(prepro_text(q(d / "t.txt") + " " + q(d / "out/t")).rc == 1);
    CHECK(read_file(d / "out/t/t_val.bin") == val_before);
    CHECK(fs::exists(d / "out/t/t_train_000001.bin"));
    write_bytes(d / "t.txt", text);
    REQUIRE(prepro_text(q(d / "t.txt") + " " + q(d / "out/t")).rc == 0);  // one train file now: the shards are gone
    CHECK(vector<fs::path>(fs::directory_iterator(d / "out/t"), {}).size() == 2);
    CHECK(fs::exists(d / "out/t/t_train.bin"));
    CHECK(!fs::exists(d / "out/t.tmp"));
}

TEST_CASE("data text: write_token_dir writes the folder whole or not at all, even when a write fails midway") {
    TempDir d;
    const vector<uint16_t> a = {1, 2, 3}, b = {4, 5};
    prepro::write_token_dir(d / "set", "set_", {{"set_val.bin", a.data(), a.size()}, {"set_train.bin", b.data(), b.size()}});
    const string before = read_file(d / "set/set_train.bin");
    // the second file cannot be written (its folder does not exist): the first must not appear, the old set stays
    const string e = error_of([&] {
        prepro::write_token_dir(d / "set", "set_", {{"set_val.bin", b.data(), b.size()}, {"no/such/set_x.bin", a.data(), a.size()}});
    });
    CHECK(contains(e, "cannot open for writing"));
    CHECK(tokens_of(d / "set/set_val.bin") == vector<int>{1, 2, 3});
    CHECK(read_file(d / "set/set_train.bin") == before);
    CHECK(!fs::exists(d / "set.tmp"));
    CHECK(!fs::exists(d / "set.old"));
}

TEST_CASE("data text: encoding in pieces, cut only at safe places, gives exactly the whole text's ids") {
    CHECK(prepro::is_safe_cut("ab\ncd", 3));
    CHECK(!prepro::is_safe_cut("ab \ncd", 4));   // whitespace before the '\n' would join it
    CHECK(!prepro::is_safe_cut("ab\n cd", 3));   // and so would whitespace after it
    CHECK(!prepro::is_safe_cut("ab\n\ncd", 4));  // a run of newlines
    const BPE& bpe = gpt2_bpe();
    const string shakespeare = read_file(source_dir() + "/tinyshakespeare/input.txt");
    const vector<int> whole = bpe.encode(shakespeare);
    for (size_t piece : {size_t(1), size_t(100), size_t(65536)}) {
        CAPTURE(piece);
        vector<uint16_t> got;
        size_t calls = 0;
        prepro::encode_in_pieces(bpe, shakespeare, false, piece, got, [&](size_t) { calls++; });
        CHECK(calls > 1);
        CHECK(vector<int>(got.begin(), got.end()) == whole);
    }
    const uint32_t seed = 2024;
    MESSAGE("mixed text, seed ", seed);
    std::mt19937 g(seed);
    for (int round = 0; round < 20; round++) {
        const string text = mixed_text(g, 3000) + "<|endoftext|>" + mixed_text(g, 100);
        vector<uint16_t> got;
        prepro::encode_in_pieces(bpe, text, true, 1 + g() % 64, got, [](size_t) {});
        const vector<int> want = bpe.encode(text, true);
        CHECK(vector<int>(got.begin(), got.end()) == want);
    }
}
