// Fault injection hooks for the reliability tests (test/reliability/fault.sh and trainer.sh): with the environment
// variable FLASHGPT2_FAULT set, a program fails on purpose at one chosen point, the same point on every run, so a
// test can check what a real failure there would leave behind. Unset (always, outside those tests) every hook
// below is one comparison against a value parsed once.
//
//   FLASHGPT2_FAULT=kill-write:N   SIGKILL in the middle of this process's N-th atomic file write (fileio.h):
//                                  half the bytes are in "<path>.tmp", nothing is renamed
//   FLASHGPT2_FAULT=enospc:N       the N-th atomic write fails half way as on a full disk (errno ENOSPC)
//   FLASHGPT2_FAULT=kill-step:S    SIGKILL in training step S, after the backward pass, before the update
//   FLASHGPT2_FAULT=nan-loss:S     the training loss of step S reads NaN (and likewise nan-norm: the gradient
//   FLASHGPT2_FAULT=nan-val:S      norm, nan-val: the validation loss at step S): the divergence guard's tests
// Steps count from 0 as the trainers' loops do; writes count from 1.
#pragma once
#include <signal.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "llmc/error.h"

namespace flashgpt2 {

struct FaultPlan {
    std::string kind;  // empty: no fault
    long long at = -1;
};

// The plan in FLASHGPT2_FAULT, parsed on first use; a malformed value is an Error, so a typo in a test
// cannot silently turn the fault off.
inline const FaultPlan& fault_plan() {
    static const FaultPlan plan = [] {
        FaultPlan p;
        const char* env = std::getenv("FLASHGPT2_FAULT");
        if (!env || !*env) return p;
        const char* colon = std::strchr(env, ':');
        char* end = nullptr;
        const long long at = colon ? std::strtoll(colon + 1, &end, 10) : -1;
        p.kind.assign(env, colon ? (size_t)(colon - env) : std::strlen(env));
        const bool known = p.kind == "kill-write" || p.kind == "enospc" || p.kind == "kill-step" ||
                           p.kind == "nan-loss" || p.kind == "nan-norm" || p.kind == "nan-val";
        if (!known || !colon || end == colon + 1 || *end != '\0' || at < 0)
            fail("FLASHGPT2_FAULT='%s': expected kill-write:N, enospc:N, kill-step:S, nan-loss:S, nan-norm:S or "
                 "nan-val:S", env);
        p.at = at;
        return p;
    }();
    return plan;
}

inline bool fault_planned(const char* kind, long long at) {
    const FaultPlan& p = fault_plan();
    return p.at == at && p.kind == kind;
}

// kill-step:S: the process dies here, at step S, as if the machine had stopped.
inline void fault_point(int step) {
    if (fault_planned("kill-step", step)) raise(SIGKILL);
}

// nan-loss / nan-norm / nan-val: value, or NaN at the planned step.
inline float fault_value(const char* kind, int step, float value) {
    return fault_planned(kind, step) ? std::nanf("") : value;
}

// Numbers this process's atomic writes 1, 2, 3, ... (fileio.h asks for the next number once per write).
inline long long next_fault_write() {
    static long long n = 0;
    return ++n;
}

}  // namespace flashgpt2
