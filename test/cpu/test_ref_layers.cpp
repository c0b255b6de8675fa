// The reference layers (llmc/ref) checked two ways, in double:
//   forward:  against a direct loop written from the formula (or known values), outputs poisoned with NaN;
//   backward: every input/weight gradient against central finite differences of the scalar
//             L = sum(out * R) for a fixed random R (so dout = R), at small odd sizes that are not
//             multiples of anything. Gradient buffers start with random values, not zeros, so the
//             test also proves that backward accumulates (+=) instead of overwriting.
// Tolerances: FD_TOL (ref_check.h) for gradients; forwards compare two double evaluations of the same
// formula in a different order, equal to ~1e-15 relative, so 1e-12 is generous yet catches any bug.
#include <doctest/doctest.h>

#include <cmath>

#include "llmc/ref/attention_sampled.h"
#include "llmc/ref/ref.h"
#include "test/cpu/ref_check.h"
#include "test/cpu/seed.h"

using namespace flashgpt2;
using namespace flashgpt2::test;
using std::vector;

namespace {
constexpr int B = 2, T = 5, C = 12, NH = 3, V = 11, Vp = 16, N = B * T;
constexpr double FWD_TOL = 1e-12;
}  // namespace

TEST_CASE("ref encoder: forward gathers wte+wpe, backward matches finite differences") {
    Rng rng(flashgpt2::testing::test_seed("ref encoder", 101));
    const int maxT = 7;
    vector<double> wte = random_vec(Vp * C, rng), wpe = random_vec(maxT * C, rng), R = random_vec(N * C, rng);
    vector<int> inp = random_tokens(N, V, rng);
    inp[3] = inp[1] = inp[7];  // a repeated token: its wte row must collect several gradients

    auto out = nan_vec<double>(N * C);
    ref::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++)
                CHECK(out[(b * T + t) * C + i] == wte[inp[b * T + t] * C + i] + wpe[t * C + i]);

    auto loss = [&] {
        vector<double> o(N * C);
        ref::encoder_forward(o.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
        return dot(o, R);
    };
    vector<double> dwte0 = random_vec(wte.size(), rng), dwpe0 = random_vec(wpe.size(), rng);
    vector<double> dwte = dwte0, dwpe = dwpe0;
    ref::encoder_backward(dwte.data(), dwpe.data(), R.data(), inp.data(), B, T, C);
    // only rows that occur get a gradient: check the used rows of wte (FD of the unused ones is 0 anyway)
    vector<size_t> used;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) used.push_back((size_t)inp[n] * C + i);
    check_grad("dwte", wte, minus(dwte, dwte0), loss, used);
    vector<size_t> used_pos;
    for (size_t i = 0; i < (size_t)T * C; i++) used_pos.push_back(i);
    check_grad("dwpe", wpe, minus(dwpe, dwpe0), loss, used_pos);
    // rows never touched must be left exactly as they were
    vector<double> d = minus(dwte, dwte0);
    double untouched = 0;
    for (int r = 0; r < Vp; r++) {
        bool seen = false;
        for (int n = 0; n < N; n++) seen |= inp[n] == r;
        if (!seen)
            for (int i = 0; i < C; i++) untouched += std::abs(d[r * C + i]);
    }
    CHECK(untouched == 0.0);
    CHECK(minus(dwpe, dwpe0)[(T + 1) * C] == 0.0);  // wpe rows past T get nothing
}

TEST_CASE("ref layernorm: forward normalizes, backward matches finite differences") {
    Rng rng(flashgpt2::testing::test_seed("ref layernorm", 202));
    vector<double> x = random_vec(N * C, rng, 0.5, 2.0), w = random_vec(C, rng, 1.0, 0.3), b = random_vec(C, rng);
    vector<double> R = random_vec(N * C, rng);
    auto out = nan_vec<double>(N * C), mean = nan_vec<double>(N), rstd = nan_vec<double>(N);
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += x[n * C + i] / C;
        for (int i = 0; i < C; i++) v += (x[n * C + i] - m) * (x[n * C + i] - m) / C;
        const double s = 1.0 / std::sqrt(v + 1e-5);
        CHECK(std::abs(mean[n] - m) <= FWD_TOL * std::abs(m));
        CHECK(std::abs(rstd[n] - s) <= FWD_TOL * s);
        for (int i = 0; i < C; i++) {
            const double want = (x[n * C + i] - m) * s * w[i] + b[i];
            CHECK(std::abs(out[n * C + i] - want) <= FWD_TOL * (1 + std::abs(want)));
        }
    }
    auto loss = [&] {
        vector<double> o(N * C), mu(N), rs(N);
        ref::layernorm_forward(o.data(), mu.data(), rs.data(), x.data(), w.data(), b.data(), N, C);
        return dot(o, R);
    };
    vector<double> dx0 = random_vec(x.size(), rng), dw0 = random_vec(C, rng), db0 = random_vec(C, rng);
    vector<double> dx = dx0, dw = dw0, db = db0;
    ref::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    check_grad("dinp", x, minus(dx, dx0), loss);
    check_grad("dw", w, minus(dw, dw0), loss);
    check_grad("db", b, minus(db, db0), loss);
}

TEST_CASE("ref matmul: forward is inp @ w^T + bias, backward matches finite differences") {
    Rng rng(flashgpt2::testing::test_seed("ref matmul", 303));
    // OC < N and OC > N: the two ways matmul_forward splits its work between threads
    for (int OC : {7, 17})
    for (bool with_bias : {true, false}) {
        CAPTURE(OC);
        CAPTURE(with_bias);
        vector<double> x = random_vec(N * C, rng), w = random_vec(OC * C, rng), bias = random_vec(OC, rng);
        vector<double> R = random_vec(N * OC, rng);
        const double* bp = with_bias ? bias.data() : nullptr;
        auto out = nan_vec<double>(N * OC);
        ref::matmul_forward(out.data(), x.data(), w.data(), bp, N, C, OC);
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                double want = with_bias ? bias[o] : 0.0;
                for (int i = 0; i < C; i++) want += x[n * C + i] * w[o * C + i];
                CHECK(std::abs(out[n * OC + o] - want) <= FWD_TOL * (1 + std::abs(want)));
            }
        auto loss = [&] {
            vector<double> o(N * OC);
            ref::matmul_forward(o.data(), x.data(), w.data(), bp, N, C, OC);
            return dot(o, R);
        };
        vector<double> dx0 = random_vec(x.size(), rng), dw0 = random_vec(w.size(), rng), db0 = random_vec(OC, rng);
        vector<double> dx = dx0, dw = dw0, db = db0;
        ref::matmul_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, R.data(), x.data(), w.data(), N, C, OC);
        check_grad("dinp", x, minus(dx, dx0), loss);
        check_grad("dw", w, minus(dw, dw0), loss);
        if (with_bias) check_grad("dbias", bias, minus(db, db0), loss);
    }
}

TEST_CASE("ref attention: forward is causal softmax(QK^T/sqrt(HS)) V, backward matches finite differences") {
    Rng rng(flashgpt2::testing::test_seed("ref attention", 404));
    const int HS = C / NH;
    vector<double> qkv = random_vec(N * 3 * C, rng), R = random_vec(N * C, rng);
    auto out = nan_vec<double>(N * C), preatt = nan_vec<double>(B * NH * T * T), att = nan_vec<double>(B * NH * T * T);
    ref::attention_forward(out.data(), preatt.data(), att.data(), qkv.data(), B, T, C, NH);
    CHECK(all_finite(preatt));  // the masked upper triangle is written too
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                // the textbook loop, one query row at a time
                vector<double> s(t + 1);
                double mx = -1e300, sum = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    s[t2] = 0;
                    for (int i = 0; i < HS; i++)
                        s[t2] += qkv[(b * T + t) * 3 * C + h * HS + i] * qkv[(b * T + t2) * 3 * C + C + h * HS + i];
                    s[t2] /= std::sqrt((double)HS);
                    mx = std::max(mx, s[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++) sum += std::exp(s[t2] - mx);
                const double* arow = &att[((b * NH + h) * T + t) * T];
                for (int t2 = 0; t2 < T; t2++) {
                    const double p = t2 <= t ? std::exp(s[t2] - mx) / sum : 0.0;
                    CHECK(std::abs(arow[t2] - p) <= FWD_TOL);
                    if (t2 <= t) CHECK(std::abs(preatt[((b * NH + h) * T + t) * T + t2] - s[t2]) <= FWD_TOL * (1 + std::abs(s[t2])));
                }
                for (int i = 0; i < HS; i++) {
                    double want = 0;
                    for (int t2 = 0; t2 <= t; t2++)
                        want += std::exp(s[t2] - mx) / sum * qkv[(b * T + t2) * 3 * C + 2 * C + h * HS + i];
                    CHECK(std::abs(out[(b * T + t) * C + h * HS + i] - want) <= FWD_TOL * (1 + std::abs(want)));
                }
            }
    auto loss = [&] {
        vector<double> o(N * C), pa(B * NH * T * T), a(B * NH * T * T);
        ref::attention_forward(o.data(), pa.data(), a.data(), qkv.data(), B, T, C, NH);
        return dot(o, R);
    };
    vector<double> dqkv0 = random_vec(qkv.size(), rng), dqkv = dqkv0;
    vector<double> dpreatt(att.size(), 0.0), datt = random_vec(att.size(), rng);  // datt not zero: must not leak
    ref::attention_backward(dqkv.data(), dpreatt.data(), datt.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
    check_grad("dqkv", qkv, minus(dqkv, dqkv0), loss);
    // dpreatt is the gradient w.r.t. the scores: zero above the diagonal, and each row sums to zero
    // (softmax is invariant to adding a constant to a row's scores).
    for (int r = 0; r < B * NH * T; r++) {
        const int t = r % T;
        double rowsum = 0;
        for (int t2 = 0; t2 < T; t2++) {
            rowsum += dpreatt[r * T + t2];
            if (t2 > t) CHECK(dpreatt[r * T + t2] == 0.0);
        }
        CHECK(std::abs(rowsum) <= 1e-12);
    }
}

TEST_CASE("ref attention_sampled: o, lse, dq at sampled rows and dk, dv at sampled keys are the whole reference's") {
    // the oracle the attention runners use where T x T per head is too big: the same numbers, element by element
    Rng rng(flashgpt2::testing::test_seed("ref attention_sampled", 405));
    const int HS = C / NH;
    vector<double> qkv = random_vec(N * 3 * C, rng), dout = random_vec(N * C, rng);
    vector<double> out(N * C), preatt(B * NH * T * T), att(B * NH * T * T), dqkv(N * 3 * C, 0.0);
    vector<double> dpreatt(att.size(), 0.0), datt(att.size(), 0.0);
    ref::attention_forward(out.data(), preatt.data(), att.data(), qkv.data(), B, T, C, NH);
    ref::attention_backward(dqkv.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    const vector<int> heads = {1, 5}, rows = {0, 4, 2, 2}, keys = {4, 0, 3};  // b·NH + h; repeats allowed
    const ref::SampledAttention a = ref::attention_sampled(qkv.data(), dout.data(), T, C, NH, heads, rows, keys);
    REQUIRE(a.o.size() == heads.size() * rows.size() * HS);
    REQUIRE(a.lse.size() == heads.size() * rows.size());
    REQUIRE(a.dk.size() == heads.size() * keys.size() * HS);
    auto near = [](double got, double want) { return std::abs(got - want) <= FWD_TOL * (1 + std::abs(want)); };
    for (size_t hh = 0; hh < heads.size(); hh++) {
        const int b = heads[hh] / NH, h = heads[hh] % NH;
        for (size_t r = 0; r < rows.size(); r++) {
            const int t = rows[r];
            const double* sc = &preatt[((size_t)heads[hh] * T + t) * T];  // scaled scores, causal prefix 0..t
            double m = sc[0], sum = 0;
            for (int t2 = 1; t2 <= t; t2++) m = std::max(m, sc[t2]);
            for (int t2 = 0; t2 <= t; t2++) sum += std::exp(sc[t2] - m);
            CHECK(near(a.lse[hh * rows.size() + r], m + std::log(sum)));
            for (int d = 0; d < HS; d++) {
                const size_t at = (hh * rows.size() + r) * HS + d;
                CHECK(near(a.o[at], out[((size_t)b * T + t) * C + h * HS + d]));
                CHECK(near(a.dq[at], dqkv[((size_t)b * T + t) * 3 * C + h * HS + d]));
            }
        }
        for (size_t r = 0; r < keys.size(); r++)
            for (int d = 0; d < HS; d++) {
                const size_t at = (hh * keys.size() + r) * HS + d, src = ((size_t)b * T + keys[r]) * 3 * C + h * HS + d;
                CHECK(near(a.dk[at], dqkv[src + C]));
                CHECK(near(a.dv[at], dqkv[src + 2 * C]));
            }
    }
}

TEST_CASE("ref gelu: known values, backward matches finite differences") {
    Rng rng(flashgpt2::testing::test_seed("ref gelu", 505));
    // GELU's tanh formula at 0, 1 and -2, evaluated independently with Python's math module in double
    const double xs[3] = {0.0, 1.0, -2.0}, want[3] = {0.0, 0.8411919906082768, -0.04540230591222494}, *px = xs;
    double got[3];
    ref::gelu_forward(got, px, 3);
    for (int i = 0; i < 3; i++) CHECK(std::abs(got[i] - want[i]) <= 1e-12);
    const int M = 37;
    vector<double> x = random_vec(M, rng, 0.2, 1.5), R = random_vec(M, rng);
    auto loss = [&] {
        vector<double> o(M);
        ref::gelu_forward(o.data(), x.data(), M);
        return dot(o, R);
    };
    vector<double> dx0 = random_vec(M, rng), dx = dx0;
    ref::gelu_backward(dx.data(), x.data(), R.data(), M);
    check_grad("dinp", x, minus(dx, dx0), loss);
}

TEST_CASE("ref residual: forward adds, backward matches finite differences") {
    Rng rng(flashgpt2::testing::test_seed("ref residual", 606));
    const int M = 29;
    vector<double> a = random_vec(M, rng), b = random_vec(M, rng), R = random_vec(M, rng);
    auto out = nan_vec<double>(M);
    ref::residual_forward(out.data(), a.data(), b.data(), M);
    for (int i = 0; i < M; i++) CHECK(out[i] == a[i] + b[i]);
    auto loss = [&] {
        vector<double> o(M);
        ref::residual_forward(o.data(), a.data(), b.data(), M);
        return dot(o, R);
    };
    vector<double> da0 = random_vec(M, rng), db0 = random_vec(M, rng), da = da0, db = db0;
    ref::residual_backward(da.data(), db.data(), R.data(), M);
    check_grad("da", a, minus(da, da0), loss);
    check_grad("db", b, minus(db, db0), loss);
}

TEST_CASE("ref crossentropy+softmax: probabilities, loss, backward vs finite differences, padding ignored") {
    Rng rng(flashgpt2::testing::test_seed("ref crossentropy", 707));
    vector<double> logits = random_vec(N * Vp, rng, 0.3, 2.0);
    for (int n = 0; n < N; n++)
        for (int i = V; i < Vp; i++) logits[n * Vp + i] = 50.0 + i;  // padding: huge, must be ignored
    vector<int> targets = random_tokens(N, V, rng);
    vector<double> dl = random_vec(N, rng);  // dloss per position
    auto probs = nan_vec<double>(N * Vp), losses = nan_vec<double>(N);
    ref::crossentropy_softmax_forward(losses.data(), probs.data(), logits.data(), targets.data(), B, T, V, Vp);
    for (int n = 0; n < N; n++) {
        double mx = -1e300, sum = 0, psum = 0;
        for (int i = 0; i < V; i++) mx = std::max(mx, logits[n * Vp + i]);
        for (int i = 0; i < V; i++) sum += std::exp(logits[n * Vp + i] - mx);
        for (int i = 0; i < V; i++) {
            CHECK(std::abs(probs[n * Vp + i] - std::exp(logits[n * Vp + i] - mx) / sum) <= FWD_TOL);
            psum += probs[n * Vp + i];
        }
        for (int i = V; i < Vp; i++) CHECK(probs[n * Vp + i] == 0.0);
        CHECK(std::abs(psum - 1.0) <= FWD_TOL);
        CHECK(std::abs(losses[n] + std::log(probs[n * Vp + targets[n]])) <= FWD_TOL);
    }
    auto loss = [&] {
        vector<double> p(N * Vp), l(N);
        ref::crossentropy_softmax_forward(l.data(), p.data(), logits.data(), targets.data(), B, T, V, Vp);
        return dot(l, dl);
    };
    vector<double> dz0 = random_vec(logits.size(), rng), dz = dz0;
    ref::crossentropy_softmax_backward(dz.data(), dl.data(), probs.data(), targets.data(), B, T, V, Vp);
    vector<size_t> real;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < V; i++) real.push_back(n * Vp + i);
    check_grad("dlogits", logits, minus(dz, dz0), loss, real);
    vector<double> d = minus(dz, dz0);
    for (int n = 0; n < N; n++)
        for (int i = V; i < Vp; i++) CHECK(d[n * Vp + i] == 0.0);  // padded columns get no gradient

    // targets == nullptr: probabilities only, losses untouched
    vector<double> l2(N, 7.0), p2 = nan_vec<double>(N * Vp);
    ref::crossentropy_softmax_forward(l2.data(), p2.data(), logits.data(), (const int*)nullptr, B, T, V, Vp);
    CHECK(l2 == vector<double>(N, 7.0));
    CHECK(p2 == probs);
}
