// Reading a training log back: the losses of the step lines llmc/logger.h writes
//   step 12 train 6.834012 val 6.912345 lr 0.0006 norm 1.2345 ms 35.21 tok/s 465321
// as (step, value) pairs, for tools/plot_loss.cpp. Lines that are not step lines ('#' header lines, blank lines)
// are passed over; a step line that does not parse is an Error naming the file and the line.
// A resumed run appends to its log and repeats the steps after its checkpoint: a step at or before one already
// read replaces the points from there on, so the curves are the run as it finally went.
#pragma once
#include <sstream>
#include <string>
#include <vector>

#include "llmc/args.h"
#include "llmc/error.h"
#include "llmc/fileio.h"

namespace flashgpt2 {

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
