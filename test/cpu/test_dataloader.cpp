// Tests of llmc/dataloader.h: batch contents, wrap-around, seeded shuffling, save/restore, every bad input, and the
// trainers' val batch size.
// Shards are small temp files written here with random tokens, so a batch's expected contents are known.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "llmc/dataloader.h"
#include "llmc/torch_rng.h"
#include "test/cpu/alloc_watch.h"
#include "test/cpu/data_helpers.h"
#include "test/cpu/seed.h"

using namespace flashgpt2;
using namespace flashgpt2::testing;

namespace {

std::vector<uint16_t> random_tokens(size_t n, std::mt19937& rng, int vocab = 50257) {
    std::vector<uint16_t> t(n);
    for (auto& x : t) x = static_cast<uint16_t>(rng() % vocab);
    return t;
}

// The B*T+1 window that batch b of a shard is cut from, as (inputs, targets).
std::pair<std::vector<int>, std::vector<int>> expected_batch(const std::vector<uint16_t>& tok, size_t b, int B, int T) {
    const size_t n = static_cast<size_t>(B) * T;
    std::vector<int> in(tok.begin() + b * n, tok.begin() + b * n + n);
    std::vector<int> tg(tok.begin() + b * n + 1, tok.begin() + b * n + n + 1);
    return {in, tg};
}

// The next `count` batches' inputs, concatenated.
std::vector<std::vector<int>> take(DataLoader& dl, size_t count) {
    std::vector<std::vector<int>> out;
    for (size_t i = 0; i < count; i++) {
        dl.next_batch();
        out.push_back(dl.inputs);
    }
    return out;
}

std::string shard_bytes(int32_t magic, int32_t version, int32_t count, const std::vector<uint16_t>& tokens) {
    int32_t h[256] = {magic, version, count};
    std::string s(reinterpret_cast<const char*>(h), sizeof h);
    s.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
    return s;
}

}  // namespace

TEST_CASE("dataloader: batches are consecutive windows; targets are inputs shifted by one; epochs wrap") {
    TempDir d;
    std::mt19937 rng((uint32_t)test_seed("dataloader: batches", 101));
    const int B = 3, T = 7;                 // B*T = 21: not a divisor of the shard size below
    const size_t N = 21 * 5 + 1 + rng() % 20;  // 5 full batches, plus 0..19 leftover tokens
    const std::vector<uint16_t> tok = random_tokens(N, rng);
    write_token_file(d / "shard.bin", tok);
    DataLoader dl(d / "shard.bin", B, T);
    REQUIRE(dl.num_batches() == (N - 1) / 21);
    CHECK(dl.num_batches() == 5);
    for (int epoch = 0; epoch < 2; epoch++) {
        for (size_t b = 0; b < dl.num_batches(); b++) {
            CAPTURE(epoch);
            CAPTURE(b);
            dl.next_batch();
            REQUIRE(dl.inputs.size() == 21);
            auto [in, tg] = expected_batch(tok, b, B, T);
            CHECK(dl.inputs == in);
            CHECK(dl.targets == tg);
            for (size_t i = 0; i + 1 < dl.inputs.size(); i++) CHECK(dl.targets[i] == dl.inputs[i + 1]);
        }
        CHECK(dl.state().epoch == static_cast<uint64_t>(epoch + 1));
    }
    dl.reset();
    CHECK(dl.state().epoch == 0);
    dl.next_batch();
    CHECK(dl.inputs == expected_batch(tok, 0, B, T).first);
}

TEST_CASE("dataloader: a glob reads several shards in sorted order") {
    TempDir d;
    std::mt19937 rng((uint32_t)test_seed("dataloader: glob", 102));
    const int B = 2, T = 4;
    const std::vector<uint16_t> a = random_tokens(8 * 3 + 1, rng), b = random_tokens(8 * 2 + 5, rng);
    write_token_file(d / "shard_001.bin", b);  // written out of order on purpose
    write_token_file(d / "shard_000.bin", a);
    write_token_file(d / "other.bin", random_tokens(100, rng));  // not matched
    DataLoader dl(d / "shard_*.bin", B, T);
    REQUIRE(dl.files().size() == 2);
    CHECK(dl.num_batches() == 5);
    for (size_t i = 0; i < 3; i++) {
        dl.next_batch();
        CHECK(dl.inputs == expected_batch(a, i, B, T).first);
    }
    for (size_t i = 0; i < 2; i++) {
        dl.next_batch();
        CHECK(dl.inputs == expected_batch(b, i, B, T).first);
        CHECK(dl.targets == expected_batch(b, i, B, T).second);
    }
    dl.next_batch();  // wrapped to the first shard
    CHECK(dl.inputs == expected_batch(a, 0, B, T).first);
}

TEST_CASE("dataloader: shuffling is a per-epoch permutation fixed by the seed") {
    TempDir d;
    std::mt19937 rng((uint32_t)test_seed("dataloader: shuffle", 103));
    const int B = 2, T = 3;
    write_token_file(d / "s_0.bin", random_tokens(6 * 20 + 1, rng));
    write_token_file(d / "s_1.bin", random_tokens(6 * 15 + 3, rng));
    write_token_file(d / "s_2.bin", random_tokens(6 * 9 + 1, rng));
    DataLoader plain(d / "s_*.bin", B, T);
    const size_t n = plain.num_batches();
    REQUIRE(n == 44);
    const auto ordered = take(plain, n);
    const uint64_t seed = rng();
    DataLoader s1(d / "s_*.bin", B, T, true, seed), s2(d / "s_*.bin", B, T, true, seed), s3(d / "s_*.bin", B, T, true, seed ^ 1);
    const auto e0 = take(s1, n), e1 = take(s1, n);
    CHECK(take(s2, n) == e0);             // same seed, same order
    CHECK(take(s3, n) != e0);             // another seed, another order (chance of equality ~1/44!)
    CHECK(e0 != ordered);                 // shuffled at all
    CHECK(e1 != e0);                      // each epoch draws a new order
    // Each epoch is a permutation of the unshuffled batches: every batch exactly once.
    auto sorted = [](std::vector<std::vector<int>> v) { std::sort(v.begin(), v.end()); return v; };
    CHECK(sorted(e0) == sorted(ordered));
    CHECK(sorted(e1) == sorted(ordered));
    // reset() goes back to epoch 0's order.
    s1.reset();
    CHECK(take(s1, n) == e0);

    // The order is llm.c's: one MT19937 stream from the seed; per epoch a Fisher-Yates permutation (from the
    // top, j = output % (i + 1)) of the previous shard order, then one of each shard's batches as it is reached.
    // (torch_permute is checked against the Fisher-Yates rule itself in test_train_utils.cpp)
    std::mt19937 g(static_cast<uint32_t>(seed));
    auto permute = [&](std::vector<size_t>& p) { torch_permute(p, g); };
    const size_t batches[3] = {20, 15, 9}, first[3] = {0, 20, 35};  // per shard, and its offset in `ordered`
    std::vector<size_t> shards = {0, 1, 2};
    std::vector<std::vector<int>> want;
    for (int epoch = 0; epoch < 2; epoch++) {
        permute(shards);
        for (size_t s : shards) {
            std::vector<size_t> p(batches[s]);
            for (size_t i = 0; i < p.size(); i++) p[i] = i;
            permute(p);
            for (size_t b : p) want.push_back(ordered[first[s] + b]);
        }
    }
    std::vector<std::vector<int>> got = e0;
    got.insert(got.end(), e1.begin(), e1.end());
    CHECK(got == want);
}

TEST_CASE("dataloader: state() then restore() resumes on exactly the next batch") {
    TempDir d;
    std::mt19937 rng((uint32_t)test_seed("dataloader: restore", 104));
    const int B = 2, T = 5;
    write_token_file(d / "r_0.bin", random_tokens(10 * 7 + 1, rng));
    write_token_file(d / "r_1.bin", random_tokens(10 * 4 + 9, rng));
    for (bool shuffle : {false, true}) {
        CAPTURE(shuffle);
        const uint64_t seed = rng();
        DataLoader a(d / "r_*.bin", B, T, shuffle, seed);
        const size_t skip = rng() % 30;  // anywhere, including across an epoch end (11 batches per epoch)
        take(a, skip);
        const DataLoaderState s = a.state();
        const auto rest = take(a, 25);
        DataLoader b(d / "r_*.bin", B, T, shuffle, seed);
        take(b, 3);  // somewhere else first: restore must not depend on where b was
        b.restore(s);
        CHECK(take(b, 25) == rest);
        DataLoader c(d / "r_*.bin", B, T, shuffle, seed);
        c.restore(s);
        CHECK(c.state().epoch == s.epoch);
        CHECK(c.state().shard_pos == s.shard_pos);
        CHECK(c.state().batch_pos == s.batch_pos);
    }
    // A position saved for other settings is refused.
    DataLoader a(d / "r_*.bin", B, T);
    DataLoader other_T(d / "r_*.bin", B, T + 1);
    CHECK(contains(error_of([&] { other_T.restore(a.state()); }), "saved loader position"));
    DataLoader shuffled(d / "r_*.bin", B, T, true, 1);
    CHECK(contains(error_of([&] { shuffled.restore(a.state()); }), "shuffle"));
    DataLoaderState bad = a.state();
    bad.batch_pos = 1000;
    CHECK(contains(error_of([&] { a.restore(bad); }), "out of range"));
}

TEST_CASE("dataloader: every bad input is an Error naming the file") {
    TempDir d;
    std::mt19937 rng((uint32_t)test_seed("dataloader: bad input", 105));
    const std::vector<uint16_t> tok = random_tokens(200, rng, 1000);
    struct Case {
        const char* name;
        std::string bytes;
        const char* says;
    } cases[] = {
        {"magic.bin", shard_bytes(20240521, 1, 200, tok), "bad magic"},
        {"version.bin", shard_bytes(20240520, 2, 200, tok), "version"},
        {"truncated.bin", shard_bytes(20240520, 1, 201, tok), "truncated"},
        {"trailing.bin", shard_bytes(20240520, 1, 199, tok), "trailing"},
        {"header.bin", shard_bytes(20240520, 1, 200, tok).substr(0, 500), "truncated header"},
        {"negative.bin", shard_bytes(20240520, 1, -5, tok), "negative"},
        {"small.bin", shard_bytes(20240520, 1, 20, std::vector<uint16_t>(tok.begin(), tok.begin() + 20)), "fewer than one batch"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        write_bytes(d / c.name, c.bytes);
        const std::string msg = error_of([&] { DataLoader(d / c.name, 4, 5); });  // needs 21 tokens
        CHECK(contains(msg, d / c.name));
        CHECK(contains(msg, c.says));
    }
    // The same tokens load fine with a correct header: the cases above fail for the stated reason only.
    write_bytes(d / "ok.bin", shard_bytes(20240520, 1, 200, tok));
    CHECK(DataLoader(d / "ok.bin", 4, 5).num_batches() == 199 / 20);
    // A token id at or above the vocab size.
    std::vector<uint16_t> big = tok;
    big[137] = 50257;
    write_token_file(d / "vocab.bin", big);
    const std::string vmsg = error_of([&] { DataLoader(d / "vocab.bin", 4, 5); });
    CHECK(contains(vmsg, d / "vocab.bin"));
    CHECK(contains(vmsg, "position 137"));
    CHECK(contains(error_of([&] { DataLoader(d / "ok.bin", 4, 5, false, 0, 500); }), "vocab size 500"));
    // Missing file, glob matching nothing, bad shape.
    CHECK(contains(error_of([&] { DataLoader(d / "missing.bin", 4, 5); }), (d / "missing.bin") + ": no such file"));
    CHECK(contains(error_of([&] { DataLoader(d / "nothing_*.bin", 4, 5); }), (d / "nothing_*.bin") + ": the pattern matches no file"));
    CHECK(contains(error_of([&] { DataLoader(d / "ok.bin", 0, 5); }), "B=0"));
    // One bad shard among good ones is found when the loader is built, not mid-training.
    write_token_file(d / "mix_0.bin", tok);
    write_bytes(d / "mix_1.bin", shard_bytes(20240520, 1, 300, tok));
    CHECK(contains(error_of([&] { DataLoader(d / "mix_*.bin", 4, 5); }), d / "mix_1.bin"));
}

TEST_CASE("dataloader: reads the TinyShakespeare val split from make data") {
    DataLoader dl("data/tinyshakespeare/tiny_shakespeare_val.bin", 4, 64);
    CHECK(dl.num_batches() == (32768 - 1) / 256);
    dl.next_batch();
    CHECK(std::vector<int>(dl.inputs.begin(), dl.inputs.begin() + 5) == std::vector<int>{50256, 5962, 22307, 25, 198});
    CHECK(std::vector<int>(dl.targets.begin(), dl.targets.begin() + 4) == std::vector<int>{5962, 22307, 25, 198});
}

TEST_CASE("val_batch_size: B sequences for -m N (llm.c's val batch), nearly the whole split for -m -1") {
    // TinyShakespeare's val split at T=1024: (32768 - 1) / 1024 = 31 sequences
    CHECK(val_batch_size(31, 16, 1) == 16);   // llm.c's one val batch at B=16
    CHECK(val_batch_size(31, 16, 3) == 16);
    CHECK(val_batch_size(31, 16, -1) == 15);  // 2 batches of 15 = 30 of 31 sequences (97%); 16 would read 16 (52%)
    CHECK(val_batch_size(31, 4, -1) == 3);    // 10 x 3 = 30 (97%); 4 would read 28 (90%)
    CHECK(val_batch_size(31, 31, -1) == 31);
    CHECK(val_batch_size(10, 16, 1) == 10);   // never more than the split holds
    CHECK(val_batch_size(10, 16, -1) == 10);
    CHECK(val_batch_size(1, 16, -1) == 1);
    CHECK(val_batch_size(7, 2, -1) == 1);     // 3 x 2 = 6 of 7 (86%): one at a time reads all 7
}

TEST_CASE("dataloader: a header's token count is checked against the file's size before anything is allocated") {
    TempDir d;
    const std::vector<uint16_t> tok(200, 7);
    // a 1.4 KiB file whose header claims 2^31 - 1 tokens (4 GiB): refused, having allocated about nothing
    write_bytes(d / "huge.bin", shard_bytes(20240520, 1, INT32_MAX, tok));
    alloc_reset();
    const std::string msg = error_of([&] { read_token_file(d / "huge.bin"); });
    CHECK(contains(msg, "truncated: header says 2147483647 tokens, file holds 200"));
    CHECK(alloc_largest() < (1u << 16));
    // a correct file allocates its tokens once: 2 bytes per token, not more
    write_token_file(d / "ok.bin", tok);
    alloc_reset();
    CHECK(read_token_file(d / "ok.bin") == tok);
    CHECK(alloc_largest() <= tok.size() * 2 + 1024);
}

TEST_CASE("dataloader: a shard that changes during the run is an Error when it is read again, never read past its end") {
    TempDir d;
    std::mt19937 rng((uint32_t)test_seed("dataloader: changed shard", 108));
    const int B = 2, T = 4;  // 8 tokens a batch
    const std::vector<uint16_t> a = random_tokens(8 * 3 + 1, rng), b = random_tokens(8 * 4 + 1, rng);
    write_token_file(d / "c_0.bin", a);
    write_token_file(d / "c_1.bin", b);
    for (int kind = 0; kind < 2; kind++) {
        CAPTURE(kind);
        DataLoader dl(d / "c_*.bin", B, T);
        take(dl, 2);  // inside shard 0 (its 3rd batch moves the loader on, reading shard 1 again)
        std::vector<uint16_t> changed = b;
        if (kind == 0) changed.resize(9);  // cut: 1 batch where the loader counted 4
        else changed[5] ^= 1;              // same size, one token different
        write_token_file(d / "c_1.bin", changed);
        const std::string msg = error_of([&] { take(dl, 1); });
        CHECK(contains(msg, d / "c_1.bin"));
        CHECK(contains(msg, "changed during the run"));
        write_token_file(d / "c_1.bin", b);
    }
    // unchanged, the same walk reads every batch of both shards and wraps
    DataLoader dl(d / "c_*.bin", B, T);
    CHECK(take(dl, 8).back() == expected_batch(a, 0, B, T).first);
}

TEST_CASE("dataloader: restore bounds every field; batches_read counts from epoch 0") {
    TempDir d;
    std::mt19937 rng((uint32_t)test_seed("dataloader: restore bounds", 109));
    const int B = 2, T = 5;
    write_token_file(d / "r_0.bin", random_tokens(10 * 7 + 1, rng));
    write_token_file(d / "r_1.bin", random_tokens(10 * 4 + 9, rng));  // 11 batches per epoch
    for (bool shuffle : {false, true}) {
        CAPTURE(shuffle);
        DataLoader dl(d / "r_*.bin", B, T, shuffle, 5);
        const size_t n = (size_t)(rng() % 40);
        take(dl, n);
        CHECK(dl.batches_read() == n);
        const DataLoaderState s = dl.state();
        DataLoader other(d / "r_*.bin", B, T, shuffle, 5);
        other.restore(s);
        CHECK(other.batches_read() == n);
        // an epoch a replay cannot reach in reasonable time is refused at once, not replayed
        DataLoaderState huge = s;
        huge.epoch = shuffle ? DataLoader::MAX_REPLAY_DRAWS : (1ull << 41);
        const auto t0 = std::chrono::steady_clock::now();
        CHECK(contains(error_of([&] { other.restore(huge); }), "epoch"));
        CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
        DataLoaderState bad = s;
        bad.shard_pos = 2;
        CHECK(contains(error_of([&] { other.restore(bad); }), "shard position 2 out of range"));
        bad = s, bad.num_shards = 3;
        CHECK(contains(error_of([&] { other.restore(bad); }), "3 shards"));
        bad = s, bad.batch_pos = 7;  // shard 0 has 7 batches, shard 1 has 4: position 7 is past either
        bad.shard_pos = 0;
        CHECK(contains(error_of([&] { other.restore(bad); }), "batch position 7 out of range"));
        bad = s, bad.seed = 6;
        CHECK(contains(error_of([&] { other.restore(bad); }), "seed"));
    }
    // unshuffled, a far epoch is a jump: the same batches as epoch 0, at once
    DataLoader plain(d / "r_*.bin", B, T);
    const auto first = take(plain, 11);
    DataLoaderState far = plain.state();
    far.epoch = 1000000000ull;
    plain.restore(far);
    CHECK(take(plain, 11) == first);
}

TEST_CASE("dataloader: fingerprint is the tokens' identity, not the files' names") {
    TempDir d;
    std::mt19937 rng((uint32_t)test_seed("dataloader: fingerprint", 110));
    const std::vector<uint16_t> tok = random_tokens(300, rng);
    write_token_file(d / "a.bin", tok);
    write_token_file(d / "renamed.bin", tok);
    std::vector<uint16_t> edited = tok;
    edited[150] = (uint16_t)((edited[150] + 1) % 50257);
    write_token_file(d / "edited.bin", edited);
    const std::string fa = DataLoader(d / "a.bin", 2, 8).fingerprint();
    CHECK(contains(fa, "1 file(s), 300 tokens, crc32c "));
    CHECK(DataLoader(d / "renamed.bin", 2, 8).fingerprint() == fa);
    CHECK(DataLoader(d / "edited.bin", 2, 8).fingerprint() != fa);
    CHECK(DataLoader(d / "a.bin", 3, 8).fingerprint() == fa);  // the batch shape is not the data
}
