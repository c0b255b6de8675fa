// Tests of the GPT-2 BPE (llmc/bpe.h) and llm.c's tokenizer file (llmc/tokenizer.h).
// Ground truth for encoding: test/cpu/vectors/gpt2_encode.tsv, ids from an independent implementation
// (js-tiktoken's "gpt2" encoding; see the file's header for how it was made; data_helpers.h reads it).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/bpe.h"
#include "llmc/tokenizer.h"
#include "test/cpu/alloc_watch.h"
#include "test/cpu/data_helpers.h"
#include "test/cpu/seed.h"

using namespace flashgpt2;
using namespace flashgpt2::testing;

namespace {

std::string bin_header(uint32_t magic, uint32_t version, uint32_t vocab, uint32_t eot) {
    uint32_t h[256] = {magic, version, vocab, eot};
    return std::string(reinterpret_cast<const char*>(h), sizeof h);
}

}  // namespace

TEST_CASE("tokenizer: encoding matches GPT-2's on the test vectors, and decodes back byte for byte") {
    const BPE& bpe = gpt2_bpe();
    CHECK(bpe.vocab_size() == 50257);
    const std::vector<Vector> vectors = load_vectors();
    REQUIRE(vectors.size() >= 30);
    for (const Vector& v : vectors) {
        CAPTURE(v.label);
        CHECK(bpe.encode(v.text, v.allow_special) == v.ids);
        CHECK(bpe.decode(v.ids) == v.text);
    }
}

TEST_CASE("tokenizer: <|endoftext|> is the special token only when allowed") {
    const BPE& bpe = gpt2_bpe();
    const std::string text = "a<|endoftext|>b";
    CHECK(bpe.encode(text, true) == std::vector<int>{64, 50256, 65});
    const std::vector<int> plain = bpe.encode(text, false);
    CHECK(plain.size() > 3);
    for (int id : plain) CHECK(id != 50256);
    CHECK(bpe.decode(plain) == text);
}

TEST_CASE("tokenizer: the pre-tokenizer cuts words like GPT-2's regex") {
    const BPE& bpe = gpt2_bpe();
    using W = std::vector<std::string>;
    CHECK(bpe.split("Hello  world") == W{"Hello", " ", " world"});        // \s+(?!\S) leaves the last space
    CHECK(bpe.split("I'll go, 42x") == W{"I", "'ll", " go", ",", " 42", "x"});
    CHECK(bpe.split("été Ωμέγα") == W{"été", " Ωμέγα"});                   // \p{L} is Unicode letters
    CHECK(bpe.split("a\n\n b") == W{"a", "\n\n", " b"});
    // Whitespace is Unicode's White_Space set. Expected splits from Python's `regex` module (GPT-2's original
    // encoder.py uses it) with the same pattern: U+180E is not space, U+0085 and U+1680 are.
    CHECK(bpe.split("x\u180e. a\u180e\n\nb") == W{"x", "\u180e.", " a", "\u180e", "\n", "\n", "b"});
    CHECK(bpe.split("a\u0085\u0085b") == W{"a", "\u0085", "\u0085", "b"});
    CHECK(bpe.split(" \u3000\u1680x") == W{" \u3000", "\u1680", "x"});
}

TEST_CASE("tokenizer: random Unicode text round-trips through encode and decode") {
    // Fresh random strings each run: code points from ASCII, Latin-1, Cyrillic, CJK and emoji ranges plus
    // whitespace, so every regex branch and many byte-level fallbacks get exercised.
    const BPE& bpe = gpt2_bpe();
    std::mt19937 rng((uint32_t)test_seed("tokenizer: random Unicode round trip", 107));
    const uint32_t ranges[][2] = {{0x20, 0x7E}, {0xA0, 0xFF}, {0x400, 0x4FF}, {0x4E00, 0x9FFF}, {0x1F300, 0x1F6FF}, {0x9, 0xD}};
    for (int trial = 0; trial < 200; trial++) {
        std::string s;
        const int n = rng() % 40;
        for (int i = 0; i < n; i++) {
            const auto& r = ranges[rng() % 6];
            append_utf8(s, r[0] + rng() % (r[1] - r[0] + 1));
        }
        CAPTURE(s);
        const std::vector<int> ids = bpe.encode(s);
        for (int id : ids) REQUIRE((id >= 0 && id < 50256));
        CHECK(bpe.decode(ids) == s);
    }
}

TEST_CASE("tokenizer: invalid UTF-8 input is an Error naming the source and the byte") {
    const BPE& bpe = gpt2_bpe();
    const char* bad[] = {"abc\xff", "ok \xC0\xAF", "x\xED\xA0\x80", "trunc \xE2\x82", "\xF4\x90\x80\x80", "\x80"};
    for (const char* s : bad) {
        CAPTURE(s);
        const std::string msg = error_of([&] { bpe.encode(s, false, "my_input.txt"); });
        CHECK(contains(msg, "my_input.txt"));
        CHECK(contains(msg, "invalid UTF-8 at byte"));
    }
    CHECK(contains(error_of([&] { bpe.encode("abc\xff"); }), "at byte 3"));
}

TEST_CASE("tokenizer: the JSON reader handles escapes, surrogate pairs, and rejects broken JSON") {
    const std::string json = R"({"a\"b": 0, "\u00e9\\": 1, "\ud83d\ude00": 2, "\n\t\/": 3})";
    const auto entries = JsonVocabReader(json, "x.json").parse();
    REQUIRE(entries.size() == 4);
    CHECK(entries[0].first == "a\"b");
    CHECK(entries[1].first == "\xC3\xA9\\");
    CHECK(entries[2].first == "\xF0\x9F\x98\x80");  // U+1F600
    CHECK(entries[3].first == "\n\t/");
    CHECK(entries[3].second == 3);
    const char* broken[] = {R"({"a": 1)", R"({"\ud83d": 1})", R"({"\ude00": 1})", R"({"a" 1})", R"({"a": -1})",
                            R"({"\q": 1})", R"({"a": 1} x)", R"(["a"])"};
    for (const char* b : broken) {
        CAPTURE(b);
        CHECK(contains(error_of([&] { JsonVocabReader(b, "x.json").parse(); }), "x.json: JSON error"));
    }
}

TEST_CASE("tokenizer: BPE::load reports missing and malformed files by name") {
    TempDir d;
    const std::string enc = source_dir() + "/gpt2/encoder.json", merges = source_dir() + "/gpt2/vocab.bpe";
    CHECK(contains(error_of([&] { BPE::load(d / "nope.json", merges); }), d / "nope.json"));
    CHECK(contains(error_of([&] { BPE::load(enc, d / "nope.bpe"); }), d / "nope.bpe"));
    write_bytes(d / "noversion.bpe", "a b\n");
    CHECK(contains(error_of([&] { BPE::load(enc, d / "noversion.bpe"); }), d / "noversion.bpe"));
    write_bytes(d / "unknown.bpe", "#version: 0.2\nzzzq qqqz\n");
    CHECK(contains(error_of([&] { BPE::load(enc, d / "unknown.bpe"); }), "line 2"));
    write_bytes(d / "trunc.json", "{\"a\": 0, \"b");
    CHECK(contains(error_of([&] { BPE::load(d / "trunc.json", merges); }), d / "trunc.json"));
}

TEST_CASE("tokenizer: gpt2_tokenizer.bin (from make data) decodes like the BPE") {
    const Tokenizer t = Tokenizer::load("data/gpt2_tokenizer.bin");
    const BPE& bpe = gpt2_bpe();
    CHECK(t.vocab_size == 50257);
    CHECK(t.eot_token == 50256);
    for (int id = 0; id < static_cast<int>(t.vocab_size); id++) REQUIRE(t.decode(id) == bpe.token_bytes(id));
    CHECK(t.decode(std::vector<int>{50256, 5962, 22307, 25, 198}) == "<|endoftext|>First Citizen:\n");
    CHECK(contains(error_of([&] { t.decode(50257); }), "out of range"));
    CHECK(contains(error_of([&] { t.decode(-1); }), "out of range"));
}

TEST_CASE("tokenizer: write_tokenizer_bin then Tokenizer::load round-trips") {
    TempDir d;
    write_tokenizer_bin(d / "tok.bin", gpt2_bpe());
    const Tokenizer t = Tokenizer::load(d / "tok.bin");
    REQUIRE(t.vocab_size == 50257);
    CHECK(t.eot_token == 50256);
    for (int id = 0; id < 50257; id++) REQUIRE(t.decode(id) == gpt2_bpe().token_bytes(id));
    CHECK(!std::filesystem::exists(d / "tok.bin.tmp"));
}

TEST_CASE("tokenizer: bad tokenizer files are Errors naming the file") {
    TempDir d;
    const std::string good = bin_header(20240328, 2, 2, 1) + std::string("\x01" "a" "\x02" "bc", 5);
    write_bytes(d / "good.bin", good);
    const Tokenizer t = Tokenizer::load(d / "good.bin");  // the hand-made file itself is valid
    CHECK(t.decode(std::vector<int>{1, 0}) == "bca");
    struct Case {
        const char* name;
        std::string bytes;
        const char* says;
    } cases[] = {
        {"magic.bin", bin_header(12345, 2, 2, 1) + good.substr(1024), "bad magic"},
        {"version.bin", bin_header(20240328, 7, 2, 1) + good.substr(1024), "version"},
        {"header.bin", good.substr(0, 100), "truncated header"},
        {"short.bin", good.substr(0, 1024 + 3), "truncated"},
        {"mid.bin", good.substr(0, good.size() - 1), "truncated"},
        {"extra.bin", good + "x", "trailing"},
        {"eot.bin", bin_header(20240328, 2, 2, 5) + good.substr(1024), "EOT"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        write_bytes(d / c.name, c.bytes);
        const std::string msg = error_of([&] { Tokenizer::load(d / c.name); });
        CHECK(contains(msg, d / c.name));
        CHECK(contains(msg, c.says));
    }
    CHECK(contains(error_of([&] { Tokenizer::load(d / "missing.bin"); }), d / "missing.bin"));
}

TEST_CASE("tokenizer: TinyShakespeare encodes well under 10 s on one core") {
    // The brief's budget: < 10 s (aim < 2 s). Measured here ~0.2 s, so 10 s only fails on a real regression.
    const std::string text = read_file(source_dir() + "/tinyshakespeare/input.txt");
    const BPE fresh = BPE::load(source_dir() + "/gpt2/encoder.json", source_dir() + "/gpt2/vocab.bpe");  // cold cache
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int> ids = fresh.encode(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("encoded " << text.size() << " bytes into " << ids.size() << " tokens in " << s << " s");
    CHECK(s < 10.0);
    CHECK(fresh.decode(ids) == text);
}

TEST_CASE("tokenizer: the header's vocab size is checked against the file's size before anything is allocated") {
    TempDir d;
    const std::string body = std::string("\x01" "a" "\x02" "bc", 5);
    // 2^32 - 1 tokens claimed by a 1029-byte file: refused at once (each token takes at least 2 bytes)
    write_bytes(d / "huge.bin", bin_header(20240328, 2, 0xFFFFFFFFu, 1) + body);
    alloc_reset();
    const std::string msg = error_of([&] { Tokenizer::load(d / "huge.bin"); });
    CHECK(contains(msg, "the header says 4294967295 tokens, the 5 bytes after it hold at most 2"));
    CHECK(alloc_largest() < 4096);
    // a token of length 0 is refused, as llm.c refuses it
    write_bytes(d / "empty.bin", bin_header(20240328, 2, 2, 1) + std::string("\x00" "\x02" "bc", 4));
    CHECK(contains(error_of([&] { Tokenizer::load(d / "empty.bin"); }), "token 0 has length 0"));
    // the real file costs no more than its size in any one allocation
    const size_t size = read_file("data/gpt2_tokenizer.bin").size();
    alloc_reset();
    CHECK(Tokenizer::load("data/gpt2_tokenizer.bin").vocab_size == 50257);
    CHECK(alloc_largest() <= size + 1);  // the file read once into a string (plus its terminating zero)
}
