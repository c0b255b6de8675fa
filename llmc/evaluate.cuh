// Evaluation and sampling for the GPU trainer (train_gpt2.cu): the val loss over a loader, the val split's sequence
// length and batch, and text from the KV-cache decoder.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "llmc/dataloader.h"
#include "llmc/distributed.h"
#include "llmc/error.h"
#include "llmc/kvcache.cuh"
#include "llmc/model.cuh"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"

namespace flashgpt2 {

// The val sequence length: T, as training reads; a val split whose shards hold fewer than T+1 tokens (TinyShakespeare's
// 32,768 at T >= 32K) is read in the longest windows that fit them instead (found by bisection: each probe only
// reads the val files).
inline int val_seq_len(const std::string& glob, int T, int V) {
    auto fits = [&](int t) {
        try {
            DataLoader probe(glob, 1, t, false, 0, V);
            return true;
        } catch (const Error&) {
            return false;
        }
    };
    if (fits(T)) return T;
    if (!fits(1)) DataLoader(glob, 1, 1, false, 0, V);  // not a length problem: let the loader say what is wrong
    int lo = 1, hi = T;  // fits(lo), !fits(hi)
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    return lo;
}

// The val batch size (dataloader.h's val_batch_size): B sequences for -m N, as llm.c; nearly the whole split for -m -1.
inline int choose_val_batch(const std::string& glob, int B, int T, int V, int max_batches) {
    const DataLoader probe(glob, 1, T, false, 0, V);  // one sequence per batch: counts the sequences
    return val_batch_size(probe.num_batches(), B, max_batches);
}

// Mean loss over max_batches batches of the loader from its start (-1: all of them). Data parallel, rank r
// evaluates batches r, r+W, ... and the per-rank sums are added up (one GPU: no reduction at all).
inline float evaluate(GPT2Model& model, DataLoader& loader, int max_batches, const Distributed& dist) {
    loader.reset();
    size_t nb = loader.num_batches();
    if (max_batches > 0) nb = std::min(nb, (size_t)max_batches);
    double sum = 0.0;
    for (size_t i = 0; i < nb; i++) {
        loader.next_batch();
        if ((int)(i % dist.world) != dist.rank) continue;
        model.forward(loader.inputs.data(), loader.targets.data(), loader.B, loader.T, false, 0.0f);
        sum += model.mean_loss();
    }
    return (float)(dist.sum_host(sum, model.stream) / nb);
}

// Generates n tokens after `prompt` (token ids; the training samples use <|endoftext|> alone) with the KV cache and
// returns them as text: the prompt fed position by position, then one sample_top_k draw per new token.
inline std::string generate_text(Decoder& dec, const Tokenizer& tok, Rng& rng, const std::vector<int>& prompt, int n,
                                 int top_k, float temperature) {
    const GPT2Config& c = dec.model.config;
    if (prompt.empty()) fail("generate: an empty prompt (start from <|endoftext|>)");
    if ((int)prompt.size() + n - 1 > c.max_seq_len)
        fail("-g: %zu prompt tokens + %d new ones need %zu positions; the model has %d (its max_seq_len; the KV "
             "cache does not slide)", prompt.size(), n, prompt.size() + n - 1, c.max_seq_len);
    const std::vector<float>* logits = nullptr;
    int pos = 0;
    for (int t : prompt) logits = &dec.step(&t, pos++);
    std::string text;
    for (int i = 0; i < n; i++) {
        int token = sample_top_k(logits->data(), c.vocab_size, top_k, temperature, rng);
        text += tok.decode(token);
        if (i + 1 < n) logits = &dec.step(&token, pos++);
    }
    return text;
}

}  // namespace flashgpt2
