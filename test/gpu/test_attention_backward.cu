// The flash attention backward on its own (every engine this build and card run: llmc/attention/
// wgmma_backward.cuh on an H100/H200, mma_backward.cuh, fp32_backward.cuh), against ref::attention_backward in
// double and the project's rule (llmc/correctness.h). Its inputs are the
// oracle's own forward results, out rounded to floatX and lse, so a forward error cannot hide or cause a
// backward one. Head sizes 64 and 128 (the tensor-core paths), T = 1, 2, a multiple of no tile, exactly one and
// just over one 64-row tile, several tiles, 1000; dQ, dK and dV are judged separately (a bug in one cannot hide
// behind the other two), then the backward runs again and must give the same bits (no floating-point atomics).
// Every engine is asked for by name, and the mma engine also runs with both of its dK/dV blocks (8 and 4
// warps); the wgmma engine's two kernels of wgmma_backward.cuh run in both grid orders too (head by head, and
// heaviest first across heads: at head size 64 the engine picks one by the grid's length), which must give the
// same bits, the engine's own where it runs them (at head size 128 its dQ kernel is the warp-specialized one), and
// its fused kernel with dQ made by the consumers and by a dQ warpgroup (dQ summed in fixed point: other bits, the
// same on every run; a NaN input must still reach dQ, the last case).
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "test/gpu/gpu_check.h"

#include "llmc/ref/ref.h"

using namespace flashgpt2;
using namespace flashgpt2::gtest;

namespace {

struct BwdShape {
    int B, T, C, NH;
};
const BwdShape BWD_SHAPES[] = {
    {1, 1, 64, 1},     // T = 1: one key, P = 1, dS = 0
    {2, 2, 128, 2},    // T = 2
    {2, 37, 128, 2},   // T a multiple of no tile
    {1, 64, 64, 1},    // exactly one 64-row tile
    {1, 65, 128, 2},   // one row into the second tile
    {1, 257, 192, 3},  // five tiles, the last with one row; 3 heads
    {2, 200, 768, 12}, // GPT-2 small's heads, B > 1
    {1, 1000, 128, 2}, // long: many tiles, the dK/dV blocks see up to 16 query tiles
    {1, 1, 128, 1},    // HS 128 (two 128-byte panels per row): T = 1
    {2, 37, 256, 2},   // HS 128, T a multiple of no tile, B > 1
    {1, 65, 256, 2},   // HS 128, one row into the second tile
    {1, 1000, 384, 3}, // HS 128, many tiles, 3 heads
    {2, 1100, 1024, 8},// HS 128, 144 work items of 128 queries, more than the SMs: some persistent blocks take two
};

// One third of dqkv (B,T,3,C): which = 0 (dq), 1 (dk), 2 (dv), as (B,T,C).
std::vector<double> third(const std::vector<double>& dqkv, int B, int T, int C, int which) {
    std::vector<double> r((size_t)B * T * C);
    for (size_t bt = 0; bt < (size_t)B * T; bt++)
        for (int c = 0; c < C; c++) r[bt * C + c] = dqkv[bt * 3 * C + (size_t)which * C + c];
    return r;
}

}  // namespace

TEST_CASE("attention backward (flash): odd T, dQ/dK/dV each against the oracle, deterministic") {
    for (const BwdShape& a : BWD_SHAPES) {
        const int B = a.B, T = a.T, C = a.C, NH = a.NH, BH = B * NH;
        const size_t btc = (size_t)B * T * C;
        const std::string tag = "B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
                                " HS=" + std::to_string(C / NH);
        Rng rng(seed_for("attention backward " + tag));
        auto qkv = random_x(3 * btc, rng, 0.3, 1.0), dout = random_x(btc, rng);

        // the oracle: forward (out, P, lse), then backward
        std::vector<double> out_ref(btc), preatt((size_t)BH * T * T), att_ref(preatt.size());
        ref::attention_forward(out_ref.data(), preatt.data(), att_ref.data(), qkv.data(), B, T, C, NH);
        std::vector<double> lse_ref((size_t)BH * T);
        for (size_t row = 0; row < lse_ref.size(); row++) {  // lse = log sum_{j <= i} exp(S_ij), row i = row % T
            const int i = (int)(row % T);
            const double* s = preatt.data() + row * T;
            double m = s[0], l = 0;
            for (int j = 1; j <= i; j++) m = std::max(m, s[j]);
            for (int j = 0; j <= i; j++) l += std::exp(s[j] - m);
            lse_ref[row] = m + std::log(l);
        }
        std::vector<double> dqkv_ref(3 * btc, 0.0), dpreatt(preatt.size(), 0.0), datt(preatt.size(), 0.0);
        ref::attention_backward(dqkv_ref.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(), att_ref.data(),
                                B, T, C, NH);

        const KernelSet naive = KernelSet::all(Variant::naive), flash;
        Dev<floatX> d_qkv(3 * btc), d_dout(btc), d_out(btc), d_dqkv(3 * btc), d_att((size_t)BH * T * T);
        Dev<float> d_lse((size_t)BH * T);
        Dev<char> ws(std::max(workspace_bytes(naive, B, T, C, NH, 8), workspace_bytes(flash, B, T, C, NH, 8)));
        put(d_qkv, qkv), put(d_dout, dout);

        // naive in the same precision: the baseline of the bf16 rule (its forward also gives the saved P)
        attention_forward(ops(naive, ws), d_out, d_att, d_qkv, B, T, C, NH);
        attention_backward(ops(naive, ws), d_dqkv, d_dout, d_qkv, d_out, d_att, B, T, C, NH);
        const auto dqkv_naive = get(d_dqkv);

        // flash, from the oracle's out (rounded to floatX, as a forward would store it) and lse
        put(d_out, rounded_x(out_ref)), put(d_lse, lse_ref);
        std::vector<std::pair<std::string, std::function<void()>>> kernels;
        for (AttnEngine e : ATTN_ENGINES)
            if (!attention_engine_unsupported(e, Pass::backward, C / NH))
                kernels.push_back({tag + " [flash:" + engine_name(e) + "]", [&, e] {
                    attention_backward_flash(d_dqkv, ws, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, e, 0);
                }});
#if !defined(ENABLE_FP32)
        float* D = WorkspaceCarver(ws).take<float>(attention_backward_d_floats(B, NH, T));
        for (int w : {8, 4})
            if (C / NH == 64)  // the mma engine's head size
                kernels.push_back({tag + " (mma.sync, dK/dV block of " + std::to_string(w) + " warps)", [&, D, w] {
                    attention_backward_flash_mma(d_dqkv, D, d_dout, d_qkv, d_out, d_lse, B, T, NH, C / NH, 0, w);
                }});
        const std::string head_major = tag + " (wgmma, grid head by head)", heaviest_first = tag + " (wgmma, grid heaviest first)";
        Dev<char> ws_fused(fixed_dq::workspace_bytes(B, NH, T, C / NH));
        if (attention_backward_flash_wgmma_supports(C / NH)) {
            kernels.push_back({tag + " (wgmma, fused, dQ in fixed point by the consumers)", [&] {
                attention_backward_flash_wgmma_fused<DqBy::consumers>(d_dqkv, ws_fused, d_dout, d_qkv, d_out, d_lse, B, T,
                                                                      NH, C / NH, 0);
            }});
            if (C / NH == 64)  // (the dQ warpgroup's head size)
                kernels.push_back({tag + " (wgmma, fused, dQ in fixed point by a dQ warpgroup)", [&] {
                    attention_backward_flash_wgmma_fused<DqBy::warpgroup>(d_dqkv, ws_fused, d_dout, d_qkv, d_out, d_lse, B,
                                                                          T, NH, C / NH, 0);
                }});
            kernels.push_back({head_major, [&, D] {
                attention_backward_flash_wgmma_in<GridOrder::head_major>(d_dqkv, D, d_dout, d_qkv, d_out, d_lse, B, T, NH,
                                                                         C / NH, 0);
            }});
            kernels.push_back({heaviest_first, [&, D] {
                attention_backward_flash_wgmma_in<GridOrder::heaviest_first>(d_dqkv, D, d_dout, d_qkv, d_out, d_lse, B, T,
                                                                             NH, C / NH, 0);
            }});
        }
#endif
        // The wgmma engine's bits, and its two kernels' in head-by-head order: where the engine runs those two kernels
        // (head size 64 below the fused kernel's T) both grid orders must give the engine's bits; at head size 128 its
        // dQ kernel is the warp-specialized one (other bits), and the heaviest-first order must match head by head.
        std::vector<unsigned char> wgmma_bits, head_major_bits;
        for (const auto& named : kernels) {
            const std::string& name = named.first;
            auto run = [&] {
                d_dqkv.poison();
                named.second();
            };
            run();
            const auto dqkv_flash = get(d_dqkv);
            // At T = 1 the exact dQ and dK are 0 (one key: P = 1, dS = P (dP - D) = 0), and the flash kernel's
            // dP - D is a difference of two fp32 sums in different orders (~1e-6, not 0), so the rule's atol, a
            // fraction of max|ref|, is taken over the whole dqkv there, as test_attention.cu does.
            const char* names[3] = {"dq", "dk", "dv"};
            if (T == 1)
                check_naive_flash("attention backward dqkv " + name, dqkv_naive, dqkv_flash, dqkv_ref);
            else
                for (int w = 0; w < 3; w++)
                    check_naive_flash(std::string("attention backward ") + names[w] + " " + name,
                                      third(dqkv_naive, B, T, C, w), third(dqkv_flash, B, T, C, w),
                                      third(dqkv_ref, B, T, C, w));

            const auto first = bytes(d_dqkv);  // deterministic: again, bit for bit
            run();
            CHECK_MESSAGE(first == bytes(d_dqkv), "attention backward (flash) is not deterministic: " << name);
            if (name == tag + " [flash:wgmma]") wgmma_bits = first;
#if !defined(ENABLE_FP32)
            if (name == head_major) {
                head_major_bits = first;
                const bool two_kernels = C / NH == 64 && !attention_backward_flash_wgmma_fused_here(T, C / NH);
                REQUIRE_MESSAGE(!wgmma_bits.empty(), "the wgmma engine ran before its two kernels");
                if (two_kernels)
                    CHECK_MESSAGE(first == wgmma_bits, "the wgmma engine and its two kernels give different bits: " << name);
            }
            if (name == heaviest_first) {  // the same blocks' work in either order: the same bits
                REQUIRE_MESSAGE(!head_major_bits.empty(), "the head-by-head order ran before the heaviest-first one");
                CHECK_MESSAGE(first == head_major_bits, "the wgmma backward's grid orders give different bits: " << name);
            }
#endif
        }
    }
}

#if !defined(ENABLE_FP32)
// The fused kernel turns dQ's shares into integers, and no integer is NaN: a NaN input must still reach dQ (the
// row's scale is NaN, and the last pass writes NaN there), not turn into a finite gradient.
TEST_CASE("attention backward (wgmma, fused): a NaN in dO, lse or K reaches dQ") {
    const int B = 1, T = 200, NH = 2, C = 128, HS = C / NH;
    if (!attention_backward_flash_wgmma_supports(HS)) {
        MESSAGE("skipped (not passed): needs an sm_90a build on an H100/H200");
        return;
    }
    const size_t btc = (size_t)B * T * C;
    Rng rng(seed_for("attention backward fused NaN"));
    Dev<floatX> d_qkv(3 * btc), d_dout(btc), d_out(btc), d_dqkv(3 * btc);
    Dev<float> d_lse((size_t)B * NH * T);
    Dev<char> ws(fixed_dq::workspace_bytes(B, NH, T, HS));
    const auto qkv = random_x(3 * btc, rng, 0.3, 1.0), dout = random_x(btc, rng);
    const int row = 77, h = 1;  // the poisoned query row of head h (and key, for K)
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const std::string names[3] = {"dO", "lse", "K"};  // (doctest prints a const char* as a pointer)
    for (int c = 0; c < 6; c++) {  // dO, lse, K with dQ made by the consumers, then by a dQ warpgroup
        const int what = c % 3;
        const DqBy by = c < 3 ? DqBy::consumers : DqBy::warpgroup;
        auto q = qkv, o = dout;
        if (what == 0) o[(size_t)row * C + h * HS + 5] = nan;
        if (what == 2) q[(size_t)row * 3 * C + C + h * HS + 5] = nan;
        put(d_qkv, q), put(d_dout, o);
        attention_forward_flash(d_out, d_lse, d_qkv, B, T, C, NH, AttnEngine::best, 0);
        if (what == 1) {
            auto lse = get(d_lse);
            lse[(size_t)h * T + row] = nan;
            put(d_lse, lse);
        }
        cudaCheck(cudaMemset(d_dqkv.p, 0x3F, d_dqkv.n * sizeof(floatX)));  // finite: a NaN below is the kernels'
        if (by == DqBy::consumers)
            attention_backward_flash_wgmma_fused<DqBy::consumers>(d_dqkv, ws, d_dout, d_qkv, d_out, d_lse, B, T, NH, HS, 0);
        else
            attention_backward_flash_wgmma_fused<DqBy::warpgroup>(d_dqkv, ws, d_dout, d_qkv, d_out, d_lse, B, T, NH, HS, 0);
        const auto g = get(d_dqkv);
        const auto finite_dq = [&](int t) {
            for (int d = 0; d < HS; d++)
                if (!std::isfinite(g[(size_t)t * 3 * C + h * HS + d])) return false;
            return true;
        };
        const std::string who = by == DqBy::consumers ? " (dQ by the consumers)" : " (dQ by a dQ warpgroup)";
        CHECK_MESSAGE(!finite_dq(row), "a NaN in " << names[what] << " (row " << row << ") left that row of dQ finite" << who);
        if (what < 2)  // (a NaN in K marks the whole head: its max |K| is NaN)
            CHECK_MESSAGE(finite_dq(row - 1),
                          "a NaN in " << names[what] << " of row " << row << " reached row " << row - 1 << who);
    }
}
#endif
