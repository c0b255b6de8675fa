// A small JSON reader (RFC 8259) and the one writing helper the project needs, for the files it shares with other
// tools: GPT-2's encoder.json (llmc/bpe.h), the safetensors header (llmc/safetensors.h) and Hugging Face's
// config.json (llmc/hf_gpt2.h).
//
// Two ways to read:
//   json::Reader  a cursor with one call per piece of grammar (string, unsigned integer, any value). A reader
//                 that knows the shape it expects walks the text with it; encoder.json's 50,257 pairs are read
//                 this way, without building a tree.
//   json::parse   a whole document as a Value tree, for small files read by key.
// Numbers keep the text they were written as, so an integer up to 2^64 - 1 (a safetensors byte offset) reads
// exactly, not through a double. Objects keep their members in file order and a repeated key is an error (the
// safetensors format forbids them; no file we read has a reason to repeat one). Nesting deeper than 64 levels
// is refused, so a hostile file cannot overflow the stack.
// Errors throw flashgpt2::Error "<where>: JSON error at byte N: <what>".
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "llmc/error.h"
#include "llmc/utf8.h"

namespace flashgpt2::json {

struct Value {
    enum class Type { null, boolean, number, string, array, object };
    Type type = Type::null;
    bool boolean = false;
    std::string text;                                    // string: its bytes (UTF-8); number: as written
    std::vector<Value> items;                            // array
    std::vector<std::pair<std::string, Value>> members;  // object, in file order

    bool is(Type t) const { return type == t; }
    // The member named key, or nullptr (also when this is not an object).
    const Value* find(const std::string& key) const {
        for (const auto& [k, v] : members)
            if (k == key) return &v;
        return nullptr;
    }
    // True for a number written as a plain non-negative integer ("12", not "12.0", "1e3" or "-1") that fits
    // 64 bits; then *out is its value.
    bool to_u64(uint64_t* out) const {
        if (type != Type::number || text.empty()) return false;
        uint64_t v = 0;
        for (char c : text) {
            if (c < '0' || c > '9') return false;
            const uint64_t d = (uint64_t)(c - '0');
            if (v > (UINT64_MAX - d) / 10) return false;
            v = v * 10 + d;
        }
        *out = v;
        return true;
    }
};

class Reader {
public:
    static constexpr int MAX_DEPTH = 64;  // arrays and objects inside each other

    Reader(const std::string& text, const std::string& where) : s_(text), where_(where) {}

    [[noreturn]] void error(const char* what) const { fail("%s: JSON error at byte %zu: %s", where_.c_str(), i_, what); }
    char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
    bool at_end() const { return i_ >= s_.size(); }
    void skip_ws() {
        while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) i_++;
    }
    void expect(char c) {
        if (peek() != c) {
            char msg[32];
            snprintf(msg, sizeof msg, "expected '%c'", c);
            error(msg);
        }
        i_++;
    }
    // Skips whitespace, then takes c if it is next.
    bool consume(char c) {
        skip_ws();
        if (peek() != c) return false;
        i_++;
        return true;
    }

    // A "..." literal with every escape decoded, \uXXXX (and UTF-16 surrogate pairs) to UTF-8.
    std::string string() {
        expect('"');
        std::string out;
        for (;;) {
            if (i_ >= s_.size()) error("unterminated string");
            const char c = s_[i_++];
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) error("control character in string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (i_ >= s_.size()) error("unterminated escape");
            switch (s_[i_++]) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': append_utf8(out, unicode_escape()); break;
                default: error("unknown escape");
            }
        }
    }

    // Digits only, at most max (encoder.json's ids).
    uint64_t unsigned_integer(uint64_t max) {
        if (!(peek() >= '0' && peek() <= '9')) error("expected a non-negative integer");
        uint64_t v = 0;
        while (peek() >= '0' && peek() <= '9') {
            v = v * 10 + (uint64_t)(s_[i_++] - '0');
            if (v > max) error("integer too large");
        }
        return v;
    }

    // Any value, whitespace around it skipped.
    Value value(int depth = 0) {
        if (depth >= MAX_DEPTH) error("nested too deeply");
        skip_ws();
        Value v;
        const char c = peek();
        if (c == '{') {
            v.type = Value::Type::object;
            i_++;
            if (!consume('}')) {
                do {
                    skip_ws();
                    std::string key = string();
                    if (v.find(key)) error(("repeated key \"" + key + "\"").c_str());
                    skip_ws();
                    expect(':');
                    v.members.emplace_back(std::move(key), value(depth + 1));
                } while (consume(','));
                skip_ws();
                expect('}');
            }
        } else if (c == '[') {
            v.type = Value::Type::array;
            i_++;
            if (!consume(']')) {
                do v.items.push_back(value(depth + 1));
                while (consume(','));
                skip_ws();
                expect(']');
            }
        } else if (c == '"') {
            v.type = Value::Type::string;
            v.text = string();
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            v.type = Value::Type::number;
            v.text = number();
        } else if (word("true")) {
            v.type = Value::Type::boolean, v.boolean = true;
        } else if (word("false")) {
            v.type = Value::Type::boolean;
        } else if (!word("null")) {
            error("expected a value");
        }
        skip_ws();
        return v;
    }

private:
    const std::string& s_;
    const std::string& where_;
    size_t i_ = 0;

    bool word(const char* w) {
        const size_t n = std::char_traits<char>::length(w);
        if (s_.compare(i_, n, w) != 0) return false;
        i_ += n;
        return true;
    }

    uint32_t hex4() {
        if (i_ + 4 > s_.size()) error("truncated \\u escape");
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) {
            const char c = s_[i_++];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= c - '0';
            else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
            else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
            else error("bad hex digit in \\u escape");
        }
        return v;
    }

    // The code point of a \u escape (its "\u" already read): a high surrogate must be followed by a low one.
    uint32_t unicode_escape() {
        uint32_t cp = hex4();
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.compare(i_, 2, "\\u") != 0) error("high surrogate without a low surrogate");
            i_ += 2;
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) error("high surrogate without a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            error("lone low surrogate");
        }
        return cp;
    }

    // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, returned as written.
    std::string number() {
        const size_t start = i_;
        auto digits = [&] {
            if (!(peek() >= '0' && peek() <= '9')) error("malformed number");
            while (peek() >= '0' && peek() <= '9') i_++;
        };
        if (peek() == '-') i_++;
        if (peek() == '0') i_++;
        else digits();
        if (peek() == '.') {
            i_++;
            digits();
        }
        if (peek() == 'e' || peek() == 'E') {
            i_++;
            if (peek() == '+' || peek() == '-') i_++;
            digits();
        }
        return s_.substr(start, i_ - start);
    }
};

// A whole document: exactly one value, nothing after it but whitespace.
inline Value parse(const std::string& text, const std::string& where) {
    Reader r(text, where);
    Value v = r.value();
    if (!r.at_end()) r.error("unexpected text after the value");
    return v;
}

// s (UTF-8) as a JSON string literal: quotes, backslashes and control characters escaped.
inline std::string quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char b[8];
            snprintf(b, sizeof b, "\\u%04x", (unsigned)c);
            out += b;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

}  // namespace flashgpt2::json
