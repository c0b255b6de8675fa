// Strict number parsing for command lines: the whole string must be the number, in range, or the flag's name
// and the bad value are one Error line. Shared by the trainers and the dev runners.
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "llmc/error.h"

namespace flashgpt2 {

// Strict number parsing: the whole string must be the number.
inline long parse_long(const char* flag, const char* s) {
    errno = 0;
    char* end = nullptr;
    const long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE) fail("%s: '%s' is not an integer", flag, s);
    return v;
}
inline int parse_int(const char* flag, const char* s, long lo, long hi) {
    const long v = parse_long(flag, s);
    if (v < lo || v > hi) fail("%s: %ld is out of range [%ld, %ld]", flag, v, lo, hi);
    return static_cast<int>(v);
}
inline float parse_float(const char* flag, const char* s, double lo, double hi) {
    errno = 0;
    char* end = nullptr;
    const double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !std::isfinite(v)) fail("%s: '%s' is not a number", flag, s);
    if (v < lo || v > hi) fail("%s: %g is out of range [%g, %g]", flag, v, lo, hi);
    return static_cast<float>(v);
}

}  // namespace flashgpt2
