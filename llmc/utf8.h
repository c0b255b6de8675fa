// UTF-8 in and out: append a code point, read the next one strictly, and find the first malformed byte.
// Shared by the tokenizer (llmc/bpe.h, whose input must be UTF-8), the JSON reader (llmc/json.h, for \u escapes)
// and the data tools (which name the byte offset of bad input). The rules are RFC 3629's: 1-4 bytes, no
// overlong forms, no UTF-16 surrogates (U+D800..U+DFFF), nothing beyond U+10FFFF.
#pragma once
#include <cstdint>
#include <string>

#include "llmc/error.h"

namespace flashgpt2 {

inline void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

// Decodes the code point at s[i], advancing i. Returns false on malformed UTF-8 (bad lead or continuation
// byte, truncated sequence, overlong form, surrogate, or beyond U+10FFFF), leaving i at the bad sequence.
inline bool next_code_point(const std::string& s, size_t& i, uint32_t& cp) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const size_t n = s.size();
    const unsigned char c = p[i];
    int len;
    uint32_t min;
    if (c < 0x80) { cp = c; len = 1; min = 0; }
    else if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; len = 2; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; len = 3; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { cp = c & 0x07; len = 4; min = 0x10000; }
    else return false;
    if (i + len > n) return false;
    for (int k = 1; k < len; k++) {
        if ((p[i + k] & 0xC0) != 0x80) return false;
        cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
    return true;
}

// Throws "<where>: invalid UTF-8 at byte N" for the first malformed sequence.
inline void check_utf8(const std::string& s, const std::string& where) {
    size_t i = 0;
    uint32_t cp;
    while (i < s.size())
        if (!next_code_point(s, i, cp)) fail("%s: invalid UTF-8 at byte %zu", where.c_str(), i);
}

}  // namespace flashgpt2
