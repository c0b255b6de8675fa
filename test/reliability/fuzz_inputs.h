// The fuzzer's inputs (test/reliability/fuzz_cpu.cpp): one valid base file of each kind, made here from a seed
// (and the project's real tokenizer and TinyShakespeare's text), and the seeded mutations applied to them.
#pragma once
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/run_record.h"

namespace flashgpt2::fuzz {

constexpr int B = 2, T = 8;  // the loaders' batch shape: 17-token windows

// ---- the base files: one valid file of each kind, made here (and the project's real tokenizer and text) ----

struct Bases {
    std::string shard0, shard1, tokenizer, real_tokenizer, model32, model16, state, state_master, record, text;
    StateLayout layout, layout_master;
};

inline std::string bytes_of(const void* p, size_t n) { return std::string((const char*)p, n); }

// The harness's own plain write (no fsync: thousands of small files; the loaders under test only read).
inline void write_bytes_file(const std::string& path, const std::string& bytes) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f) fail("%s: cannot open for writing: %s", path.c_str(), strerror(errno));
    const bool ok = fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    if (fclose(f) != 0 || !ok) fail("%s: write failed", path.c_str());
}

inline GPT2Config small_config() { return GPT2Config{8, 21, 32, 2, 2, 8}; }  // maxT V Vp L NH C

inline std::string make_shard(size_t n, std::mt19937& g) {
    int32_t h[256] = {20240520, 1, (int32_t)n};
    std::string s = bytes_of(h, sizeof h);
    for (size_t i = 0; i < n; i++) {
        const uint16_t t = (uint16_t)(g() % 50257);
        s += bytes_of(&t, 2);
    }
    return s;
}

inline std::string make_tokenizer(int V, std::mt19937& g) {
    uint32_t h[256] = {20240328, 2, (uint32_t)V, (uint32_t)V - 1};
    std::string s = bytes_of(h, sizeof h);
    for (int i = 0; i < V; i++) {
        const int len = 1 + (int)(g() % 8);
        s += (char)len;
        for (int k = 0; k < len; k++) s += (char)(g() % 256);
    }
    return s;
}

inline Bases make_bases(uint64_t seed, const std::string& text, const std::string& tokenizer, const std::string& dir) {
    Bases b;
    std::mt19937 g((uint32_t)seed);
    b.shard0 = make_shard(6 * B * T + 1, g);
    b.shard1 = make_shard(5 * B * T + 3, g);
    b.tokenizer = make_tokenizer(300, g);
    b.real_tokenizer = read_file(tokenizer);
    const GPT2Config c = small_config();
    std::vector<float> params(num_parameters(c));
    for (float& x : params) x = std::normal_distribution<float>(0.0f, 0.5f)(g);
    save_checkpoint(dir + "/base32.bin", c, params.data());
    b.model32 = read_file(dir + "/base32.bin");
    std::vector<uint16_t> half(params.size());
    for (size_t i = 0; i < half.size(); i++) half[i] = float_to_bf16(params[i]);
    write_checkpoint_file(dir + "/base16.bin", c, CHECKPOINT_VERSION_BF16, half.data(), half.size() * 2);
    b.model16 = read_file(dir + "/base16.bin");
    // a state file whose loader position is real: 13 batches into the two base shards, shuffled
    write_bytes_file(dir + "/base_0.bin", b.shard0);
    write_bytes_file(dir + "/base_1.bin", b.shard1);
    DataLoader dl(dir + "/base_*.bin", B, T, true, 7);
    for (int i = 0; i < 13; i++) dl.next_batch();
    TrainState st;
    st.step = 13, st.rng_state = g(), st.B = B, st.T = T, st.total_batch = B * T, st.seed = 7, st.loader = dl.state();
    st.guard.count = 5, st.guard.skipped_in_a_row = 1;
    for (int i = 0; i < 5; i++) st.guard.losses[i] = 4.0f + 0.1f * i;
    for (bool master : {false, true}) {
        StateLayout& lay = master ? b.layout_master : b.layout;
        lay.config = c, lay.num_params = params.size(), lay.master = master, lay.begin = 0, lay.end = params.size();
        std::vector<float> m(params.size()), v(params.size());
        for (size_t i = 0; i < m.size(); i++) m[i] = 0.01f * params[i], v[i] = 1e-4f * params[i] * params[i];
        write_state_file(dir + "/state.bin", st, lay, m.data(), v.data(), params.data());
        (master ? b.state_master : b.state) = read_file(dir + "/state.bin");
    }
    RunRecord r;
    r.set("trainer", std::string("fuzz base"));
    r.set("model", config_str(c));
    r.set("train_data", dl.fingerprint());
    r.set("lr", (double)6e-4f), r.set("steps", 250LL), r.set("seed", 7LL);
    b.record = r.text();
    b.text = read_file(text);
    return b;
}

// ---- mutations ----

// Sets the word-sized header field at byte offset `at` (4- or 8-byte words) if the file is long enough.
inline void set_word(std::string& s, size_t at, int64_t value, int word_bytes) {
    if (at + word_bytes > s.size()) return;
    if (word_bytes == 4) {
        const int32_t v = (int32_t)value;
        std::memcpy(&s[at], &v, 4);
    } else {
        std::memcpy(&s[at], &value, 8);
    }
}

inline constexpr int64_t EXTREMES[] = {0, 1, -1, 2, 3, 5, 255, 256, 65535, 65536, INT32_MAX, INT32_MIN, INT32_MAX - 1,
                            (int64_t)UINT32_MAX, INT64_MAX, INT64_MIN, 1ll << 40, 20240520, 20240326, 20261129};

// One seeded mutation of s; appends what it did to `what`. `word` is the format's header word size, `words`
// how many header words are worth aiming at.
inline void mutate_once(std::string& s, std::mt19937_64& g, int word, int words, std::string& what) {
    char d[96];
    const size_t n = s.size();
    switch (g() % 8) {
        case 0: {  // flip 1..8 bits
            const int k = 1 + (int)(g() % 8);
            for (int i = 0; i < k && n; i++) s[g() % n] ^= (char)(1 << (g() % 8));
            snprintf(d, sizeof d, "flip %d bits; ", k);
            break;
        }
        case 1: {  // overwrite 1..16 random bytes in a row
            const size_t at = n ? g() % n : 0, k = 1 + g() % 16;
            for (size_t i = at; i < std::min(n, at + k); i++) s[i] = (char)g();
            snprintf(d, sizeof d, "random bytes at %zu; ", at);
            break;
        }
        case 2: {  // truncate: in the header, at its end, or anywhere
            const size_t header = (size_t)word * 256;
            const size_t choices[] = {0, 1, header - 1, header, header + 1, n ? g() % n : 0, n ? n - 1 : 0};
            s.resize(std::min(n, choices[g() % 7]));
            snprintf(d, sizeof d, "truncate to %zu; ", s.size());
            break;
        }
        case 3: {  // append bytes
            const size_t k = 1 + g() % 64;
            for (size_t i = 0; i < k; i++) s += (g() & 1) ? '\0' : (char)g();
            snprintf(d, sizeof d, "append %zu bytes; ", k);
            break;
        }
        case 4:
        case 5: {
            if (word == 1) {  // text: insert something a parser must not trip over
                const std::string specials[] = {"\xff", "\xc3", "\xe2\x82", "\xf0\x9f\x98", "\xed\xa0\x80", "<|endoftext|>",
                                                " = ", "\n", "\r\n", "#", "key = value\n", std::string(300, ' '),
                                                std::string(200, '9'), std::string(1, '\0'), "'s'll've", "\u180e"};
                const std::string& x = specials[g() % (sizeof specials / sizeof specials[0])];
                const size_t at = n ? g() % n : 0;
                s.insert(at, x);
                snprintf(d, sizeof d, "insert %zu bytes at %zu; ", x.size(), at);
                break;
            }
            const int w = (int)(g() % words);  // a header word at an extreme
            const int64_t v = EXTREMES[g() % (sizeof EXTREMES / sizeof EXTREMES[0])];
            set_word(s, (size_t)w * word, v, word);
            snprintf(d, sizeof d, "word %d = %" PRId64 "; ", w, v);
            break;
        }
        case 6: {
            if (word == 1) {  // text: cut inside a multi-byte UTF-8 character, or repeat a line
                size_t at = n ? g() % n : 0;
                while (at < n && ((unsigned char)s[at] & 0xC0) != 0x80) at++;
                if (at < n && (g() & 1)) s.resize(at);
                else if (n) s += s.substr(g() % n, 80);
                snprintf(d, sizeof d, "cut or repeat near %zu; ", at);
                break;
            }
            const int w = (int)(g() % words);  // a header word just past what the file holds, or a little off
            int64_t v = 0;
            if ((size_t)(w + 1) * word <= n) std::memcpy(&v, &s[(size_t)w * word], word);
            if (word == 4) v = (int32_t)v;
            v += (int64_t)(g() % 5) - 2 + ((g() & 1) ? (int64_t)(n / 2) : 0);
            set_word(s, (size_t)w * word, v, word);
            snprintf(d, sizeof d, "word %d nudged to %" PRId64 "; ", w, v);
            break;
        }
        default: {  // splice: copy a chunk over another place
            if (n < 2) break;
            const size_t from = g() % n, to = g() % n, k = 1 + g() % std::min<size_t>(n, 512);
            const std::string chunk = s.substr(from, k);
            s.replace(to, std::min(k, n - to), chunk);
            snprintf(d, sizeof d, "splice %zu bytes %zu -> %zu; ", k, from, to);
        }
    }
    what += d;
}

}  // namespace flashgpt2::fuzz
