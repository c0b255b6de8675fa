// The block dispatcher as a model: what the order of a causal grid costs at the end of a kernel, computed
// without a GPU. `./dev/attention/runner schedule [B NH T HS] [--sms N] [--out DIR]`; without a shape, the
// anchor shapes: `make schedule-model` writes the tables into backward rung 9's page (the two grid orders)
// and rung 6's (its persistent grid's item order), beside their measurements.
//
// The model. An SM holds `per_sm` blocks of the kernel at once (its places; the kernel's __launch_bounds__).
// A block that visits w tiles takes w + 1 steps (the one more: its first loads and its stores). Every place
// runs at the same speed whatever else is on its SM, and the dispatcher gives the blocks, in index order, each
// to the place that frees first. So the model sees only the order and the weights. It overstates the tail: a
// block left alone on an SM really runs faster than one of three, which it does not know.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <queue>
#include <string>
#include <vector>

#include "dev/attention/problem.cuh"
#include "llmc/attention/schedule.h"
#include "llmc/attention/wgmma_backward.cuh"
#include "llmc/fileio.h"
#include "llmc/profile.h"  // utc_timestamp

namespace schedule_model {

using flashgpt2::fail;
using flashgpt2::dev::kAnchorShapes;
using flashgpt2::dev::Shape;

// Steps until the last of `weights` (block steps, in dispatch order) ends on `places` places.
inline double makespan(const std::vector<double>& weights, int places) {
    std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;  // when each place frees
    for (int p = 0; p < places; p++) free_at.push(0.0);
    double end = 0.0;
    for (double w : weights) {
        const double t = free_at.top() + w;
        free_at.pop();
        free_at.push(t);
        end = std::max(end, t);
    }
    return end;
}

// The block weights of one of the wgmma backward's kernels (n tiles of 64 per head; rank 0, the heaviest,
// visits all n tiles of the other side) in rung 5's order and in rung 9's.
struct Orders {
    std::vector<double> head_major, heaviest_first;
};
inline Orders orders(int BH, int n, int T, int HS) {
    Orders o;
    for (int bh = 0; bh < BH; bh++)  // grid (n, B·NH): blockIdx.x fastest, rank = blockIdx.x
        for (int rank = 0; rank < n; rank++) o.head_major.push_back(n - rank + 1);
    const int sh = flashgpt2::balanced_section_heads(BH, flashgpt2::l2_section_heads(T, HS));
    for (int item = 0; item < BH * n; item++)
        o.heaviest_first.push_back(n - flashgpt2::heaviest_first(item, n, BH, sh).rank + 1);
    return o;
}

// Rung 6's persistent grid: G blocks (one per SM) run their items back to back. An item is a key tile of 128 keys
// of one head, weighing the 64-query tiles that see it + 1, listed heaviest first (schedule.h, sections of
// l2_section_heads). Round robin (rung 6's first version): block b takes items b, b + G, b + 2G, ...; a counter
// (rung 6 now, as the forward's scheduler): the block that frees first takes the next item. Each as a multiple of an even share.
struct Persistent {
    int items, blocks;
    double round_robin, counter;
};
inline Persistent persistent(const Shape& s, int sms) {
    const int BH = s.B * s.NH, n_kt = ceil_div(s.T, 128), total = BH * n_kt, G = std::min(total, sms);
    const int sh = flashgpt2::l2_section_heads(s.T, s.HS);
    std::vector<double> w(total), load(G, 0.0);
    double sum = 0.0;
    for (int it = 0; it < total; it++) {
        w[it] = ceil_div(s.T - 128 * flashgpt2::heaviest_first(it, n_kt, BH, sh).rank, 64) + 1;
        sum += w[it];
        load[it % G] += w[it];
    }
    const double even = sum / G;
    return {total, G, *std::max_element(load.begin(), load.end()) / even, makespan(w, G) / even};
}

inline int cmd_schedule(int argc, char** argv) {  // argv[0] = "schedule"
    const char* usage = "usage: runner schedule [B NH T HS] [--sms N] [--out DIR]";
    int sms = 132;  // an H100 / H200 SXM
    std::string out_dir;
    std::vector<int> pos;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sms") && i + 1 < argc) sms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_dir = argv[++i];
        else if (argv[i][0] != '-' && pos.size() < 4) pos.push_back(atoi(argv[i]));
        else fail("%s", usage);
    }
    if (sms < 1 || sms > 4096) fail("--sms %d: expected 1 to 4096", sms);
    if (!pos.empty() && pos.size() != 4) fail("%s (a shape is four numbers)", usage);
    std::vector<Shape> shapes(std::begin(kAnchorShapes), std::end(kAnchorShapes));
    if (!pos.empty()) {
        shapes = {Shape{pos[0], pos[1], pos[2], pos[3]}};
        const Shape& s = shapes[0];
        if (s.B < 1 || s.NH < 1 || s.T < 1 || (s.HS != 64 && s.HS != 128) || (long long)s.B * s.NH * s.T > (1LL << 28))
            fail("schedule %s: expects B, NH, T >= 1 (B·NH·T at most 2^28) and HS 64 or 128", s.str().c_str());
    }
    std::string md = "Backward grid order, **modelled**, not measured (`dev/attention/schedule_model.h`: every place the "
                     "same speed, blocks handed out in index order): the last block's end, as a multiple of an even "
                     "share of the steps; " + std::to_string(sms) + " SMs.  \nWritten " + flashgpt2::utc_timestamp() +
                     " by `./dev/attention/runner schedule` (make schedule-model).\n\n"
                     "| shape | kernel | blocks | places | rung 5, head by head | rung 9, heaviest first |\n"
                     "|---|---|--:|--:|--:|--:|\n";
    for (const Shape& s : shapes) {
        const int BH = s.B * s.NH, n = ceil_div(s.T, 64);
        const Orders o = orders(BH, n, s.T, s.HS);
        double total = 0.0;
        for (double w : o.head_major) total += w;
        for (int k = 0; k < 2; k++) {  // the same weights; only the places differ
            const int per_sm = k == 0 ? flashgpt2::fbh_dq_blocks_per_sm(s.HS) : flashgpt2::fbh_dkdv_blocks_per_sm(s.HS);
            const int places = per_sm * sms;
            const double even = total / places;
            char row[256];
            snprintf(row, sizeof row, "| %s | %s | %d | %d | %.3f× | %.3f× |\n", s.str().c_str(), k == 0 ? "dQ" : "dK/dV",
                     BH * n, places, makespan(o.head_major, places) / even, makespan(o.heaviest_first, places) / even);
            md += row;
        }
    }
    std::string md6 = "Rung 6's persistent grid, **modelled**, not measured (`dev/attention/schedule_model.h`: each block "
                      "runs its items back to back at the same speed): the last block's end, as a multiple of an even "
                      "share; " + std::to_string(sms) + " SMs.  \nWritten " + flashgpt2::utc_timestamp() +
                      " by `./dev/attention/runner schedule` (make schedule-model).\n\n"
                      "| shape | items | blocks | round robin (rung 6's first version) | from a counter (rung 6) |\n|---|--:|--:|--:|--:|\n";
    for (const Shape& s : shapes) {
        const Persistent r = persistent(s, sms);
        char row[256];
        snprintf(row, sizeof row, "| %s | %d | %d | %.3f× | %.3f× |\n", s.str().c_str(), r.items, r.blocks,
                 r.round_robin, r.counter);
        md6 += row;
    }
    printf("%s\n%s", md.c_str(), md6.c_str());
    if (!out_dir.empty()) {
        flashgpt2::make_directories(out_dir, "--out");
        flashgpt2::write_file_atomic(out_dir + "/schedule_model.md", md);
        flashgpt2::write_file_atomic(out_dir + "/schedule_model_persistent.md", md6);
        printf("wrote %s/schedule_model.md and %s/schedule_model_persistent.md\n", out_dir.c_str(), out_dir.c_str());
    }
    return 0;
}

}  // namespace schedule_model
