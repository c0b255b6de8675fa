// Command lines of the small programs (tools/*.cpp, data/prepro_text.cpp): a table of flags and strict numbers.
//   args::Flags f;
//   f.value("-g", [&](const std::string& v) { n = (int)args::parse_int("-g", v, 0, 1 << 20); });
//   f.flag("--allow-special", [&] { special = true; });
//   if (!f.parse(argc, argv)) { print usage; return 0; }   // false: -h or --help was given
//   f.positional   // the words that are not flags, in order
// Every value is parsed whole ("-b 4x" is an error, not 4) and range-checked; an unknown flag, a missing value
// or a bad number throws flashgpt2::Error naming the flag, so main() prints one line and exits 1.
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "llmc/error.h"

namespace flashgpt2::args {

inline long long parse_int(const std::string& flag, const std::string& s, long long lo, long long hi) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno == ERANGE) fail("%s: '%s' is not an integer", flag.c_str(), s.c_str());
    if (v < lo || v > hi) fail("%s: %lld is out of range [%lld, %lld]", flag.c_str(), v, lo, hi);
    return v;
}

inline double parse_float(const std::string& flag, const std::string& s, double lo, double hi) {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
        fail("%s: '%s' is not a number", flag.c_str(), s.c_str());
    if (v < lo || v > hi) fail("%s: %g is out of range [%g, %g]", flag.c_str(), v, lo, hi);
    return v;
}

class Flags {
public:
    std::vector<std::string> positional;

    void value(const std::string& name, std::function<void(const std::string&)> set) { values_[name] = std::move(set); }
    void flag(const std::string& name, std::function<void()> set) { switches_[name] = std::move(set); }

    // Applies argv[first..] to the table. Returns false when -h or --help was given (nothing else is applied).
    bool parse(int argc, char** argv, int first = 1) {
        for (int a = first; a < argc; a++) {
            const std::string w = argv[a];
            if (w == "-h" || w == "--help") return false;
        }
        for (int a = first; a < argc; a++) {
            const std::string w = argv[a];
            if (w.size() < 2 || w[0] != '-') {
                positional.push_back(w);
            } else if (auto s = switches_.find(w); s != switches_.end()) {
                s->second();
            } else if (auto v = values_.find(w); v != values_.end()) {
                if (a + 1 >= argc) fail("%s: missing its value (see --help)", w.c_str());
                v->second(argv[++a]);
            } else {
                fail("%s: unknown flag (see --help)", w.c_str());
            }
        }
        return true;
    }

private:
    std::map<std::string, std::function<void(const std::string&)>> values_;
    std::map<std::string, std::function<void()>> switches_;
};

}  // namespace flashgpt2::args
