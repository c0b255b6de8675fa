// The online softmax update (Milakov & Gimelshein 2018, arXiv:1805.02867) that rungs 2–7 of the
// attention ladder are built on, as a tiny C++ struct — the same update doc/attention/2_online_softmax.md
// shows — checked on the page's worked example and against the ordinary two-pass softmax.
#include <doctest/doctest.h>
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "test/cpu/seed.h"

namespace {

// Running statistics of one softmax row, fed one block of scores at a time.
struct OnlineSoftmax {
    double m = -INFINITY;  // running max of the scores seen so far
    double l = 0;          // running sum of exp(score - m)
    std::vector<double> o; // running Σ exp(score - m) · v (unnormalized output row)

    // Folds in a block of scores s[j] (with value rows v[j], may be empty); returns the factor
    // exp(m_old - m_new) by which the old l and o were rescaled.
    double update(const std::vector<double>& s, const std::vector<std::vector<double>>& v = {}) {
        const double m_new = std::max(m, *std::max_element(s.begin(), s.end()));
        const double rescale = std::exp(m - m_new);  // 0 for the first block: exp(-inf)
        l *= rescale;
        for (double& x : o) x *= rescale;
        for (size_t j = 0; j < s.size(); j++) {
            const double p = std::exp(s[j] - m_new);
            l += p;
            if (!v.empty()) {
                o.resize(v[j].size(), 0.0);
                for (size_t d = 0; d < v[j].size(); d++) o[d] += p * v[j][d];
            }
        }
        m = m_new;
        return rescale;
    }
    double lse() const { return m + std::log(l); }
};

// The two-pass softmax, for comparison: max first, then the sum.
double two_pass_sum(const std::vector<double>& s, double m) {
    double l = 0;
    for (double x : s) l += std::exp(x - m);
    return l;
}

}  // namespace

TEST_CASE("online softmax: the worked example of doc/attention/2_online_softmax.md") {
    OnlineSoftmax r;
    const double first = r.update({1, 3});
    CHECK(first == 0.0);  // nothing to rescale yet, and no NaN from exp(-inf - 3)
    CHECK(r.m == 3.0);
    CHECK(r.l == doctest::Approx(std::exp(-2.0) + 1.0));  // e^(1-3) + e^(3-3) ≈ 1.135
    CHECK(r.l == doctest::Approx(1.135).epsilon(1e-3));

    const double rescale = r.update({2, 5});
    CHECK(r.m == 5.0);
    CHECK(rescale == doctest::Approx(0.135).epsilon(2e-3));  // e^(3-5)
    CHECK(r.l == doctest::Approx(1.203).epsilon(1e-3));      // 1.135·0.135 + e^(2-5) + e^(5-5)

    // Same as computing the max of all four scores first, then one sum.
    CHECK(r.l == doctest::Approx(two_pass_sum({1, 3, 2, 5}, 5.0)).epsilon(1e-12));
    CHECK(r.lse() == doctest::Approx(std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(5.0))).epsilon(1e-12));
}

TEST_CASE("online softmax: any block split gives the two-pass softmax and output") {
    std::mt19937 rng((uint32_t)flashgpt2::testing::test_seed("online softmax: block splits", 20240520));
    std::uniform_real_distribution<double> uni(-4, 4);
    const int n = 37, dim = 3;
    std::vector<double> s(n);
    std::vector<std::vector<double>> v(n, std::vector<double>(dim));
    for (int j = 0; j < n; j++) {
        s[j] = uni(rng) + 0.5 * j / n * 8;  // drifting upward, so the max changes many times
        for (double& x : v[j]) x = uni(rng);
    }
    // reference: two-pass softmax and P·V
    const double m = *std::max_element(s.begin(), s.end());
    const double l = two_pass_sum(s, m);
    std::vector<double> o_ref(dim, 0.0);
    for (int j = 0; j < n; j++)
        for (int d = 0; d < dim; d++) o_ref[d] += std::exp(s[j] - m) / l * v[j][d];

    for (int block : {1, 2, 5, 16, 37}) {  // 1 = rung 2 (a key at a time), larger = rungs 3+ (tiles)
        CAPTURE(block);
        OnlineSoftmax r;
        for (int j0 = 0; j0 < n; j0 += block) {
            const int j1 = std::min(n, j0 + block);
            r.update(std::vector<double>(s.begin() + j0, s.begin() + j1),
                     std::vector<std::vector<double>>(v.begin() + j0, v.begin() + j1));
        }
        CHECK(r.m == m);
        CHECK(r.l == doctest::Approx(l).epsilon(1e-12));
        CHECK(r.lse() == doctest::Approx(m + std::log(l)).epsilon(1e-12));
        for (int d = 0; d < dim; d++) CHECK(r.o[d] / r.l == doctest::Approx(o_ref[d]).epsilon(1e-12));
    }
}
