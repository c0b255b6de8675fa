// `runner bwd`: the trainer's attention BACKWARD (llmc/attention.cuh: naive and flash, bf16), validated and
// timed exactly as the forward ladder's rungs are (dev/harness.cuh's validate() and benchmark()).
//   ./dev/attention/runner bwd [B NH T HS] [--seed S]
// Per shape: fresh random qkv and dout (uniform in [-1, 1) + 0.3, rounded to bf16); llmc's forwards make
// what each backward needs (naive: P; flash: out, lse), dqkv is poisoned with NaN, each backward runs, and
// dQ, dK, dV are compared with the CPU oracle (llmc/ref/attention.h in double) on a subset of heads (all of
// them on small shapes). The naive bf16 backward is the baseline of the bf16 rule; the trainer's flash
// backward (llmc/attention.cuh picks it: on an H100/H200 the Hopper one, attention_backward_hopper.cuh) must
// also be bit-identical on a second run (deterministic: no atomics). The other bf16 flash backwards this card
// runs are validated the same way, and each is said to give the trainer's bits or not (doc/attention/
// backward.md has the steps): the warp-specialized one (dev/attention/backward/3_warp_specialized.cuh) and
// the mma.sync one (attention_backward.cuh, with both of its dK/dV blocks, 8 and 4 warps). Then all are timed
// (CUDA events, warm-up, median, L2 flushed) and scored with the FlashAttention count for the backward: 2.5x
// the forward's 4·B·H·T²·D/2. On an H100/H200 the Hopper backward's two kernels are also timed apart (each
// alone, L2 flushed: where its time goes).
// No shape: odd shapes T = 1, 2, 37, 257, 1000 at HS 64 (and 257 at HS 128, the fp32-arithmetic fallback)
// are validated, then (4,12,1024,64) is validated and timed.
#pragma once
#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dev/attention/attention.cuh"
#include "dev/attention/backward/3_warp_specialized.cuh"
#include "dev/attention/problem.cuh"
#include "dev/harness.cuh"
#include "llmc/kernels.h"
#include "llmc/args.h"
#include "llmc/peak.h"

namespace bwd_runner {

using namespace flashgpt2;
using dev::DeviceBuffer;
using dev::Shape;
using harness::Compared;
using harness::Range;

inline double attention_backward_flops(int B, int NH, int T, int HS) {
    return 2.5 * attention_forward_flops(B, NH, T, HS);
}

// The oracle on heads `heads` (b·NH + h): packed as the heads of one batch row, so ref's loop over heads runs
// them in parallel. Outputs dq, dk, dv in (B, NH, T, HS) order, filled on the checked heads only.
// Also `o_err`, per tensor, the error the flash backward inherits from its input O: it forms D_i = rowsum(dO_i
// * O_i) from o_used, the forward's stored bf16 output (B, T, NH, HS), not from the exact O (FlashAttention-2
// does the same; the naive backward sums P * dP instead). dS_ij then moves by -P_ij dD_i, so dQ_i moves by
// -scale dD_i sum_j P_ij K_j and dK_j by -scale sum_i P_ij dD_i Q_i; their largest sizes join the bf16 rule's
// atol. (On tiny T the naive error can be far below this, e.g. T = 2: 1.4e-4 vs 4.4e-4 in dK.)
inline void oracle_backward(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout,
                     const std::vector<float>& o_used, const std::vector<int>& heads, std::vector<double> (&d)[3],
                     double (&o_err)[3]) {
    const int n = (int)heads.size(), T = s.T, HS = s.HS, C = s.NH * s.HS, Cn = n * HS;
    std::vector<double> q3((size_t)T * 3 * Cn), o((size_t)T * Cn), dO((size_t)T * Cn), dq3((size_t)T * 3 * Cn, 0.0);
    std::vector<double> preatt((size_t)n * T * T), att((size_t)n * T * T), dpre((size_t)n * T * T, 0.0),
        datt((size_t)n * T * T, 0.0);
    for (int hh = 0; hh < n; hh++) {
        const int b = heads[hh] / s.NH, h = heads[hh] % s.NH;
        for (int t = 0; t < T; t++)
            for (int x = 0; x < HS; x++) {
                for (int w = 0; w < 3; w++)
                    q3[(size_t)t * 3 * Cn + w * Cn + hh * HS + x] = qkv[((size_t)b * T + t) * 3 * C + w * C + h * HS + x];
                dO[(size_t)t * Cn + hh * HS + x] = dout[((size_t)b * T + t) * C + h * HS + x];
            }
    }
    ref::attention_forward<double>(o.data(), preatt.data(), att.data(), q3.data(), 1, T, Cn, n);
    ref::attention_backward<double>(dq3.data(), dpre.data(), datt.data(), dO.data(), q3.data(), att.data(), 1, T, Cn, n);
    for (auto& v : d) v.assign(s.elems(), 0.0);
    for (int hh = 0; hh < n; hh++)
        for (int t = 0; t < T; t++)
            for (int x = 0; x < HS; x++)
                for (int w = 0; w < 3; w++)
                    d[w][((size_t)heads[hh] * T + t) * HS + x] = dq3[(size_t)t * 3 * Cn + w * Cn + hh * HS + x];

    const double scale = 1.0 / std::sqrt((double)HS);
    o_err[0] = o_err[1] = o_err[2] = 0.0;
    std::vector<double> dD(T), ddk((size_t)T * HS);
    for (int hh = 0; hh < n; hh++) {
        const int b = heads[hh] / s.NH, h = heads[hh] % s.NH;
        const double* P = att.data() + (size_t)hh * T * T;  // (T, T), row i = query
        const auto q = [&](int t, int w, int x) { return q3[(size_t)t * 3 * Cn + w * Cn + hh * HS + x]; };
        for (int i = 0; i < T; i++) {
            dD[i] = 0.0;
            for (int x = 0; x < HS; x++)
                dD[i] += dO[(size_t)i * Cn + hh * HS + x] *
                         (o_used[((size_t)b * T + i) * C + h * HS + x] - o[(size_t)i * Cn + hh * HS + x]);
        }
        std::fill(ddk.begin(), ddk.end(), 0.0);
        for (int i = 0; i < T; i++)
            for (int x = 0; x < HS; x++) {
                double pk = 0.0;  // sum_j P_ij K_j
                for (int j = 0; j <= i; j++) pk += P[(size_t)i * T + j] * q(j, 1, x);
                o_err[0] = std::max(o_err[0], std::abs(scale * dD[i] * pk));
                for (int j = 0; j <= i; j++) ddk[(size_t)j * HS + x] += P[(size_t)i * T + j] * dD[i] * q(i, 0, x);
            }
        for (double v : ddk) o_err[1] = std::max(o_err[1], std::abs(scale * v));
    }
}

// dqkv (B, T, 3, NH, HS) bf16 on the device -> dq, dk, dv as float in (B, NH, T, HS) order.
inline void download_grads(const Shape& s, const void* dqkv, std::vector<float> (&g)[3]) {
    const int C = s.NH * s.HS;
    std::vector<uint16_t> bits(3 * s.elems());
    cudaCheck(cudaMemcpy(bits.data(), dqkv, bits.size() * 2, cudaMemcpyDeviceToHost));
    for (auto& v : g) v.resize(s.elems());
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < s.T; t++)
            for (int w = 0; w < 3; w++)
                for (int h = 0; h < s.NH; h++)
                    for (int x = 0; x < s.HS; x++)
                        g[w][(((size_t)b * s.NH + h) * s.T + t) * s.HS + x] =
                            harness::bf16_to_float(bits[(((size_t)b * s.T + t) * 3 + w) * C + h * s.HS + x]);
}

// One shape: validate naive and flash; time them when `timed`. Returns whether every check passed.
inline bool run_shape(const Shape& s, uint64_t seed, bool timed, cudaStream_t stream) {
    const int BH = s.B * s.NH, C = s.NH * s.HS;
    const size_t btc = s.elems();
    // heads the oracle checks: all on small shapes; else the last one (a wrong head offset shows there) + random
    const int n = std::min(BH, std::max(1, std::min(12, dev::heads_to_check(s))));
    std::mt19937_64 rng(seed);
    std::vector<int> heads;
    {
        std::vector<int> all(BH);
        for (int i = 0; i < BH; i++) all[i] = i;
        std::shuffle(all.begin(), all.end() - 1, rng);
        heads.assign(all.begin(), all.begin() + (n - 1));
        heads.push_back(BH - 1);
        std::sort(heads.begin(), heads.end());
    }
    std::vector<Range> ranges;
    for (int bh : heads) ranges.push_back({(size_t)bh * s.T * s.HS, (size_t)(bh + 1) * s.T * s.HS});

    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    std::vector<float> qkv(3 * btc), dout(btc);
    for (float& f : qkv) f = harness::round_bf16(uni(rng) + 0.3f);
    for (float& f : dout) f = harness::round_bf16(uni(rng) + 0.3f);
    std::vector<double> ref[3], ref_cat;  // ref_cat: dq | dk | dv, for T = 1 (see `check` below)
    double o_err[3];                      // filled by the oracle, after the flash forward below has run

    DeviceBuffer d_qkv(3 * btc * 2, "qkv"), d_dout(btc * 2, "dout"), d_out(btc * 2, "out"), d_dqkv(3 * btc * 2, "dqkv");
    DeviceBuffer d_lse((size_t)BH * s.T * 4, "lse"), d_att((size_t)BH * s.T * s.T * 2, "P (naive)");
    DeviceBuffer ws(std::max(attention_workspace_bytes(Variant::naive, s.B, s.T, C, s.NH),
                             attention_workspace_bytes(Variant::flash, s.B, s.T, C, s.NH)), "workspace");
    auto upload = [](void* dst, const std::vector<float>& v) {
        std::vector<uint16_t> bits(v.size());
        for (size_t e = 0; e < v.size(); e++) bits[e] = harness::bf16_bits(v[e]);
        cudaCheck(cudaMemcpy(dst, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    };
    upload(d_qkv.p, qkv), upload(d_dout.p, dout);
    auto* qkvp = (const floatX*)d_qkv.p;
    auto* doutp = (const floatX*)d_dout.p;
    auto* dqkvp = (floatX*)d_dqkv.p;

    const auto naive_bwd = [&] {
        attention_backward_naive(dqkvp, ws.p, doutp, qkvp, (const floatX*)d_att.p, s.B, s.T, C, s.NH, stream);
    };
    const AttnEngine picked = attention_engine(AttnEngine::best, Pass::backward, s.HS);
    const auto flash_bwd = [&] {  // the trainer's: `--attention flash`, the best engine here
        attention_backward_flash(dqkvp, ws.p, doutp, qkvp, (const floatX*)d_out.p, (const float*)d_lse.p, s.B, s.T,
                                 C, s.NH, AttnEngine::best, stream);
    };
    // The other bf16 flash backwards this card runs, each validated too, so that every timing below is of a
    // checked kernel: the other engines and the other steps of the backward.
    std::vector<std::pair<std::string, std::function<void()>>> others;
    float* D = WorkspaceCarver(ws.p).take<float>(attention_backward_d_floats(s.B, s.NH, s.T));
    const auto* outp = (const floatX*)d_out.p;
    const auto* lsep = (const float*)d_lse.p;
    if (attention_backward_flash_wgmma_supports(s.HS))
        others.push_back({"attention_backward_flash_hopper_ws (bf16, step 3, warp-specialized)", [&, D] {
            attention_backward_flash_hopper_ws(dqkvp, D, doutp, qkvp, outp, lsep, s.B, s.T, s.NH, s.HS, stream);
        }});
    if (!attention_engine_unsupported(AttnEngine::mma, Pass::backward, s.HS))
        for (int w : {8, 4})
            others.push_back({"attention_backward_flash_mma (bf16, dK/dV block of " + std::to_string(w) + " warps)", [&, D, w] {
                attention_backward_flash_mma(dqkvp, D, doutp, qkvp, outp, lsep, s.B, s.T, s.NH, s.HS, stream, w);
            }});
    const auto check = [&](const std::string& what, const std::function<void()>& run, harness::Rule rule,
                           const std::vector<Compared>* baseline) {
        harness::poison(d_dqkv.p, 3 * btc * 2, stream);
        run();
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaGetLastError());
        std::vector<float> got[3];
        download_grads(s, d_dqkv.p, got);
        std::vector<harness::TensorCheck> checks;
        const char* names[3] = {"dq", "dk", "dv"};
        if (s.T > 1) {
            for (int w = 0; w < 3; w++) checks.push_back({names[w], std::move(got[w]), ref[w].data(), ranges, true, o_err[w]});
        } else {  // T = 1: exact dQ = dK = 0 (P = 1, dS = 0), so judge dq|dk|dv as one tensor (atol from |dv|)
            harness::TensorCheck all{"dqkv", {}, ref_cat.data(), {}, true, std::max(o_err[0], o_err[1])};
            for (int w = 0; w < 3; w++) {
                all.got.insert(all.got.end(), got[w].begin(), got[w].end());
                for (const Range& r : ranges) all.ranges.push_back({r.first + w * btc, r.second + w * btc});
            }
            checks.push_back(std::move(all));
        }
        char cover[64];
        snprintf(cover, sizeof cover, "%d of %d heads", n, BH);
        return harness::validate(what + " " + s.str() + ", oracle on " + cover, checks, rule, baseline);
    };

    // the forwards that make the backwards' inputs: naive -> P (B,NH,T,T); flash -> out, lse
    attention_forward_naive((floatX*)d_out.p, (floatX*)d_att.p, ws.p, qkvp, s.B, s.T, C, s.NH, stream);
    attention_forward_flash((floatX*)d_out.p, (float*)d_lse.p, qkvp, s.B, s.T, C, s.NH, AttnEngine::best, stream);
    {
        std::vector<uint16_t> bits(btc);
        cudaCheck(cudaMemcpy(bits.data(), d_out.p, btc * 2, cudaMemcpyDeviceToHost));
        std::vector<float> o_used(btc);
        for (size_t e = 0; e < btc; e++) o_used[e] = harness::bf16_to_float(bits[e]);
        oracle_backward(s, qkv, dout, o_used, heads, ref, o_err);
        for (auto& r : ref) ref_cat.insert(ref_cat.end(), r.begin(), r.end());
    }
    const harness::Verdict base = check("attention_backward_naive (bf16)", naive_bwd, harness::Rule::Bf16Baseline, nullptr);
    const std::string flash_name = std::string("attention_backward_flash (bf16, ") + engine_name(picked) + ")";
    const harness::Verdict fl = check(flash_name, flash_bwd, harness::Rule::Bf16, &base.tensors);
    std::vector<unsigned char> first(3 * btc * 2), again(3 * btc * 2);
    cudaCheck(cudaMemcpy(first.data(), d_dqkv.p, first.size(), cudaMemcpyDeviceToHost));
    flash_bwd();
    cudaCheck(cudaStreamSynchronize(stream));
    cudaCheck(cudaMemcpy(again.data(), d_dqkv.p, again.size(), cudaMemcpyDeviceToHost));
    const bool same = first == again;
    printf("  %s %s: second run %s\n", flash_name.c_str(), s.str().c_str(),
           same ? "bit-identical: PASS" : "DIFFERS: FAIL (not deterministic)");
    bool ok = base.ok && fl.ok && same;
    for (const auto& [what, run] : others) {  // every step does the same products in the same order
        ok = check(what, run, harness::Rule::Bf16, &base.tensors).ok && ok;
        cudaCheck(cudaMemcpy(again.data(), d_dqkv.p, again.size(), cudaMemcpyDeviceToHost));
        printf("  %s %s: %s the trainer's bits\n", what.c_str(), s.str().c_str(), again == first ? "the same as" : "differs from");
    }
    if (!timed || !ok) return ok;

    const double flops = attention_backward_flops(s.B, s.NH, s.T, s.HS);
    const auto time_one = [&](const std::string& what, const std::function<void()>& run, bool whole = true) {
        harness::BenchOpts opts;
        const harness::Timing t = harness::benchmark(run, stream, opts);
        const double tf = flops / (t.median_ms * 1e9);
        if (!whole) {  // one kernel of a backward: its time only (the FLOP count is the whole backward's)
            printf("  time %s %s: %.4f ms  [median of %d, L2 flushed]\n", what.c_str(), s.str().c_str(), t.median_ms, t.reps);
            return;
        }
        printf("  time %s %s: %.4f ms  %.2f TFLOP/s  %.2f%% of %.0f (bf16 peak, measured)  [median of %d, L2 flushed]\n",
               what.c_str(), s.str().c_str(), t.median_ms, tf, 100 * tf / PEAK_BF16_TFLOPS, PEAK_BF16_TFLOPS, t.reps);
    };
    time_one("attention_backward_naive (bf16)", naive_bwd);
    time_one(flash_name, flash_bwd);
    for (const auto& [what, run] : others) time_one(what, run);
    if (attention_backward_flash_wgmma_supports(s.HS)) {  // where the wgmma backward's time goes: its kernels apart
        time_one("attention_backward_flash (wgmma): its dQ kernel alone", [&, D] {
            attention_backward_flash_wgmma_dq(dqkvp, D, doutp, qkvp, outp, lsep, s.B, s.T, s.NH, stream);
        }, false);
        time_one("attention_backward_flash (wgmma): its dK/dV kernel alone", [&, D] {
            attention_backward_flash_wgmma_dkdv(dqkvp, D, doutp, qkvp, s.B, s.T, s.NH, stream);
        }, false);
    }
    return ok;
}

inline int cmd_bwd(int argc, char** argv) {  // argv[0] = "bwd"
    std::vector<int> pos;
    uint64_t seed = std::random_device{}();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = (uint64_t)args::parse_int("--seed", argv[++i], 0, 2147483647);
        else pos.push_back((int)args::parse_int("bwd B/NH/T/HS", argv[i], 1, 1 << 24));
    }
    if (!pos.empty() && pos.size() != 4) fail("bwd: give all four of B NH T HS, or none");
    std::vector<Shape> checks;  // validated in order; the last one is also timed
    if (pos.empty()) {
        for (Shape s : {Shape{1, 1, 1, 64}, Shape{1, 2, 2, 64}, Shape{2, 3, 37, 64}, Shape{2, 2, 257, 64},
                        Shape{1, 2, 1000, 64}, Shape{1, 2, 257, 128}})
            checks.push_back(s);
        checks.push_back({4, 12, 1024, 64});
    } else {
        const Shape s{pos[0], pos[1], pos[2], pos[3]};
        if ((size_t)s.B * s.NH > 65535) fail("bwd: B·NH = %zu exceeds 65535", (size_t)s.B * s.NH);
        if (3 * s.elems() >= (1ull << 31)) fail("bwd: 3·B·NH·T·HS = %zu elements: this runner stays below 2^31", 3 * s.elems());
        checks.push_back(s);
    }
    printf("card: %s, seed %llu\n", dev::card_name().c_str(), (unsigned long long)seed);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    bool all_ok = true;
    for (size_t c = 0; c < checks.size(); c++)
        all_ok = run_shape(checks[c], seed + c, c + 1 == checks.size(), stream) && all_ok;
    cudaCheck(cudaStreamDestroy(stream));
    printf(all_ok ? "bwd: all checks passed\n" : "bwd: FAILED (see FAIL lines above)\n");
    return all_ok ? 0 : 1;
}

}  // namespace bwd_runner
