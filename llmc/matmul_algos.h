// Which cuBLASLt algorithm each distinct matmul call of a run takes, as a table that can be saved and loaded
// (`--matmul-algos`, llmc/matmul.cuh). Plain C++: the format is tested on a CPU (test/cpu/test_matmul_algos.cpp).
//
// Why a table: cuBLASLt's heuristic names one algorithm per call shape, and it is not always the fastest of
// the ones it offers (doc/kernels.md has the figures). Timing the candidates picks a faster one, but the pick
// can differ from run to run when two candidates time alike, and another algorithm rounds differently. So a
// run that tunes writes down what it chose (DIR/matmul_algos.txt), and a resume reads it back: the same
// algorithms, the same bits.
//
// The file, one call per line after a header naming the card and the cuBLASLt version it is valid for:
//   # flashgpt2 matmul algorithms v1
//   device <name> | <SMs> SMs | cuBLASLt <version>
//   call <12 key integers> algo <8 x 16 hex digits> us <time> pick <index> of <candidates>
#pragma once
#include <array>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "llmc/error.h"

namespace flashgpt2 {

// A call's key: m, n, k, transa, transb, lda, ldb, ldd, epilogue, ldaux (-1: none), A's alignment << 32 | B's,
// D's alignment (what the heuristic may assume about the pointers).
using MatmulKey = std::array<int64_t, 12>;

struct MatmulChoice {
    std::array<uint64_t, 8> algo{};  // cublasLtMatmulAlgo_t's opaque bytes
    float us = 0.0f;                 // its median time when tuned; 0: not timed (the heuristic's first)
    int pick = 0, candidates = 1;    // which of the heuristic's candidates, out of how many
    bool checked = false;            // not in the file: cuBLASLt has accepted `algo` for this call in this process
};

struct MatmulAlgoTable {
    std::string device;  // "<name> | <SMs> SMs | cuBLASLt <version>": the table is valid there only
    std::map<MatmulKey, MatmulChoice> calls;
};

constexpr const char* MATMUL_ALGOS_MAGIC = "# flashgpt2 matmul algorithms v1";

inline std::string format_matmul_algos(const MatmulAlgoTable& t) {
    std::string s = std::string(MATMUL_ALGOS_MAGIC) + "\ndevice " + t.device + "\n";
    char buf[64];
    for (const auto& [key, c] : t.calls) {
        s += "call";
        for (int64_t v : key) s += " " + std::to_string(v);
        s += " algo";
        for (uint64_t w : c.algo) snprintf(buf, sizeof buf, " %016" PRIx64, w), s += buf;
        snprintf(buf, sizeof buf, " us %.2f pick %d of %d\n", c.us, c.pick, c.candidates);
        s += buf;
    }
    return s;
}

// `what` names the file in errors: "<what> line N: ..." for the first line that does not parse.
inline MatmulAlgoTable parse_matmul_algos(const std::string& text, const std::string& what) {
    MatmulAlgoTable t;
    std::istringstream in(text);
    std::string line;
    int n = 0;
    if (!std::getline(in, line) || line != MATMUL_ALGOS_MAGIC)
        fail("%s: not a matmul algorithm table (its first line is not '%s')", what.c_str(), MATMUL_ALGOS_MAGIC);
    n++;
    if (!std::getline(in, line) || line.rfind("device ", 0) != 0 || line.size() == 7)
        fail("%s line 2: expected 'device <name> | <SMs> SMs | cuBLASLt <version>'", what.c_str());
    n++;
    t.device = line.substr(7);
    while (std::getline(in, line)) {
        n++;
        std::istringstream ls(line);
        std::string word, hex;
        MatmulKey key;
        MatmulChoice c;
        bool ok = (ls >> word) && word == "call";
        for (int64_t& v : key) ok = ok && (ls >> v);
        ok = ok && (ls >> word) && word == "algo";
        for (uint64_t& w : c.algo) {
            ok = ok && (ls >> hex) && hex.size() == 16 && hex.find_first_not_of("0123456789abcdef") == std::string::npos;
            if (ok) w = std::stoull(hex, nullptr, 16);
        }
        ok = ok && (ls >> word) && word == "us" && (ls >> c.us) && c.us >= 0.0f;
        ok = ok && (ls >> word) && word == "pick" && (ls >> c.pick) && (ls >> word) && word == "of" &&
             (ls >> c.candidates) && c.pick >= 0 && c.pick < c.candidates && !(ls >> word);
        if (!ok) fail("%s line %d: expected 'call <12 integers> algo <8 x 16 hex digits> us <time> pick <i> of <n>'",
                      what.c_str(), n);
        if (!t.calls.emplace(key, c).second) fail("%s line %d: a second line for the same call", what.c_str(), n);
    }
    return t;
}

}  // namespace flashgpt2
