// `runner bwd` and `runner bench --pass bwd`: the attention BACKWARD ladder (the RUNGS_BWD table of
// dev/attention/runner.cu), validated and timed as the forward ladder's rungs are (dev/harness.cuh's validate()
// and benchmark()).
//   ./dev/attention/runner bwd V|all [B NH T HS] [--seed S]
// Per shape: fresh random qkv and dout (uniform in [-1, 1) + 0.3, rounded to bf16); llmc's forwards make what
// the backwards read (naive: P; flash: out, lse); dqkv is poisoned with NaN, the rung runs, and dQ, dK, dV are
// compared with the CPU oracle in double:
//   T < 4096   llmc/ref/attention.h on whole heads (all of them on small shapes, else 12: the last one, where a
//              wrong head offset shows, and 11 at random)
//   T >= 4096  llmc/ref/attention_sampled.h on 2 heads (the last and one at random): dQ at 33 query rows, dK and
//              dV at 33 keys (both sides of the 64- and 128-row tile edges, the middle, the ends, 24 at random), so
//              that a long shape validates in seconds; the whole dqkv is still scanned for NaN/inf
// under the bf16 rule, whose baseline is rung 1 (naive) on the same inputs. Where rung 1's P (B,NH,T,T) and
// workspace do not fit on the card (T = 32K on an 80 GB one), its full-size cell is skipped, saying why, and the
// baseline is rung 1 run on the checked heads alone (Problem::baseline_on_heads). Every rung must also give the same
// bits on a second run (deterministic: no atomics, or atomics in a fixed order), and is said to give the
// trainer's bits or not. Then it is timed (CUDA events, warm-up, median, L2 flushed) and scored with the
// FlashAttention count for the backward.
// No shape: odd shapes (T = 1, 2, 17, 63, 65, 1000, 2047; HS 64 and 128) are validated, then (4,12,1024,64)
// is validated and timed. On an H100/H200, `bwd 5`, `bwd 9` and `bwd 12` also time their two kernels apart.
#pragma once
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dev/attention/attention.cuh"
#include "dev/attention/problem.cuh"
#include "dev/attention/report.cuh"
#include "dev/harness.cuh"
#include "llmc/args.h"
#include "llmc/attention/wgmma_backward_dq_ws.cuh"  // rung 12's dQ kernel, timed apart
#include "llmc/attention/wgmma_backward_ws.cuh"     // rung 12's dK/dV kernel
#include "llmc/kernels.h"
#include "llmc/ref/attention_sampled.h"

namespace bwd_runner {

using namespace flashgpt2;
using dev::DeviceBuffer;
using dev::Shape;
using harness::Compared;
using harness::Range;

constexpr int kSampledFromT = 4096;  // from this T on, the oracle checks sampled rows and keys

// The oracle on whole heads `heads` (b·NH + h): packed as the heads of one batch row, so ref's loop over heads
// runs them in parallel. Outputs dq, dk, dv in (B, NH, T, HS) order, filled on the checked heads only, and every
// row's lse_i and D_i = dO_i · O_i of the checked heads (for o_err_allowance).
inline void oracle_backward(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout,
                            const std::vector<int>& heads, std::vector<double> (&d)[3], ref::SampledAttention& stats) {
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
    stats.lse_all.assign((size_t)n * T, 0.0), stats.D_all.assign((size_t)n * T, 0.0);
    for (int hh = 0; hh < n; hh++)
        for (int i = 0; i < T; i++) {
            const double* S = preatt.data() + ((size_t)hh * T + i) * T;  // row i's scaled scores, keys 0..i
            const double m = *std::max_element(S, S + i + 1);
            double l = 0.0;
            for (int j = 0; j <= i; j++) l += std::exp(S[j] - m);
            stats.lse_all[(size_t)hh * T + i] = m + std::log(l);
            for (int x = 0; x < HS; x++)
                stats.D_all[(size_t)hh * T + i] += dO[(size_t)i * Cn + hh * HS + x] * o[(size_t)i * Cn + hh * HS + x];
        }
}

// `o_err`, per tensor, the error the flash backwards inherit from their input O, at the checked rows (dQ) and keys
// (dK): they form D_i = rowsum(dO_i * O_i) from o_used, the forward's stored bf16 output (B, T, NH, HS), not from
// the exact O (FlashAttention-2 does the same; the naive backward sums P * dP instead). With the exact lse_i and
// D_i of the checked heads (`a`), dD_i = dO_i · o_used_i - D_i; dS_ij then moves by -P_ij dD_i, so dQ_i moves by
// -scale dD_i sum_j P_ij K_j and dK_j by -scale sum_i P_ij dD_i Q_i; their largest sizes join the bf16 rule's
// atol. (On tiny T the naive error can be far below this, e.g. T = 2: 1.4e-4 vs 4.4e-4 in dK.)
inline void o_err_allowance(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout,
                            const std::vector<float>& o_used, const std::vector<int>& heads, const std::vector<int>& rows,
                            const std::vector<int>& keys, const ref::SampledAttention& a, double (&o_err)[3]) {
    const int T = s.T, HS = s.HS, C = s.NH * HS, n = (int)heads.size();
    const double scale = 1.0 / std::sqrt((double)HS);
    std::vector<double> err_q(n, 0.0), err_k(n, 0.0);  // per head, reduced below
#pragma omp parallel for
    for (int hh = 0; hh < n; hh++) {
        const int b = heads[hh] / s.NH, h = heads[hh] % s.NH;
        const double* lse = a.lse_all.data() + (size_t)hh * T;
        const auto x = [&](int t, int w) { return &qkv[(((size_t)b * T + t) * 3 + w) * C + (size_t)h * HS]; };
        const auto row = [&](const std::vector<float>& v, int t) { return &v[((size_t)b * T + t) * C + (size_t)h * HS]; };
        const auto dot = [&](const float* p, const float* q) {
            double r = 0;
            for (int d = 0; d < HS; d++) r += (double)p[d] * (double)q[d];
            return r;
        };
        std::vector<double> dD(T);
        for (int i = 0; i < T; i++) dD[i] = dot(row(dout, i), row(o_used, i)) - a.D_all[(size_t)hh * T + i];
        const auto P = [&](int i, int j) { return std::exp(scale * dot(x(i, 0), x(j, 1)) - lse[i]); };
        std::vector<double> acc(HS);
        for (int i : rows) {  // dQ_i moves by -scale dD_i sum_j P_ij K_j
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int j = 0; j <= i; j++) {
                const double p = P(i, j);
                for (int d = 0; d < HS; d++) acc[d] += p * x(j, 1)[d];
            }
            for (int d = 0; d < HS; d++) err_q[hh] = std::max(err_q[hh], std::abs(scale * dD[i] * acc[d]));
        }
        for (int j : keys) {  // dK_j moves by -scale sum_i P_ij dD_i Q_i
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int i = j; i < T; i++) {
                const double w = P(i, j) * dD[i];
                for (int d = 0; d < HS; d++) acc[d] += w * x(i, 0)[d];
            }
            for (int d = 0; d < HS; d++) err_k[hh] = std::max(err_k[hh], std::abs(scale * acc[d]));
        }
    }
    o_err[0] = *std::max_element(err_q.begin(), err_q.end());
    o_err[1] = *std::max_element(err_k.begin(), err_k.end());
    o_err[2] = 0.0;  // dV = Pᵀ dO does not read D
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

// NaN/inf elements of a bf16 tensor given as its bytes (little-endian): exponent bits all ones.
inline size_t nonfinite_bf16(const std::vector<unsigned char>& b) {
    size_t n = 0;
    for (size_t e = 0; e < b.size(); e += 2) n += (((b[e + 1] & 0x7f) << 8 | b[e]) >> 7) == 0xff;
    return n;
}

// Heads `heads` (b·NH + h) of a (B, T, K, NH, HS) bf16 tensor on the device <-> a (1, T, K, n, HS) one holding
// just those heads, heads[hh] as head hh: K = 3 for qkv and dqkv, 1 for dout. One strided copy per head and slice.
inline void copy_heads(const Shape& s, int K, const std::vector<int>& heads, void* full, void* sub, bool to_sub,
                       cudaStream_t stream) {
    const size_t n = heads.size(), hs = (size_t)s.HS * 2, full_pitch = K * s.NH * hs, sub_pitch = K * n * hs;
    for (size_t hh = 0; hh < n; hh++)
        for (int w = 0; w < K; w++) {
            const int b = heads[hh] / s.NH, h = heads[hh] % s.NH;
            char* f = (char*)full + ((size_t)b * s.T * K + w) * s.NH * hs + h * hs;  // (b, t = 0, w, h)
            char* u = (char*)sub + (w * n + hh) * hs;                                // (0, t = 0, w, hh)
            const auto kind = cudaMemcpyDeviceToDevice;
            if (to_sub) cudaCheck(cudaMemcpy2DAsync(u, sub_pitch, f, full_pitch, hs, s.T, kind, stream));
            else cudaCheck(cudaMemcpy2DAsync(f, full_pitch, u, sub_pitch, hs, s.T, kind, stream));
        }
}

// llmc's naive forward: P (B, NH, T, T) into att, what rung 1 reads; O into out.
inline void naive_forward(const Shape& s, void* out, void* att, const void* qkv, cudaStream_t stream) {
    const int C = s.NH * s.HS;
    DeviceBuffer ws(attention_workspace_bytes(Variant::naive, s.B, s.T, C, s.NH), "naive forward workspace");
    attention_forward_naive((floatX*)out, (floatX*)att, ws.p, (const floatX*)qkv, s.B, s.T, C, s.NH, stream);
}

// One shape: inputs, the forwards' outputs, the oracle's answers; then check() and time() per rung.
struct Problem {
    Shape s;
    bool sampled;
    std::vector<int> heads, rows, keys;  // checked heads (b·NH + h); sampled: query rows (dq) and keys (dk, dv)
    std::vector<double> ref[3];          // whole heads: dq, dk, dv (B, NH, T, HS); sampled: [head][sample][d]
    std::vector<double> ref_cat;         // dq | dk | dv, for T = 1 (see checks())
    std::vector<Range> ranges[3];
    double o_err[3] = {0, 0, 0};
    std::unique_ptr<DeviceBuffer> qkv, dout, out, lse, att, dqkv;
    std::vector<unsigned char> trainer_bits;  // dqkv of llmc's `--attention flash` backward on these inputs
    std::string trainer_engine;
    std::vector<Compared> baseline;           // rung 1's errors: the bf16 rule's baseline
    bool baseline_ok = false;
    std::string naive_skip;                   // why rung 1 cannot run at full size on this card; empty: it can
    cudaStream_t stream;

    Problem(const Shape& shape, uint64_t seed, cudaStream_t st) : s(shape), sampled(shape.T >= kSampledFromT), stream(st) {
        const int BH = s.B * s.NH, C = s.NH * s.HS;
        const size_t btc = s.elems();
        std::mt19937_64 rng(seed);
        const int n = sampled ? std::min(BH, 2) : std::min(BH, std::max(1, std::min(12, dev::heads_to_check(s))));
        std::vector<int> all(BH);
        for (int i = 0; i < BH; i++) all[i] = i;
        std::shuffle(all.begin(), all.end() - 1, rng);  // the last head always, the others at random
        heads.assign(all.begin(), all.begin() + (n - 1));
        heads.push_back(BH - 1);
        std::sort(heads.begin(), heads.end());
        std::uniform_real_distribution<float> uni(-1.f, 1.f);
        std::vector<float> h_qkv(3 * btc), h_dout(btc);
        for (float& f : h_qkv) f = harness::round_bf16(uni(rng) + 0.3f);
        for (float& f : h_dout) f = harness::round_bf16(uni(rng) + 0.3f);

        qkv = std::make_unique<DeviceBuffer>(3 * btc * 2, "qkv");
        dout = std::make_unique<DeviceBuffer>(btc * 2, "dout");
        out = std::make_unique<DeviceBuffer>(btc * 2, "out");
        lse = std::make_unique<DeviceBuffer>((size_t)BH * s.T * 4, "lse");
        dqkv = std::make_unique<DeviceBuffer>(3 * btc * 2, "dqkv");
        upload(qkv->p, h_qkv), upload(dout->p, h_dout);
        // the forwards: naive -> P (B,NH,T,T), held while rung 1 runs beside its workspace (the naive forward's
        // size), so both must fit in what is free now; else rung 1 runs on the checked heads alone
        // (baseline_on_heads). flash -> out, lse (its out is what the flash backwards read).
        size_t free_b = 0, total_b = 0;
        cudaCheck(cudaMemGetInfo(&free_b, &total_b));
        const size_t p_bytes = attention_saved_bytes(Variant::naive, s.B, s.T, s.NH),
                     need = p_bytes + attention_workspace_bytes(Variant::naive, s.B, s.T, C, s.NH);
        if (need <= free_b) {
            att = std::make_unique<DeviceBuffer>(p_bytes, "P (the naive forward's)");
            naive_forward(s, out->p, att->p, qkv->p, stream);
        } else {
            char b[160];
            snprintf(b, sizeof b, "P (B,NH,T,T) and the naive workspace need %.1f GB, this card has %.1f GB free",
                     need / 1e9, free_b / 1e9);
            naive_skip = b;
        }
        attention_forward_flash((floatX*)out->p, (float*)lse->p, (const floatX*)qkv->p, s.B, s.T, C, s.NH, AttnEngine::best, stream);
        cudaCheck(cudaStreamSynchronize(stream));

        const auto o_used = [&] {  // the flash forward's stored bf16 O, which the flash backwards form D from
            std::vector<uint16_t> bits(btc);
            cudaCheck(cudaMemcpy(bits.data(), out->p, btc * 2, cudaMemcpyDeviceToHost));
            std::vector<float> o(btc);
            for (size_t e = 0; e < btc; e++) o[e] = harness::bf16_to_float(bits[e]);
            return o;
        };
        if (sampled) {
            rows = dev::sampled_rows(s.T, rng);
            keys.assign(rows.rbegin(), rows.rend());
            const ref::SampledAttention a = ref::attention_sampled(h_qkv.data(), h_dout.data(), s.T, C, s.NH, heads, rows, keys);
            ref[0] = a.dq, ref[1] = a.dk, ref[2] = a.dv;
            for (int w = 0; w < 3; w++) ranges[w] = {{0, ref[w].size()}};
            o_err_allowance(s, h_qkv, h_dout, o_used(), heads, rows, keys, a, o_err);
        } else {
            ref::SampledAttention a;  // every row's lse and D: the allowance is taken at every row and key
            oracle_backward(s, h_qkv, h_dout, heads, ref, a);
            std::vector<int> every(s.T);
            std::iota(every.begin(), every.end(), 0);
            o_err_allowance(s, h_qkv, h_dout, o_used(), heads, every, every, a, o_err);
            for (int w = 0; w < 3; w++)
                for (int bh : heads) ranges[w].push_back({(size_t)bh * s.T * s.HS, (size_t)(bh + 1) * s.T * s.HS});
            for (auto& r : ref) ref_cat.insert(ref_cat.end(), r.begin(), r.end());
        }
        {  // the trainer's flash backward, for "the same bits as the trainer's" (information, not a check)
            DeviceBuffer ws(attention_workspace_bytes(Variant::flash, s.B, s.T, C, s.NH), "flash workspace");
            trainer_engine = engine_name(attention_engine(AttnEngine::best, Pass::backward, s.HS));
            attention_backward_flash((floatX*)dqkv->p, ws.p, (const floatX*)dout->p, (const floatX*)qkv->p,
                                     (const floatX*)out->p, (const float*)lse->p, s.B, s.T, C, s.NH, AttnEngine::best, stream);
            trainer_bits = download_bits();
        }
    }

    static void upload(void* dst, const std::vector<float>& v) {
        std::vector<uint16_t> bits(v.size());
        for (size_t e = 0; e < v.size(); e++) bits[e] = harness::bf16_bits(v[e]);
        cudaCheck(cudaMemcpy(dst, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    }
    std::vector<unsigned char> download_bits() const {
        std::vector<unsigned char> b(3 * s.elems() * 2);
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaMemcpy(b.data(), dqkv->p, b.size(), cudaMemcpyDeviceToHost));
        return b;
    }
    std::string coverage() const {
        char b[128];
        if (sampled) snprintf(b, sizeof b, "%zu of %d heads, dq at %zu rows and dk, dv at %zu keys each", heads.size(),
                              s.B * s.NH, rows.size(), keys.size());
        else snprintf(b, sizeof b, "%zu of %d heads", heads.size(), s.B * s.NH);
        return b;
    }
    AttnBwdParams params(void* workspace) const {
        return {(floatX*)dqkv->p, (const floatX*)dout->p, (const floatX*)qkv->p, (const floatX*)out->p,
                (const float*)lse->p, att ? (const floatX*)att->p : nullptr, s.B, s.NH, s.T, s.HS, workspace, stream};
    }

    // The rung's dq, dk, dv as the checks compare them: whole tensors, or the sampled heads, rows and keys.
    std::vector<harness::TensorCheck> checks() const {
        std::vector<float> g[3];
        download_grads(s, dqkv->p, g);
        const char* names[3] = {"dq", "dk", "dv"};
        std::vector<harness::TensorCheck> out_checks;
        for (int w = 0; w < 3; w++) {
            std::vector<float> got = std::move(g[w]);
            if (sampled) {  // gathered in the oracle's [head][sample][d] order
                std::vector<float> pick;
                for (int bh : heads)
                    for (int t : (w == 0 ? rows : keys))
                        for (int x = 0; x < s.HS; x++) pick.push_back(got[((size_t)bh * s.T + t) * s.HS + x]);
                got = std::move(pick);
            }
            out_checks.push_back({names[w], std::move(got), ref[w].data(), ranges[w], true, o_err[w]});
        }
        if (s.T == 1 && !sampled) {  // exact dQ = dK = 0 (P = 1, dS = 0): judge dq|dk|dv as one tensor (atol from |dv|)
            harness::TensorCheck all{"dqkv", {}, ref_cat.data(), {}, true, std::max(o_err[0], o_err[1])};
            for (int w = 0; w < 3; w++) {
                all.got.insert(all.got.end(), out_checks[w].got.begin(), out_checks[w].got.end());
                for (const Range& r : ranges[w]) all.ranges.push_back({r.first + w * s.elems(), r.second + w * s.elems()});
            }
            return {std::move(all)};
        }
        return out_checks;
    }

    // Runs rung r on poisoned dqkv and judges it; then a second run must give the same bits.
    bool check(const BwdRung& r, bool is_baseline) {
        DeviceBuffer ws(r.workspace_bytes ? r.workspace_bytes(s.B, s.NH, s.T, s.HS) : 0, "workspace");
        const AttnBwdParams p = params(ws.p);
        harness::poison(dqkv->p, 3 * s.elems() * 2, stream);
        r.run(p);
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaGetLastError());
        const std::vector<unsigned char> first = download_bits();
        const size_t nonfinite = nonfinite_bf16(first);  // the whole dqkv, whatever the oracle checks
        const std::string lbl = report::label(r) + " " + s.str() + ", oracle on " + coverage();
        const harness::Verdict v = harness::validate(lbl, checks(), is_baseline ? harness::Rule::Bf16Baseline : harness::Rule::Bf16,
                                                     is_baseline ? nullptr : &baseline);
        if (is_baseline) baseline = v.tensors, baseline_ok = v.ok;
        if (nonfinite) printf("  %s: FAIL (%zu NaN/inf elements in dqkv)\n", lbl.c_str(), nonfinite);
        r.run(p);
        const bool same = download_bits() == first;
        printf("  %s %s: second run %s; %s the trainer's bits (flash:%s)\n", report::label(r).c_str(), s.str().c_str(),
               same ? "bit-identical: PASS" : "DIFFERS: FAIL (not deterministic)",
               first == trainer_bits ? "the same as" : "differs from", trainer_engine.c_str());
        if (!is_baseline && !baseline_ok) printf("  %s: FAIL (its baseline, rung 1, failed its own check)\n", lbl.c_str());
        return v.ok && same && !nonfinite && baseline_ok;
    }

    // The bf16 rule's baseline where rung 1 does not fit at full size (naive_skip): rung 1 on a sub-problem made of
    // the checked heads alone, (1, n, T, HS), their qkv and dout gathered from the full tensors; llmc's naive forward
    // then rung 1, as at full size. Each head's attention is independent, so a head's error here is its error in
    // the full problem. Its dQ, dK, dV go back to those heads' places in a zeroed dqkv, where checks() picks them
    // (zero, not NaN, elsewhere: a whole-head check scans every head); its own dqkv is scanned for NaN/inf whole.
    void baseline_on_heads(const BwdRung& r) {
        const int n = (int)heads.size();
        const Shape sub{1, n, s.T, s.HS};
        printf(" baseline for the bf16 rule: %s on the %d checked heads alone, as %s (at %s, %s)\n",
               report::label(r).c_str(), n, sub.str().c_str(), s.str().c_str(), naive_skip.c_str());
        DeviceBuffer q(3 * sub.elems() * 2, "qkv of the checked heads");  // (1, T, 3, n, HS)
        DeviceBuffer d(sub.elems() * 2, "dout of the checked heads");      // (1, T, n, HS)
        DeviceBuffer o(sub.elems() * 2, "out of the checked heads");       // (1, T, n, HS)
        DeviceBuffer a(attention_saved_bytes(Variant::naive, 1, s.T, n), "P of the checked heads");  // (1, n, T, T)
        DeviceBuffer g(3 * sub.elems() * 2, "dqkv of the checked heads");  // (1, T, 3, n, HS)
        copy_heads(s, 3, heads, qkv->p, q.p, true, stream);
        copy_heads(s, 1, heads, dout->p, d.p, true, stream);
        naive_forward(sub, o.p, a.p, q.p, stream);
        DeviceBuffer ws(r.workspace_bytes ? r.workspace_bytes(1, n, s.T, s.HS) : 0, "workspace");
        harness::poison(g.p, 3 * sub.elems() * 2, stream);
        r.run({(floatX*)g.p, (const floatX*)d.p, (const floatX*)q.p, (const floatX*)o.p, nullptr, (const floatX*)a.p,
               1, n, s.T, s.HS, ws.p, stream});  // rung 1 reads P, not out or lse
        cudaCheck(cudaMemsetAsync(dqkv->p, 0, 3 * s.elems() * 2, stream));
        copy_heads(s, 3, heads, dqkv->p, g.p, false, stream);
        std::vector<unsigned char> bits(3 * sub.elems() * 2);
        cudaCheck(cudaMemcpyAsync(bits.data(), g.p, bits.size(), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaGetLastError());
        const std::string lbl = report::label(r) + " " + sub.str() + ", the checked heads of " + s.str();
        const harness::Verdict v =
            harness::validate(lbl + ", oracle on " + coverage(), checks(), harness::Rule::Bf16Baseline);
        const size_t nonfinite = nonfinite_bf16(bits);
        if (nonfinite) printf("  %s: FAIL (%zu NaN/inf elements in its dqkv)\n", lbl.c_str(), nonfinite);
        baseline = v.tensors, baseline_ok = v.ok && !nonfinite;
    }
    std::string baseline_note() const {  // for the report's coverage: where the baseline ran, if not at full size
        if (naive_skip.empty()) return "";
        return "; rung 1, the bf16 rule's baseline, ran on those " + std::to_string(heads.size()) + " heads alone";
    }

    report::Measured time(const BwdRung& r, double budget_s) {
        DeviceBuffer ws(r.workspace_bytes ? r.workspace_bytes(s.B, s.NH, s.T, s.HS) : 0, "workspace");
        const AttnBwdParams p = params(ws.p);
        harness::BenchOpts opts;  // 1 warm-up and at least 2 timed runs: a slow rung takes seconds per run at T = 32K
        opts.budget_s = budget_s, opts.warmup = 1, opts.min_reps = 2;
        const harness::Timing t = harness::benchmark([&] { r.run(p); }, stream, opts);
        const report::Measured m{t.median_ms, attention_backward_flops(s.B, s.NH, s.T, s.HS) / (t.median_ms * 1e9), t.reps};
        printf("  time %s %s: %.4f ms  %.2f TFLOP/s  %.2f%% of %.0f (bf16 peak, measured)  [median of %d, L2 flushed]\n",
               report::label(r).c_str(), s.str().c_str(), m.ms, m.tflops, 100 * m.tflops / report::kPeakBf16,
               report::kPeakBf16, m.reps);
        return m;
    }
};

// One cell of the table: rung r validated, then timed; or why it was skipped.
inline report::Cell cell(const BwdRung& r, Problem& p, bool timed) {
    if (!r.supports(p.s.HS)) return {"skip: head dim " + std::to_string(p.s.HS) + " not supported", {}};
    if (r.id == 1 && !p.naive_skip.empty()) return {"skip: " + p.naive_skip, {}};  // the baseline ran on the heads
    try {
        if (!p.check(r, r.id == 1)) return {"FAIL", {}};
        return {"ok", timed ? p.time(r, 0.5) : report::Measured{}};
    } catch (const Error& e) {  // e.g. no sm_90a device for rungs 5 and 6, or a workspace that does not fit
        return {std::string("skip: ") + e.what(), {}};
    }
}

// Where the time of a two-kernel wgmma backward goes: its dQ kernel (which also writes the per-tile lse, D) and its
// dK/dV kernel, each timed on its own. rung 5: both kernels of wgmma_backward.cuh head by head; rung 9: the same,
// heaviest first; rung 12: the warp-specialized dQ kernel, then rung 6's dK/dV kernel.
template <class Dq, class Dkdv>
inline void time_kernels_apart(const char* label, Problem& p, cudaStream_t stream, Dq&& dq, Dkdv&& dkdv) {
    const Shape& s = p.s;
    DeviceBuffer ws(attention_backward_d_floats(s.B, s.NH, s.T) * sizeof(float), "D");
    const AttnBwdParams q = p.params(ws.p);
    float* D = (float*)ws.p;
    for (int k = 0; k < 2; k++) {
        const harness::Timing t = harness::benchmark([&] { k == 0 ? dq(q, D) : dkdv(q, D); }, stream);
        printf("  time %s: its %s kernel alone %s: %.4f ms  [median of %d, L2 flushed]\n", label, k == 0 ? "dQ" : "dK/dV",
               s.str().c_str(), t.median_ms, t.reps);
    }
}
template <GridOrder O>
inline void time_wgmma_kernels_apart(const char* label, Problem& p, cudaStream_t stream) {
    const Shape& s = p.s;
    time_kernels_apart(label, p, stream,
        [&](const AttnBwdParams& q, float* D) {
            attention_backward_flash_wgmma_dq<O>(q.dqkv, D, q.dout, q.qkv, q.out, q.lse, s.B, s.T, s.NH, s.HS, stream);
        },
        [&](const AttnBwdParams& q, float* D) {
            attention_backward_flash_wgmma_dkdv<O>(q.dqkv, D, q.dout, q.qkv, s.B, s.T, s.NH, s.HS, stream);
        });
}

// The baseline of the bf16 rule first: rung 1 of `table`, checked on its own when it is not among `rungs`, or on
// the checked heads alone when it does not fit at full size.
template <class Table>
inline void ensure_baseline(Problem& p, const Table& table, const std::vector<const BwdRung*>& rungs) {
    const BwdRung* naive = nullptr;
    for (const BwdRung& r : table)
        if (r.id == 1 && !naive) naive = &r;
    if (!naive) fail("the RUNGS_BWD table has no rung 1 (naive): the bf16 rule needs it");
    if (!p.naive_skip.empty()) {
        p.baseline_on_heads(*naive);
        return;
    }
    for (const BwdRung* r : rungs)
        if (r->id == 1) return;  // it runs first, as the table's first entry
    printf(" baseline for the bf16 rule: %s on the same inputs\n", report::label(*naive).c_str());
    p.check(*naive, true);
}

// `runner bench --pass bwd`: every rung of rep.rungs on the backward's anchor shapes. Returns the failures.
template <class Table>
inline int bench(report::Report<BwdRung>& rep, const Table& table, uint64_t seed) {
    printf("card: %s, seed %llu, %zu rungs x %zu shapes\n", rep.card.c_str(), (unsigned long long)seed, rep.rungs.size(),
           std::size(dev::kAnchorShapes));
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    int failed = 0;
    for (const Shape& s : dev::kAnchorShapes) {
        rep.shapes.push_back(s);
        rep.cells.emplace_back();
        try {
            Problem p(s, seed + rep.shapes.size(), stream);
            rep.coverage.push_back(p.coverage() + p.baseline_note());
            printf("== %s: the oracle checks %s\n", s.str().c_str(), p.coverage().c_str());
            ensure_baseline(p, table, rep.rungs);
            for (const BwdRung* r : rep.rungs) {
                const report::Cell c = cell(*r, p, true);
                if (c.status != "ok") printf("  %s %s: %s\n", report::label(*r).c_str(), s.str().c_str(), c.status.c_str());
                failed += c.status == "FAIL";
                rep.cells.back().push_back(c);
            }
        } catch (const Error& e) {  // the shape's inputs or forwards do not fit: every rung skipped, saying why
            printf("== %s: not run: %s\n", s.str().c_str(), e.what());
            if (rep.coverage.size() < rep.shapes.size()) rep.coverage.push_back("not run");
            for (size_t k = rep.cells.back().size(); k < rep.rungs.size(); k++)
                rep.cells.back().push_back({std::string("skip: ") + e.what(), {}});
        }
    }
    cudaCheck(cudaStreamDestroy(stream));
    if (failed) printf("bench: %d rung x shape validations FAILED (marked FAIL in the tables)\n", failed);
    return failed;
}

// `runner bwd V|all [B NH T HS] [--seed S]`
template <class Table>
inline int cmd_bwd(int argc, char** argv, const Table& table) {  // argv[0] = "bwd"
    if (argc < 2) fail("usage: runner bwd V|all [B NH T HS] [--seed S]");
    std::vector<const BwdRung*> rungs;
    const bool all = !strcmp(argv[1], "all");
    const int id = all ? 0 : (int)args::parse_int("bwd V", argv[1], 1, 1000);
    for (const BwdRung& r : table)
        if (all || r.id == id) rungs.push_back(&r);
    if (rungs.empty()) fail("bwd: there is no backward rung %d (see --list)", id);
    const dev::ShapeArgs a = dev::parse_shape_args("bwd", argc, argv, 3);
    std::vector<Shape> shapes;  // validated in order; the last one is also timed
    if (!a.shape) {
        for (int hs : {64, 128})
            for (Shape s : {Shape{1, 1, 1, hs}, Shape{1, 2, 2, hs}, Shape{2, 3, 17, hs}, Shape{1, 2, 63, hs},
                            Shape{2, 2, 65, hs}, Shape{1, 2, 1000, hs}, Shape{1, 1, 2047, hs}})
                shapes.push_back(s);
        shapes.push_back({4, 12, 1024, 64});
    } else {
        shapes.push_back(*a.shape);
    }
    printf("card: %s, seed %llu\n", dev::card_name().c_str(), (unsigned long long)a.seed);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    bool all_ok = true;
    for (size_t c = 0; c < shapes.size(); c++) {
        const Shape& s = shapes[c];
        const bool timed = c + 1 == shapes.size();
        Problem p(s, a.seed + c, stream);
        printf("== %s: the oracle checks %s\n", s.str().c_str(), p.coverage().c_str());
        ensure_baseline(p, table, rungs);
        for (const BwdRung* r : rungs) {
            const report::Cell cl = cell(*r, p, timed);
            if (cl.status == "FAIL") all_ok = false;
            else if (cl.status != "ok") {
                printf("  %s %s: %s\n", report::label(*r).c_str(), s.str().c_str(), cl.status.c_str());
                if (a.shape && !all) all_ok = false;  // a shape asked for by name must run
            }
        }
        if (timed && attention_backward_flash_wgmma_supports(s.HS)) {  // where rung 5's (9's, 12's) time goes
            if (all || id == 5) time_wgmma_kernels_apart<GridOrder::head_major>("5 hopper_wgmma", p, stream);
            if (all || id == 9) time_wgmma_kernels_apart<GridOrder::heaviest_first>("9 heaviest_first", p, stream);
            if (all || id == 12)
                time_kernels_apart("12 dq_warp_specialized", p, stream,
                    [&](const AttnBwdParams& q, float* D) {
                        attention_backward_flash_wgmma_dq_ws(q.dqkv, D, q.dout, q.qkv, q.out, q.lse, s.B, s.T, s.NH,
                                                             s.HS, stream);
                    },
                    [&](const AttnBwdParams& q, float* D) {
                        attention_backward_flash_wgmma_dkdv_ws(q.dqkv, D, q.dout, q.qkv, s.B, s.T, s.NH, s.HS, stream);
                    });
        }
    }
    cudaCheck(cudaStreamDestroy(stream));
    printf(all_ok ? "bwd: all checks passed\n" : "bwd: FAILED (see FAIL lines above)\n");
    return all_ok ? 0 : 1;
}

}  // namespace bwd_runner
