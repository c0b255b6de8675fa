// The whole reference model and its optimizer:
//   * the gradient of the mean loss w.r.t. all 16 parameter tensors vs central finite differences (double);
//   * float and double instantiations agree;
//   * GPT-2 initialization (statistics, padding, determinism, loss ≈ ln V);
//   * bad calls throw; AdamW and gradient clipping against numbers computed by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <omp.h>
#include <set>
#include <string>

#include "llmc/ref/ref.h"
#include "test/cpu/ref_check.h"
#include "test/cpu/seed.h"

using namespace flashgpt2;
using namespace flashgpt2::test;
using std::vector;

namespace {

// Small and odd on purpose: no size is a multiple of another, T < maxT, V < Vp.
GPT2Config tiny_config() {
    GPT2Config c;
    c.max_seq_len = 7, c.vocab_size = 13, c.padded_vocab_size = 16, c.num_layers = 2, c.num_heads = 2, c.channels = 8;
    return c;
}

// Up to k distinct random indices in [begin, end).
vector<size_t> sample_indices(size_t begin, size_t end, size_t k, Rng& rng) {
    vector<size_t> all;
    for (size_t i = begin; i < end; i++) all.push_back(i);
    for (size_t i = all.size(); i > 1; i--) std::swap(all[i - 1], all[rng.next_u32() % i]);  // Fisher-Yates
    if (all.size() > k) all.resize(k);
    return all;
}

}  // namespace

TEST_CASE("ref GPT2: the gradient of the loss matches finite differences for all 16 tensors") {
    const GPT2Config cfg = tiny_config();
    const int B = 2, T = 5;
    Rng rng(flashgpt2::testing::test_seed("ref GPT2: gradient vs finite differences", 1234));
    ref::GPT2<double> model(cfg);
    // Weights far larger than GPT-2's init, so that every path (attention, GELU's curve, layernorm gains)
    // carries a gradient of order one; shifted from zero mean like every input here.
    model.params = random_vec(model.params.size(), rng, 0.1, 0.5);
    vector<int> inp = random_tokens(B * T, cfg.vocab_size, rng), tgt = random_tokens(B * T, cfg.vocab_size, rng);

    const double loss0 = model.forward(inp.data(), tgt.data(), B, T);
    REQUIRE(std::isfinite(loss0));
    model.zero_grad();
    model.backward();
    const vector<double> grads = model.grads;
    auto loss = [&] { return model.forward(inp.data(), tgt.data(), B, T); };

    const auto sizes = parameter_sizes(cfg);
    size_t off = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        // wte: sample only the V real rows (padded rows only reach ignored logits: both gradients are 0)
        const size_t end = off + (i == WTE ? (size_t)cfg.vocab_size * cfg.channels : sizes[i]);
        check_grad(PARAMETER_NAMES[i], model.params, grads, loss, sample_indices(off, end, 150, rng));
        off += sizes[i];
    }
    // padded wte rows: exactly zero gradient
    for (size_t j = (size_t)cfg.vocab_size * cfg.channels; j < sizes[0]; j++) CHECK(grads[j] == 0.0);

    // backward accumulates: a second call without zero_grad doubles every gradient
    model.forward(inp.data(), tgt.data(), B, T);
    model.backward();
    vector<double> twice(grads.size());
    for (size_t j = 0; j < grads.size(); j++) twice[j] = 2 * grads[j];
    CHECK(rel_error(model.grads, twice) <= 1e-12);  // equal up to the rounding of the extra additions
}

TEST_CASE("ref GPT2: float and double instantiations agree") {
    // A config big enough for Eigen's blocked matmul paths, still not a multiple of any block size.
    GPT2Config cfg;
    cfg.max_seq_len = 24, cfg.vocab_size = 101, cfg.padded_vocab_size = 128, cfg.num_layers = 2,
    cfg.num_heads = 3, cfg.channels = 36;
    const int B = 3, T = 19;
    Rng rng(flashgpt2::testing::test_seed("ref GPT2: float vs double", 99));
    ref::GPT2<double> md(cfg);
    ref::GPT2<float> mf(cfg);
    md.init_random(7);
    for (size_t j = 0; j < md.params.size(); j++) md.params[j] += 0.05 * rng.next_normal();  // past the init
    for (size_t j = 0; j < md.params.size(); j++) mf.params[j] = (float)md.params[j];
    for (size_t j = 0; j < md.params.size(); j++) md.params[j] = (double)mf.params[j];  // identical inputs
    vector<int> inp = random_tokens(B * T, cfg.vocab_size, rng), tgt = random_tokens(B * T, cfg.vocab_size, rng);

    const double ld = md.forward(inp.data(), tgt.data(), B, T);
    const float lf = mf.forward(inp.data(), tgt.data(), B, T);
    md.zero_grad(), mf.zero_grad();
    md.backward(), mf.backward();
    // float carries 24 bits (eps 6e-8); the longest sums here have ~100 terms and errors compound
    // through a dozen layers, so per-tensor relative errors of ~1e-6 are expected. 2e-5 bounds that with
    // margin and still fails for any real difference between the two code paths (they are one template).
    CHECK(std::abs(lf - ld) <= 2e-5 * ld);
    const auto sizes = parameter_sizes(cfg);
    size_t off = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        vector<double> gd(md.grads.begin() + off, md.grads.begin() + off + sizes[i]);
        vector<double> gf(mf.grads.begin() + off, mf.grads.begin() + off + sizes[i]);
        const double err = rel_error(gf, gd);
        INFO(std::string(PARAMETER_NAMES[i]) << " relative error " << err);
        CHECK(err <= 2e-5);
        off += sizes[i];
    }
}

TEST_CASE("ref GPT2: init_random follows GPT-2's initialization, draws as llm.c, and is deterministic") {
    GPT2Config cfg;
    cfg.max_seq_len = 32, cfg.vocab_size = 250, cfg.padded_vocab_size = 256, cfg.num_layers = 2,
    cfg.num_heads = 4, cfg.channels = 64;
    ref::GPT2<float> m(cfg), m2(cfg), m3(cfg);
    m.init_random(42), m2.init_random(42), m3.init_random(43);
    CHECK(m.params == m2.params);
    CHECK(m.params != m3.params);

    auto p = m.param_ptrs();
    const auto sizes = parameter_sizes(cfg);
    auto stats = [&](int i, size_t n, double& mean, double& sd) {
        double s = 0, s2 = 0;
        for (size_t j = 0; j < n; j++) s += p[i][j], s2 += (double)p[i][j] * p[i][j];
        mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
    };
    const double resid = 0.02 / std::sqrt(2.0 * cfg.num_layers);
    const struct { int i; double sd; } weights[] = {{WTE, 0.02}, {WPE, 0.02}, {QKVW, 0.02},
                                                     {ATTPROJW, resid}, {FCW, 0.02}, {FCPROJW, resid}};
    for (auto w : weights) {
        double mean, sd;
        const size_t n = w.i == WTE ? (size_t)cfg.vocab_size * cfg.channels : sizes[w.i];
        stats(w.i, n, mean, sd);
        // >= 8192 samples each: the sample std is within ~1.5% of the true one and the mean within
        // ~3 std/sqrt(n) ≈ 0.03 std; 10% and 0.1 std are safe bounds that a wrong scale still breaks.
        INFO(std::string(PARAMETER_NAMES[w.i]) << " mean " << mean << " std " << sd);
        CHECK(std::abs(sd - w.sd) <= 0.1 * w.sd);
        CHECK(std::abs(mean) <= 0.1 * w.sd);
    }
    for (size_t j = (size_t)cfg.vocab_size * cfg.channels; j < sizes[WTE]; j++) CHECK(p[WTE][j] == 0.0f);
    for (int i : {LN1W, LN2W, LNFW})
        for (size_t j = 0; j < sizes[i]; j++) CHECK(p[i][j] == 1.0f);
    for (int i : {LN1B, QKVB, ATTPROJB, LN2B, FCB, FCPROJB, LNFB})
        for (size_t j = 0; j < sizes[i]; j++) CHECK(p[i][j] == 0.0f);

    // llm.c's draws in llm.c's order: wte, wpe, then per layer qkvw, attprojw, fcw, fcprojw (all sizes here are
    // multiples of 16, so a tensor's first 16 values come from the 16 outputs at its start in the stream)
    auto first16 = [&](size_t skip, float std) {
        std::mt19937 g(42);
        g.discard(skip);
        vector<float> x(16);
        torch_normal(x.data(), 16, 0.0f, std, g);
        return x;
    };
    auto head = [](const float* t) { return vector<float>(t, t + 16); };
    const size_t L = cfg.num_layers, C = cfg.channels, VC = (size_t)cfg.vocab_size * C;
    CHECK(head(p[WTE]) == first16(0, 0.02f));
    CHECK(head(p[WPE]) == first16(VC, 0.02f));
    const size_t layer = (3 + 1 + 4 + 4) * C * C;  // one layer's qkvw, attprojw, fcw, fcprojw
    CHECK(head(p[QKVW] + 3 * C * C) == first16(VC + sizes[WPE] + layer, 0.02f));  // layer 1
    CHECK(head(p[FCPROJW] + 4 * C * C) == first16(VC + sizes[WPE] + layer + 8 * C * C, 0.02f * (1.0f / sqrtf(2.0f * L))));
    // small weights give near-uniform predictions: the loss starts at ln V (GPT-2 124M: ln 50257 ≈ 10.82)
    Rng rng(flashgpt2::testing::test_seed("ref GPT2: init loss inputs", 5));
    vector<int> inp = random_tokens(4 * 16, cfg.vocab_size, rng), tgt = random_tokens(4 * 16, cfg.vocab_size, rng);
    const float loss = m.forward(inp.data(), tgt.data(), 4, 16);
    CHECK(std::abs(loss - std::log((float)cfg.vocab_size)) <= 0.05f);
}

TEST_CASE("ref GPT2: sampling forward, and bad calls throw clear errors") {
    const GPT2Config cfg = tiny_config();
    ref::GPT2<float> m(cfg);
    m.init_random(1);
    vector<int> inp = {1, 2, 3, 4, 5, 6, 7}, tgt = {2, 3, 4, 5, 6, 7, 8};
    CHECK(m.forward(inp.data(), nullptr, 1, 7) == -1.0f);  // no targets: probabilities only
    double psum = 0;
    for (int i = 0; i < cfg.vocab_size; i++) psum += m.probs_at(0, 6)[i];
    CHECK(std::abs(psum - 1.0) <= 1e-5);
    CHECK_THROWS_WITH_AS(m.backward(), doctest::Contains("had no targets"), Error);

    vector<int> eight(8, 1);
    CHECK_THROWS_WITH_AS(m.forward(eight.data(), eight.data(), 1, 8), doctest::Contains("exceeds"), Error);
    inp[2] = cfg.vocab_size;  // one past the last token
    CHECK_THROWS_WITH_AS(m.forward(inp.data(), tgt.data(), 1, 7), doctest::Contains("out of range"), Error);
    inp[2] = 3, tgt[4] = -1;
    CHECK_THROWS_WITH_AS(m.forward(inp.data(), tgt.data(), 1, 7), doctest::Contains("out of range"), Error);

    GPT2Config bad = cfg;
    bad.channels = 9;  // not divisible by 2 heads
    CHECK_THROWS_WITH_AS(ref::GPT2<float>{bad}, doctest::Contains("divisible"), Error);
}

TEST_CASE("ref AdamW: two steps against a hand computation, decay only on the weight matrices") {
    // C=V=Vp=L=NH=maxT=1: 29 parameters, every tensor non-empty.
    GPT2Config cfg{1, 1, 1, 1, 1, 1};
    const size_t n = num_parameters(cfg);
    REQUIRE(n == 29);
    vector<float> p(n, 1.0f), g(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
    ref::AdamW hp;
    hp.lr = 0.1f, hp.weight_decay = 0.1f;
    ref::adamw_update(p, g, m, v, cfg, hp, 1);
    // step 1: m = 0.05, v = 0.0125, mhat = g, vhat = g^2: the update is lr (sign(g) + wd p)
    //   decayed: 1 - 0.1 (1 + 0.1) = 0.89     not decayed: 1 - 0.1 = 0.9
    // step 2 with g = -0.25: m = 0.9*0.05 - 0.1*0.25 = 0.02, v = 0.95*0.0125 + 0.05*0.0625 = 0.015,
    //   mhat = 0.02/0.19, vhat = 0.015/0.0975, mhat/sqrt(vhat) = 0.26836945...
    //   decayed: 0.89 - 0.1 (0.26836945 + 0.1*0.89) = 0.85426306   not decayed: 0.9 - 0.026836945 = 0.87316306
    const auto sizes = parameter_sizes(cfg);
    auto each_param = [&](auto check) {  // check(tensor index, flat index) for every parameter
        size_t off = 0;
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++)
            for (size_t j = 0; j < sizes[i]; j++) check(i, off++);
    };
    each_param([&](int i, size_t k) { CHECK(p[k] == doctest::Approx(parameter_decays(i) ? 0.89 : 0.9).epsilon(1e-6)); });
    std::fill(g.begin(), g.end(), -0.25f);
    ref::adamw_update(p, g, m, v, cfg, hp, 2);
    each_param([&](int i, size_t k) {
        CHECK(m[k] == doctest::Approx(0.02).epsilon(1e-6));
        CHECK(v[k] == doctest::Approx(0.015).epsilon(1e-6));
        CHECK(p[k] == doctest::Approx(parameter_decays(i) ? 0.85426306 : 0.87316306).epsilon(1e-6));
    });
    CHECK_THROWS_WITH_AS(ref::adamw_update(p, g, m, v, cfg, hp, 0), doctest::Contains("start at 1"), Error);
    m.pop_back();
    CHECK_THROWS_WITH_AS(ref::adamw_update(p, g, m, v, cfg, hp, 3), doctest::Contains("29 parameters"), Error);
}

TEST_CASE("ref AdamW: every element its own gradient, and the decay mask by name, against a scalar AdamW here") {
    // The test above feeds every element the same gradient, so an update that read one gradient per tensor, or
    // a decay mask that also decayed the layernorm gains, would pass it. Here each element has its own values,
    // and the expected update is this test's own double-precision loop over GPT-2's decay rule as written in
    // GPT-2 / llm.c: the 2-D weight matrices decay; biases, layernorm gains and shifts do not.
    const std::set<std::string> decayed = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"};
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const std::string name = PARAMETER_NAMES[i];
        CAPTURE(name);
        CHECK(parameter_decays(i) == (decayed.count(name) == 1));
    }
    GPT2Config cfg{3, 5, 8, 2, 1, 4};  // maxT 3, V 5, Vp 8, L 2, NH 1, C 4
    const size_t n = num_parameters(cfg);
    Rng rng(flashgpt2::testing::test_seed("ref AdamW: per-element inputs", 31));
    vector<float> p(n), g(n), m(n), v(n);
    for (size_t k = 0; k < n; k++) {
        p[k] = 0.5f + (float)rng.next_normal(), g[k] = 0.2f + (float)rng.next_normal();
        m[k] = 0.1f * (float)rng.next_normal(), v[k] = 0.05f * rng.next_f32();
    }
    ref::AdamW hp;
    hp.lr = 0.01f, hp.weight_decay = 0.3f;
    const int t = 3;
    vector<double> want_p(n), want_m(n), want_v(n), size_p(n), size_m(n);  // size_*: the terms' magnitude
    const auto sizes = parameter_sizes(cfg);
    size_t k = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const double wd = decayed.count(PARAMETER_NAMES[i]) ? 0.3 : 0.0;
        for (size_t j = 0; j < sizes[i]; j++, k++) {
            want_m[k] = 0.9 * m[k] + 0.1 * g[k];
            want_v[k] = 0.95 * v[k] + 0.05 * (double)g[k] * g[k];
            const double mhat = want_m[k] / (1 - std::pow(0.9, t)), vhat = want_v[k] / (1 - std::pow(0.95, t));
            want_p[k] = p[k] - 0.01 * (mhat / (std::sqrt(vhat) + 1e-8) + wd * p[k]);
            size_m[k] = 0.9 * std::abs(m[k]) + 0.1 * std::abs(g[k]);
            size_p[k] = std::abs(p[k]) + 0.01 * (std::abs(mhat) / std::sqrt(vhat) + wd * std::abs(p[k]));
        }
    }
    ref::adamw_update(p, g, m, v, cfg, hp, t);
    // float arithmetic against double: each result within a few float epsilons (1.2e-7) of its terms' size.
    // A gradient read from the wrong element moves a parameter by ~1e-3 of its size and a moment by ~100%;
    // decaying a gain that must not decay moves it by lr * wd = 3e-3 of its size.
    k = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const std::string name = PARAMETER_NAMES[i];
        CAPTURE(name);
        double worst = 0;  // the largest error in the tensor, in float epsilons of the terms' size
        for (size_t j = 0; j < sizes[i]; j++, k++) {
            worst = std::max(worst, std::abs(p[k] - want_p[k]) / (1.2e-7 * size_p[k]));
            worst = std::max(worst, std::abs(m[k] - want_m[k]) / (1.2e-7 * size_m[k]));
            worst = std::max(worst, std::abs(v[k] - want_v[k]) / (1.2e-7 * want_v[k]));
        }
        CHECK(worst <= 8);
    }
}

TEST_CASE("ref gradient norm: the same bits for any number of threads") {
    // In double, where a sum's order shows in the last bits (a float norm rounds most such differences away):
    // an OpenMP reduction splits the sum by the thread count and adds the partials as threads finish.
    Rng rng(flashgpt2::testing::test_seed("ref gradient norm: values", 32));
    vector<double> g(200000);
    for (double& x : g) x = rng.next_normal();
    const int threads = omp_get_max_threads();
    std::vector<double> norms;
    for (int nt : {1, 2, 3, 7}) {
        omp_set_num_threads(nt);
        norms.push_back(ref::global_grad_norm(g));
    }
    omp_set_num_threads(threads);
    for (double x : norms) CHECK(x == norms[0]);
    double want = 0;  // and it is the norm
    for (double x : g) want += x * x;
    CHECK(norms[0] == doctest::Approx(std::sqrt(want)).epsilon(1e-12));
}

TEST_CASE("ref gradient norm and clipping against a hand computation") {
    vector<double> g = {3.0, 0.0, -4.0};
    CHECK(ref::global_grad_norm(g) == doctest::Approx(5.0));
    CHECK(ref::clip_grads(g, 10.0) == doctest::Approx(5.0));  // under the limit: untouched
    CHECK(g == vector<double>{3.0, 0.0, -4.0});
    CHECK(ref::clip_grads(g, 1.0) == doctest::Approx(5.0));  // returns the norm before clipping
    CHECK(g[0] == doctest::Approx(0.6));
    CHECK(g[2] == doctest::Approx(-0.8));
    CHECK(ref::global_grad_norm(g) == doctest::Approx(1.0));
    vector<float> gf = {1e20f, 1e20f};  // squares overflow float: the sum is done in double
    CHECK(std::isfinite(ref::global_grad_norm(gf)));
}
