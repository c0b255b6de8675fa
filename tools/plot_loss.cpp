// plot_loss: loss curves from training logs, one PNG (`make plots`), drawn by llmc/plot.h.
//
//   build/plot_loss [--labels naive,flash] [--title TEXT] -o doc/results/loss.png a/main.log b/main.log ...
//
// Reads the step lines both trainers write (llmc/log_reader.h's read_log: "step 12 train 6.83 val 6.91 lr ...", a
// resumed run's repeated steps replaced) and overlays every log's curves: its train loss as a thin light line, its
// validation loss as a thicker line of the same colour with a dot per evaluation.
// Labels default to each log's folder name (log/naive/main.log -> "naive"), or its path when folders repeat.
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/args.h"
#include "llmc/error.h"
#include "llmc/log_reader.h"
#include "llmc/plot.h"

using namespace flashgpt2;

namespace {

const char* USAGE = R"(usage: plot_loss [--labels A,B,...] [--title TEXT] -o OUT.png LOG...
  LOG           a training log (main.log of the GPU trainer, log/train_cpu.log of the CPU trainer)
  -o OUT.png    the picture to write (its folder is created)
  --labels L    comma-separated names for the logs, in order   [each log's folder name]
  --title TEXT  the chart's title                              [Loss]
)";

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
            const LogCurves c = read_log(logs[i]);
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
