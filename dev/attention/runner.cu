// dev/attention/runner: the attention ladders, forward and backward, one table each. Every rung is first validated against
// the CPU oracle (llmc/ref/attention.h, run in double; where a whole head is too long for it, llmc/ref/
// attention_sampled.h at sampled rows) on fresh random inputs, outputs poisoned with NaN,
// and only then timed (dev/harness.cuh). `bench` runs a whole ladder on the anchor shapes and writes the
// CSV, markdown table and bar chart that README.md and doc/ show (dev/attention/report.cuh). The backward
// ladder has its own table, RUNGS_BWD, beside the forward's.
//   ./dev/attention/runner --list
//   ./dev/attention/runner fwd V [B NH T HS] [--seed S]    (no shape: edge shapes T = 1, 2, 17, 65, 257, 1000
//                                                          at HS 64 and 128, then (8,12,1024,64), timed)
//   ./dev/attention/runner bench [--pass fwd|bwd] [--anchors FILE] [--out DIR] [--rungs 1,4,7] [--seed S]
//   ./dev/attention/runner bwd V|all [B NH T HS] [--seed S]   (the backward ladder: RUNGS_BWD below, validated
//                                                          and timed by dev/attention/backward/runner_bwd.cuh)
//   ./dev/attention/runner schedule [B NH T HS] [--sms N] [--out DIR]   (no GPU: the backward's grid orders in
//                                                          a model, dev/attention/schedule_model.h)
#define EIGEN_NO_CUDA  // the oracle is host code: keep Eigen's own CUDA support out of this .cu file
#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include "dev/attention/attention.cuh"
#include "dev/attention/backward/runner_bwd.cuh"  // `runner bwd`: the backwards, validated and timed the same way
#include "dev/attention/problem.cuh"
#include "dev/attention/report.cuh"
#include "dev/attention/schedule_model.h"  // `runner schedule`: the grid-order model (no GPU)
#include "dev/harness.cuh"
#include "llmc/args.h"
#include "llmc/profile.h"  // utc_timestamp
#include "llmc/ref/attention.h"

#include "dev/attention/forward/1_naive.cuh"
#include "dev/attention/forward/2_online_softmax.cuh"
#include "dev/attention/forward/3_flash1_tiled.cuh"
#include "dev/attention/forward/4_flash2.cuh"
#include "dev/attention/forward/5_tensor_cores.cuh"
#include "dev/attention/forward/6_pipelined.cuh"
#include "dev/attention/forward/7_hopper_wgmma.cuh"
#include "dev/attention/forward/8_pingpong.cuh"

#include "dev/attention/backward/1_naive.cuh"
#include "dev/attention/backward/2_flash1_recompute.cuh"
#include "dev/attention/backward/3_flash2.cuh"
#include "dev/attention/backward/4_tensor_cores.cuh"
#include "dev/attention/backward/5_hopper_wgmma.cuh"
#include "dev/attention/backward/6_warp_specialized.cuh"
#include "dev/attention/backward/7_fused_dq.cuh"
#include "dev/attention/backward/8_cluster_dq.cuh"
#include "dev/attention/backward/9_heaviest_first.cuh"
#include "dev/attention/backward/10_fixed_point_dq.cuh"
#include "dev/attention/backward/11_dq_warpgroup.cuh"
#include "dev/attention/backward/12_dq_warp_specialized.cuh"

// ONE table: every rung of the ladder. `fwd V` runs every entry with id V (rung 1 comes in fp32 and bf16:
// the bf16 one is the "naive in the same precision" that the bf16 rungs' errors are judged against).
const Rung RUNGS[] = {
    {1, "1_naive.cuh", "naive", DType::F32, ladder::r1::supports, ladder::r1::workspace_bytes<float>,
     attention_forward_naive},
    {1, "1_naive.cuh", "naive_bf16", DType::BF16, ladder::r1::supports, ladder::r1::workspace_bytes<__nv_bfloat16>,
     attention_forward_naive_bf16},
    {2, "2_online_softmax.cuh", "online_softmax", DType::F32, ladder::r2::supports, nullptr,
     attention_forward_online_softmax},
    {3, "3_flash1_tiled.cuh", "flash1_tiled", DType::F32, ladder::r3::supports, ladder::r3::workspace_bytes,
     attention_forward_flash1_tiled},
    {4, "4_flash2.cuh", "flash2", DType::F32, ladder::r4::supports, nullptr, attention_forward_flash2},
    {5, "5_tensor_cores.cuh", "tensor_cores", DType::BF16, ladder::r5::supports, nullptr, attention_forward_tensor_cores},
    {6, "6_pipelined.cuh", "pipelined", DType::BF16, ladder::r6::supports, nullptr, attention_forward_pipelined},
    {7, "7_hopper_wgmma.cuh", "hopper_wgmma", DType::BF16, ladder::r7::supports, nullptr, attention_forward_hopper_wgmma},
    {8, "8_pingpong.cuh", "pingpong", DType::BF16, ladder::r8::supports, nullptr, attention_forward_pingpong},
};

// ONE table for the backward: `bwd V` runs every entry with id V. All read and write bf16 (the trainer's
// tensors); dtype is the arithmetic. Rung 1 is the baseline of the bf16 rule for every other.
const BwdRung RUNGS_BWD[] = {
    {1, "1_naive.cuh", "naive", DType::BF16, ladder::b1::supports, ladder::b1::workspace_bytes, attention_backward_naive},
    {2, "2_flash1_recompute.cuh", "flash1_recompute", DType::F32, ladder::b2::supports, ladder::b2::workspace_bytes,
     attention_backward_flash1_recompute},
    {3, "3_flash2.cuh", "flash2", DType::F32, ladder::b3::supports, ladder::b3::workspace_bytes, attention_backward_flash2},
    {4, "4_tensor_cores.cuh", "tensor_cores", DType::BF16, ladder::b4::supports, ladder::b4::workspace_bytes,
     attention_backward_tensor_cores},
    {4, "4_tensor_cores.cuh", "tensor_cores_4warps", DType::BF16, ladder::b4::supports, ladder::b4::workspace_bytes,
     attention_backward_tensor_cores_4warps},
    {5, "5_hopper_wgmma.cuh", "hopper_wgmma", DType::BF16, ladder::b5::supports, ladder::b5::workspace_bytes,
     attention_backward_hopper_wgmma},
    {6, "6_warp_specialized.cuh", "warp_specialized", DType::BF16, ladder::b6::supports, ladder::b6::workspace_bytes,
     attention_backward_warp_specialized},
    {7, "7_fused_dq.cuh", "fused_dq", DType::BF16, ladder::b7::supports, ladder::b7::workspace_bytes,
     attention_backward_fused_dq},
    {8, "8_cluster_dq.cuh", "cluster_dq", DType::BF16, ladder::b8::supports, ladder::b8::workspace_bytes,
     attention_backward_cluster_dq},
    {9, "9_heaviest_first.cuh", "heaviest_first", DType::BF16, ladder::b9::supports, ladder::b9::workspace_bytes,
     attention_backward_heaviest_first},
    {10, "10_fixed_point_dq.cuh", "fixed_point_dq", DType::BF16, ladder::b10::supports, ladder::b10::workspace_bytes,
     attention_backward_fixed_point_dq},
    {11, "11_dq_warpgroup.cuh", "dq_warpgroup", DType::BF16, ladder::b11::supports, ladder::b11::workspace_bytes,
     attention_backward_dq_warpgroup},
    {12, "12_dq_warp_specialized.cuh", "dq_warp_specialized", DType::BF16, ladder::b12::supports,
     ladder::b12::workspace_bytes, attention_backward_dq_warp_specialized},
};

using namespace flashgpt2;
using harness::Compared;
using harness::Range;

using dev::DeviceBuffer;
using dev::Shape;
using report::kPeakBf16;
using report::kPeakFp32;
using report::label;

// ---- one problem: a shape, fresh random inputs per precision, the oracle's answers, the outputs ----
struct Inputs {
    std::vector<float> q, k, v;                 // host copies: exactly the values the device holds
    std::unique_ptr<DeviceBuffer> dq, dk, dv;   // (B, NH, T, HS) each, in the precision's dtype
    std::vector<double> o_ref, lse_ref;         // oracle, filled on the checked heads
    std::optional<std::vector<Compared>> baseline;  // bf16 only: the naive bf16 rung's errors on these inputs
    bool baseline_ok = true;
};

struct Problem {
    Shape s;
    uint64_t seed;
    bool sampled;                          // the oracle checks sampled rows (dev::oracle_samples_rows)
    std::vector<int> heads;                // (b·NH + h) of the heads the oracle checks
    std::vector<int> rows;                 // sampled: the query rows it checks in each of those heads
    std::vector<Range> o_ranges, lse_ranges;
    std::unique_ptr<Inputs> in[2];         // [DType::F32], [DType::BF16], made on first use
    std::unique_ptr<DeviceBuffer> o, lse;  // outputs, sized for fp32

    Problem(const Shape& shape, uint64_t seed_) : s(shape), seed(seed_), sampled(dev::oracle_samples_rows(shape)) {
        const int total = s.B * s.NH, n = std::min(total, sampled ? 2 : dev::heads_to_check(s));
        std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
        std::vector<int> all(total);
        for (int i = 0; i < total; i++) all[i] = i;
        if (n < total) {  // the last head always (catches a wrong head offset), the rest at random
            std::shuffle(all.begin(), all.end() - 1, rng);
            heads.push_back(total - 1);
            heads.insert(heads.end(), all.begin(), all.begin() + (n - 1));
            std::sort(heads.begin(), heads.end());
        } else {
            heads = all;
        }
        if (sampled) rows = dev::sampled_rows(s.T, rng);
        for (int bh : heads) {
            if (!sampled) {
                o_ranges.push_back({(size_t)bh * s.T * s.HS, (size_t)(bh + 1) * s.T * s.HS});
                lse_ranges.push_back({(size_t)bh * s.T, (size_t)(bh + 1) * s.T});
            }
            for (int t : rows) {
                const size_t row = (size_t)bh * s.T + t;
                o_ranges.push_back({row * s.HS, (row + 1) * s.HS});
                lse_ranges.push_back({row, row + 1});
            }
        }
        o = std::make_unique<DeviceBuffer>(s.elems() * sizeof(float), "output o");
        lse = std::make_unique<DeviceBuffer>(s.rows() * sizeof(float), "output lse");
    }

    std::string coverage() const {
        char b[96];
        if (sampled) snprintf(b, sizeof b, "%zu of %d heads, o and lse at %zu rows each", heads.size(), s.B * s.NH, rows.size());
        else snprintf(b, sizeof b, "%zu of %d heads", heads.size(), s.B * s.NH);
        return b;
    }

    // Fresh random inputs, uniform in [-1, 1) shifted by +0.3 (away from zero mean, so a sign or offset
    // bug cannot hide); bf16 gets the same draw rounded to bf16, and the oracle sees the rounded values.
    Inputs& inputs(DType dt) {
        auto& slot = in[dt == DType::BF16];
        if (slot) return *slot;
        slot = std::make_unique<Inputs>();
        Inputs& x = *slot;
        std::mt19937_64 rng(seed);
        std::uniform_real_distribution<float> uni(-1.f, 1.f);
        for (auto* vec : {&x.q, &x.k, &x.v}) {
            vec->resize(s.elems());
            for (float& f : *vec) f = uni(rng) + 0.3f;
            if (dt == DType::BF16)
                for (float& f : *vec) f = harness::round_bf16(f);
        }
        const size_t bytes = s.elems() * dtype_bytes(dt);
        std::vector<uint16_t> bits(dt == DType::BF16 ? s.elems() : 0);
        const std::vector<float>* host[3] = {&x.q, &x.k, &x.v};
        std::unique_ptr<DeviceBuffer>* dev[3] = {&x.dq, &x.dk, &x.dv};
        for (int i = 0; i < 3; i++) {
            *dev[i] = std::make_unique<DeviceBuffer>(bytes, "inputs q/k/v");
            const void* src = host[i]->data();
            if (dt == DType::BF16) {
                for (size_t e = 0; e < s.elems(); e++) bits[e] = harness::bf16_bits((*host[i])[e]);
                src = bits.data();
            }
            cudaCheck(cudaMemcpy((*dev[i])->p, src, bytes, cudaMemcpyHostToDevice));
        }
        if (sampled) dev::oracle_rows(s, x.q, x.k, x.v, heads, rows, x.o_ref, x.lse_ref);
        else dev::oracle(s, x.q, x.k, x.v, heads, x.o_ref, x.lse_ref);
        return x;
    }
};

AttnFwdParams make_params(const Rung& r, Problem& p, void* workspace, cudaStream_t stream) {
    Inputs& x = p.inputs(r.dtype);
    return AttnFwdParams{x.dq->p, x.dk->p, x.dv->p, p.o->p, (float*)p.lse->p, p.s.B, p.s.NH, p.s.T, p.s.HS,
                         workspace, stream};
}

size_t workspace_of(const Rung& r, const Shape& s) { return r.workspace_bytes ? r.workspace_bytes(s.B, s.NH, s.T, s.HS) : 0; }

const Rung& naive_bf16_rung() {
    for (const Rung& r : RUNGS)
        if (r.id == 1 && r.dtype == DType::BF16) return r;
    fail("the RUNGS table has no bf16 naive rung (id 1, bf16): the bf16 rule needs it");
}

// Runs rung r once on poisoned outputs and checks o and lse against the oracle with its precision's rule.
bool check_rung(const Rung& r, Problem& p, void* workspace, cudaStream_t stream) {
    const bool is_baseline = &r == &naive_bf16_rung();
    Inputs& x = p.inputs(r.dtype);
    if (r.dtype == DType::BF16 && !is_baseline && !x.baseline) {  // the naive bf16 errors on these inputs
        const Rung& nb = naive_bf16_rung();
        DeviceBuffer ws(workspace_of(nb, p.s), "naive bf16 workspace (baseline for the bf16 rule)");
        printf(" baseline for the bf16 rule: %s on the same inputs\n", label(nb).c_str());
        check_rung(nb, p, ws.p, stream);
    }
    const AttnFwdParams prm = make_params(r, p, workspace, stream);
    harness::poison(prm.o, p.s.elems() * dtype_bytes(r.dtype), stream);
    harness::poison(prm.lse, p.s.rows() * sizeof(float), stream);
    r.run(prm);
    cudaCheck(cudaStreamSynchronize(stream));
    cudaCheck(cudaGetLastError());

    std::vector<harness::TensorCheck> checks(2);
    checks[0] = {"o", std::vector<float>(p.s.elems()), x.o_ref.data(), p.o_ranges};
    checks[1] = {"lse", std::vector<float>(p.s.rows()), x.lse_ref.data(), p.lse_ranges, /*stored_bf16=*/false};
    if (r.dtype == DType::F32) {
        cudaCheck(cudaMemcpy(checks[0].got.data(), prm.o, p.s.elems() * 4, cudaMemcpyDeviceToHost));
    } else {
        std::vector<uint16_t> bits(p.s.elems());
        cudaCheck(cudaMemcpy(bits.data(), prm.o, p.s.elems() * 2, cudaMemcpyDeviceToHost));
        for (size_t e = 0; e < bits.size(); e++) checks[0].got[e] = harness::bf16_to_float(bits[e]);
    }
    cudaCheck(cudaMemcpy(checks[1].got.data(), prm.lse, p.s.rows() * 4, cudaMemcpyDeviceToHost));

    const std::string what = report::label(r) + " " + p.s.str() + ", oracle on " + p.coverage();
    const harness::Rule rule = r.dtype == DType::F32 ? harness::Rule::Fp32
                               : is_baseline         ? harness::Rule::Bf16Baseline
                                                     : harness::Rule::Bf16;
    harness::Verdict v = harness::validate(what, checks, rule, x.baseline ? &*x.baseline : nullptr);
    if (is_baseline) {
        x.baseline = v.tensors;
        x.baseline_ok = v.ok;
    } else if (r.dtype == DType::BF16 && !x.baseline_ok) {
        printf("  %s: FAIL (its baseline, the naive bf16 rung, failed its own check)\n", what.c_str());
        return false;
    }
    return v.ok;
}

using report::Measured;

Measured time_rung(const Rung& r, Problem& p, void* workspace, cudaStream_t stream, double budget_s) {
    const AttnFwdParams prm = make_params(r, p, workspace, stream);
    harness::BenchOpts opts;
    opts.budget_s = budget_s;
    const harness::Timing t = harness::benchmark([&] { r.run(prm); }, stream, opts);
    Measured m{t.median_ms, attention_forward_flops(p.s.B, p.s.NH, p.s.T, p.s.HS) / (t.median_ms * 1e9), t.reps};
    printf("  time %s %s: %.4f ms  %.2f TFLOP/s  %.2f%% of %.0f (bf16 peak, measured)", label(r).c_str(),
           p.s.str().c_str(), m.ms, m.tflops, 100 * m.tflops / kPeakBf16, kPeakBf16);
    if (r.dtype == DType::F32) printf("  %.1f%% of %.0f (fp32 non-tensor peak, datasheet)", 100 * m.tflops / kPeakFp32, kPeakFp32);
    printf("  [median of %d, L2 flushed]\n", m.reps);
    return m;
}

// Every rung of both ladders; host facts only, so it runs without a GPU.
int cmd_list() {
    printf("%-4s %-3s %-5s %-26s %-19s %-16s %s\n", "pass", "id", "dtype", "file", "name", "head dims",
           "workspace at (8,12,1024,64)");
    for (const Rung& r : RUNGS) {
        std::string dims;
        for (int hs : {32, 64, 96, 128, 256})
            if (r.supports(hs)) dims += (dims.empty() ? "" : ",") + std::to_string(hs);
        printf("%-4s %-3d %-5s %-26s %-19s %-16s %.1f MB\n", "fwd", r.id, dtype_name(r.dtype), r.file, r.name,
               dims.c_str(), workspace_of(r, {8, 12, 1024, 64}) / 1e6);
    }
    for (const BwdRung& r : RUNGS_BWD) {  // storage bf16, dtype = the arithmetic
        std::string dims;
        for (int hs : {32, 64, 96, 128, 256})
            if (r.supports(hs)) dims += (dims.empty() ? "" : ",") + std::to_string(hs);
        printf("%-4s %-3d %-5s %-26s %-19s %-16s %.1f MB\n", "bwd", r.id, dtype_name(r.dtype), r.file, r.name,
               dims.c_str(), (r.workspace_bytes ? r.workspace_bytes(8, 12, 1024, 64) : 0) / 1e6);
    }
    return 0;
}

// ---- bench: a whole ladder on the anchor shapes (dev/attention/report.cuh writes the tables) ----
// One cell: rung r on problem p, validated (and then timed), or the reason it was skipped.
report::Cell bench_cell(const Rung& r, Problem& p, cudaStream_t stream) {
    report::Cell cell;
    if (!r.supports(p.s.HS)) return {"skip: head dim " + std::to_string(p.s.HS) + " not supported", {}};
    try {
        DeviceBuffer ws(workspace_of(r, p.s), "workspace");
        if (!check_rung(r, p, ws.p, stream)) return {"FAIL", {}};
        cell = {"ok", time_rung(r, p, ws.p, stream, 0.5)};
    } catch (const Error& e) {  // e.g. the naive rung's T×T buffers do not fit: skip, say why
        cell.status = std::string("skip: ") + e.what();
    }
    return cell;
}

int cmd_bench(int argc, char** argv, const std::string& command) {  // argv[0] = "bench"
    std::string anchors_path, out_dir = "doc", pass = "fwd";
    std::vector<int> only;
    uint64_t seed = std::random_device{}();
    for (int i = 1; i < argc; i++) {
        const bool has_value = i + 1 < argc;
        if (!strcmp(argv[i], "--anchors") && has_value) anchors_path = argv[++i];
        else if (!strcmp(argv[i], "--out") && has_value) out_dir = argv[++i];
        else if (!strcmp(argv[i], "--pass") && has_value) pass = argv[++i];
        else if (!strcmp(argv[i], "--seed") && has_value) seed = (uint64_t)args::parse_int("--seed", argv[++i], 0, 2147483647);
        else if (!strcmp(argv[i], "--rungs") && has_value) {
            std::stringstream list(argv[++i]);
            for (std::string tok; std::getline(list, tok, ',');) only.push_back((int)args::parse_int("--rungs", tok.c_str(), 1, 1000));
        } else fail("bench: unknown or incomplete argument '%s'", argv[i]);
    }
    if (pass != "fwd" && pass != "bwd") fail("bench: --pass %s (fwd or bwd)", pass.c_str());
    std::optional<harness::Anchors> anchors;
    if (!anchors_path.empty()) anchors = harness::parse_sdpa_log(anchors_path);  // bad file: fail before the long run
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (ec || !std::filesystem::is_directory(out_dir)) fail("--out %s: cannot create the directory", out_dir.c_str());
    auto start = [&](auto& rep, const auto& table) {  // the report's header and its rungs
        rep.anchors = anchors, rep.card = dev::card_name(), rep.date = utc_timestamp(), rep.command = command;
        for (const auto& r : table)
            if (only.empty() || std::count(only.begin(), only.end(), r.id)) rep.rungs.push_back(&r);
        if (rep.rungs.empty()) fail("--rungs: none of those rungs exist (see --list)");
    };
    if (pass == "bwd") {
        report::Report<BwdRung> rep{&report::BACKWARD};
        start(rep, RUNGS_BWD);
        const int failed = bwd_runner::bench(rep, RUNGS_BWD, seed);
        report::write_all(rep, out_dir);
        return failed ? 1 : 0;
    }
    report::Report<Rung> rep{&report::FORWARD};
    start(rep, RUNGS);
    printf("card: %s, seed %llu, %zu rungs x %zu shapes\n", rep.card.c_str(), (unsigned long long)seed, rep.rungs.size(),
           std::size(dev::kAnchorShapes));
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    int failed = 0;
    for (const Shape& s : dev::kAnchorShapes) {
        rep.shapes.push_back(s);
        Problem p(s, seed + rep.shapes.size());
        rep.coverage.push_back(p.coverage());
        rep.cells.emplace_back();
        printf("== %s: the oracle checks %s (a random subset on big shapes keeps the CPU time bounded)\n",
               s.str().c_str(), p.coverage().c_str());
        for (const Rung* r : rep.rungs) {
            const report::Cell cell = bench_cell(*r, p, stream);
            if (cell.status != "ok") printf("  %s %s: %s\n", label(*r).c_str(), s.str().c_str(), cell.status.c_str());
            failed += cell.status == "FAIL";
            rep.cells.back().push_back(cell);
        }
    }
    cudaCheck(cudaStreamDestroy(stream));
    report::write_all(rep, out_dir);
    if (failed) printf("bench: %d rung x shape validations FAILED (marked FAIL in the tables)\n", failed);
    return failed ? 1 : 0;
}

int cmd_fwd(int argc, char** argv) {  // argv[0] = "fwd"
    if (argc < 2) fail("usage: runner fwd V [B NH T HS] [--seed S]");
    const int id = (int)args::parse_int("fwd V", argv[1], 1, 1000);
    std::vector<const Rung*> rungs;
    for (const Rung& r : RUNGS)
        if (r.id == id) rungs.push_back(&r);
    if (rungs.empty()) fail("fwd: there is no rung %d (see --list)", id);
    const dev::ShapeArgs a = dev::parse_shape_args("fwd", argc, argv, 1);
    std::vector<Shape> checks;  // validated in order; the last one is also timed
    if (!a.shape) {
        for (int hs : {64, 128})
            for (Shape s : {Shape{1, 1, 1, hs}, Shape{1, 2, 2, hs}, Shape{2, 3, 17, hs}, Shape{1, 2, 65, hs},
                            Shape{2, 2, 257, hs}, Shape{1, 1, 1000, hs}})
                checks.push_back(s);
        checks.push_back({8, 12, 1024, 64});
    } else {
        checks.push_back(*a.shape);
    }
    printf("card: %s, seed %llu\n", dev::card_name().c_str(), (unsigned long long)a.seed);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    bool all_ok = true;
    for (size_t c = 0; c < checks.size(); c++) {
        const Shape& s = checks[c];
        Problem p(s, a.seed + c);
        for (const Rung* r : rungs) {
            if (!r->supports(s.HS)) {
                printf("%s: skip %s (head dim %d not supported)\n", label(*r).c_str(), s.str().c_str(), s.HS);
                if (a.shape) all_ok = false;  // a shape asked for by name must run
                continue;
            }
            DeviceBuffer ws(workspace_of(*r, s), "workspace");
            const bool ok = check_rung(*r, p, ws.p, stream);
            all_ok = all_ok && ok;
            if (ok && c + 1 == checks.size()) time_rung(*r, p, ws.p, stream, 1.0);
        }
    }
    cudaCheck(cudaStreamDestroy(stream));
    printf(all_ok ? "fwd %d: all checks passed\n" : "fwd %d: FAILED (see FAIL lines above)\n", id);
    return all_ok ? 0 : 1;
}

int main(int argc, char** argv) {
    return run_main([&] {
        std::string command = "./dev/attention/runner";
        for (int i = 1; i < argc; i++) command += std::string(" ") + argv[i];
        if (argc >= 2 && !strcmp(argv[1], "--list")) return cmd_list();
        if (argc >= 2 && !strcmp(argv[1], "fwd")) return cmd_fwd(argc - 1, argv + 1);
        if (argc >= 2 && !strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1, command);
        if (argc >= 2 && !strcmp(argv[1], "bwd")) return bwd_runner::cmd_bwd(argc - 1, argv + 1, RUNGS_BWD);
        if (argc >= 2 && !strcmp(argv[1], "schedule")) return schedule_model::cmd_schedule(argc - 1, argv + 1);
        fail("usage: runner --list | fwd V [B NH T HS] [--seed S] | bench [--pass fwd|bwd] [--anchors FILE] [--out DIR] "
             "[--rungs 1,4,7] [--seed S] | bwd V|all [B NH T HS] [--seed S] | schedule [B NH T HS] [--sms N] [--out DIR]");
    });
}
