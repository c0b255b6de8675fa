// Host-side errors: every problem with user input becomes one clear line and a non-zero exit.
// Library code throws flashgpt2::Error("<file or flag>: <what is wrong>"); each main() catches it,
// prints "error: <message>" on stderr and returns 1. Tests check the throw and its message.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace flashgpt2 {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// printf-style throw: fail("%s: bad magic %d (expected %d)", path, got, want)
[[noreturn]] inline void fail(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    throw Error(buf);
}

// Wraps a main body: int main(int argc, char** argv) { return flashgpt2::run_main([&] { ...; return 0; }); }
template <class F>
int run_main(F&& body) {
    try {
        return body();
    } catch (const Error& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        fprintf(stderr, "error: out of host memory\n");
        return 1;
    }
}

}  // namespace flashgpt2
