// llm.c model files (llmc/checkpoint.h): fp32 round trip, bf16 files read as float, header-only read,
// and one test per kind of bad file, each checking that the error names the file.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "llmc/checkpoint.h"
#include "llmc/sampler.h"

using namespace flashgpt2;
using std::string;
using std::vector;
namespace fs = std::filesystem;

namespace {

GPT2Config small_config() {
    GPT2Config c;
    c.max_seq_len = 9, c.vocab_size = 21, c.padded_vocab_size = 32, c.num_layers = 2, c.num_heads = 3, c.channels = 12;
    return c;
}

// A fresh directory per test under the system temp dir, removed at the end.
struct TempDir {
    fs::path dir;
    TempDir() {
        dir = fs::temp_directory_path() / ("flashgpt2_ckpt_" + std::to_string(getpid()) + "_" + std::to_string(counter()++));
        fs::create_directories(dir);
    }
    ~TempDir() { fs::remove_all(dir); }
    string operator/(const string& name) const { return (dir / name).string(); }
    static int& counter() {
        static int n = 0;
        return n;
    }
};

vector<float> random_params(const GPT2Config& c, uint64_t seed) {
    Rng rng(seed);
    vector<float> p(num_parameters(c));
    for (auto& x : p) x = 0.1f + (float)rng.next_normal();
    return p;
}

vector<char> read_bytes(const string& path) {
    std::ifstream f(path, std::ios::binary);
    return vector<char>(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const string& path, const vector<char>& b) {
    std::ofstream f(path, std::ios::binary);
    f.write(b.data(), (std::streamsize)b.size());
}

void set_header_int(vector<char>& bytes, int index, int32_t value) { std::memcpy(&bytes[index * 4], &value, 4); }

}  // namespace

TEST_CASE("checkpoint: fp32 save/load round trip is bit exact, the header matches llm.c's layout") {
    TempDir tmp;
    const GPT2Config cfg = small_config();
    const vector<float> params = random_params(cfg, 1);
    const string path = tmp / "sub/dir/model.bin";  // parent directories are created
    save_checkpoint(path, cfg, params.data());
    CHECK_FALSE(fs::exists(path + ".tmp"));

    const vector<char> bytes = read_bytes(path);
    REQUIRE(bytes.size() == 1024 + params.size() * 4);
    int32_t h[8];
    std::memcpy(h, bytes.data(), sizeof h);
    CHECK(h[0] == 20240326);
    CHECK(h[1] == 3);
    CHECK(h[2] == 9);   // max_seq_len
    CHECK(h[3] == 21);  // vocab_size
    CHECK(h[4] == 2);   // num_layers
    CHECK(h[5] == 3);   // num_heads
    CHECK(h[6] == 12);  // channels
    CHECK(h[7] == 32);  // padded_vocab_size

    vector<float> loaded = {1.0f, 2.0f};  // stale contents must be replaced
    const GPT2Config got = load_checkpoint(path, loaded);
    CHECK(same_config(got, cfg));
    CHECK(loaded == params);
    CHECK(same_config(load_checkpoint_config(path), cfg));
    CHECK(read_checkpoint_header(path).version == CHECKPOINT_VERSION_FP32);

    // saving again over an existing file replaces it
    const vector<float> params2 = random_params(cfg, 2);
    save_checkpoint(path, cfg, params2.data());
    load_checkpoint(path, loaded);
    CHECK(loaded == params2);
}

TEST_CASE("checkpoint: bf16 (version 5) files load as float; bf16 rounding is to nearest even") {
    CHECK(float_to_bf16(1.0f) == 0x3F80);
    CHECK(bf16_to_float(0x3F80) == 1.0f);
    CHECK(float_to_bf16(1.0f + 1.0f / 256) == 0x3F80);  // exactly half way, 0x3F80 is even: rounds down
    CHECK(float_to_bf16(1.0f + 3.0f / 256) == 0x3F82);  // half way between 0x3F81 and 0x3F82: to even, up
    CHECK(float_to_bf16(-2.5f) == 0xC020);
    CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))));

    TempDir tmp;
    const GPT2Config cfg = small_config();
    const vector<float> params = random_params(cfg, 3);
    vector<uint16_t> half(params.size());
    for (size_t i = 0; i < params.size(); i++) half[i] = float_to_bf16(params[i]);
    const string path = tmp / "model_bf16.bin";
    write_checkpoint_file(path, cfg, CHECKPOINT_VERSION_BF16, half.data(), half.size() * 2);
    CHECK(read_checkpoint_header(path).version == CHECKPOINT_VERSION_BF16);
    vector<float> loaded;
    CHECK(same_config(load_checkpoint(path, loaded), cfg));
    REQUIRE(loaded.size() == params.size());
    for (size_t i = 0; i < params.size(); i++) {
        CHECK(loaded[i] == bf16_to_float(half[i]));
        // bf16 stores 7 mantissa bits: the spacing is 2^-7 of the power of two below |x|, and round to
        // nearest is off by at most half of that, so at most 2^-8 |x|
        CHECK(std::abs(loaded[i] - params[i]) <= std::abs(params[i]) / 256.0f);
    }
}

TEST_CASE("checkpoint: every kind of bad file is an Error that names the file") {
    TempDir tmp;
    const GPT2Config cfg = small_config();
    const vector<float> params = random_params(cfg, 4);
    const string good = tmp / "good.bin";
    save_checkpoint(good, cfg, params.data());
    const vector<char> bytes = read_bytes(good);
    vector<float> out;

    auto expect_error = [&](const string& path, const char* what) {
        CAPTURE(what);
        CHECK_THROWS_WITH_AS(load_checkpoint(path, out), doctest::Contains(path.c_str()), Error);
        CHECK_THROWS_WITH_AS(load_checkpoint(path, out), doctest::Contains(what), Error);
        CHECK_THROWS_AS(read_checkpoint_header(path), Error);
    };
    auto variant = [&](const string& name, auto edit) {
        vector<char> b = bytes;
        edit(b);
        write_bytes(tmp / name, b);
        return tmp / name;
    };

    expect_error(tmp / "missing.bin", "cannot open");
    expect_error(variant("magic.bin", [](vector<char>& b) { set_header_int(b, 0, 20240520); }), "bad magic");
    expect_error(variant("version.bin", [](vector<char>& b) { set_header_int(b, 1, 4); }), "unknown checkpoint version");
    expect_error(variant("short_header.bin", [](vector<char>& b) { b.resize(100); }), "truncated");
    expect_error(variant("truncated.bin", [](vector<char>& b) { b.resize(b.size() - 4); }), "truncated");
    expect_error(variant("oversized.bin", [](vector<char>& b) { b.push_back(0); }), "oversized");
    // a bf16 header on fp32 data: the sizes disagree
    expect_error(variant("wrongsize.bin", [](vector<char>& b) { set_header_int(b, 1, 5); }), "oversized");
    expect_error(variant("neg_layers.bin", [](vector<char>& b) { set_header_int(b, 4, -2); }), "must be positive");
    expect_error(variant("huge_layers.bin", [](vector<char>& b) { set_header_int(b, 4, 1 << 30); }), "absurd");
    expect_error(variant("heads.bin", [](vector<char>& b) { set_header_int(b, 5, 5); }), "divisible");
    expect_error(variant("vocab.bin", [](vector<char>& b) { set_header_int(b, 3, 33); }), "smaller than vocab");
    CHECK_THROWS_WITH_AS(load_checkpoint_config(tmp / "magic.bin"), doctest::Contains("bad magic"), Error);
}

TEST_CASE("checkpoint: a failed save leaves the previous file untouched and no temp file") {
    TempDir tmp;
    const GPT2Config cfg = small_config();
    const vector<float> params = random_params(cfg, 5);
    const string path = tmp / "model.bin";
    save_checkpoint(path, cfg, params.data());
    const vector<char> before = read_bytes(path);

    // wrong byte count for the config: refused before anything is written
    CHECK_THROWS_WITH_AS(write_checkpoint_file(path, cfg, CHECKPOINT_VERSION_BF16, params.data(), 10),
                         doctest::Contains("parameter bytes"), Error);
    GPT2Config bad = cfg;
    bad.num_heads = 5;
    CHECK_THROWS_WITH_AS(save_checkpoint(path, bad, params.data()), doctest::Contains("divisible"), Error);
    CHECK_THROWS_WITH_AS(write_checkpoint_file(path, cfg, 4, params.data(), params.size() * 4),
                         doctest::Contains("version 4"), Error);
    // unwritable destination: a directory sits where the temp file would go
    fs::create_directories(path + ".tmp");
    CHECK_THROWS_AS(save_checkpoint(path, cfg, random_params(cfg, 6).data()), Error);
    fs::remove_all(path + ".tmp");

    CHECK(read_bytes(path) == before);
    CHECK_FALSE(fs::exists(path + ".tmp"));
}
