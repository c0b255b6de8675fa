// `runner bench`'s tables, written once for both ladders: a ladder's rungs on the anchor shapes, each validated
// then timed, as CSV, a markdown table (README and doc/results), a bar chart, and one "Measured" block per rung
// file (its doc page splices it in between its measured markers). The forward and the backward differ only in
// the Pass below: the title, the FLOP count, which of sdpa_bench.py's columns is the anchor, where files go.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dev/attention/attention.cuh"
#include "dev/attention/problem.cuh"
#include "dev/harness.cuh"
#include "llmc/fileio.h"
#include "llmc/peak.h"
#include "llmc/plot.h"

namespace report {

using flashgpt2::dev::Shape;
constexpr double kPeakBf16 = flashgpt2::PEAK_BF16_TFLOPS;  // llmc/peak.h
constexpr double kPeakFp32 = flashgpt2::PEAK_FP32_TFLOPS;

struct Pass {
    const char* title;     // "Attention forward"
    const char* count;     // the FLOP count, as the table states it
    const char* base;      // output files: <out>/<base>.{csv,md,png}
    const char* blocks;    // rung blocks: <out>/<blocks>/<rung file>.md
    bool backward;         // the anchor is sdpa_bench.py's backward column
    double anchor(const flashgpt2::harness::AnchorRow& a) const { return backward ? a.bwd_tflops : a.fwd_tflops; }
    double anchor_ms(const flashgpt2::harness::AnchorRow& a) const { return backward ? a.bwd_ms : a.fwd_ms; }
};
inline const Pass FORWARD{"Attention forward", "4·B·H·T²·D/2", "attention_forward", "rungs", false};
inline const Pass BACKWARD{"Attention backward", "2.5 × 4·B·H·T²·D/2", "attention_backward", "rungs/backward", true};

struct Measured {
    double ms = 0, tflops = 0;
    int reps = 0;
};
struct Cell {            // one rung on one shape
    std::string status;  // "ok", "FAIL", "skip: <why>"
    Measured m;
};

inline std::string fmt_tflops(double x) {
    char b[32];
    snprintf(b, sizeof b, x < 10 ? "%.2f" : x < 100 ? "%.1f" : "%.0f", x);
    return b;
}

template <class R>  // R: Rung or BwdRung (id, file, name, dtype)
std::string label(const R& r) { return std::to_string(r.id) + " " + r.name + " (" + dtype_name(r.dtype) + ")"; }

template <class R>
struct Report {
    const Pass* pass;
    std::string card, date, command;
    std::vector<Shape> shapes;
    std::vector<std::string> coverage;       // per shape: what the oracle checked
    std::vector<const R*> rungs;
    std::vector<std::vector<Cell>> cells;    // [shape][rung]
    std::optional<flashgpt2::harness::Anchors> anchors;
    const flashgpt2::harness::AnchorRow* anchor(size_t si, const char* backend) const {
        const Shape& s = shapes[si];
        return anchors ? anchors->find(s.B, s.NH, s.T, s.HS, backend) : nullptr;
    }
    double anchor_tflops(size_t si, const char* backend) const {  // 0: not measured
        const auto* a = anchor(si, backend);
        return a ? pass->anchor(*a) : 0.0;
    }
};

template <class R>
std::string csv(const Report<R>& rep) {
    std::string out = std::string("# ") + rep.pass->title + ", causal; TFLOP/s by the FlashAttention count " + rep.pass->count + "\n";
    out += "# card: " + rep.card + ", date: " + rep.date + ", command: " + rep.command + "\n";
    if (rep.anchors) out += "# anchors (same GPU session): " + rep.anchors->header + "\n";
    out += "B,H,T,D,rung,file,name,dtype,status,ms,tflops,pct_of_bf16_peak,pct_of_fp32_peak,reps,oracle_checked\n";
    char b[512];
    for (size_t si = 0; si < rep.shapes.size(); si++) {
        const Shape& s = rep.shapes[si];
        std::string cover = rep.coverage[si];
        std::replace(cover.begin(), cover.end(), ',', ';');
        for (size_t ri = 0; ri < rep.rungs.size(); ri++) {
            const R& r = *rep.rungs[ri];
            const Cell& c = rep.cells[si][ri];
            std::string status = c.status;
            std::replace(status.begin(), status.end(), ',', ';');
            char pct32[32] = "";  // % of the fp32 peak: fp32-arithmetic rungs only
            if (c.status == "ok" && r.dtype == DType::F32) snprintf(pct32, sizeof pct32, "%.3f", 100 * c.m.tflops / kPeakFp32);
            if (c.status == "ok")
                snprintf(b, sizeof b, "%d,%d,%d,%d,%d,%s,%s,%s,ok,%.5f,%.3f,%.3f,%s,%d,%s\n", s.B, s.NH, s.T, s.HS, r.id,
                         r.file, r.name, dtype_name(r.dtype), c.m.ms, c.m.tflops, 100 * c.m.tflops / kPeakBf16, pct32,
                         c.m.reps, cover.c_str());
            else
                snprintf(b, sizeof b, "%d,%d,%d,%d,%d,%s,%s,%s,%s,,,,,,%s\n", s.B, s.NH, s.T, s.HS, r.id, r.file, r.name,
                         dtype_name(r.dtype), status.c_str(), cover.c_str());
            out += b;
        }
        for (const char* backend : {"flash", "cudnn"})
            if (const auto* a = rep.anchor(si, backend)) {
                const double tf = rep.pass->anchor(*a);
                snprintf(b, sizeof b, "%d,%d,%d,%d,anchor,sdpa_bench.py,%s,bf16,ok,%.5f,%.3f,%.3f,,,\n", s.B, s.NH, s.T,
                         s.HS, backend, rep.pass->anchor_ms(*a), tf, 100 * tf / kPeakBf16);
                out += b;
            }
    }
    return out;
}

template <class R>
std::string markdown(const Report<R>& rep) {
    std::string out = std::string(rep.pass->title) + ", causal, **TFLOP/s** (FlashAttention count " + rep.pass->count +
                      "; higher is better).  \nCard: " + rep.card + " · " + rep.date + " · `" + rep.command + "`\n\n| rung | dtype |";
    std::string rule = "|---|---|";
    for (const Shape& s : rep.shapes) out += " " + s.str() + " |", rule += "--:|";
    out += "\n" + rule + "\n";
    for (size_t ri = 0; ri < rep.rungs.size(); ri++) {
        const R& r = *rep.rungs[ri];
        out += "| " + std::to_string(r.id) + " " + r.name + " | " + dtype_name(r.dtype) + " |";
        for (size_t si = 0; si < rep.shapes.size(); si++) {
            const Cell& c = rep.cells[si][ri];
            out += " " + (c.status == "ok" ? fmt_tflops(c.m.tflops) : c.status == "FAIL" ? std::string("FAIL") : std::string("skipped")) + " |";
        }
        out += "\n";
    }
    if (rep.anchors) {
        for (auto [backend, name] : {std::pair{"flash", "PyTorch flash (FA2)"}, std::pair{"cudnn", "cuDNN"}}) {
            out += std::string("| ") + name + " | bf16 |";
            for (size_t si = 0; si < rep.shapes.size(); si++) {
                const double a = rep.anchor_tflops(si, backend);
                out += " " + (a > 0 ? fmt_tflops(a) : std::string("not measured")) + " |";
            }
            out += "\n";
        }
        out += "| best rung ÷ cuDNN | |";
        for (size_t si = 0; si < rep.shapes.size(); si++) {
            const double a = rep.anchor_tflops(si, "cudnn");
            int best = -1;
            for (size_t ri = 0; ri < rep.rungs.size(); ri++)
                if (rep.cells[si][ri].status == "ok" && (best < 0 || rep.cells[si][ri].m.tflops > rep.cells[si][best].m.tflops)) best = (int)ri;
            char b[64] = "–";
            if (a > 0 && best >= 0) snprintf(b, sizeof b, "%.2f× (%d)", rep.cells[si][best].m.tflops / a, rep.rungs[best]->id);
            out += std::string(" ") + b + " |";
        }
        out += "\n";
    }
    out += rep.pass->backward
               ? "\nEach rung was validated against the CPU oracle (llmc/ref, double) on the same fresh inputs before timing "
                 "(every rung stores bf16, so all are judged by the bf16 rule: max error ≤ 2× rung 1's + half an ulp, plus "
                 "what a flash rung inherits from the bf16 O), and run twice for the same bits; "
                 "checked per shape:"
               : "\nEach rung was validated against the CPU oracle (llmc/ref, double) on the same fresh inputs before timing "
                 "(fp32: relative error ≤ 1e-5; bf16: max error ≤ 2× the naive bf16 rung's + half an ulp); checked per shape:";
    for (size_t si = 0; si < rep.shapes.size(); si++) out += (si ? ", " : " ") + rep.shapes[si].str() + " " + rep.coverage[si];
    out += ". Timing: CUDA events, median of up to 100 runs, L2 flushed before each. ";
    out += rep.anchors ? "Anchors: `sdpa_bench.py` in the same GPU session (" + rep.anchors->header + ")."
                      : "Anchors: not measured in this run (no `--anchors`).";
    return out + "\n";
}

// One rung file's "Measured" block: every entry of the table from that file, on every anchor shape, beside cuDNN.
template <class R>
std::string rung_block(const Report<R>& rep, const std::string& file) {
    std::string out = "Card: " + rep.card + " · " + rep.date + " · `" + rep.command + "` (run by `make bench-attention`); " +
                      "causal, TFLOP/s by the FlashAttention count " + rep.pass->count + ", validated against the oracle first.\n\n" +
                      "| rung | shape | ms | TFLOP/s | % of peak | ÷ cuDNN (same run) |\n|---|---|--:|--:|--:|--:|\n";
    char b[256];
    for (size_t ri = 0; ri < rep.rungs.size(); ri++) {
        const R& r = *rep.rungs[ri];
        if (file != r.file) continue;
        for (size_t si = 0; si < rep.shapes.size(); si++) {
            const Cell& c = rep.cells[si][ri];
            if (c.status != "ok") {
                snprintf(b, sizeof b, "| %s | %s | %s | | | |\n", label(r).c_str(), rep.shapes[si].str().c_str(), c.status.c_str());
            } else {
                const double peak = r.dtype == DType::F32 ? kPeakFp32 : kPeakBf16, a = rep.anchor_tflops(si, "cudnn");
                char ratio[32] = "–";
                if (a > 0) snprintf(ratio, sizeof ratio, "%.2f×", c.m.tflops / a);
                snprintf(b, sizeof b, "| %s | %s | %.4f | %s | %.1f%% of %.0f (%s) | %s |\n", label(r).c_str(),
                         rep.shapes[si].str().c_str(), c.m.ms, fmt_tflops(c.m.tflops).c_str(), 100 * c.m.tflops / peak,
                         peak, r.dtype == DType::F32 ? "fp32, datasheet" : "bf16, measured", ratio);
            }
            out += b;
        }
    }
    return out;
}

template <class R>
void chart(const Report<R>& rep, const std::string& path) {
    flashgpt2::plot::BarChart c;
    c.title = std::string(rep.pass->title) + ", causal: TFLOP/s (log scale)";
    c.subtitle = rep.card + " - " + rep.date;
    c.footnote = rep.command;
    for (const Shape& s : rep.shapes) c.groups.push_back(s.str());
    for (size_t ri = 0; ri < rep.rungs.size(); ri++) {
        c.series.push_back(std::to_string(rep.rungs[ri]->id) + " " + rep.rungs[ri]->name + " " + dtype_name(rep.rungs[ri]->dtype));
        c.values.emplace_back();
        for (size_t si = 0; si < rep.shapes.size(); si++)
            c.values.back().push_back(rep.cells[si][ri].status == "ok" ? rep.cells[si][ri].m.tflops : NAN);
    }
    if (rep.anchors)
        for (auto [backend, name] : {std::pair{"flash", "PyTorch FA2"}, std::pair{"cudnn", "cuDNN"}}) {
            c.series.push_back(name);
            c.values.emplace_back();
            for (size_t si = 0; si < rep.shapes.size(); si++) {
                const double a = rep.anchor_tflops(si, backend);
                c.values.back().push_back(a > 0 ? a : NAN);
            }
        }
    flashgpt2::plot::write_bar_chart_png(path, c);
}

// Writes <out>/<base>.{csv,md,png} and one block per rung file under <out>/<blocks>/.
template <class R>
void write_all(const Report<R>& rep, const std::string& out_dir) {
    const std::string base = out_dir + "/" + rep.pass->base, blocks = out_dir + "/" + rep.pass->blocks;
    flashgpt2::write_file_atomic(base + ".csv", csv(rep));
    flashgpt2::write_file_atomic(base + ".md", markdown(rep));
    chart(rep, base + ".png");
    std::error_code ec;
    std::filesystem::create_directories(blocks, ec);
    if (ec) flashgpt2::fail("%s: cannot create the directory", blocks.c_str());
    std::vector<std::string> files;
    for (const R* r : rep.rungs)
        if (std::find(files.begin(), files.end(), std::string(r->file)) == files.end()) files.push_back(r->file);
    for (const std::string& f : files)
        flashgpt2::write_file_atomic(blocks + "/" + f.substr(0, f.rfind('.')) + ".md", rung_block(rep, f));
    printf("wrote %s.csv, %s.md, %s.png and %zu rung blocks in %s/\n", base.c_str(), base.c_str(), base.c_str(),
           files.size(), blocks.c_str());
}

}  // namespace report
