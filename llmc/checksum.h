// CRC-32C, the checksum of our state files, of model files (in a side file, see llmc/checkpoint.h) and of the
// data shards a run records (llmc/run_record.h). It catches accidental damage: a flipped bit, a truncated copy,
// a file overwritten by another. It is no defence against someone who edits a file on purpose.
//
// Why CRC-32C (Castagnoli, Braun and Herrmann, "Optimization of Cyclic Redundancy-Check Codes with 24 and 32
// Parity Bits", IEEE Trans. Commun. 1993): it is the CRC that storage uses (iSCSI, ext4 metadata, Btrfs), it
// detects every burst of up to 32 flipped bits and lets a random corruption through with probability 2^-32.
//
// The arithmetic: the file's bits are the coefficients of a polynomial over GF(2); the CRC is the remainder of
// its division by the generator 0x1EDC6F41. In the reflected (least significant bit first) form used here the
// generator reads 0x82F63B78, the register starts at all ones and is inverted at the end, so that leading and
// trailing zero bytes change the result. Check value (the CRC catalogue's): crc32c("123456789") = 0xE3069283.
//
// Speed: byte at a time a table of 256 remainders does one lookup per byte; "slicing by 8" keeps 8 tables,
// table k holding the remainder of a byte followed by k zero bytes, so 8 bytes cost 8 independent lookups
// that the CPU overlaps (a few GB/s, enough to check a GPT-2 124M state file in well under a second).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace flashgpt2 {

constexpr uint32_t CRC32C_POLY_REFLECTED = 0x82F63B78u;

using Crc32cTables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Crc32cTables make_crc32c_tables() {
    Crc32cTables t{};
    for (uint32_t b = 0; b < 256; b++) {  // table 0: the remainder of one byte, one bit at a time
        uint32_t r = b;
        for (int bit = 0; bit < 8; bit++) r = (r >> 1) ^ ((r & 1u) ? CRC32C_POLY_REFLECTED : 0u);
        t[0][b] = r;
    }
    for (int k = 1; k < 8; k++)  // table k: the same byte followed by k zero bytes
        for (uint32_t b = 0; b < 256; b++) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
    return t;
}

inline constexpr Crc32cTables CRC32C_TABLES = make_crc32c_tables();

// Continues a CRC over n more bytes: crc32c(b, nb, crc32c(a, na)) == crc32c(a followed by b). Start from 0.
inline uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0) {
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the 8-byte step reads words little-endian");
    const auto& t = CRC32C_TABLES;
    const auto* p = static_cast<const unsigned char*>(data);
    uint32_t r = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo, hi;
        std::memcpy(&lo, p, 4);
        std::memcpy(&hi, p + 4, 4);
        lo ^= r;  // the register meets the first 4 bytes; the last 4 are shifted in behind them
        r = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
            t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
    }
    for (; n > 0; n--, p++) r = (r >> 8) ^ t[0][(r ^ *p) & 0xFFu];
    return ~r;
}

}  // namespace flashgpt2
