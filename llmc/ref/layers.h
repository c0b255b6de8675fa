// The oracle, part 1: every GPT-2 layer except attention, forward and backward, on the CPU.
//
// This is the reference that every CUDA kernel is checked against, and it is itself checked against
// finite differences (test/cpu/test_ref_layers.cpp). It follows llm.c's train_gpt2.c layer by layer:
// same shapes, same memory layout, same formulas. Two rules hold throughout:
//   * every buffer is a plain row-major array; Eigen only *maps* them (Eigen::Map) for the matmuls;
//   * every backward function ACCUMULATES (+=) into its gradient outputs, so the caller zeroes them
//     once and gradients from several uses of a tensor simply add up (e.g. wte in encoder + LM head).
// The scalar type S is float (to compare against GPU kernels) or double (for finite differences).
#pragma once
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace flashgpt2::ref {

// Row-major matrix views over raw pointers: the only way Eigen touches our buffers.
template <class S>
using MatrixR = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using MapR = Eigen::Map<MatrixR<S>>;
template <class S>
using ConstMapR = Eigen::Map<const MatrixR<S>>;
template <class S>
using RowVec = Eigen::Matrix<S, 1, Eigen::Dynamic>;

// ---------------------------------------------------------------------------------------------------
// encoder: token embedding + position embedding.  out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
template <class S>
void encoder_forward(S* out, const int* inp, const S* wte, const S* wpe, int B, int T, int C) {
    // out (B,T,C)  inp (B,T)  wte (Vp,C)  wpe (maxT,C)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            S* o = out + ((size_t)b * T + t) * C;
            const S* w = wte + (size_t)inp[b * T + t] * C;
            const S* p = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) o[i] = w[i] + p[i];
        }
}

// Serial on purpose: two positions holding the same token add into the same row of dwte.
template <class S>
void encoder_backward(S* dwte, S* dwpe, const S* dout, const int* inp, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const S* d = dout + ((size_t)b * T + t) * C;
            S* dw = dwte + (size_t)inp[b * T + t] * C;
            S* dp = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                dw[i] += d[i];
                dp[i] += d[i];
            }
        }
}

// ---------------------------------------------------------------------------------------------------
// layernorm over the last dimension: y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + 1e-5), var biased.
// mean and rstd are saved for the backward pass.
template <class S>
void layernorm_forward(S* out, S* mean, S* rstd, const S* inp, const S* w, const S* b, int N, int C) {
    // out, inp (N,C)   mean, rstd (N)   w, b (C)
    const S eps = S(1e-5);
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const S* x = inp + (size_t)n * C;
        S m = 0;
        for (int i = 0; i < C; i++) m += x[i];
        m /= C;
        S v = 0;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= C;
        S s = S(1) / std::sqrt(v + eps);
        S* o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

// With xhat = (x - mean) * rstd and g = w * dout:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum_n dout * xhat,  db = sum_n dout.
template <class S>
void layernorm_backward(S* dinp, S* dw, S* db, const S* dout, const S* inp, const S* w, const S* mean,
                        const S* rstd, int N, int C) {
    // dinp, dout, inp (N,C)   dw, db, w (C)   mean, rstd (N)
    // Rows run in parallel for dinp; dw/db are summed over rows, so they are reduced serially after.
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const S* x = inp + (size_t)n * C;
        const S* d = dout + (size_t)n * C;
        S g_mean = 0, gx_mean = 0;
        for (int i = 0; i < C; i++) {
            S xhat = (x[i] - mean[n]) * rstd[n];
            S g = w[i] * d[i];
            g_mean += g;
            gx_mean += g * xhat;
        }
        g_mean /= C;
        gx_mean /= C;
        S* dx = dinp + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            S xhat = (x[i] - mean[n]) * rstd[n];
            dx[i] += rstd[n] * (w[i] * d[i] - g_mean - xhat * gx_mean);
        }
    }
    for (int n = 0; n < N; n++) {
        const S* x = inp + (size_t)n * C;
        const S* d = dout + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            db[i] += d[i];
            dw[i] += d[i] * (x[i] - mean[n]) * rstd[n];
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// matmul (a linear layer, PyTorch's nn.Linear layout): out = inp @ w^T + bias.
// Each product is split into blocks of its output's rows (or columns), one contiguous block per OpenMP
// thread, each block an independent single-threaded Eigen product. (Eigen's own threaded GEMM synchronizes inside every product,
// which stalls badly when the cores are shared with other work, e.g. a build running beside training.)
template <class F>
void parallel_row_blocks(int rows, F&& f) {  // calls f(first, count) once per thread: [0, rows) in blocks
#pragma omp parallel
    {
#ifdef _OPENMP
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
#else
        const int nt = 1, id = 0;
#endif
        const int chunk = (rows + nt - 1) / nt, first = id * chunk, count = std::min(chunk, rows - first);
        if (count > 0) f(first, count);
    }
}

template <class S>
void matmul_forward(S* out, const S* inp, const S* w, const S* bias, int N, int C, int OC) {
    // out (N,OC)  inp (N,C)  w (OC,C)  bias (OC) or nullptr
    MapR<S> O(out, N, OC);
    ConstMapR<S> X(inp, N, C), W(w, OC, C);
    if (N >= OC) {  // split the rows of out (the rows of inp)
        parallel_row_blocks(N, [&](int r, int n) { O.middleRows(r, n).noalias() = X.middleRows(r, n) * W.transpose(); });
    } else {  // split the columns of out (the rows of w): the LM head, where w is (Vp, C) and large
        parallel_row_blocks(OC, [&](int r, int n) { O.middleCols(r, n).noalias() = X * W.middleRows(r, n).transpose(); });
    }
    if (bias) O.rowwise() += Eigen::Map<const RowVec<S>>(bias, OC);
}

// dinp += dout @ w,  dw += dout^T @ inp,  dbias += column sums of dout.
template <class S>
void matmul_backward(S* dinp, S* dw, S* dbias, const S* dout, const S* inp, const S* w, int N, int C,
                     int OC) {
    // dinp, inp (N,C)  dw, w (OC,C)  dbias (OC) or nullptr  dout (N,OC)
    ConstMapR<S> D(dout, N, OC), X(inp, N, C), W(w, OC, C);
    MapR<S> dX(dinp, N, C), dW(dw, OC, C);
    parallel_row_blocks(N, [&](int r, int n) { dX.middleRows(r, n).noalias() += D.middleRows(r, n) * W; });
    parallel_row_blocks(OC, [&](int r, int n) {
        dW.middleRows(r, n).noalias() += D.middleCols(r, n).transpose() * X;
        if (dbias) Eigen::Map<RowVec<S>>(dbias + r, n) += D.middleCols(r, n).colwise().sum();
    });
}

// ---------------------------------------------------------------------------------------------------
// GELU, tanh approximation as in GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class S>
void gelu_forward(S* out, const S* inp, int N) {
    const S k = std::sqrt(S(2) / S(M_PI));
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        S x = inp[i];
        out[i] = S(0.5) * x * (S(1) + std::tanh(k * (x + S(0.044715) * x * x * x)));
    }
}

// d/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) du/dx,  u = k (x + 0.044715 x^3).
template <class S>
void gelu_backward(S* dinp, const S* inp, const S* dout, int N) {
    const S k = std::sqrt(S(2) / S(M_PI));
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        S x = inp[i];
        S th = std::tanh(k * (x + S(0.044715) * x * x * x));
        S du = k * (S(1) + S(3) * S(0.044715) * x * x);
        dinp[i] += (S(0.5) * (S(1) + th) + S(0.5) * x * (S(1) - th * th) * du) * dout[i];
    }
}

// ---------------------------------------------------------------------------------------------------
// residual: out = a + b; the gradient flows unchanged into both branches.
template <class S>
void residual_forward(S* out, const S* a, const S* b, int N) {
    for (int i = 0; i < N; i++) out[i] = a[i] + b[i];
}

template <class S>
void residual_backward(S* da, S* db, const S* dout, int N) {
    for (int i = 0; i < N; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

// ---------------------------------------------------------------------------------------------------
// classifier: softmax over the V real logits of each row, then cross-entropy against the target.
// Rows are Vp long (padded for aligned matmuls); the padded columns get probability 0.
// The loss is computed as logsumexp(logits) - logits[target], the same value as llm.c's
// -log(probs[target]) but without underflowing to inf when that probability is tiny in float.
// targets == nullptr: only the probabilities are computed (sampling), losses is left untouched.
template <class S>
void crossentropy_softmax_forward(S* losses, S* probs, const S* logits, const int* targets, int B, int T,
                                  int V, int Vp) {
    // losses (B,T)  probs, logits (B,T,Vp)  targets (B,T)
#pragma omp parallel for
    for (int n = 0; n < B * T; n++) {
        const S* z = logits + (size_t)n * Vp;
        S* p = probs + (size_t)n * Vp;
        Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>> zr(z, V);  // the V real logits
        Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>> pr(p, V);
        const S zmax = zr.maxCoeff();
        pr = (zr - zmax).exp();  // Eigen's vectorized exp
        const S sum = pr.sum();
        pr /= sum;
        for (int i = V; i < Vp; i++) p[i] = 0;
        if (targets) losses[n] = zmax + std::log(sum) - z[targets[n]];
    }
}

// dlogits += (probs - onehot(target)) * dloss for the V real columns; padded columns get nothing.
template <class S>
void crossentropy_softmax_backward(S* dlogits, const S* dlosses, const S* probs, const int* targets, int B,
                                   int T, int V, int Vp) {
    // dlogits, probs (B,T,Vp)  dlosses, targets (B,T)
#pragma omp parallel for
    for (int n = 0; n < B * T; n++) {
        S* dz = dlogits + (size_t)n * Vp;
        const S* p = probs + (size_t)n * Vp;
        for (int i = 0; i < V; i++) dz[i] += p[i] * dlosses[n];
        dz[targets[n]] -= dlosses[n];
    }
}

}  // namespace flashgpt2::ref
