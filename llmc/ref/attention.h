// The oracle, part 2: causal multi-head self-attention, forward and backward, "standard attention":
// the scores S = Q K^T / sqrt(HS) (preatt) and the probabilities P = softmax(S) (att) are materialized,
// T x T per head, exactly what the flash kernels avoid. llm.c's layout:
//   qkv (B, T, 3C) holds [q | k | v] per position; head h uses columns h*HS .. h*HS+HS-1 of each third.
//   out (B, T, C) holds the heads side by side, the same columns as q.
// Causal mask: position t attends to t2 <= t. Above the diagonal (t2 > t) both preatt and att are
// written as 0, so every element of both buffers is defined (a GPU test may compare the lower triangle).
#pragma once
#include "llmc/ref/layers.h"

namespace flashgpt2::ref {

// A (T, HS) slice of a (B, T, W) buffer: rows are W apart.
template <class S>
using StridedMap = Eigen::Map<MatrixR<S>, 0, Eigen::OuterStride<>>;
template <class S>
using ConstStridedMap = Eigen::Map<const MatrixR<S>, 0, Eigen::OuterStride<>>;

template <class S>
void attention_forward(S* out, S* preatt, S* att, const S* qkv, int B, int T, int C, int NH) {
    // out (B,T,C)  preatt, att (B,NH,T,T)  qkv (B,T,3C)
    const int HS = C / NH;
    const S scale = S(1) / std::sqrt(S(HS));
#pragma omp parallel for
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        const S* base = qkv + (size_t)b * T * 3 * C + h * HS;
        ConstStridedMap<S> Q(base, T, HS, Eigen::OuterStride<>(3 * C));          // (T, HS)
        ConstStridedMap<S> K(base + C, T, HS, Eigen::OuterStride<>(3 * C));      // (T, HS)
        ConstStridedMap<S> V(base + 2 * C, T, HS, Eigen::OuterStride<>(3 * C));  // (T, HS)
        MapR<S> Sc(preatt + (size_t)bh * T * T, T, T);                           // (T, T)
        MapR<S> P(att + (size_t)bh * T * T, T, T);                               // (T, T)
        Sc.noalias() = scale * (Q * K.transpose());
        for (int t = 0; t < T; t++) {
            // softmax over the causal prefix 0..t of row t, shifted by its max for stability
            S m = Sc(t, 0);
            for (int t2 = 1; t2 <= t; t2++) m = std::max(m, Sc(t, t2));
            S l = 0;
            for (int t2 = 0; t2 <= t; t2++) {
                P(t, t2) = std::exp(Sc(t, t2) - m);
                l += P(t, t2);
            }
            for (int t2 = 0; t2 <= t; t2++) P(t, t2) /= l;
            for (int t2 = t + 1; t2 < T; t2++) Sc(t, t2) = P(t, t2) = 0;  // masked
        }
        StridedMap<S> O(out + (size_t)b * T * C + h * HS, T, HS, Eigen::OuterStride<>(C));  // (T, HS)
        O.noalias() = P * V;
    }
}

// With dO the gradient of out and P = att:
//   dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(P * dP))  (softmax backward, masked to t2 <= t),
//   dQ = scale dS K,   dK = scale dS^T Q.
// dqkv, dpreatt (= dS) and datt (= dP, lower triangle) are accumulated (+=). dS is computed from this
// call's dP alone, so a datt buffer that was not zero does not leak into dqkv.
template <class S>
void attention_backward(S* dqkv, S* dpreatt, S* datt, const S* dout, const S* qkv, const S* att, int B, int T,
                        int C, int NH) {
    // dqkv, qkv (B,T,3C)  dpreatt, datt, att (B,NH,T,T)  dout (B,T,C)
    const int HS = C / NH;
    const S scale = S(1) / std::sqrt(S(HS));
#pragma omp parallel for
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        const size_t off = (size_t)b * T * 3 * C + h * HS;
        const Eigen::OuterStride<> s3(3 * C);
        ConstStridedMap<S> Q(qkv + off, T, HS, s3), K(qkv + off + C, T, HS, s3), V(qkv + off + 2 * C, T, HS, s3);
        StridedMap<S> dQ(dqkv + off, T, HS, s3), dK(dqkv + off + C, T, HS, s3), dV(dqkv + off + 2 * C, T, HS, s3);
        ConstStridedMap<S> dO(dout + (size_t)b * T * C + h * HS, T, HS, Eigen::OuterStride<>(C));  // (T, HS)
        ConstMapR<S> P(att + (size_t)bh * T * T, T, T);                                          // (T, T)
        MapR<S> dPacc(datt + (size_t)bh * T * T, T, T);
        MapR<S> dSacc(dpreatt + (size_t)bh * T * T, T, T);

        dV.noalias() += P.transpose() * dO;
        MatrixR<S> dP = dO * V.transpose();  // (T, T); only t2 <= t is meaningful
        MatrixR<S> dS = MatrixR<S>::Zero(T, T);
        for (int t = 0; t < T; t++) {
            S dot = 0;
            for (int t2 = 0; t2 <= t; t2++) dot += P(t, t2) * dP(t, t2);
            for (int t2 = 0; t2 <= t; t2++) {
                dS(t, t2) = P(t, t2) * (dP(t, t2) - dot);
                dPacc(t, t2) += dP(t, t2);
            }
        }
        dSacc += dS;
        dQ.noalias() += scale * (dS * K);
        dK.noalias() += scale * (dS.transpose() * Q);
    }
}

}  // namespace flashgpt2::ref
