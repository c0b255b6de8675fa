// plot_loss: loss curves from training logs, one PNG (`make plots`), drawn by llmc/plot.h.
//
//   build/plot_loss [--labels naive,flash] [--title TEXT] -o doc/results/loss.png a/main.log b/main.log ...
//
// Reads the step lines both trainers write (llmc/logger.h: "step 12 train 6.83 val 6.91 lr ..."; other lines,
// such as '#' comments, are not data and are passed over) and overlays every log's curves: its train loss as a
// thin light line, its validation loss as a thicker line of the same colour with a dot per evaluation. A resumed
// run appends to its log and repeats the steps after its checkpoint; a step at or before one already read
// replaces the points from there on, so the curve shows the run as it finally went.
// Labels default to each log's folder name (log/naive/main.log -> "naive"), or its path when folders repeat.
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/args.h"
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/plot.h"

using namespace flashgpt2;

namespace {

const char* USAGE = R"(usage: plot_loss [--labels A,B,...] [--title TEXT] -o OUT.png LOG...
  LOG           a training log (main.log of the GPU trainer, log/train_cpu.log of the CPU trainer)
  -o OUT.png    the picture to write (its folder is created)
  --labels L    comma-separated names for the logs, in order   [each log's folder name]
  --title TEXT  the chart's title                              [Loss]
)";

struct Curve {
    std::vector<double> train_step, train, val_step, val;
};

// Appends (step, v), first dropping the points a resumed run repeats (those at step or later).
void add_point(std::vector<double>& steps, std::vector<double>& values, double step, double v) {
    while (!steps.empty() && steps.back() >= step) steps.pop_back(), values.pop_back();
    steps.push_back(step), values.push_back(v);
}

Curve read_log(const std::string& path) {
    std::istringstream lines(read_file(path));
    Curve c;
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
            if (key == "train") add_point(c.train_step, c.train, step, args::parse_float(where + " train", value, -1e30, 1e30));
            if (key == "val") add_point(c.val_step, c.val, step, args::parse_float(where + " val", value, -1e30, 1e30));
        }
    }
    if (c.train.empty() && c.val.empty())
        fail("%s: no step lines with a train or val loss: not a training log (llmc/logger.h's format)", path.c_str());
    return c;
}

std::vector<std::string> split_commas(const std::string& s) {
    std::vector<std::string> out;
    std::istringstream in(s);
    for (std::string part; std::getline(in, part, ',');) out.push_back(part);
    return out;
}

std::vector<std::string> default_labels(const std::vector<std::string>& logs) {
    std::vector<std::string> labels;
    for (const std::string& l : logs) labels.push_back(std::filesystem::path(l).parent_path().filename().string());
    const std::set<std::string> distinct(labels.begin(), labels.end());
    if (distinct.size() != labels.size() || distinct.count("")) return logs;
    return labels;
}

}  // namespace

int main(int argc, char** argv) {
    return run_main([&] {
        std::string out, labels_arg, title = "Loss";
        args::Flags f;
        f.value("-o", [&](const std::string& v) { out = v; });
        f.value("--labels", [&](const std::string& v) { labels_arg = v; });
        f.value("--title", [&](const std::string& v) { title = v; });
        if (!f.parse(argc, argv)) {
            fputs(USAGE, stdout);
            return 0;
        }
        const std::vector<std::string>& logs = f.positional;
        if (out.empty() || logs.empty()) fail("give -o OUT.png and at least one log (see --help)");
        const std::vector<std::string> labels = labels_arg.empty() ? default_labels(logs) : split_commas(labels_arg);
        if (labels.size() != logs.size())
            fail("--labels: %zu labels for %zu logs (one each, comma-separated)", labels.size(), logs.size());

        plot::LineChart chart;
        chart.title = title;
        chart.subtitle = "train: thin line, val: thick line with dots";
        chart.x_label = "step";
        chart.y_label = "loss";
        for (size_t i = 0; i < logs.size(); i++) {
            const Curve c = read_log(logs[i]);
            const plot::Rgb color = plot::palette(i);
            if (!c.train.empty()) chart.series.push_back({labels[i] + " train", c.train_step, c.train, plot::lighter(color, 0.45), 2, false});
            if (!c.val.empty()) chart.series.push_back({labels[i] + " val", c.val_step, c.val, color, 3, true});
        }
        const auto parent = std::filesystem::path(out).parent_path();
        std::error_code ec;
        if (!parent.empty()) std::filesystem::create_directories(parent, ec);
        plot::write_line_chart_png(out, chart);
        printf("%s: %zu log%s\n", out.c_str(), logs.size(), logs.size() == 1 ? "" : "s");
        return 0;
    });
}
