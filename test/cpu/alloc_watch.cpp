// The replacement operator new and delete behind alloc_watch.h: every request goes to malloc (so AddressSanitizer,
// which intercepts malloc, still checks every block) after its size is noted.
#include "test/cpu/alloc_watch.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {

std::atomic<size_t> largest{0}, limit{0}, refused{0};

void* allocate(size_t n, size_t align) {
    size_t seen = largest.load(std::memory_order_relaxed);
    while (n > seen && !largest.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
    }
    const size_t cap = limit.load(std::memory_order_relaxed);
    if (cap && n > cap) {
        refused.fetch_add(1, std::memory_order_relaxed);
        throw std::bad_alloc();
    }
    if (n == 0) n = 1;
    void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align)
                                                : std::malloc(n);
    if (!p) throw std::bad_alloc();
    return p;
}

}  // namespace

namespace flashgpt2::testing {
void alloc_reset() { largest = 0, refused = 0; }
size_t alloc_largest() { return largest; }
void alloc_limit(size_t bytes) { limit = bytes; }
size_t alloc_refused() { return refused; }
}  // namespace flashgpt2::testing

void* operator new(size_t n) { return allocate(n, 0); }
void* operator new[](size_t n) { return allocate(n, 0); }
void* operator new(size_t n, std::align_val_t a) { return allocate(n, (size_t)a); }
void* operator new[](size_t n, std::align_val_t a) { return allocate(n, (size_t)a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }
