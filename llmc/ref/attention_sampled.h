// The oracle, part 2b: causal attention on SAMPLED rows and keys, for sequences too long for the whole T×T
// reference (llmc/ref/attention.h materializes (T, T) per head). In double, llm.c's layouts: qkv (B, T, 3C),
// dout (B, T, C). For each checked head: every row's lse_i and D_i = Σ_j P_ij dP_ij over its visible keys
// (one O(T²·HS) pass, rows in parallel: lse_i needs all of row i, and dK_j, dV_j need P_ij of every query
// i >= j), then O_i and dQ_i of the sampled queries and dK_j, dV_j of the sampled keys, O(T·HS) each.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace flashgpt2::ref {

struct SampledAttention {
    std::vector<double> o, lse, dq, dk, dv;  // [head][sample][d] (lse: [head][sample]), heads and samples in order
    std::vector<double> lse_all, D_all;      // [head][t]: every row's lse_i and D_i = dO_i · O_i
};

// heads: b·NH + h of the heads to check; rows: the query rows whose o, lse and dq are wanted; keys: the key rows
// whose dk, dv are wanted (both in 0..T-1, repeats allowed).
template <class In>
SampledAttention attention_sampled(const In* qkv, const In* dout, int T, int C, int NH, const std::vector<int>& heads,
                                   const std::vector<int>& rows, const std::vector<int>& keys) {
    const int HS = C / NH;
    const double scale = 1.0 / std::sqrt((double)HS);
    SampledAttention r;
    for (int bh : heads) {
        const int b = bh / NH, h = bh % NH;
        // x(t, w): q (w = 0), k (1) or v (2) of position t; dO(t): dout of position t; this head's columns
        auto x = [&](int t, int w) { return &qkv[(((size_t)b * T + t) * 3 + w) * C + (size_t)h * HS]; };
        auto dO = [&](int t) { return &dout[((size_t)b * T + t) * C + (size_t)h * HS]; };
        auto dot = [&](const In* a, const In* c) {
            double s = 0;
            for (int d = 0; d < HS; d++) s += (double)a[d] * (double)c[d];
            return s;
        };
        std::vector<double> lse(T), D(T);
#pragma omp parallel for schedule(dynamic, 16)
        for (int i = 0; i < T; i++) {
            double m = -INFINITY, l = 0, dd = 0;
            for (int j = 0; j <= i; j++) m = std::max(m, scale * dot(x(i, 0), x(j, 1)));
            for (int j = 0; j <= i; j++) {
                const double p = std::exp(scale * dot(x(i, 0), x(j, 1)) - m);
                l += p;
                dd += p * dot(dO(i), x(j, 2));
            }
            lse[i] = m + std::log(l);
            D[i] = dd / l;
        }
        r.lse_all.insert(r.lse_all.end(), lse.begin(), lse.end());
        r.D_all.insert(r.D_all.end(), D.begin(), D.end());
        auto P = [&](int i, int j) { return std::exp(scale * dot(x(i, 0), x(j, 1)) - lse[i]); };
        for (int i : rows) {
            std::vector<double> o(HS, 0.0), dq(HS, 0.0);
            for (int j = 0; j <= i; j++) {
                const double p = P(i, j), ds = p * (dot(dO(i), x(j, 2)) - D[i]);
                for (int d = 0; d < HS; d++) o[d] += p * x(j, 2)[d], dq[d] += scale * ds * x(j, 1)[d];
            }
            r.o.insert(r.o.end(), o.begin(), o.end());
            r.dq.insert(r.dq.end(), dq.begin(), dq.end());
            r.lse.push_back(lse[i]);
        }
        for (int j : keys) {
            std::vector<double> dk(HS, 0.0), dv(HS, 0.0);
            for (int i = j; i < T; i++) {
                const double p = P(i, j), ds = p * (dot(dO(i), x(j, 2)) - D[i]);
                for (int d = 0; d < HS; d++) dv[d] += p * dO(i)[d], dk[d] += scale * ds * x(i, 0)[d];
            }
            r.dk.insert(r.dk.end(), dk.begin(), dk.end());
            r.dv.insert(r.dv.end(), dv.begin(), dv.end());
        }
    }
    return r;
}

}  // namespace flashgpt2::ref
