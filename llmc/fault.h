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
//   FLASHGPT2_FAULT=spike-loss:S   the training loss of step S reads 10 times its value (the loss-spike guard's)
// Several plans can be given at once, comma-separated. Steps count from 0 as the trainers' loops do; writes
// count from 1.
#pragma once
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/error.h"

namespace flashgpt2 {

struct FaultPlan {
    std::string kind;
    long long at = -1;
};

// The plans in FLASHGPT2_FAULT (comma-separated, e.g. "spike-loss:67,kill-step:30"), parsed on first use; a
// malformed value is an Error, so a typo in a test cannot silently turn the fault off.
inline const std::vector<FaultPlan>& fault_plans() {
    static const std::vector<FaultPlan> plans = [] {
        std::vector<FaultPlan> out;
        const char* env = std::getenv("FLASHGPT2_FAULT");
        const std::string all = env ? env : "";
        for (size_t pos = 0; pos < all.size();) {
            const size_t comma = std::min(all.find(',', pos), all.size());
            const std::string item = all.substr(pos, comma - pos);
            pos = comma + 1;
            const size_t colon = item.find(':');
            FaultPlan p;
            p.kind = item.substr(0, colon);
            char* end = nullptr;
            const std::string number = colon == std::string::npos ? "" : item.substr(colon + 1);
            p.at = std::strtoll(number.c_str(), &end, 10);
            const bool known = p.kind == "kill-write" || p.kind == "enospc" || p.kind == "kill-step" ||
                               p.kind == "nan-loss" || p.kind == "nan-norm" || p.kind == "nan-val" ||
                               p.kind == "spike-loss";
            if (!known || number.empty() || *end != '\0' || p.at < 0)
                fail("FLASHGPT2_FAULT='%s': expected kill-write:N, enospc:N, kill-step:S, nan-loss:S, nan-norm:S, "
                     "nan-val:S or spike-loss:S, comma-separated", all.c_str());
            out.push_back(p);
        }
        return out;
    }();
    return plans;
}

inline bool fault_planned(const char* kind, long long at) {
    for (const FaultPlan& p : fault_plans())
        if (p.at == at && p.kind == kind) return true;
    return false;
}

// kill-step:S: the process dies here, at step S, as if the machine had stopped.
inline void fault_point(int step) {
    if (fault_planned("kill-step", step)) raise(SIGKILL);
}

// nan-loss / nan-norm / nan-val: value, or NaN at the planned step; spike-loss: 10 x value there.
inline float fault_value(const char* kind, int step, float value) {
    if (!fault_planned(kind, step)) return value;
    return std::strcmp(kind, "spike-loss") == 0 ? 10.0f * value : std::nanf("");
}

// Numbers this process's atomic writes 1, 2, 3, ... (fileio.h asks for the next number once per write).
inline long long next_fault_write() {
    static long long n = 0;
    return ++n;
}

}  // namespace flashgpt2
