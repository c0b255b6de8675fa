// Watches what the program allocates through operator new, so a test can check that a reader sized its buffers
// from the bytes it read and not from what a header claims (a 1 KiB file must not cost 4 GB before it is refused).
// alloc_watch.cpp replaces the global operator new and delete (C++ allows one replacement per program); the CPU
// test binary and the fuzzer (test/reliability/fuzz_cpu.cpp) link it.
#pragma once
#include <cstddef>

namespace flashgpt2::testing {

void alloc_reset();             // starts a new measurement
size_t alloc_largest();         // the largest single request since the last reset
void alloc_limit(size_t bytes); // requests above this throw std::bad_alloc instead (0: no limit)
size_t alloc_refused();         // requests refused by the limit since the last reset

}  // namespace flashgpt2::testing
