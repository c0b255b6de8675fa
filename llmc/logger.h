// A training log: one line of plain text per step, easy to grep and plot, shared by both trainers.
//   step 12 train 6.834012 val 6.912345 lr 0.0006 norm 1.2345 ms 35.21 tok/s 465321
// The val field appears only on steps where the validation loss was computed. Each line is flushed as it
// is written, so a crashed or killed run keeps its log. A resumed run opens the file in append mode.
// read_log() reads the losses back (tools/plot_loss.cpp draws them).
#pragma once
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/args.h"
#include "llmc/error.h"
#include "llmc/fileio.h"

namespace flashgpt2 {

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
                  double tok_per_s) {
        if (!f_) return;
        std::fprintf(f_, "step %d train %.6f", step, train_loss);
        if (val_loss) std::fprintf(f_, " val %.6f", *val_loss);
        std::fprintf(f_, " lr %.6g norm %.4f ms %.2f tok/s %.0f\n", lr, grad_norm, ms, tok_per_s);
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

// The losses of a log, as (step, value) pairs in step order. Lines that are not step lines ('#' comments, blank
// lines) are passed over. A resumed run repeats the steps after its checkpoint: a step at or before one already
// read replaces the points from there on, so the curves are the run as it finally went.
struct LogCurves {
    std::vector<double> train_step, train, val_step, val;
};

inline LogCurves read_log(const std::string& path) {
    auto add = [](std::vector<double>& steps, std::vector<double>& values, double step, double v) {
        while (!steps.empty() && steps.back() >= step) steps.pop_back(), values.pop_back();
        steps.push_back(step), values.push_back(v);
    };
    std::istringstream lines(read_file(path));
    LogCurves c;
    std::string line;
    for (int n = 1; std::getline(lines, line); n++) {
        std::istringstream words(line);
        std::string w, step_text;
        if (!(words >> w) || w != "step") continue;
        const std::string where = path + ":" + std::to_string(n);
        if (!(words >> step_text)) fail("%s: a step line without its step number", where.c_str());
        const double step = (double)args::parse_int(where + " step", step_text, 0, 1LL << 40);
        for (std::string key, value; words >> key;) {
            if (!(words >> value)) fail("%s: '%s' without its value", where.c_str(), key.c_str());
            if (key == "train") add(c.train_step, c.train, step, args::parse_float(where + " train", value, -1e30, 1e30));
            if (key == "val") add(c.val_step, c.val, step, args::parse_float(where + " val", value, -1e30, 1e30));
        }
    }
    if (c.train.empty() && c.val.empty())
        fail("%s: no step lines with a train or val loss: not a training log (llmc/logger.h's format)", path.c_str());
    return c;
}

}  // namespace flashgpt2
