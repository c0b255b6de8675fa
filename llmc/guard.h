// The divergence guard, shared by both trainers: what a run does when training goes wrong.
//
// 1. Non-finite values stop the run BEFORE the update. A NaN or an infinity in the training loss, the gradient
//    norm or the validation loss means the step's gradients (or the weights) are garbage; applying them would
//    write NaN into AdamW's moments and every weight, and the next checkpoint would save that. So the trainer
//    checks each quantity as soon as it is known and throws one Error naming the step and the quantity: nothing
//    is applied, no checkpoint is written after it, and the newest complete checkpoint stays the last good state.
//    (Clipping does not catch it: `norm > clip` is false when norm is NaN, so the scale stays 1.)
// 2. An optional loss-spike guard (--spike-z Z): the loss's z-score against the last WINDOW steps' losses,
//    z = (loss - mean) / std. Above Z the update is skipped (the batch is consumed, the weights and the optimizer
//    state do not move) and the step line and the log say so. This is llm.c's outlier detector
//    (llmc/outlier_detector.h, its -sl flag: window 64, a skipped value does not join the window so the guard does
//    not grow lenient, except on the third skip in a row, which joins it so that a real level shift is accepted);
//    here z is measured against the window before the new loss joins it, and its state goes into every
//    checkpoint (llmc/checkpoint.h), so a resumed run makes the same decisions as one that never stopped.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

#include "llmc/error.h"

namespace flashgpt2 {

// The guard's memory: what a checkpoint stores so that a resume continues with the same window.
struct GuardState {
    static constexpr int WINDOW = 64;
    int count = 0;             // losses in the window (at most WINDOW), oldest first
    int skipped_in_a_row = 0;  // updates skipped since the last accepted one
    std::array<float, WINDOW> losses{};
};

// Throws "step S: the <quantity> is nan: ..." unless x is finite. Call it before the value is used.
inline void require_finite(int step, const char* quantity, double x) {
    if (std::isfinite(x)) return;
    fail("step %d: the %s is %s: the run diverged; stopped before the update (nothing was applied, the newest "
         "checkpoint is the last good state: resume from it with a lower -l, or start again)",
         step, quantity, std::isnan(x) ? "NaN" : (x > 0 ? "+inf" : "-inf"));
}

struct SpikeVerdict {
    double z = NAN;     // the loss's z-score against the window; NaN until the window is full
    bool skip = false;  // true: do not apply this step's update
};

class SpikeGuard {
public:
    GuardState state;

    // z_max <= 0: the guard only measures (never skips).
    explicit SpikeGuard(float z_max = 0.0f) : z_max_(z_max) {}

    // Judges a finite loss and updates the window.
    SpikeVerdict check(float loss) {
        SpikeVerdict v;
        GuardState& s = state;
        if (s.count == GuardState::WINDOW) {
            double mean = 0.0, var = 0.0;
            for (float x : s.losses) mean += x;
            mean /= GuardState::WINDOW;
            for (float x : s.losses) var += (x - mean) * (x - mean);
            const double sd = std::sqrt(var / GuardState::WINDOW);
            v.z = sd > 0.0 ? (loss - mean) / sd : 0.0;
            v.skip = z_max_ > 0.0f && v.z > z_max_;
        }
        s.skipped_in_a_row = v.skip ? s.skipped_in_a_row + 1 : 0;
        if (!v.skip || s.skipped_in_a_row >= 3) push(loss);
        return v;
    }

private:
    float z_max_;

    void push(float loss) {
        GuardState& s = state;
        if (s.count == GuardState::WINDOW) {  // drop the oldest
            for (int i = 1; i < GuardState::WINDOW; i++) s.losses[i - 1] = s.losses[i];
            s.count--;
        }
        s.losses[s.count++] = loss;
    }
};

}  // namespace flashgpt2
