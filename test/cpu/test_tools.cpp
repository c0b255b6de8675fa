// Tests of the command-line tools as a user runs them (tools/*.cpp, through the shell): build/tokenizer's round trip
// and GPT-2 ids, build/sample's text against the model run here step by step, build/loss against the model's loss,
// make sample's quoting, build/plot_loss's inputs, and scripts/deps.sh's answer when something is missing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/bpe.h"
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/log_reader.h"
#include "llmc/ref/ref.h"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"
#include "test/cpu/data_helpers.h"

using namespace flashgpt2;
using namespace flashgpt2::testing;
using std::string;
using std::vector;

namespace {

string q(const string& s) { return "'" + s + "'"; }

// A tiny random GPT-2 with the real vocabulary (so the tokenizer's ids fit), max_seq_len 12: every parameter
// N(0, 0.5), so that the logits differ enough for top-k and greedy choices to depend on every layer.
ref::GPT2<float> tiny_model(uint64_t seed) {
    MESSAGE("model parameters seed ", seed);
    GPT2Config c;
    c.max_seq_len = 12, c.num_layers = 1, c.num_heads = 2, c.channels = 8;  // V 50257, Vp 50304
    ref::GPT2<float> m(c);
    Rng rng(seed);
    for (float& p : m.params) p = 0.5f * (float)rng.next_normal();
    return m;
}

// n tokens after ids, drawn as build/sample's header says: the model on the last max_seq_len tokens of the context,
// the next token from the logits of its last position (greedy: the first largest; else sample_top_k with one Rng).
vector<int> continue_here(ref::GPT2<float>& m, vector<int> ids, int n, int top_k, float temperature, uint64_t seed) {
    Rng rng(seed);
    const int V = m.config.vocab_size, maxT = m.config.max_seq_len;
    vector<int> out;
    for (int i = 0; i < n; i++) {
        const int len = std::min((int)ids.size(), maxT);
        m.forward(ids.data() + ids.size() - len, nullptr, 1, len);
        const float* logits = m.logits_at(0, len - 1);
        const int next = temperature == 0 ? (int)(std::max_element(logits, logits + V) - logits)
                                          : sample_top_k(logits, V, top_k, temperature, rng);
        ids.push_back(next);
        out.push_back(next);
    }
    return out;
}

string decode(const vector<int>& ids) { return Tokenizer::load("data/gpt2_tokenizer.bin").decode(ids); }

}  // namespace

TEST_CASE("tools: tokenizer encode | decode gives a Unicode file back byte for byte, and the ids are GPT-2's") {
    TempDir d;
    write_bytes(d / "in.txt", string("Ünïcödé: 日本語のテキスト, русский текст, emoji 😀🚀, a NUL ") + '\0' +
                                  " byte,\r\nCRLF lines,\ttabs,   spaces and <|endoftext|> as plain text.\n\n");
    const string input = read_file(d / "in.txt");
    const auto round = run_command(tool("tokenizer") + " encode < " + q(d / "in.txt") + " | " + tool("tokenizer") + " decode");
    REQUIRE_MESSAGE(round.rc == 0, round.err);
    CHECK(round.out == input);

    const auto enc = run_command(tool("tokenizer") + " encode < " + q(d / "in.txt"));
    REQUIRE(enc.rc == 0);
    string want;
    for (int id : gpt2_bpe().encode(input)) want += (want.empty() ? "" : " ") + std::to_string(id);
    CHECK(enc.out == want + "\n");

    // reference encodings (js-tiktoken's), through the command line: four ordinary ones, two with --allow-special
    vector<Vector> picked;
    int ordinary = 0, special = 0;
    for (const Vector& v : load_vectors())
        if (!v.text.empty() && (v.allow_special ? special++ < 2 : ordinary++ < 4)) picked.push_back(v);
    REQUIRE(picked.size() == 6);
    for (const Vector& v : picked) {
        CAPTURE(v.label);
        write_bytes(d / "v.txt", v.text);
        const auto r = run_command(tool("tokenizer") + " encode" + (v.allow_special ? " --allow-special" : "") + " < " + q(d / "v.txt"));
        string ids;
        for (int id : v.ids) ids += (ids.empty() ? "" : " ") + std::to_string(id);
        CHECK(r.out == ids + "\n");
    }
}

TEST_CASE("tools: tokenizer errors are one line, with nothing on stdout") {
    TempDir d;
    write_bytes(d / "ids.txt", "15496 11 50257 0\n");
    auto r = run_command(tool("tokenizer") + " decode < " + q(d / "ids.txt"));
    CHECK(r.rc == 1);
    CHECK(r.out.empty());
    CHECK(r.err == "error: stdin: id #3 (byte 9) is '50257', not a token id: ids are 0..50256\n");
    write_bytes(d / "ids.txt", "15496 eleven");
    CHECK(contains(run_command(tool("tokenizer") + " decode < " + q(d / "ids.txt")).err, "id #2 (byte 6) is 'eleven'"));
    write_bytes(d / "bad.txt", "ok \xE2\x82");
    r = run_command(tool("tokenizer") + " encode < " + q(d / "bad.txt"));
    CHECK(r.err == "error: stdin: invalid UTF-8 at byte 3\n");
    CHECK(r.out.empty());
    CHECK(contains(run_command(tool("tokenizer") + " translate < /dev/null").err, "expected one command, encode or decode"));
}

TEST_CASE("tools: sample prints the prompt and the model's continuation, drawn as the header says") {
    TempDir d;
    ref::GPT2<float> m = tiny_model(5);
    save_checkpoint(d / "m.bin", m.config, m.params.data());
    const BPE& bpe = gpt2_bpe();
    auto sample = [&](const string& args) { return run_command(tool("sample") + " --model " + q(d / "m.bin") + " " + args); };

    SUBCASE("greedy, with a prompt") {
        const auto r = sample("--prompt 'Hello, world' -g 6 --temperature 0");
        REQUIRE_MESSAGE(r.rc == 0, r.err);
        CHECK(r.out == "Hello, world" + decode(continue_here(m, bpe.encode("Hello, world"), 6, 0, 0, 0)) + "\n");
        CHECK(contains(r.err, "L=1 NH=2 C=8 maxT=12"));
    }
    SUBCASE("top-k with a seed: the same seed, the same text; past max_seq_len the context slides") {
        const uint64_t seed = 7;
        MESSAGE("sampling seed ", seed);
        const auto r = sample("--prompt 'One two three four five six seven' -g 9 --top-k 5 --temperature 0.8 --seed 7");
        REQUIRE_MESSAGE(r.rc == 0, r.err);
        const vector<int> prompt = bpe.encode("One two three four five six seven");
        REQUIRE(prompt.size() + 9 - 1 > 12);  // the last tokens see a slid window
        CHECK(r.out == "One two three four five six seven" + decode(continue_here(m, prompt, 9, 5, 0.8f, seed)) + "\n");
        CHECK(contains(r.err, "past 12 tokens the model sees only the last 12"));
        CHECK(sample("--prompt 'One two three four five six seven' -g 9 --top-k 5 --temperature 0.8 --seed 7").out == r.out);
    }
    SUBCASE("an empty prompt starts a new document after <|endoftext|>") {
        const auto r = sample("--prompt '' -g 5 --seed 3");
        REQUIRE_MESSAGE(r.rc == 0, r.err);
        CHECK(r.out == decode(continue_here(m, {BPE::EOT}, 5, 40, 1.0f, 3)) + "\n");
    }
    SUBCASE("a prompt longer than max_seq_len, no model, a bad flag: one error line") {
        auto r = sample("--prompt 'a b c d e f g h i j k l m n'");
        CHECK(r.rc == 1);
        CHECK(contains(r.err, "error: --prompt: 14 tokens, more than the model's max_seq_len 12"));
        r = run_command(tool("sample") + " --prompt hi");
        CHECK(contains(r.err, "error: --model: a checkpoint is required"));
        CHECK(contains(sample("--temperature -1").err, "error: --temperature: -1 is out of range"));
    }
    SUBCASE("make sample passes the prompt through unharmed (quotes, apostrophes)") {
        const string prompt = "It's \"quoted\"";
        const auto r = run_command("make --no-print-directory sample CKPT=" + q(d / "m.bin") +
                                   " PROMPT='It'\\''s \"quoted\"' SAMPLE_ARGS='-g 3 --temperature 0'");
        REQUIRE_MESSAGE(r.rc == 0, r.err);
        CHECK(contains(r.out, prompt + decode(continue_here(m, bpe.encode(prompt, true), 3, 0, 0, 0)) + "\n"));
    }
}

TEST_CASE("tools: loss prints the model's mean loss on the token file's first batch") {
    TempDir d;
    ref::GPT2<float> m = tiny_model(6);
    save_checkpoint(d / "m.bin", m.config, m.params.data());
    const vector<uint16_t> t = read_token_file("data/tinyshakespeare/tiny_shakespeare_val.bin");
    const int B = 2, T = 8;
    vector<int> in(t.begin(), t.begin() + B * T), tg(t.begin() + 1, t.begin() + B * T + 1);
    char want[64];
    snprintf(want, sizeof want, "loss %.6f\n", m.forward(in.data(), tg.data(), B, T));
    const auto r = run_command(tool("loss") + " --model " + q(d / "m.bin") +
                               " --tokens data/tinyshakespeare/tiny_shakespeare_val.bin -b 2 -t 8");
    REQUIRE_MESSAGE(r.rc == 0, r.err);
    CHECK(r.out == want);
    CHECK(contains(run_command(tool("loss") + " --model " + q(d / "m.bin") + " --tokens x -t 13").err,
                   "error: -t: T=13 exceeds the model's max_seq_len 12"));
}

TEST_CASE("tools: read_log and plot_loss: step lines in, resumed steps replaced, a PNG out; bad logs named") {
    TempDir d;
    write_bytes(d / "a/main.log", "# a comment line\nstep 0 val 10.5\nstep 0 train 10.9 lr 0.001 norm 1.0 ms 5 tok/s 9\n"
                                  "step 1 train 9.0 lr 0.001 norm 1.0 ms 5 tok/s 9\nstep 2 train 8.0 val 8.5 lr 0.001\n"
                                  "step 1 train 7.5 lr 0.001\nstep 2 train 7.0 lr 0.001\nstep 3 val 6.5\n");
    const LogCurves c = read_log(d / "a/main.log");  // the resumed run repeated steps 1 and 2
    CHECK(c.train_step == vector<double>{0, 1, 2});
    CHECK(c.train == vector<double>{10.9, 7.5, 7.0});
    CHECK(c.val_step == vector<double>{0, 2, 3});
    CHECK(c.val == vector<double>{10.5, 8.5, 6.5});
    write_bytes(d / "b/main.log", "step 0 train 10.0\nstep 5 train 6.0 val 6.2\n");

    const auto r = run_command(tool("plot_loss") + " -o " + q(d / "out/loss.png") + " --labels naive,flash " +
                               q(d / "a/main.log") + " " + q(d / "b/main.log"));
    REQUIRE_MESSAGE(r.rc == 0, r.err);
    const string png = read_file(d / "out/loss.png");
    CHECK(png.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
    CHECK(!std::filesystem::exists(d / "out/loss.png.tmp"));

    write_bytes(d / "c.log", "step x train 1.0\n");
    CHECK(contains(run_command(tool("plot_loss") + " -o " + q(d / "x.png") + " " + q(d / "c.log")).err,
                   (d / "c.log") + ":1 step: 'x' is not an integer"));
    write_bytes(d / "c.log", "not a log at all\n");
    CHECK(contains(error_of([&] { read_log(d / "c.log"); }), "no step lines with a train or val loss"));
    CHECK(contains(run_command(tool("plot_loss") + " -o " + q(d / "x.png") + " --labels one " + q(d / "a/main.log") + " " +
                               q(d / "b/main.log")).err, "--labels: 1 labels for 2 logs"));
    CHECK(!std::filesystem::exists(d / "x.png"));
}

TEST_CASE("tools: scripts/deps.sh is silent when all is there, else names what is missing and the command") {
    auto deps = [](const string& env, const string& needs) { return run_command("DEPS_INSTALL=no " + env + " bash scripts/deps.sh " + needs); };
    const auto ok = deps("", "cxx make eigen doctest stb pcre2");
    CHECK(ok.rc == 0);
    CHECK(ok.out + ok.err == "");
    const auto eigen = deps("EIGEN_INC=/nonexistent", "cxx eigen stb");
    CHECK(eigen.rc == 1);
    CHECK(contains(eigen.err, "error: missing: Eigen 3 (/nonexistent/Eigen/Core)"));
    CHECK(contains(eigen.err, "install with: sudo apt-get install -y libeigen3-dev\n"));
    const auto cuda = deps("NVCC=/nonexistent/bin/nvcc", "nvcc cublas");
    CHECK(cuda.rc == 1);
    CHECK(contains(cuda.err, "the CUDA compiler (/nonexistent/bin/nvcc)"));
    CHECK(contains(cuda.err, "https://developer.nvidia.com/cuda-downloads"));
    CHECK(deps("", "teleporter").rc == 2);
}
