// A training log: one line of plain text per step, easy to grep and plot, shared by both trainers.
//   step 12 train 6.834012 val 6.912345 lr 0.0006 norm 1.2345 ms 35.21 tok/s 465321
// Step numbers count from 0, the updates done before the step (its val loss is measured before it), as llm.c's
// logs count; both trainers' screens show the same step as "13/250", steps done out of the run's, as llm.c's do.
// The val field appears only on steps where the validation loss was computed; a note (e.g. the divergence
// guard's "skipped lossz 5.31", llmc/guard.h) ends the line when there is one; lines starting with '#' are the
// run's header (device, kernels, model, batch), written once at the start. Each line is flushed as it is
// written, so a crashed or killed run keeps its log. A resumed run opens the file in append mode.
#pragma once
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

#include "llmc/error.h"

namespace flashgpt2 {

// "42 s", "3m05s", "1h02m": a step line's elapsed time and ETA.
inline std::string duration_str(double seconds) {
    char b[32];
    const long s = std::lround(std::max(0.0, seconds));
    if (s < 60) snprintf(b, sizeof b, "%ld s", s);
    else if (s < 3600) snprintf(b, sizeof b, "%ldm%02lds", s / 60, s % 60);
    else snprintf(b, sizeof b, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
    return b;
}

struct Logger {
    // An empty path gives a disabled logger (every call does nothing). The parent directory is created.
    explicit Logger(const std::string& path, bool append = false) : path_(path) {
        if (path.empty()) return;
        std::error_code ec;
        const auto parent = std::filesystem::path(path).parent_path();
        if (!parent.empty()) std::filesystem::create_directories(parent, ec);
        f_ = std::fopen(path.c_str(), append ? "a" : "w");
        if (!f_) fail("%s: cannot open log file: %s", path.c_str(), std::strerror(errno));
    }
    ~Logger() {
        if (f_) std::fclose(f_);
    }
    Logger(const Logger&) = delete;
    Logger& operator=(const Logger&) = delete;

    void log_step(int step, float train_loss, std::optional<float> val_loss, float lr, float grad_norm, double ms,
                  double tok_per_s, const std::string& note = "") {
        if (!f_) return;
        std::fprintf(f_, "step %d train %.6f", step, train_loss);
        if (val_loss) std::fprintf(f_, " val %.6f", *val_loss);
        std::fprintf(f_, " lr %.6g norm %.4f ms %.2f tok/s %.0f%s%s\n", lr, grad_norm, ms, tok_per_s,
                     note.empty() ? "" : " ", note.c_str());
        flush();
    }

    // One header line: "# " + text.
    void log_comment(const std::string& text) {
        if (!f_) return;
        std::fprintf(f_, "# %s\n", text.c_str());
        flush();
    }

    // A validation loss measured outside a training step (e.g. before the first one or after the last).
    void log_val(int step, float val_loss) {
        if (!f_) return;
        std::fprintf(f_, "step %d val %.6f\n", step, val_loss);
        flush();
    }

    const std::string& path() const { return path_; }

  private:
    void flush() {
        if (std::fflush(f_) != 0) fail("%s: cannot write log file: %s", path_.c_str(), std::strerror(errno));
    }
    std::string path_;
    std::FILE* f_ = nullptr;
};

}  // namespace flashgpt2
