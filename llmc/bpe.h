// GPT-2's byte-level BPE tokenizer, written from its description (Radford et al. 2019, "Language Models are
// Unsupervised Multitask Learners", section 2.2, and the encoder.json / vocab.bpe files OpenAI published).
//
// The idea in four steps:
//   1. Text is bytes (UTF-8). Every one of the 256 byte values is a token, so any text can be encoded.
//   2. Pre-tokenization: a regex splits the text into "words" (letters with one optional leading space,
//      numbers, punctuation runs, whitespace runs, English contractions). Merges never cross a word edge.
//   3. Each word starts as a sequence of single-byte tokens; the merge list (vocab.bpe, line r = rank r) is
//      applied greedily: repeatedly merge the adjacent pair with the lowest rank, until no pair has a rank.
//   4. The resulting pieces are looked up in encoder.json to get ids. Decoding concatenates the pieces' bytes.
//
// The files store tokens not as raw bytes but as printable unicode strings: GPT-2 maps each byte to a
// visible code point (printable Latin-1 bytes to themselves, the others to U+0100 + n), so "Ġ" (U+0120) is a
// space. We undo that mapping on load and work on raw bytes from then on.
//
// The special token <|endoftext|> (id 50256) is produced only when encode() is called with allow_special:
// otherwise the string "<|endoftext|>" in text is ordinary text (tiktoken's encode_ordinary behaviour).
//
// Words are cached (word bytes -> ids), which makes a text like TinyShakespeare fast: most words repeat.
// A BPE object is therefore not safe to share between threads while encoding.
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/json.h"
#include "llmc/utf8.h"

namespace flashgpt2 {

// ---- encoder.json: a JSON object of string -> integer ----------------------------------------------------

// A reader for exactly this shape of JSON (one flat object, string keys, non-negative integer values), walked with
// llmc/json.h's cursor rather than built as a tree: 50,257 pairs, read once per load.
class JsonVocabReader {
public:
    JsonVocabReader(const std::string& text, const std::string& path) : r_(text, path) {}

    std::vector<std::pair<std::string, int>> parse() {
        std::vector<std::pair<std::string, int>> out;
        r_.skip_ws();
        r_.expect('{');
        if (!r_.consume('}')) {
            do {
                r_.skip_ws();
                std::string key = r_.string();
                r_.skip_ws();
                r_.expect(':');
                r_.skip_ws();
                out.emplace_back(std::move(key), static_cast<int>(r_.unsigned_integer(INT_MAX)));
            } while (r_.consume(','));
            r_.skip_ws();
            r_.expect('}');
        }
        r_.skip_ws();
        if (!r_.at_end()) r_.error("unexpected text after the closing '}'");
        return out;
    }

private:
    json::Reader r_;
};

// ---- the tokenizer ---------------------------------------------------------------------------------------

// GPT-2's pre-tokenization regex, as published: \p{L} letters, \p{N} numbers, \s whitespace (Unicode).
constexpr const char* GPT2_SPLIT_PATTERN =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The same pattern as PCRE2 runs it (with PCRE2_UTF | PCRE2_UCP), \s spelled out as Unicode's White_Space set:
// PCRE2 10.42's \s also matches U+180E MONGOLIAN VOWEL SEPARATOR, which left White_Space in Unicode 6.3 and which
// Python's `regex` (GPT-2's own encoder) and tiktoken treat as non-space. \S becomes [^WS], [^\s...] becomes [^WS...].
#define FLASHGPT2_WS "\\t\\n\\x0B\\f\\r \\x85\\xA0\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
constexpr const char* GPT2_SPLIT_PATTERN_PCRE2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" FLASHGPT2_WS "\\p{L}\\p{N}]+|[" FLASHGPT2_WS "]+(?![^" FLASHGPT2_WS
    "])|[" FLASHGPT2_WS "]+";
#undef FLASHGPT2_WS

class BPE {
public:
    static constexpr int EOT = 50256;  // <|endoftext|>
    static constexpr const char* EOT_TEXT = "<|endoftext|>";

    // Loads encoder.json (token string -> id) and vocab.bpe (merges, by rank; first line "#version: ...").
    static BPE load(const std::string& encoder_json, const std::string& vocab_bpe) {
        BPE b;
        b.build_byte_maps();
        // encoder.json: keys are byte strings written in the byte->unicode alphabet.
        const std::string json = read_file(encoder_json);
        std::vector<std::pair<std::string, int>> entries = JsonVocabReader(json, encoder_json).parse();
        if (entries.empty()) fail("%s: empty vocabulary", encoder_json.c_str());
        b.id_to_bytes_.assign(entries.size(), std::string());
        std::vector<bool> seen(entries.size(), false);
        for (auto& [key, id] : entries) {
            if (id < 0 || static_cast<size_t>(id) >= entries.size() || seen[id])
                fail("%s: token ids must be 0..%zu, each once (bad or repeated id %d)", encoder_json.c_str(),
                     entries.size() - 1, id);
            seen[id] = true;
            b.id_to_bytes_[id] = b.unicode_to_bytes(key, encoder_json);
            b.bytes_to_id_[b.id_to_bytes_[id]] = id;
        }
        if (b.bytes_to_id_.size() != entries.size()) fail("%s: two tokens have the same bytes", encoder_json.c_str());
        for (int c = 0; c < 256; c++) {
            auto it = b.bytes_to_id_.find(std::string(1, static_cast<char>(c)));
            if (it == b.bytes_to_id_.end()) fail("%s: no token for byte %d", encoder_json.c_str(), c);
            b.byte_token_[c] = it->second;
        }
        if (b.vocab_size() <= EOT || b.id_to_bytes_[EOT] != EOT_TEXT)
            fail("%s: token %d is not %s", encoder_json.c_str(), EOT, EOT_TEXT);
        // vocab.bpe: "#version" line, then one merge "left right" per line; line r (from 0) has rank r.
        const std::string merges = read_file(vocab_bpe);
        size_t pos = 0, line_no = 0;
        int rank = 0;
        while (pos < merges.size()) {
            size_t end = merges.find('\n', pos);
            if (end == std::string::npos) end = merges.size();
            std::string line = merges.substr(pos, end - pos);
            pos = end + 1;
            line_no++;
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line_no == 1) {
                if (line.rfind("#version", 0) != 0) fail("%s: line 1 is not a '#version' comment", vocab_bpe.c_str());
                continue;
            }
            if (line.empty()) continue;
            const size_t sp = line.find(' ');
            if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
                fail("%s: line %zu is not 'left right'", vocab_bpe.c_str(), line_no);
            const std::string left = b.unicode_to_bytes(line.substr(0, sp), vocab_bpe);
            const std::string right = b.unicode_to_bytes(line.substr(sp + 1), vocab_bpe);
            const int l = b.id_of(left, vocab_bpe, line_no), r = b.id_of(right, vocab_bpe, line_no);
            const int merged = b.id_of(left + right, vocab_bpe, line_no);
            b.merges_.emplace(pair_key(l, r), Merge{rank++, merged});  // a repeated pair keeps its first rank
        }
        if (rank == 0) fail("%s: no merges", vocab_bpe.c_str());
        b.compile_regex();
        return b;
    }

    int vocab_size() const { return static_cast<int>(id_to_bytes_.size()); }

    // The raw bytes of one token (may be a partial UTF-8 sequence).
    const std::string& token_bytes(int id) const {
        if (id < 0 || id >= vocab_size()) fail("token id %d out of range [0, %d)", id, vocab_size());
        return id_to_bytes_[id];
    }

    // ids -> bytes. The exact inverse of encode().
    std::string decode(const std::vector<int>& ids) const {
        std::string out;
        for (int id : ids) out += token_bytes(id);
        return out;
    }

    // text -> ids. `where` names the text's source in the error for invalid UTF-8.
    std::vector<int> encode(const std::string& text, bool allow_special = false, const std::string& where = "text") const {
        check_utf8(text, where);
        std::vector<int> ids;
        if (!allow_special) {
            encode_ordinary(text, ids);
            return ids;
        }
        size_t pos = 0;
        for (;;) {
            const size_t hit = text.find(EOT_TEXT, pos);
            encode_ordinary(text.substr(pos, hit == std::string::npos ? std::string::npos : hit - pos), ids);
            if (hit == std::string::npos) break;
            ids.push_back(EOT);
            pos = hit + strlen(EOT_TEXT);
        }
        return ids;
    }

    // Empties the word cache, which grows with every distinct word encoded (the fuzzer measures each text alone).
    void clear_cache() const { std::unordered_map<std::string, std::vector<int>>().swap(cache_); }

    // The pre-tokenizer alone: the words the regex cuts text into (for tests and teaching).
    std::vector<std::string> split(const std::string& text) const {
        check_utf8(text, "text");
        std::vector<std::string> words;
        for_each_word(text, [&](const char* p, size_t n) { words.emplace_back(p, n); });
        return words;
    }

private:
    struct Merge {
        int rank;  // position in vocab.bpe: lower merges first
        int id;    // the token the pair becomes
    };
    struct RegexDeleter {
        void operator()(pcre2_code* c) const { pcre2_code_free(c); }
    };

    std::vector<std::string> id_to_bytes_;              // (V) token id -> its bytes
    std::unordered_map<std::string, int> bytes_to_id_;  // the inverse
    std::unordered_map<uint64_t, Merge> merges_;        // (left id, right id) -> merge
    int byte_token_[256] = {};                          // byte value -> its single-byte token id
    uint32_t byte_to_cp_[256] = {};                     // GPT-2's byte -> printable code point
    std::unordered_map<uint32_t, unsigned char> cp_to_byte_;
    std::shared_ptr<pcre2_code> regex_;
    bool jit_ = false;
    mutable std::unordered_map<std::string, std::vector<int>> cache_;  // word bytes -> ids

    static uint64_t pair_key(int l, int r) { return (static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(r); }

    // GPT-2's byte <-> unicode table: bytes that are printable Latin-1 ('!'..'~', '¡'..'¬', '®'..'ÿ') map to the
    // same code point; the remaining 68 bytes map, in increasing order, to U+0100, U+0101, ...
    void build_byte_maps() {
        int next = 0;
        for (int b = 0; b < 256; b++) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            byte_to_cp_[b] = printable ? b : 256 + next++;
            cp_to_byte_[byte_to_cp_[b]] = static_cast<unsigned char>(b);
        }
    }

    std::string unicode_to_bytes(const std::string& s, const std::string& path) const {
        std::string out;
        size_t i = 0;
        uint32_t cp;
        while (i < s.size()) {
            if (!next_code_point(s, i, cp)) fail("%s: invalid UTF-8 in token '%s'", path.c_str(), s.c_str());
            auto it = cp_to_byte_.find(cp);
            if (it == cp_to_byte_.end()) fail("%s: token '%s' has U+%04X, not in GPT-2's byte alphabet", path.c_str(), s.c_str(), cp);
            out += static_cast<char>(it->second);
        }
        return out;
    }

    int id_of(const std::string& bytes, const std::string& path, size_t line_no) const {
        auto it = bytes_to_id_.find(bytes);
        if (it == bytes_to_id_.end()) fail("%s: line %zu names a token that is not in the vocabulary", path.c_str(), line_no);
        return it->second;
    }

    void compile_regex() {
        int err;
        PCRE2_SIZE off;
        pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(GPT2_SPLIT_PATTERN_PCRE2), PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            fail("GPT-2 split regex: %s at offset %zu", reinterpret_cast<char*>(msg), static_cast<size_t>(off));
        }
        regex_.reset(re, RegexDeleter());
        jit_ = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;  // falls back to the interpreter without JIT
    }

    // Calls f(ptr, len) for each pre-tokenized word of (already validated) UTF-8 text.
    template <class F>
    void for_each_word(const std::string& text, F&& f) const {
        std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md_owner(
            pcre2_match_data_create_from_pattern(regex_.get(), nullptr), pcre2_match_data_free);
        pcre2_match_data* md = md_owner.get();
        if (!md) fail("out of memory for regex match data");
        const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
        PCRE2_SIZE pos = 0;
        while (pos < text.size()) {
            const int rc = jit_ ? pcre2_jit_match(regex_.get(), subject, text.size(), pos, 0, md, nullptr)
                                : pcre2_match(regex_.get(), subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
            if (rc < 0) break;  // no more words: the pattern matches every code point, so this is the end
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
            if (ov[1] == ov[0])  // cannot happen (every alternative consumes), but never loop forever
                fail("GPT-2 split regex matched an empty word at byte %zu", static_cast<size_t>(ov[0]));
            f(text.data() + ov[0], ov[1] - ov[0]);
            pos = ov[1];
        }
    }

    void encode_ordinary(const std::string& text, std::vector<int>& ids) const {
        for_each_word(text, [&](const char* p, size_t n) {
            std::string word(p, n);
            auto it = cache_.find(word);
            if (it == cache_.end()) it = cache_.emplace(word, bpe_word(word)).first;
            ids.insert(ids.end(), it->second.begin(), it->second.end());
        });
    }

    // Step 3 of the header: start from single bytes, merge the lowest-ranked adjacent pair (all its
    // non-overlapping occurrences, left to right), repeat until no adjacent pair is in the merge list.
    std::vector<int> bpe_word(const std::string& word) const {
        std::vector<int> parts(word.size());
        for (size_t i = 0; i < word.size(); i++) parts[i] = byte_token_[static_cast<unsigned char>(word[i])];
        while (parts.size() > 1) {
            int best_rank = INT_MAX, best_id = -1;
            uint64_t best_key = 0;
            for (size_t i = 0; i + 1 < parts.size(); i++) {
                auto it = merges_.find(pair_key(parts[i], parts[i + 1]));
                if (it != merges_.end() && it->second.rank < best_rank) {
                    best_rank = it->second.rank;
                    best_id = it->second.id;
                    best_key = it->first;
                }
            }
            if (best_id < 0) break;
            std::vector<int> next;
            next.reserve(parts.size());
            for (size_t i = 0; i < parts.size(); i++) {
                if (i + 1 < parts.size() && pair_key(parts[i], parts[i + 1]) == best_key) {
                    next.push_back(best_id);
                    i++;
                } else {
                    next.push_back(parts[i]);
                }
            }
            parts.swap(next);
        }
        return parts;
    }
};

// ---- where the vocabulary files live ------------------------------------------------------------------------

// The source directory that holds gpt2/encoder.json and gpt2/vocab.bpe, as data/get_sources.sh chooses it
// ($DATA_MIRROR, else ../shared/data, else data/raw): the script is asked, so the order is written in one place.
// Needs the working directory to be the repository root (where make runs every tool).
inline std::string gpt2_source_dir() {
    FILE* p = popen("bash data/get_sources.sh dir 2>/dev/null", "r");
    char buf[4096] = {};
    const bool got = p && fgets(buf, sizeof buf, p) != nullptr;
    if (p) pclose(p);
    std::string d(buf);
    while (!d.empty() && (d.back() == '\n' || d.back() == '\r')) d.pop_back();
    if (!got || d.empty())
        fail("cannot find GPT-2's vocabulary: data/get_sources.sh did not answer (run from the repository root, or "
             "give --bpe DIR, a directory holding gpt2/encoder.json and gpt2/vocab.bpe)");
    return d;
}

// GPT-2's BPE from a source directory (dir/gpt2/encoder.json, dir/gpt2/vocab.bpe); an empty dir asks
// gpt2_source_dir().
inline BPE load_gpt2_bpe(const std::string& dir = "") {
    const std::string d = dir.empty() ? gpt2_source_dir() : dir;
    return BPE::load(d + "/gpt2/encoder.json", d + "/gpt2/vocab.bpe");
}

}  // namespace flashgpt2
