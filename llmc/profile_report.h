// The `--compare` report (make compare): two kernel sets' profiles of the same short run, side by side, as the
// markdown table README and doc/results/compare.md show. The runs themselves are train_gpt2.cu's; this file only
// renders what LayerProfiler (llmc/profile.h) measured.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/kernels.h"
#include "llmc/layer.h"
#include "llmc/memory.cuh"  // gib
#include "llmc/profile.h"

namespace flashgpt2 {

// One kernel set's run: per-layer ms per step, whole-step figures, memory, losses, and what ran for attention.
struct SetProfile {
    KernelSet ks;
    std::string attention;  // attention_kernels_str(): "naive" or "flash (forward wgmma, backward wgmma)"
    double fwd_ms[NUM_LAYERS] = {}, bwd_ms[NUM_LAYERS] = {};  // per step
    double step_ms = 0.0, tok_per_s = 0.0;
    size_t peak_memory = 0, planned = 0;
    std::vector<float> losses;
};

// The facts of the run the table states.
struct CompareRun {
    std::string card, date, precision, model;
    int B = 0, T = 0, timed_steps = 0, profiled_steps = 0;
    unsigned long long seed = 0;
};

// "12.34" or, for a layer with no op of its own in this set, what happened to it.
inline std::string compare_ms_cell(double ms, Layer layer, Pass pass, const KernelSet& ks) {
    char s[48];
    if (ms > 0.0) snprintf(s, sizeof s, "%.3f", ms);
    else if (layer == Layer::residual && pass == Pass::forward && ks.flash(Layer::layernorm)) snprintf(s, sizeof s, "in layernorm");
    else if (layer == Layer::gelu && ks.flash(Layer::matmul)) snprintf(s, sizeof s, "in matmul");
    else snprintf(s, sizeof s, "-");
    return s;
}
inline std::string compare_ratio_cell(double naive, double flash) {
    char s[32];
    if (naive > 0.0 && flash > 0.0) snprintf(s, sizeof s, "%.1fx", naive / flash);
    else snprintf(s, sizeof s, "-");
    return s;
}

inline std::string compare_report_md(const CompareRun& run, const SetProfile& naive, const SetProfile& flash) {
    std::string md;
    auto line = [&md](const char* fmt, ...) {
        char buf[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        md += buf;
    };
    line("**naive vs flash kernels: one training step of %s**\n\n", run.model.c_str());
    line("%s, %s, %s build, B=%d T=%d (%d tokens per step), seed %llu. Attention: naive set %s; flash set %s. "
         "Per-layer ms per step: CUDA events around every op, mean of %d profiled steps. Step ms: wall clock, mean of "
         "%d unprofiled steps after a warm-up step. Command: `make compare` (train_gpt2cu --compare).\n\n",
         run.card.c_str(), run.date.c_str(), run.precision.c_str(), run.B, run.T, run.B * run.T, run.seed,
         naive.attention.c_str(), flash.attention.c_str(), run.profiled_steps, run.timed_steps);
    line("| layer | naive fwd ms | flash fwd ms | ratio | naive bwd ms | flash bwd ms | ratio |\n");
    line("|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < NUM_LAYERS; i++) {
        const Layer l = layer_at(i);
        line("| %s | %s | %s | %s | %s | %s | %s |\n", LAYER_NAMES[i],
             compare_ms_cell(naive.fwd_ms[i], l, Pass::forward, naive.ks).c_str(),
             compare_ms_cell(flash.fwd_ms[i], l, Pass::forward, flash.ks).c_str(),
             compare_ratio_cell(naive.fwd_ms[i], flash.fwd_ms[i]).c_str(),
             compare_ms_cell(naive.bwd_ms[i], l, Pass::backward, naive.ks).c_str(),
             compare_ms_cell(flash.bwd_ms[i], l, Pass::backward, flash.ks).c_str(),
             compare_ratio_cell(naive.bwd_ms[i], flash.bwd_ms[i]).c_str());
    }
    line("\n| whole step | naive | flash | ratio |\n|---|---:|---:|---:|\n");
    line("| step ms | %.2f | %.2f | %.1fx |\n", naive.step_ms, flash.step_ms, naive.step_ms / flash.step_ms);
    line("| tok/s | %.0f | %.0f | %.1fx |\n", naive.tok_per_s, flash.tok_per_s, flash.tok_per_s / naive.tok_per_s);
    line("| peak GPU memory GiB (device-wide) | %.2f | %.2f | %.1fx |\n", gib(naive.peak_memory), gib(flash.peak_memory),
         (double)naive.peak_memory / flash.peak_memory);
    line("| planned by the trainer GiB | %.2f | %.2f | %.1fx |\n", gib(naive.planned), gib(flash.planned),
         (double)naive.planned / flash.planned);
    line("\nNotes: the classifier row is softmax + loss + dlogits, done in the forward pass by both sets. The adamw row is "
         "the optimizer step (grad norm + update). \"in layernorm\" / \"in matmul\": the flash set fuses the residual "
         "add into the layernorm kernel and the GELU into the matmul epilogue, so they have no time of their own.\n\n");
    line("Train loss per step (same seed, same data): naive");
    for (float v : naive.losses) line(" %.4f", v);
    line("; flash");
    for (float v : flash.losses) line(" %.4f", v);
    line("\n");
    return md;
}

// One kernel set's profile (`--profile-steps N`): per layer, ms per step forward and backward, and each layer's share
// of the time the ops took. What a long-context run uses to show how a step splits between attention and the rest.
inline std::string profile_report_md(const CompareRun& run, const SetProfile& set) {
    std::string md;
    char b[512];
    snprintf(b, sizeof b, "**one training step of %s, by layer**\n\n%s, %s, %s build, B=%d T=%d (%d tokens per step), kernels %s, "
             "attention %s. CUDA events around every op, mean of the last %d steps (`--profile-steps %d`).\n\n",
             run.model.c_str(), run.card.c_str(), run.date.c_str(), run.precision.c_str(), run.B, run.T, run.B * run.T,
             set.ks.str().c_str(), set.attention.c_str(), run.profiled_steps, run.profiled_steps);
    md += b;
    md += "| layer | fwd ms | bwd ms | fwd + bwd ms | share |\n|---|---:|---:|---:|---:|\n";
    double total = 0;
    for (int i = 0; i < NUM_LAYERS; i++) total += set.fwd_ms[i] + set.bwd_ms[i];
    for (int i = 0; i < NUM_LAYERS; i++) {
        const double t = set.fwd_ms[i] + set.bwd_ms[i];
        if (t <= 0) continue;
        snprintf(b, sizeof b, "| %s | %.3f | %.3f | %.3f | %.1f%% |\n", LAYER_NAMES[i], set.fwd_ms[i], set.bwd_ms[i], t,
                 100.0 * t / total);
        md += b;
    }
    snprintf(b, sizeof b, "| all ops | | | %.3f | 100%% |\n", total);
    return md + b;
}

}  // namespace flashgpt2
