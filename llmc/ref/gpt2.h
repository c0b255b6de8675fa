// The oracle, part 3: the whole GPT-2 model on the CPU, forward and backward, wired like llm.c's
// gpt2_forward / gpt2_backward. The parameters live in ONE flat vector in llm.c order (config.h's
// PARAMETER_NAMES / parameter_sizes), the gradients in a second one with the same layout, and every
// intermediate of the last forward pass is kept (Activations) because the backward pass reads them.
//
//   x = wte[tok] + wpe[pos]
//   for each layer:  x = x + attproj(attention(qkv(ln1(x))))
//                    x = x + fcproj(gelu(fc(ln2(x))))
//   logits = lnf(x) @ wte^T  ->  softmax  ->  cross-entropy against the targets, mean over B*T positions
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../checkpoint.h"  // validate_config
#include "../config.h"
#include "../error.h"
#include "../sampler.h"
#include "../torch_rng.h"
#include "attention.h"
#include "layers.h"

namespace flashgpt2::ref {

// Indices of the 16 parameter tensors (PARAMETER_NAMES order).
enum ParamIndex {
    WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB,
    LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB
};

// Splits a flat parameter (or gradient) buffer into pointers to its 16 tensors.
template <class T>
std::array<T*, NUM_PARAMETER_TENSORS> tensor_ptrs(T* base, const GPT2Config& c) {
    std::array<T*, NUM_PARAMETER_TENSORS> ptrs;
    const auto sizes = parameter_sizes(c);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        ptrs[i] = base;
        base += sizes[i];
    }
    return ptrs;
}

// Every intermediate of one forward pass. The gradient of each one has the same shape, so the backward
// pass uses a second instance for them (without the saved statistics and probabilities).
template <class S>
struct Activations {
    std::vector<S> encoded;                   // (B,T,C)
    std::vector<S> ln1, ln1_mean, ln1_rstd;   // (L,B,T,C), (L,B,T), (L,B,T)
    std::vector<S> qkv;                       // (L,B,T,3C)
    std::vector<S> atty;                      // (L,B,T,C)
    std::vector<S> preatt, att;               // (L,B,NH,T,T)
    std::vector<S> attproj, residual2;        // (L,B,T,C)
    std::vector<S> ln2, ln2_mean, ln2_rstd;   // (L,B,T,C), (L,B,T), (L,B,T)
    std::vector<S> fch, fch_gelu;             // (L,B,T,4C)
    std::vector<S> fcproj, residual3;         // (L,B,T,C)
    std::vector<S> lnf, lnf_mean, lnf_rstd;   // (B,T,C), (B,T), (B,T)
    std::vector<S> logits, probs;             // (B,T,Vp)
    std::vector<S> losses;                    // (B,T)

    void resize(const GPT2Config& c, int B, int T, bool for_grads) {
        const size_t BT = (size_t)B * T, L = c.num_layers, C = c.channels;
        const size_t stat = for_grads ? 0 : L * BT;  // mean/rstd have no gradient
        encoded.resize(BT * C);
        ln1.resize(L * BT * C), ln1_mean.resize(stat), ln1_rstd.resize(stat);
        qkv.resize(L * BT * 3 * C);
        atty.resize(L * BT * C);
        preatt.resize(L * B * c.num_heads * (size_t)T * T), att.resize(preatt.size());
        attproj.resize(L * BT * C), residual2.resize(L * BT * C);
        ln2.resize(L * BT * C), ln2_mean.resize(stat), ln2_rstd.resize(stat);
        fch.resize(L * BT * 4 * C), fch_gelu.resize(L * BT * 4 * C);
        fcproj.resize(L * BT * C), residual3.resize(L * BT * C);
        lnf.resize(BT * C), lnf_mean.resize(for_grads ? 0 : BT), lnf_rstd.resize(for_grads ? 0 : BT);
        logits.resize(BT * c.padded_vocab_size), probs.resize(for_grads ? 0 : BT * c.padded_vocab_size);
        losses.resize(BT);
    }

    void zero() {
        for (auto* v : {&encoded, &ln1, &ln1_mean, &ln1_rstd, &qkv, &atty, &preatt, &att, &attproj, &residual2,
                        &ln2, &ln2_mean, &ln2_rstd, &fch, &fch_gelu, &fcproj, &residual3, &lnf, &lnf_mean,
                        &lnf_rstd, &logits, &probs, &losses})
            std::fill(v->begin(), v->end(), S(0));
    }
};

template <class S>
struct GPT2 {
    GPT2Config config;
    std::vector<S> params, grads;  // flat, llm.c order, num_parameters(config) each
    Activations<S> acts;           // of the last forward() call
    Activations<S> grad_acts;      // gradients of the activations, filled by backward()
    int B = 0, T = 0;              // shape of the last forward() call
    std::vector<int> inputs, targets;  // (B,T) copies of the last forward() call's tokens
    S mean_loss = S(-1);           // -1 when the last forward() had no targets (as llm.c)

    explicit GPT2(const GPT2Config& c) : config(c) {
        validate_config(c, "ref::GPT2");
        params.assign(num_parameters(c), S(0));
        grads.assign(params.size(), S(0));
    }

    std::array<S*, NUM_PARAMETER_TENSORS> param_ptrs() { return tensor_ptrs(params.data(), config); }
    std::array<const S*, NUM_PARAMETER_TENSORS> param_ptrs() const { return tensor_ptrs(params.data(), config); }
    std::array<S*, NUM_PARAMETER_TENSORS> grad_ptrs() { return tensor_ptrs(grads.data(), config); }

    // GPT-2's initialization, as llm.c's gpt2_build_from_random: weights ~ N(0, 0.02), the two projections
    // back into the residual stream (attprojw, fcprojw) scaled by 1/sqrt(2L), biases 0, layernorm gains 1;
    // wte's padding rows (V..Vp) stay 0. The draws are llm.c's too (llmc/torch_rng.h), in its order: wte, wpe,
    // then layer by layer qkvw, attprojw, fcw, fcprojw. So a seed gives llm.c's initial weights for that seed.
    void init_random(uint64_t seed) {
        if (seed > UINT32_MAX) fail("init_random: seed %llu does not fit the generator's 32 bits", (unsigned long long)seed);
        std::mt19937 g((uint32_t)seed);
        auto p = param_ptrs();
        const auto sizes = parameter_sizes(config);
        const size_t L = config.num_layers;
        const float proj_std = 0.02f * (1.0f / sqrtf(2.0f * (float)L));
        std::fill(params.begin(), params.end(), S(0));
        for (int i : {LN1W, LN2W, LNFW}) std::fill(p[i], p[i] + sizes[i], S(1));
        std::vector<float> x;
        auto draw = [&](S* dst, size_t n, float std) {  // n normals into dst
            x.resize(n);
            torch_normal(x.data(), n, 0.0f, std, g);
            std::copy(x.begin(), x.end(), dst);
        };
        draw(p[WTE], (size_t)config.vocab_size * config.channels, 0.02f);
        draw(p[WPE], sizes[WPE], 0.02f);
        for (size_t l = 0; l < L; l++)
            for (int i : {QKVW, ATTPROJW, FCW, FCPROJW}) {
                const size_t n = sizes[i] / L;  // layer l's slice
                draw(p[i] + l * n, n, (i == ATTPROJW || i == FCPROJW) ? proj_std : 0.02f);
            }
    }

    // Runs the model on inputs (B,T) and returns the mean cross-entropy loss against targets (B,T).
    // targets == nullptr: only logits and probs are computed (sampling) and -1 is returned.
    S forward(const int* in, const int* tg, int B_, int T_) {
        const GPT2Config& c = config;
        if (B_ <= 0 || T_ <= 0) fail("ref::GPT2::forward: B=%d and T=%d must be positive", B_, T_);
        if (T_ > c.max_seq_len) fail("ref::GPT2::forward: T=%d exceeds the model's max_seq_len %d", T_, c.max_seq_len);
        for (int i = 0; i < B_ * T_; i++) {
            if (in[i] < 0 || in[i] >= c.vocab_size) fail("ref::GPT2::forward: input token %d out of range [0,%d)", in[i], c.vocab_size);
            if (tg && (tg[i] < 0 || tg[i] >= c.vocab_size)) fail("ref::GPT2::forward: target token %d out of range [0,%d)", tg[i], c.vocab_size);
        }
        B = B_, T = T_;
        inputs.assign(in, in + B * T);
        if (tg) targets.assign(tg, tg + B * T); else targets.clear();
        acts.resize(c, B, T, false);

        const int L = c.num_layers, NH = c.num_heads, C = c.channels, V = c.vocab_size, Vp = c.padded_vocab_size;
        const int BT = B * T;
        const size_t BTC = (size_t)BT * C, att_size = (size_t)B * NH * T * T;
        auto p = param_ptrs();
        Activations<S>& a = acts;

        encoder_forward(a.encoded.data(), in, p[WTE], p[WPE], B, T, C);
        for (int l = 0; l < L; l++) {
            const S* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * BTC;  // (B,T,C)
            S* ln1 = a.ln1.data() + l * BTC;
            S* qkv = a.qkv.data() + l * 3 * BTC;
            S* atty = a.atty.data() + l * BTC;
            S* attproj = a.attproj.data() + l * BTC;
            S* residual2 = a.residual2.data() + l * BTC;
            S* ln2 = a.ln2.data() + l * BTC;
            S* fch = a.fch.data() + l * 4 * BTC;
            S* fch_gelu = a.fch_gelu.data() + l * 4 * BTC;
            S* fcproj = a.fcproj.data() + l * BTC;
            S* residual3 = a.residual3.data() + l * BTC;
            layernorm_forward(ln1, &a.ln1_mean[l * BT], &a.ln1_rstd[l * BT], residual, p[LN1W] + l * C, p[LN1B] + l * C, BT, C);
            matmul_forward(qkv, ln1, p[QKVW] + (size_t)l * 3 * C * C, p[QKVB] + l * 3 * C, BT, C, 3 * C);
            attention_forward(atty, &a.preatt[l * att_size], &a.att[l * att_size], qkv, B, T, C, NH);
            matmul_forward(attproj, atty, p[ATTPROJW] + (size_t)l * C * C, p[ATTPROJB] + l * C, BT, C, C);
            residual_forward(residual2, residual, attproj, (int)BTC);
            layernorm_forward(ln2, &a.ln2_mean[l * BT], &a.ln2_rstd[l * BT], residual2, p[LN2W] + l * C, p[LN2B] + l * C, BT, C);
            matmul_forward(fch, ln2, p[FCW] + (size_t)l * 4 * C * C, p[FCB] + l * 4 * C, BT, C, 4 * C);
            gelu_forward(fch_gelu, fch, (int)(4 * BTC));
            matmul_forward(fcproj, fch_gelu, p[FCPROJW] + (size_t)l * 4 * C * C, p[FCPROJB] + l * C, BT, 4 * C, C);
            residual_forward(residual3, residual2, fcproj, (int)BTC);
        }
        const S* last = a.residual3.data() + (L - 1) * BTC;  // (B,T,C)
        layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), last, p[LNFW], p[LNFB], BT, C);
        matmul_forward(a.logits.data(), a.lnf.data(), p[WTE], (const S*)nullptr, BT, C, Vp);  // weight tying
        crossentropy_softmax_forward(a.losses.data(), a.probs.data(), a.logits.data(), tg, B, T, V, Vp);

        mean_loss = S(-1);
        if (tg) {
            S sum = 0;
            for (int i = 0; i < BT; i++) sum += a.losses[i];
            mean_loss = sum / BT;
        }
        return mean_loss;
    }

    // Probabilities / logits of position (b, t) of the last forward pass: Vp values, the first V real.
    const S* probs_at(int b, int t) const { return acts.probs.data() + ((size_t)b * T + t) * config.padded_vocab_size; }
    const S* logits_at(int b, int t) const { return acts.logits.data() + ((size_t)b * T + t) * config.padded_vocab_size; }

    void zero_grad() { std::fill(grads.begin(), grads.end(), S(0)); }

    // Gradient of the mean loss of the last forward pass, ACCUMULATED into grads (call zero_grad first,
    // or not, to accumulate over micro-batches). The loss gradient per position is 1/(B*T).
    void backward() {
        if (targets.empty()) fail("ref::GPT2::backward: the last forward pass had no targets");
        const GPT2Config& c = config;
        const int L = c.num_layers, NH = c.num_heads, C = c.channels, V = c.vocab_size, Vp = c.padded_vocab_size;
        const int BT = B * T;
        const size_t BTC = (size_t)BT * C, att_size = (size_t)B * NH * T * T;
        auto p = param_ptrs();
        auto g = grad_ptrs();
        Activations<S>& a = acts;
        Activations<S>& d = grad_acts;
        d.resize(c, B, T, true);
        d.zero();

        std::fill(d.losses.begin(), d.losses.end(), S(1) / BT);
        crossentropy_softmax_backward(d.logits.data(), d.losses.data(), a.probs.data(), targets.data(), B, T, V, Vp);
        matmul_backward(d.lnf.data(), g[WTE], (S*)nullptr, d.logits.data(), a.lnf.data(), p[WTE], BT, C, Vp);
        const size_t lastoff = (L - 1) * BTC;
        layernorm_backward(d.residual3.data() + lastoff, g[LNFW], g[LNFB], d.lnf.data(), a.residual3.data() + lastoff,
                           p[LNFW], a.lnf_mean.data(), a.lnf_rstd.data(), BT, C);

        for (int l = L - 1; l >= 0; l--) {
            const S* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * BTC;
            S* dresidual = l == 0 ? d.encoded.data() : d.residual3.data() + (l - 1) * BTC;
            const size_t o1 = l * BTC, o3 = 3 * o1, o4 = 4 * o1, oa = l * att_size;
            const size_t wC = (size_t)l * C * C;  // offset of layer l in a (L, k*C, C) weight, divided by k

            residual_backward(&d.residual2[o1], &d.fcproj[o1], &d.residual3[o1], (int)BTC);
            matmul_backward(&d.fch_gelu[o4], g[FCPROJW] + 4 * wC, g[FCPROJB] + l * C, &d.fcproj[o1], &a.fch_gelu[o4],
                            p[FCPROJW] + 4 * wC, BT, 4 * C, C);
            gelu_backward(&d.fch[o4], &a.fch[o4], &d.fch_gelu[o4], (int)(4 * BTC));
            matmul_backward(&d.ln2[o1], g[FCW] + 4 * wC, g[FCB] + l * 4 * C, &d.fch[o4], &a.ln2[o1], p[FCW] + 4 * wC,
                            BT, C, 4 * C);
            layernorm_backward(&d.residual2[o1], g[LN2W] + l * C, g[LN2B] + l * C, &d.ln2[o1], &a.residual2[o1],
                               p[LN2W] + l * C, &a.ln2_mean[l * BT], &a.ln2_rstd[l * BT], BT, C);
            residual_backward(dresidual, &d.attproj[o1], &d.residual2[o1], (int)BTC);
            matmul_backward(&d.atty[o1], g[ATTPROJW] + wC, g[ATTPROJB] + l * C, &d.attproj[o1], &a.atty[o1],
                            p[ATTPROJW] + wC, BT, C, C);
            attention_backward(&d.qkv[o3], &d.preatt[oa], &d.att[oa], &d.atty[o1], &a.qkv[o3], &a.att[oa], B, T, C, NH);
            matmul_backward(&d.ln1[o1], g[QKVW] + 3 * wC, g[QKVB] + l * 3 * C, &d.qkv[o3], &a.ln1[o1], p[QKVW] + 3 * wC,
                            BT, C, 3 * C);
            layernorm_backward(dresidual, g[LN1W] + l * C, g[LN1B] + l * C, &d.ln1[o1], residual, p[LN1W] + l * C,
                               &a.ln1_mean[l * BT], &a.ln1_rstd[l * BT], BT, C);
        }
        encoder_backward(g[WTE], g[WPE], d.encoded.data(), inputs.data(), B, T, C);
    }
};

}  // namespace flashgpt2::ref
