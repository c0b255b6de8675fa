// Every random seed a CPU test draws comes from here and is printed, so a failure can be replayed:
//   seed: <what> = <value>
// By default a test's seed is the fixed value in its source, so every run checks the same inputs and the
// assertion count is the same from run to run. FLASHGPT2_TEST_SEED=N replaces every seed by N (a replay of one
// printed seed, or a look at other inputs); FLASHGPT2_TEST_SEED=random draws a fresh seed per call.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace flashgpt2::testing {

inline uint64_t test_seed(const char* what, uint64_t fixed) {
    const char* env = std::getenv("FLASHGPT2_TEST_SEED");
    uint64_t seed = fixed;
    if (env && std::string(env) == "random") seed = std::random_device{}();
    else if (env && *env) seed = std::strtoull(env, nullptr, 10);
    std::printf("seed: %s = %llu\n", what, (unsigned long long)seed);
    return seed;
}

}  // namespace flashgpt2::testing
