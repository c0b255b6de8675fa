// llm.c's tokenizer file (gpt2_tokenizer.bin): just enough to turn sampled token ids back into text.
//
// Format: a header of 256 uint32 — [0] magic 20240328, [1] version (2; version 1 files lack [3]), [2] vocab size V,
// [3] the end-of-text token id — then, for each of the V tokens in id order, one length byte and that many bytes.
// Tokens are raw bytes; a few GPT-2 tokens are pieces of a multi-byte UTF-8 character, so decode one id at a
// time only when printing a stream (the bytes join up), and decode whole sequences when you need valid text.
//
// write_tokenizer_bin() makes the file from our BPE (llmc/bpe.h); `make data` writes data/gpt2_tokenizer.bin.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/error.h"
#include "llmc/fileio.h"

namespace flashgpt2 {

constexpr uint32_t TOKENIZER_MAGIC = 20240328;
constexpr uint32_t TOKENIZER_VERSION = 2;

struct Tokenizer {
    uint32_t vocab_size = 0;
    uint32_t eot_token = 0;

    // Every count in the header is checked against the file's size before it sizes anything: each token takes
    // at least 2 bytes (its length byte and 1..255 bytes, as llm.c requires), so a header asking for more tokens
    // than the file can hold is refused at once. The file is kept as read, with the position of every 16th
    // token: a lookup walks at most 15 length bytes, and the tokenizer costs its file's size plus V/4 bytes.
    static Tokenizer load(const std::string& path) {
        Tokenizer t;
        t.data_ = read_file(path);  // parse from memory: one place to check every length
        const std::string& data = t.data_;
        uint32_t header[256];
        if (data.size() < sizeof header)
            fail("%s: truncated header (%zu bytes, expected %zu)", path.c_str(), data.size(), sizeof header);
        memcpy(header, data.data(), sizeof header);
        if (header[0] != TOKENIZER_MAGIC)
            fail("%s: bad magic %u (expected %u: not an llm.c tokenizer file)", path.c_str(), header[0], TOKENIZER_MAGIC);
        if (header[1] != 1 && header[1] != 2)
            fail("%s: unsupported version %u (expected 1 or 2)", path.c_str(), header[1]);
        t.vocab_size = header[2];
        t.eot_token = header[1] == 1 ? 50256u : header[3];  // version 1 predates the EOT field; GPT-2's is 50256
        if (t.vocab_size == 0 || t.eot_token >= t.vocab_size)
            fail("%s: bad header: vocab size %u, EOT token %u", path.c_str(), t.vocab_size, t.eot_token);
        const size_t body = data.size() - sizeof header;
        if (t.vocab_size > body / 2)
            fail("%s: truncated: the header says %u tokens, the %zu bytes after it hold at most %zu", path.c_str(),
                 t.vocab_size, body, body / 2);
        t.every16_.reserve(t.vocab_size / 16 + 1);
        size_t pos = sizeof header;
        for (uint32_t id = 0; id < t.vocab_size; id++) {
            if (id % 16 == 0) t.every16_.push_back(pos);
            if (pos >= data.size()) fail("%s: truncated: ends at token %u of %u", path.c_str(), id, t.vocab_size);
            const size_t len = static_cast<unsigned char>(data[pos]);
            if (len == 0) fail("%s: token %u has length 0 (the format allows 1..255)", path.c_str(), id);
            if (pos + 1 + len > data.size()) fail("%s: truncated: ends inside token %u", path.c_str(), id);
            pos += 1 + len;
        }
        if (pos != data.size()) fail("%s: %zu trailing bytes after the last token", path.c_str(), data.size() - pos);
        return t;
    }

    std::string decode(int id) const {
        if (id < 0 || static_cast<uint32_t>(id) >= vocab_size) fail("token id %d out of range [0, %u)", id, vocab_size);
        size_t pos = every16_[id / 16];
        for (int k = 0; k < id % 16; k++) pos += 1 + static_cast<unsigned char>(data_[pos]);
        return data_.substr(pos + 1, static_cast<unsigned char>(data_[pos]));
    }

    std::string decode(const std::vector<int>& ids) const {
        std::string out;
        for (int id : ids) out += decode(id);
        return out;
    }

private:
    std::string data_;             // the file: header, then each token's length byte and bytes
    std::vector<size_t> every16_;  // where tokens 0, 16, 32, ... start in data_
};

// Writes a vocabulary as an llm.c tokenizer file (version 2), atomically. Vocab is our BPE (llmc/bpe.h) or
// anything with vocab_size() and token_bytes(id): a template, so this header does not pull in PCRE2.
template <class Vocab>
void write_tokenizer_bin(const std::string& path, const Vocab& bpe, uint32_t eot_token = 50256) {
    uint32_t header[256] = {};
    header[0] = TOKENIZER_MAGIC;
    header[1] = TOKENIZER_VERSION;
    header[2] = static_cast<uint32_t>(bpe.vocab_size());
    header[3] = eot_token;
    std::string data(reinterpret_cast<const char*>(header), sizeof header);
    for (int id = 0; id < bpe.vocab_size(); id++) {
        const std::string& b = bpe.token_bytes(id);
        if (b.empty() || b.size() > 255) fail("%s: token %d has %zu bytes (the format allows 1..255)", path.c_str(), id, b.size());
        data += static_cast<char>(b.size());
        data += b;
    }
    write_file_atomic(path, data);
}

}  // namespace flashgpt2
