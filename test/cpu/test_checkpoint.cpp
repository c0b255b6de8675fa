// Checkpoints (llmc/checkpoint.h): llm.c model files (fp32 round trip, bf16 files read as float, header-only
// read, one test per kind of bad file, each checking that the error names the file), their CRC-32C side files,
// the state file (round trip; every damaged byte of the header and the payload refused), and the directory
// helpers --resume and --overwrite use.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "llmc/checkpoint.h"
#include "llmc/sampler.h"
#include "test/cpu/alloc_watch.h"
#include "test/cpu/seed.h"

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
    Rng rng(testing::test_seed("checkpoint: random parameters", seed));
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

// The message contains the part; the message is printed when it does not.
#define CHECK_SAYS(message, part)                          \
    do {                                                   \
        const string said_ = (message);                    \
        CHECK_MESSAGE(said_.find(part) != string::npos, said_); \
    } while (0)

bool contains_any(const string& s, std::initializer_list<const char*> parts) {
    for (const char* p : parts)
        if (s.find(p) != string::npos) return true;
    return false;
}

string error_of_state(const string& path) {
    try {
        read_state_file(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

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
    vector<float> loaded;  // and its checksum file still matches it
    load_checkpoint(path, loaded, /*require_checksum=*/true);
    CHECK(loaded == params);
}

TEST_CASE("checkpoint: the CRC-32C side file catches any damaged byte; llm.c files without one still load") {
    TempDir tmp;
    const GPT2Config cfg = small_config();
    const vector<float> params = random_params(cfg, 7);
    const string path = tmp / "model.bin";
    save_checkpoint(path, cfg, params.data());
    const vector<char> bytes = read_bytes(path);
    // the model file itself is exactly llm.c's (no trailer); the checksum is beside it, in one line
    REQUIRE(bytes.size() == 1024 + params.size() * 4);
    char want[64];
    snprintf(want, sizeof want, "crc32c %08x bytes %zu\n", crc32c(bytes.data(), bytes.size()), bytes.size());
    CHECK(read_file(checksum_path(path)) == want);
    vector<float> out;
    CHECK(same_config(load_checkpoint(path, out, true), cfg));

    // one flipped bit anywhere in the parameters: a valid header, plausible floats, refused by the checksum
    Rng rng(testing::test_seed("checkpoint: damaged byte positions", 8));
    for (int trial = 0; trial < 20; trial++) {
        vector<char> b = bytes;
        const size_t at = 1024 + rng.next_u32() % (b.size() - 1024);
        b[at] ^= (char)(1 << (rng.next_u32() % 8));
        write_bytes(path, b);
        CAPTURE(at);
        CHECK_THROWS_WITH_AS(load_checkpoint(path, out), doctest::Contains("checksum mismatch"), Error);
    }
    // without its side file (as every llm.c file is) the same damaged file loads on the header's checks alone,
    // unless the caller requires the checksum (a resume)
    fs::remove(checksum_path(path));
    CHECK(same_config(load_checkpoint(path, out), cfg));
    CHECK_THROWS_WITH_AS(load_checkpoint(path, out, true), doctest::Contains("no checksum file"), Error);
    // a side file that is not one, or whose size disagrees, is an Error too
    write_bytes(path, bytes);
    write_bytes(checksum_path(path), vector<char>{'x', '\n'});
    CHECK_THROWS_WITH_AS(load_checkpoint(path, out), doctest::Contains("not a checksum file"), Error);
    write_checksum_file(path, FileChecksum{crc32c(bytes.data(), bytes.size()), bytes.size() + 1});
    CHECK_THROWS_WITH_AS(load_checkpoint(path, out), doctest::Contains("its checksum file says"), Error);
}

namespace {

// A small state file's inputs: a made-up layout and distinct payload values (no two floats alike).
struct StateCase {
    TrainState st;
    StateLayout lay;
    vector<float> m, v, master;
    StateCase(bool with_master) {
        lay.config = small_config();
        lay.num_params = num_parameters(lay.config);
        lay.master = with_master;
        lay.world = 3, lay.rank = 1, lay.begin = 100, lay.end = 250;
        st.step = 17, st.rng_state = 0x1234567890abcdefull, st.B = 2, st.T = 4, st.total_batch = 48, st.seed = 42;
        st.loader.epoch = 2, st.loader.shard_pos = 1, st.loader.batch_pos = 5, st.loader.seed = 42;
        st.loader.shuffle = 1, st.loader.B = 2, st.loader.T = 4, st.loader.num_shards = 3;
        st.guard.count = 3, st.guard.skipped_in_a_row = 1;
        st.guard.losses[0] = 4.5f, st.guard.losses[1] = 4.25f, st.guard.losses[2] = 4.125f;
        for (size_t i = 0; i < lay.slice(); i++) {
            m.push_back(0.5f + i), v.push_back(1e-3f * i);
            if (with_master) master.push_back(-1.0f - i);
        }
    }
    void write(const string& path) const { write_state_file(path, st, lay, m.data(), v.data(), master.data()); }
};

vector<float> floats_at(const char* p, size_t n) {
    vector<float> out(n);
    std::memcpy(out.data(), p, n * sizeof(float));
    return out;
}

}  // namespace

TEST_CASE("state file: round trip of every field and the payload") {
    TempDir tmp;
    for (bool master : {false, true}) {
        CAPTURE(master);
        const StateCase c(master);
        const string path = tmp / "state.bin";
        c.write(path);
        CHECK(fs::file_size(path) == 2048 + c.m.size() * 4 * (master ? 3 : 2));
        const StateFile sf = read_state_file(path);
        const TrainState& s = sf.state;
        CHECK(s.step == 17);
        CHECK(s.rng_state == 0x1234567890abcdefull);
        CHECK(s.B == 2); CHECK(s.T == 4); CHECK(s.total_batch == 48); CHECK(s.seed == 42);
        CHECK(s.loader.epoch == 2); CHECK(s.loader.shard_pos == 1); CHECK(s.loader.batch_pos == 5);
        CHECK(s.loader.shuffle == 1); CHECK(s.loader.num_shards == 3);
        CHECK(s.guard.count == 3); CHECK(s.guard.skipped_in_a_row == 1);
        CHECK(s.guard.losses[2] == 4.125f);
        CHECK(same_config(sf.layout.config, c.lay.config));
        CHECK(sf.layout.world == 3); CHECK(sf.layout.rank == 1); CHECK(sf.layout.begin == 100); CHECK(sf.layout.end == 250);
        CHECK(sf.layout.master == master);
        CHECK(floats_at(sf.m(), 150) == c.m);
        CHECK(floats_at(sf.v(), 150) == c.v);
        if (master) CHECK(floats_at(sf.master(), 150) == c.master);
        CHECK(read_state_header(path).layout.world == 3);
        check_state_layout(path, sf.layout, c.lay);  // its own layout: no error
    }
}

TEST_CASE("state file: the magic is checked first, then every header word and every payload byte") {
    TempDir tmp;
    const StateCase c(true);
    const string path = tmp / "state.bin";
    c.write(path);
    const vector<char> good = read_bytes(path);
    auto error_for = [&](const vector<char>& b) {
        write_bytes(path, b);
        try {
            read_state_file(path);
        } catch (const Error& e) {
            return string(e.what());
        }
        return string("(no error)");
    };
    // random bytes are "not a state file", never a question about the GPU count (the old order read [24] first)
    Rng rng(testing::test_seed("state file: random bytes and flipped bits", 9));
    vector<char> noise(good.size());
    for (char& x : noise) x = (char)rng.next_u32();
    CHECK_SAYS(error_for(noise), "bad magic");
    // a flipped bit in any header word: the header checksum (or the magic/version check) refuses it
    for (int word = 0; word < 256; word++) {
        vector<char> b = good;
        b[word * 8 + rng.next_u32() % 8] ^= (char)(1 << (rng.next_u32() % 8));
        const string msg = error_for(b);
        CAPTURE(word);
        CHECK(contains_any(msg, {"bad magic", "version", "header checksum mismatch"}));
        CHECK_SAYS(msg, path.c_str());
    }
    // a flipped bit in the payload: the payload checksum
    for (int trial = 0; trial < 20; trial++) {
        vector<char> b = good;
        b[2048 + rng.next_u32() % (b.size() - 2048)] ^= (char)(1 << (rng.next_u32() % 8));
        CHECK_SAYS(error_for(b), "checksum mismatch in the optimizer state");
    }
    // cut short, or longer
    vector<char> cut(good.begin(), good.end() - 4), longer = good;
    longer.push_back(0);
    CHECK_SAYS(error_for(cut), "truncated or damaged");
    CHECK_SAYS(error_for(longer), "truncated or damaged");
    CHECK_SAYS(error_for(vector<char>(good.begin(), good.begin() + 100)), "shorter than its 2048-byte header");
    // version 2 (before checksums) is refused by name
    vector<char> v2 = good;
    const int64_t two = 2;
    std::memcpy(&v2[8], &two, 8);
    CHECK_SAYS(error_for(v2), "no checksum");
}

TEST_CASE("state file: out-of-range fields are refused even with a valid header checksum") {
    TempDir tmp;
    const StateCase c(false);
    const string path = tmp / "state.bin";
    c.write(path);
    const vector<char> good = read_bytes(path);
    // sets one header word and re-seals the header's checksum, as a bug (not damage) would write it
    auto sealed = [&](int word, int64_t value) {
        vector<char> b = good;
        std::memcpy(&b[word * 8], &value, 8);
        int64_t h[256];
        std::memcpy(h, b.data(), sizeof h);
        const int64_t crc = crc32c(h, 255 * 8);
        std::memcpy(&b[255 * 8], &crc, 8);
        write_bytes(path, b);
        return error_of_state(path);
    };
    const struct {
        int word;
        int64_t value;
        const char* says;
    } cases[] = {
        {2, -1, "step -1"},
        {3, 12345, "parameters"},
        {4, 2, "master-weights flag"},
        {6, 0, "batch B=0"},
        {8, 7, "tokens per step"},
        {9, (int64_t)1 << 33, "seed"},
        {10, -1, "loader position"},
        {11, 3, "loader position"},
        {14, 2, "loader position"},
        {17, 0, "loader position"},
        {21, 0, "config word 21"},
        {22, 5, "divisible"},
        {24, 0, "rank"},
        {25, 3, "rank 3 of 3"},
        {26, 300, "optimizer slice"},
        {27, 1 << 30, "optimizer slice"},
        {28, 17, "expected"},
        {30, 65, "loss-spike window"},
        {32, 0x7fc00000, "not a finite loss"},  // a NaN inside the window's 3 losses
    };
    for (const auto& k : cases) {
        CAPTURE(k.word);
        CHECK_SAYS(sealed(k.word, k.value), k.says);
    }
}

TEST_CASE("state file: a layout that is not this run's names the field") {
    const StateCase c(true);
    StateLayout other = c.lay;
    other.config.num_layers = 3;
    CHECK_THROWS_WITH_AS(check_state_layout("s.bin", c.lay, other), doctest::Contains("config mismatch"), Error);
    other = c.lay, other.world = 2;
    CHECK_THROWS_WITH_AS(check_state_layout("s.bin", c.lay, other), doctest::Contains("--num-gpus 3"), Error);
    other = c.lay, other.rank = 2, other.begin = 250, other.end = 400;
    CHECK_THROWS_WITH_AS(check_state_layout("s.bin", c.lay, other), doctest::Contains("rank 1's optimizer slice"), Error);
    other = c.lay, other.master = false;
    CHECK_THROWS_WITH_AS(check_state_layout("s.bin", c.lay, other), doctest::Contains("precision mismatch"), Error);
}

TEST_CASE("checkpoint directory: names, the newest complete step, and which files are a checkpoint's") {
    TempDir tmp;
    CHECK(checkpoint_path(tmp.dir.string(), "model", 12) == tmp / "model_00000012.bin");
    CHECK(checkpoint_path(tmp.dir.string(), "DONE", 12) == tmp / "DONE_00000012");
    CHECK(state_path(tmp.dir.string(), 12, 1, 2) == tmp / "state_00000012_rank1.bin");
    CHECK(latest_checkpoint_step(tmp / "missing") == -1);
    for (const char* name : {"DONE_00000004", "DONE_00000010", "DONE_00000010x", "model_00000012.bin", "main.log",
                             "run_settings.txt", "model_final.bin", "state_00000012_rank0.bin.tmp", "notes.txt"})
        write_bytes(tmp / name, vector<char>{});
    CHECK(latest_checkpoint_step(tmp.dir.string()) == 10);  // model_12 has no DONE: not complete
    const vector<string> files = checkpoint_files(tmp.dir.string());
    CHECK(files == vector<string>{tmp / "DONE_00000004", tmp / "DONE_00000010", tmp / "DONE_00000010x",
                                  tmp / "model_00000012.bin", tmp / "state_00000012_rank0.bin.tmp"});
    CHECK(checkpoint_files(tmp / "missing").empty());
}
