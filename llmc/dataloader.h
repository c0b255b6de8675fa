// The token data loader: llm.c's .bin shards in, (B, T) batches of inputs and next-token targets out.
//
// File format (llm.c's, version 1): a header of 256 int32 — [0] magic 20240520, [1] version 1, [2] token count N —
// then N uint16 token ids (little-endian). write_token_file() writes one; DataLoader reads them.
//
// How batches are cut: a shard of N tokens holds (N - 1) / (B*T) batches. Batch b is the B*T+1 tokens starting
// at b*B*T: inputs are the first B*T of them, targets the same window shifted by one (targets[i] = the token
// that follows inputs[i]). Windows do not overlap, so one epoch sees every token (but the few at a shard's end
// that do not fill a batch) exactly once as a target. This is how llm.c's dataloader cuts a shard.
//
// Order: shards in sorted glob order, batches in file order; after the last batch of the last shard the loader
// wraps to the first batch of the first shard and the epoch counter goes up by one.
// With shuffle=true the order is llm.c's (its dataloader.h, with its seed as ours): one MT19937 stream seeded by
// the seed (llmc/torch_rng.h) draws, at the start of every epoch, a permutation of the shard order (applied to
// the previous epoch's shard order, as llm.c does), and, whenever a shard is reached, a fresh permutation of its
// batches. So --seed 42 reads llm.c's batches in llm.c's order, and the order is the same on every machine.
//
// The position is three integers (epoch, shard_pos, batch_pos): "the next batch is the batch_pos-th batch in
// this epoch's order of the shard_pos-th shard in this epoch's shard order". state() returns it (plus the
// settings it is only valid for), restore() puts it back (replaying the stream from the seed up to that
// shard), so a checkpoint resumes on exactly the next batch.
//
// Every shard is validated once when the loader is built (header, size, every token id < vocab_size, at least
// B*T+1 tokens); problems throw flashgpt2::Error naming the file. Only the current shard is held in memory, and a
// shard read again must still have the size and CRC-32C it had then (a file changed during a run is an Error).
#pragma once
#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "llmc/checksum.h"
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/torch_rng.h"

namespace flashgpt2 {

constexpr int32_t TOKEN_FILE_MAGIC = 20240520;
constexpr int32_t TOKEN_FILE_VERSION = 1;
constexpr int TOKEN_FILE_HEADER_INTS = 256;

// Writes n tokens as an llm.c shard, atomically: "<path>.tmp" first, then renamed over path.
inline void write_token_file(const std::string& path, const uint16_t* tokens, size_t n) {
    if (n > static_cast<size_t>(INT32_MAX)) fail("%s: %zu tokens do not fit the header", path.c_str(), n);
    int32_t header[TOKEN_FILE_HEADER_INTS] = {};
    header[0] = TOKEN_FILE_MAGIC;
    header[1] = TOKEN_FILE_VERSION;
    header[2] = static_cast<int32_t>(n);
    write_file_atomic(path, {{header, sizeof header}, {tokens, n * sizeof(uint16_t)}});
}

inline void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
    write_token_file(path, tokens.data(), tokens.size());
}

// Reads a whole shard, checking magic, version and that the file holds exactly the header's token count. The
// count is checked against the file's size before anything is allocated: a header that claims more tokens than
// the file holds is refused, never trusted with a buffer.
inline std::vector<uint16_t> read_token_file(const std::string& path) {
    InputFile in(path);
    FILE* f = in.f;
    const size_t size = file_size(f, path);
    int32_t header[TOKEN_FILE_HEADER_INTS];
    const size_t got = fread(header, sizeof(int32_t), TOKEN_FILE_HEADER_INTS, f);
    if (got != TOKEN_FILE_HEADER_INTS)
        fail("%s: truncated header (%zu bytes, expected %zu)", path.c_str(), got * sizeof(int32_t), sizeof header);
    if (header[0] != TOKEN_FILE_MAGIC)
        fail("%s: bad magic %d (expected %d: not an llm.c token file)", path.c_str(), header[0], TOKEN_FILE_MAGIC);
    if (header[1] != TOKEN_FILE_VERSION)
        fail("%s: unsupported version %d (expected %d)", path.c_str(), header[1], TOKEN_FILE_VERSION);
    if (header[2] < 0) fail("%s: negative token count %d in header", path.c_str(), header[2]);
    const size_t n = static_cast<size_t>(header[2]);
    const size_t holds = size > sizeof header ? (size - sizeof header) / sizeof(uint16_t) : 0;
    if (n > holds) fail("%s: truncated: header says %zu tokens, file holds %zu", path.c_str(), n, holds);
    if (size != sizeof header + n * sizeof(uint16_t))
        fail("%s: trailing bytes after the %zu tokens the header announces", path.c_str(), n);
    std::vector<uint16_t> tokens(n);
    const size_t read = n ? fread(tokens.data(), sizeof(uint16_t), n, f) : 0;
    if (read != n) fail("%s: truncated while reading: header says %zu tokens, read %zu", path.c_str(), n, read);
    if (fgetc(f) != EOF) fail("%s: grew while being read (trailing bytes after %zu tokens)", path.c_str(), n);
    return tokens;
}

// What a shard was when the loader first read it: a shard read again later (the loader keeps one in memory)
// must be the same, or the run would silently train on other data, or read past the end of a shorter file.
struct ShardInfo {
    size_t tokens = 0;
    uint32_t crc = 0;  // CRC-32C of the token bytes (llmc/checksum.h)
};

inline uint32_t token_crc(const std::vector<uint16_t>& tok) { return crc32c(tok.data(), tok.size() * sizeof(uint16_t)); }

// The loader's position, as plain integers so a checkpoint can store it. The last four fields are the settings
// the position is only meaningful for; restore() checks them.
struct DataLoaderState {
    uint64_t epoch = 0;      // how many times the loader has wrapped around
    uint64_t shard_pos = 0;  // index into this epoch's shard order
    uint64_t batch_pos = 0;  // index into this epoch's batch order of that shard: the NEXT batch next_batch() returns
    uint64_t seed = 0;
    int64_t shuffle = 0;  // 0 or 1
    int64_t B = 0, T = 0;
    int64_t num_shards = 0;
};

class DataLoader {
public:
    int B, T;
    std::vector<int> inputs;   // (B, T) token ids
    std::vector<int> targets;  // (B, T) the token after each input

    // restore() replays the shuffle stream from the seed to the saved shard: at most this many draws (about a
    // second), so a corrupt or hostile epoch count is refused instead of replaying for hours.
    static constexpr uint64_t MAX_REPLAY_DRAWS = 1ull << 26;

    DataLoader(const std::string& pattern, int B_, int T_, bool shuffle = false, uint64_t seed = 0,
               int vocab_size = 50257)
        : B(B_), T(T_), shuffle_(shuffle), seed_(seed) {
        if (B <= 0 || T <= 0) fail("%s: batch shape B=%d T=%d must be positive", pattern.c_str(), B, T);
        if (seed > UINT32_MAX) fail("%s: seed %llu does not fit the shuffler's 32 bits", pattern.c_str(), (unsigned long long)seed);
        files_ = glob_files(pattern);
        const size_t window = static_cast<size_t>(B) * T + 1;
        for (const std::string& path : files_) {
            std::vector<uint16_t> tok = read_token_file(path);
            if (tok.size() < window)
                fail("%s: %zu tokens, fewer than one batch needs (B*T+1 = %zu)", path.c_str(), tok.size(), window);
            for (size_t i = 0; i < tok.size(); i++)
                if (tok[i] >= vocab_size)
                    fail("%s: token %u at position %zu is not below the vocab size %d", path.c_str(), tok[i], i, vocab_size);
            shards_.push_back(ShardInfo{tok.size(), token_crc(tok)});
            shard_batches_.push_back((tok.size() - 1) / (static_cast<size_t>(B) * T));
            total_batches_ += shard_batches_.back();
            if (files_.size() == 1) {  // a single shard stays resident from the start
                tokens_ = std::move(tok);
                loaded_shard_ = 0;
            }
        }
        inputs.assign(static_cast<size_t>(B) * T, 0);
        targets.assign(static_cast<size_t>(B) * T, 0);
        reset();
    }

    // Batches in one epoch: sum over shards of (tokens - 1) / (B*T).
    size_t num_batches() const { return total_batches_; }
    const std::vector<std::string>& files() const { return files_; }

    // The data's identity for a run's settings record (llmc/run_record.h): shard count, tokens, and one CRC-32C
    // over every shard's token count and checksum in order. Another file name with the same tokens matches.
    std::string fingerprint() const {
        uint32_t crc = 0;
        size_t tokens = 0;
        for (const ShardInfo& sh : shards_) {
            const uint64_t fields[2] = {sh.tokens, sh.crc};
            crc = crc32c(fields, sizeof fields, crc);
            tokens += sh.tokens;
        }
        char s[96];
        snprintf(s, sizeof s, "%zu file(s), %zu tokens, crc32c %08x", shards_.size(), tokens, crc);
        return s;
    }

    // Back to the first batch of epoch 0.
    void reset() { seek(0, 0, 0); }

    // Fills inputs/targets with the batch at the current position, then moves one batch on (wrapping at epoch end).
    void next_batch() {
        const size_t shard = shard_order_[shard_pos_];
        const size_t batch = batch_order_[batch_pos_];
        const size_t n = static_cast<size_t>(B) * T;
        const uint16_t* w = tokens_.data() + batch * n;  // the batch's B*T+1 token window
        for (size_t i = 0; i < n; i++) {
            inputs[i] = w[i];
            targets[i] = w[i + 1];
        }
        if (batch_pos_ + 1 < shard_batches_[shard]) {
            seek(epoch_, shard_pos_, batch_pos_ + 1);
        } else if (shard_pos_ + 1 < files_.size()) {
            seek(epoch_, shard_pos_ + 1, 0);
        } else {
            seek(epoch_ + 1, 0, 0);
        }
    }

    DataLoaderState state() const {
        DataLoaderState s;
        s.epoch = epoch_;
        s.shard_pos = shard_pos_;
        s.batch_pos = batch_pos_;
        s.seed = seed_;
        s.shuffle = shuffle_ ? 1 : 0;
        s.B = B;
        s.T = T;
        s.num_shards = static_cast<int64_t>(files_.size());
        return s;
    }

    // How many batches next_batch() has returned since epoch 0 began, at the current position. A trainer knows
    // how many it read (steps x micro-batches x GPUs), so after restore() this must equal that count.
    uint64_t batches_read() const {
        uint64_t n = epoch_ * total_batches_ + batch_pos_;
        for (size_t i = 0; i < shard_pos_; i++) n += shard_batches_[shard_order_[i]];
        return n;
    }

    // Puts back a position from state(). Every field is checked before it is used: the settings must be this
    // loader's, the shard and batch must exist, and the epoch must be one a replay can reach (MAX_REPLAY_DRAWS).
    // Errors name `source` (the state file the position came from), else the loader's first shard.
    void restore(const DataLoaderState& s, const std::string& source = "") {
        const char* where = source.empty() ? files_.front().c_str() : source.c_str();
        if (s.B != B || s.T != T)
            fail("%s: saved loader position is for B=%lld T=%lld, this loader has B=%d T=%d", where, (long long)s.B,
                 (long long)s.T, B, T);
        if (s.shuffle != (shuffle_ ? 1 : 0) || s.seed != seed_)
            fail("%s: saved loader position is for shuffle=%lld seed=%llu, this loader has shuffle=%d seed=%llu", where,
                 (long long)s.shuffle, (unsigned long long)s.seed, shuffle_ ? 1 : 0, (unsigned long long)seed_);
        if (s.num_shards != static_cast<int64_t>(files_.size()))
            fail("%s: saved loader position is for %lld shards, the pattern now matches %zu", where,
                 (long long)s.num_shards, files_.size());
        if (s.shard_pos >= files_.size()) fail("%s: saved shard position %llu out of range", where, (unsigned long long)s.shard_pos);
        const uint64_t draws_per_epoch = total_batches_ + files_.size();  // one shard order + every batch order
        if (shuffle_ && s.epoch > MAX_REPLAY_DRAWS / draws_per_epoch)
            fail("%s: saved epoch %llu is out of range (a restore replays the shuffle up to epoch %llu at most)", where,
                 (unsigned long long)s.epoch, (unsigned long long)(MAX_REPLAY_DRAWS / draws_per_epoch));
        if (!shuffle_ && s.epoch > (1ull << 40)) fail("%s: saved epoch %llu out of range", where, (unsigned long long)s.epoch);
        seek(s.epoch, s.shard_pos, 0);  // builds this epoch's orders so the shard's batch count is known
        if (s.batch_pos >= shard_batches_[shard_order_[s.shard_pos]])
            fail("%s: saved batch position %llu out of range", where, (unsigned long long)s.batch_pos);
        batch_pos_ = s.batch_pos;
    }

private:
    bool shuffle_;
    uint64_t seed_;
    std::vector<std::string> files_;
    std::vector<ShardInfo> shards_;      // (num_shards) each file as first read, in file order
    std::vector<size_t> shard_batches_;  // (num_shards) batches in each shard, in file order
    size_t total_batches_ = 0;
    uint64_t epoch_ = 0;
    size_t shard_pos_ = 0, batch_pos_ = 0;
    std::vector<size_t> shard_order_;  // (num_shards) this epoch's shard order
    std::vector<size_t> batch_order_;  // (batches of the current shard) this epoch's batch order in it
    std::mt19937 rng_;                 // (shuffle) the order stream, at the point after the current shard's draw
    size_t loaded_shard_ = SIZE_MAX;   // which file tokens_ holds
    std::vector<uint16_t> tokens_;     // the current shard's tokens

    static std::vector<std::string> glob_files(const std::string& pattern) {
        glob_t g;
        const int rc = glob(pattern.c_str(), 0, nullptr, &g);  // results come back sorted
        std::vector<std::string> out;
        if (rc == 0)
            for (size_t i = 0; i < g.gl_pathc; i++) out.emplace_back(g.gl_pathv[i]);
        globfree(&g);
        if (rc == GLOB_NOMATCH || (rc == 0 && out.empty())) {
            if (pattern.find_first_of("*?[") == std::string::npos) fail("%s: no such file", pattern.c_str());
            fail("%s: the pattern matches no file", pattern.c_str());
        }
        if (rc != 0) fail("%s: glob failed (code %d)", pattern.c_str(), rc);
        return out;
    }

    // The stream's two kinds of draw, in the order llm.c makes them.
    void begin_epoch() {  // the shard order: this epoch's permutation of the last one
        if (shuffle_) torch_permute(shard_order_, rng_);
    }
    void begin_shard() {  // the batch order of the shard at shard_pos_: a fresh permutation of 0..n-1
        batch_order_.resize(shard_batches_[shard_order_[shard_pos_]]);
        for (size_t i = 0; i < batch_order_.size(); i++) batch_order_[i] = i;
        if (shuffle_) torch_permute(batch_order_, rng_);
    }

    // Moves to (epoch, shard_pos, batch_pos). Unshuffled, the orders never change: it jumps there. Shuffled,
    // forward moves draw on from the live stream; a move back (or the first seek) restarts the stream from the
    // seed and walks to the target shard, drawing every order on the way.
    void seek(uint64_t epoch, size_t shard_pos, size_t batch_pos) {
        if (!shuffle_) {
            const bool moved = batch_order_.empty() || epoch != epoch_ || shard_pos != shard_pos_;
            if (shard_order_.size() != files_.size()) {
                shard_order_.resize(files_.size());
                for (size_t i = 0; i < files_.size(); i++) shard_order_[i] = i;
            }
            epoch_ = epoch, shard_pos_ = shard_pos;
            if (moved) begin_shard();
        } else {
            if (batch_order_.empty() || epoch < epoch_ || (epoch == epoch_ && shard_pos < shard_pos_)) {
                rng_.seed(static_cast<uint32_t>(seed_));
                shard_order_.resize(files_.size());
                for (size_t i = 0; i < files_.size(); i++) shard_order_[i] = i;
                epoch_ = 0, shard_pos_ = 0;
                begin_epoch();
                begin_shard();
            }
            while (epoch_ < epoch || (epoch_ == epoch && shard_pos_ < shard_pos)) {
                if (shard_pos_ + 1 < files_.size()) {
                    shard_pos_++;
                } else {
                    epoch_++, shard_pos_ = 0;
                    begin_epoch();
                }
                begin_shard();
            }
        }
        batch_pos_ = batch_pos;
        load_shard(shard_order_[shard_pos_]);
    }

    // Reads a shard again (several shards: one is in memory at a time) and checks it is the file the loader
    // validated at the start: a file replaced or cut during the run is an Error, never an out-of-bounds read.
    void load_shard(size_t shard) {
        if (loaded_shard_ == shard) return;
        std::vector<uint16_t> tok = read_token_file(files_[shard]);
        const ShardInfo& was = shards_[shard];
        if (tok.size() != was.tokens || token_crc(tok) != was.crc)
            fail("%s: changed during the run (%zu tokens, crc32c %08x; the run started with %zu tokens, crc32c %08x)",
                 files_[shard].c_str(), tok.size(), token_crc(tok), was.tokens, was.crc);
        tokens_ = std::move(tok);
        loaded_shard_ = shard;
    }
};

// How many sequences per val batch, for a val split of nseq sequences of T tokens and a training batch of B.
// max_batches > 0 (the trainers' -m N): batches of B, as llm.c reads them (at B=16 T=1024, llm.c's val loss on
// TinyShakespeare is the loss of the split's first batch of 16 sequences). max_batches <= 0 (-m -1, the whole
// split): the largest B' <= B whose whole batches cover at least 95% of the sequences (the loader reads only
// whole batches), so "the whole val split" really is nearly all of it.
inline int val_batch_size(size_t nseq, int B, int max_batches) {
    const int most = (int)std::min<size_t>((size_t)B, nseq);
    if (max_batches > 0) return most;
    for (int b = most; b > 1; b--)
        if ((nseq / b) * b * 100 >= nseq * 95) return b;
    return 1;
}

}  // namespace flashgpt2
