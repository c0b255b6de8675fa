// Attention's GPU tests: naive (S and P in HBM) and flash (tiled, lse saved), forward and backward, against
// ref::attention_forward/backward in double. Shapes cover T = 1, T that is a multiple of no tile (the
// flash tiles are 32 and 64 rows), several tiles, GPT-2 small's 12 heads of 64, and every head size the
// flash path takes (16, 32, 64, 128). Every flash engine this build and card run (wgmma, mma, fp32: llmc/
// attention.cuh) is asked for by name on each pass it supports, under the same rule, and plain `flash` must pick
// the best one. The wgmma forward gets odd T (1, 37, 67, 257, 301, 2051), both head sizes, more work items
// than SMs (its dynamic scheduler) and Br 192 tiles (T >= 2048), and back-to-back launches (its self-resetting
// work counter).
#include "test/gpu/gpu_check.h"

#include "llmc/ref/attention_sampled.h"
#include "llmc/ref/ref.h"

using namespace flashgpt2;
using namespace flashgpt2::gtest;

namespace {

struct AttnShape {
    int B, T, C, NH;
};
const AttnShape ATTN_SHAPES[] = {
    {2, 37, 96, 3},     // HS 32, T a multiple of nothing
    {2, 37, 128, 2},    // HS 64
    {3, 1, 128, 2},     // T = 1
    {1, 130, 768, 12},  // GPT-2 small's heads; three 64-row tiles, five 32-row tiles
    {1, 257, 64, 1},    // one long head
    {1, 67, 256, 2},    // HS 128
    {2, 20, 64, 4},     // HS 16
    {2, 37, 256, 2},    // HS 128, T odd
    {2, 1, 256, 2},     // HS 128, T = 1
    {1, 257, 256, 2},   // HS 128, several 128-row tiles
    {4, 301, 768, 12},  // Hopper: 48 heads x 3 query tiles = 144 work items > 132 SMs (dynamic scheduler)
    {1, 2051, 128, 2},  // Hopper HS 64 with 192-row tiles (T >= 2048), last tile partial
};

// lse[bh, i] = log sum_{j <= i} exp(S[bh, i, j]) from the oracle's scaled scores (B, NH, T, T).
std::vector<double> lse_of(const std::vector<double>& preatt, int BH, int T) {
    std::vector<double> lse((size_t)BH * T);
    for (int bh = 0; bh < BH; bh++)
        for (int i = 0; i < T; i++) {
            const double* s = preatt.data() + ((size_t)bh * T + i) * T;
            double m = s[0];
            for (int j = 1; j <= i; j++) m = std::max(m, s[j]);
            double l = 0;
            for (int j = 0; j <= i; j++) l += std::exp(s[j] - m);
            lse[(size_t)bh * T + i] = m + std::log(l);
        }
    return lse;
}

}  // namespace

TEST_CASE("attention: forward and backward, naive and flash") {
    for (const AttnShape& a : ATTN_SHAPES) {
        const int B = a.B, T = a.T, C = a.C, NH = a.NH, HS = C / NH, BH = B * NH;
        const size_t btc = (size_t)B * T * C;
        const std::string tag = "B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
                                " HS=" + std::to_string(HS);
        Rng rng(seed_for("attention " + tag));
        auto qkv = random_x(3 * btc, rng, 0.3, 1.0), dout = random_x(btc, rng);

        std::vector<double> out_ref(btc), preatt((size_t)BH * T * T), att_ref(preatt.size());
        ref::attention_forward(out_ref.data(), preatt.data(), att_ref.data(), qkv.data(), B, T, C, NH);
        const auto lse_ref = lse_of(preatt, BH, T);
        std::vector<double> dqkv_ref(3 * btc, 0.0), dpreatt(preatt.size(), 0.0), datt(preatt.size(), 0.0);
        ref::attention_backward(dqkv_ref.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(), att_ref.data(),
                                B, T, C, NH);

        const KernelSet naive = KernelSet::all(Variant::naive), flash;
        Dev<floatX> d_qkv(3 * btc), d_dout(btc), d_out(btc), d_dqkv(3 * btc), d_att((size_t)BH * T * T);
        Dev<float> d_lse((size_t)BH * T);
        Dev<char> ws(std::max(workspace_bytes(naive, B, T, C, NH, 8), workspace_bytes(flash, B, T, C, NH, 8)));
        REQUIRE(attention_saved_bytes(naive, B, T, NH) == d_att.n * sizeof(floatX));
        REQUIRE(attention_saved_bytes(flash, B, T, NH) == d_lse.n * sizeof(float));
        put(d_qkv, qkv), put(d_dout, dout);

        // naive: out, the saved P, dqkv
        attention_forward(ops(naive, ws), d_out, d_att, d_qkv, B, T, C, NH);
        const auto out_naive = get(d_out), att_naive = get(d_att);
        attention_backward(ops(naive, ws), d_dqkv, d_dout, d_qkv, d_out, d_att, B, T, C, NH);
        const auto dqkv_naive = get(d_dqkv);
        // P is bf16 in the BF16 build, computed from S rounded to bf16: the sanity bound (see gpu_check.h).
        check_single("attention P (naive) " + tag, att_naive, att_ref, rule::BF16_SANITY_REL);

        // `--attention flash` must dispatch the best engine this card runs (a silent fallback would leave the
        // fast one untested): wgmma on an sm_90 device in the BF16 build (HS 64 and 128, both passes), else mma
        // at HS 64 in the BF16 build, else fp32.
        const bool bf16_sm90 = BF16_BUILD && device_is_sm90();
        const AttnEngine want = bf16_sm90 && (HS == 64 || HS == 128) ? AttnEngine::wgmma
                                : BF16_BUILD && HS == 64                ? AttnEngine::mma
                                                                        : AttnEngine::fp32;
        CHECK_MESSAGE(attention_engine(AttnEngine::best, Pass::forward, HS) == want, "forward engine, " << tag);
        CHECK_MESSAGE(attention_engine(AttnEngine::best, Pass::backward, HS) == want, "backward engine, " << tag);

        // Every engine, asked for by name, on each pass it runs at this head size.
        for (AttnEngine e : ATTN_ENGINES) {
            const bool fwd = !attention_engine_unsupported(e, Pass::forward, HS);
            const bool bwd = !attention_engine_unsupported(e, Pass::backward, HS);
            if (!fwd && !bwd) continue;
            const AttnEngine fwd_engine = fwd ? e : AttnEngine::best;  // a forward for the backward's inputs
            const std::string name = std::string(" [flash:") + engine_name(e) + "] " + tag;
            d_out.poison(), d_lse.poison(), d_dqkv.poison();
            attention_forward_flash(d_out, d_lse, d_qkv, B, T, C, NH, fwd_engine, 0);
            const auto out_flash = get(d_out), lse_flash = get(d_lse);
            if (fwd) {
                check_naive_flash("attention out" + name, out_naive, out_flash, out_ref);
                // lse is fp32 arithmetic on the same bf16 q, k the oracle sees: ~1e-6; 1e-4 leaves margin.
                check_single("attention lse" + name, lse_flash, lse_ref, 1e-4);
                // launched twice back to back on one stream: the same bits (the wgmma kernel's work counter
                // must have reset itself, or the second launch would leave NaN rows)
                const auto out_bytes = bytes(d_out), lse_bytes = bytes(d_lse);
                d_out.poison(), d_lse.poison();
                attention_forward_flash(d_out, d_lse, d_qkv, B, T, C, NH, e, 0);
                attention_forward_flash(d_out, d_lse, d_qkv, B, T, C, NH, e, 0);
                CHECK_MESSAGE((out_bytes == bytes(d_out) && lse_bytes == bytes(d_lse)),
                              "attention_forward_flash differs when launched back to back" << name);
            }
            if (!bwd) continue;
            attention_backward_flash(d_dqkv, ws, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, e, 0);
            const auto dqkv_flash = get(d_dqkv);
            check_naive_flash("attention dqkv" + name, dqkv_naive, dqkv_flash, dqkv_ref);
            // deterministic: the backward again, bit for bit
            const auto first = bytes(d_dqkv);
            d_dqkv.poison();
            attention_backward_flash(d_dqkv, ws, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, e, 0);
            CHECK_MESSAGE(first == bytes(d_dqkv), "attention_backward_flash is not deterministic" << name);
        }
    }
}

TEST_CASE("attention: the flash path rejects head sizes it has no kernel for, before launching") {
    Dev<floatX> qkv(3 * 2 * 48), out(2 * 48);
    Dev<float> lse(2);
    CHECK_THROWS_WITH_AS(attention_forward(ops(KernelSet{}, nullptr), out, lse, qkv, 1, 2, 48, 1),
                         doctest::Contains("head size 48"), Error);
}

namespace {

// The same samples out of the GPU's tensors: out (1,T,NH,HS) at `rows`, lse (1,NH,T) at `rows`, and one third
// of dqkv (1,T,3,NH,HS) (which = 0, 1, 2) at `ts`, in the oracle's [head][sample][d] order.
std::vector<double> gather(const std::vector<double>& t, int C, int NH, int which, int thirds, const std::vector<int>& ts) {
    const int HS = C / NH;
    std::vector<double> g;
    for (int h = 0; h < NH; h++)
        for (int i : ts)
            for (int d = 0; d < HS; d++) g.push_back(t[((size_t)i * thirds + which) * C + (size_t)h * HS + d]);
    return g;
}

}  // namespace

TEST_CASE("attention at long T (4096, 16384): naive and flash against the oracle on sampled rows and keys") {
    struct LongShape { int T, C, NH; };
    for (const LongShape a : {LongShape{4096, 128, 2}, LongShape{4096, 256, 2}, LongShape{16384, 64, 1}}) {
        const int T = a.T, C = a.C, NH = a.NH, HS = C / NH;
        const std::string tag = "T=" + std::to_string(T) + " NH=" + std::to_string(NH) + " HS=" + std::to_string(HS);
        Rng rng(seed_for("attention long " + tag));
        const auto qkv = random_x(3 * (size_t)T * C, rng, 0.3, 1.0), dout = random_x((size_t)T * C, rng);
        // the edges, both sides of the 64- and 128-row tile boundaries, the middle, and 24 at random
        std::vector<int> rows = {0, 1, 63, 64, 127, 128, T / 2, T - 2, T - 1};
        for (int s = 0; s < 24; s++) rows.push_back((int)(rng.next_u32() % (uint32_t)T));
        std::vector<int> keys = rows;
        std::reverse(keys.begin(), keys.end());
        MESSAGE(tag << ": the oracle checks " << rows.size() << " query rows and " << keys.size() << " keys per head");
        std::vector<int> heads(NH);
        for (int h = 0; h < NH; h++) heads[h] = h;
        const ref::SampledAttention want = ref::attention_sampled(qkv.data(), dout.data(), T, C, NH, heads, rows, keys);

        const KernelSet naive = KernelSet::all(Variant::naive), flash;
        Dev<floatX> d_qkv(3 * (size_t)T * C), d_dout((size_t)T * C), d_out((size_t)T * C), d_dqkv(3 * (size_t)T * C);
        Dev<floatX> d_att((size_t)NH * T * T);
        Dev<float> d_lse((size_t)NH * T);
        Dev<char> ws(std::max(workspace_bytes(naive, 1, T, C, NH, 8), workspace_bytes(flash, 1, T, C, NH, 8)));
        put(d_qkv, qkv), put(d_dout, dout);
        struct Got { std::vector<double> out, dqkv; };
        auto run = [&](const KernelSet& ks, void* saved) {
            d_out.poison(), d_dqkv.poison();
            attention_forward(ops(ks, ws), d_out, saved, d_qkv, 1, T, C, NH);
            attention_backward(ops(ks, ws), d_dqkv, d_dout, d_qkv, d_out, saved, 1, T, C, NH);
            return Got{get(d_out), get(d_dqkv)};
        };
        const Got n = run(naive, d_att), f = run(flash, d_lse);
        const std::string name = " [flash:" + std::string(engine_name(attention_engine(AttnEngine::best, Pass::forward, HS))) +
                                 "/" + engine_name(attention_engine(AttnEngine::best, Pass::backward, HS)) + "] " + tag;
        check_naive_flash("attention out" + name, gather(n.out, C, NH, 0, 1, rows), gather(f.out, C, NH, 0, 1, rows), want.o);
        std::vector<double> lse_got;
        const auto lse = get(d_lse);
        for (int h = 0; h < NH; h++)
            for (int i : rows) lse_got.push_back(lse[(size_t)h * T + i]);
        check_single("attention lse" + name, lse_got, want.lse, 1e-4);
        const std::pair<const char*, std::pair<int, const std::vector<double>*>> grads[] = {
            {"dq", {0, &want.dq}}, {"dk", {1, &want.dk}}, {"dv", {2, &want.dv}}};
        for (const auto& [what, g] : grads) {
            const std::vector<int>& at = g.first == 0 ? rows : keys;
            check_naive_flash(std::string("attention ") + what + name, gather(n.dqkv, C, NH, g.first, 3, at),
                              gather(f.dqkv, C, NH, g.first, 3, at), *g.second);
        }
    }
}
