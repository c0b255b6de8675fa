// Sampling with a KV cache: generate one token at a time without recomputing the past.
//
// The idea: in causal attention a position's key and value never change once computed (they depend only on
// the tokens up to it). So when generating token t we keep every layer's K and V of positions 0..t-1 in a
// cache, compute q, k, v for the ONE new position only, append k and v to the cache, and attend the new q
// over the cached keys. Every other layer (layernorm, matmuls, GELU, residual) is per position anyway, so a
// decode step is the training forward with N = B rows instead of B*T — the same layer ops, reused.
// Cost per generated token: O(t·C) for attention and O(C²) for the matmuls, instead of re-running the whole
// prefix (O(t·C²)) as a cacheless sampler does.
//
// Buffers (per layer l):   kcache, vcache (L, B, NH, maxT, HS)   floatX
// The step at position pos reads qkv (B, 3C) = [q | k | v] of the new token, writes k and v into row pos
// of the cache, and writes the attention output (B, C), heads side by side as the training kernels do.
#pragma once
#include <cmath>
#include <vector>

#include "llmc/kernel_common.cuh"  // block_max, block_sum, to_float, from_float
#include "llmc/model.cuh"

namespace flashgpt2 {

// One block per (head h, sequence b). Dynamic shared memory: HS floats for q, then pos+1 floats for the
// scores of row pos.
static __global__ void attention_decode_kernel(floatX* out, floatX* kcache, floatX* vcache, const floatX* qkv,
                                               int pos, int maxT, int C, int NH) {
    extern __shared__ float smem[];
    const int h = blockIdx.x, b = blockIdx.y, HS = C / NH;
    float* q = smem;                  // (HS)   the new query, pre-scaled by 1/sqrt(HS)
    float* p = smem + HS;             // (pos+1) scores, then unnormalized probabilities
    const floatX* x = qkv + (size_t)b * 3 * C + h * HS;  // this head's q; k at +C, v at +2C
    const size_t head = ((size_t)b * NH + h) * maxT;     // row 0 of this (b, h) in the cache
    floatX* K = kcache + head * HS;                      // (maxT, HS)
    floatX* V = vcache + head * HS;                      // (maxT, HS)
    const float scale = rsqrtf((float)HS);
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
        q[d] = to_float(x[d]) * scale;
        K[(size_t)pos * HS + d] = x[C + d];
        V[(size_t)pos * HS + d] = x[2 * C + d];
    }
    __syncthreads();  // q and the new cache row pos (written by other threads) are visible to all

    // scores s_t = q·k_t for t <= pos (causal: the new token sees itself and the past), and their max
    float m = -INFINITY;
    for (int t = threadIdx.x; t <= pos; t += blockDim.x) {
        const floatX* k = K + (size_t)t * HS;
        float s = 0.0f;
        for (int d = 0; d < HS; d++) s += q[d] * to_float(k[d]);
        p[t] = s;
        m = fmaxf(m, s);
    }
    m = block_max(m);
    float l = 0.0f;
    for (int t = threadIdx.x; t <= pos; t += blockDim.x) {
        p[t] = expf(p[t] - m);
        l += p[t];
    }
    l = block_sum(l);  // its barriers also make every thread's p[t] visible to all

    // out_d = Σ_t p_t v_t[d] / l
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t <= pos; t++) acc += p[t] * to_float(V[(size_t)t * HS + d]);
        out[(size_t)b * C + h * HS + d] = from_float<floatX>(acc / l);
    }
}

// The K and V of every layer for B sequences of up to maxT tokens.
struct KVCache {
    int L = 0, B = 0, NH = 0, maxT = 0, HS = 0;
    floatX* k = nullptr;  // (L, B, NH, maxT, HS)
    floatX* v = nullptr;  // (L, B, NH, maxT, HS)

    size_t layer_elems() const { return (size_t)B * NH * maxT * HS; }
    floatX* k_layer(int l) const { return k + (size_t)l * layer_elems(); }
    floatX* v_layer(int l) const { return v + (size_t)l * layer_elems(); }
    static size_t bytes(int L, int B, int NH, int maxT, int HS) { return 2 * (size_t)L * B * NH * maxT * HS * sizeof(floatX); }
};

inline size_t attention_decode_smem(int HS, int pos) { return (HS + pos + 1) * sizeof(float); }

// Attends the new token at position pos of layer l: out (B, C), qkv (B, 3C); appends its k, v to the cache.
inline void attention_decode(floatX* out, const KVCache& cache, int l, const floatX* qkv, int pos, int C,
                             cudaStream_t stream) {
    const size_t smem = attention_decode_smem(cache.HS, pos);
    allow_shared_memory(attention_decode_kernel, smem);  // beyond 48 KB when maxT is above ~12K positions
    attention_decode_kernel<<<dim3(cache.NH, cache.B), 128, smem, stream>>>(out, cache.k_layer(l), cache.v_layer(l),
                                                                           qkv, pos, cache.maxT, C, cache.NH);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------------------------
// The decode step: the training forward of llmc/model.cuh for ONE new position per sequence, through the same
// layer ops, with attention_decode in place of the full attention. N = B rows throughout.
struct Decoder {
    const GPT2Model& model;
    KVCache cache;
    GpuMemory mem;
    floatX *x, *x2, *ln, *qkv, *atty, *proj, *fch, *fch_gelu;  // (B, C), (B, C), (B, C), (B, 3C), (B, C) ... (B, 4C)
    float *mean, *rstd;                                        // (B)
    floatX* logits;                                            // (B, Vp)
    int* tokens;                                               // (B)
    std::vector<floatX> logits_host;
    std::vector<float> logits_f;

    Decoder(const GPT2Model& m, int B) : model(m) {
        const GPT2Config& c = m.config;
        const int C = c.channels, NH = c.num_heads;
        mem.hint = "reduce -g (tokens per sample) or -b";
        cache.L = c.num_layers, cache.B = B, cache.NH = NH, cache.maxT = c.max_seq_len, cache.HS = C / NH;
        cache.k = mem.alloc_n<floatX>(cache.L * cache.layer_elems(), "KV cache (K)");
        cache.v = mem.alloc_n<floatX>(cache.L * cache.layer_elems(), "KV cache (V)");
        x = mem.alloc_n<floatX>((size_t)B * C, "decode x");
        x2 = mem.alloc_n<floatX>((size_t)B * C, "decode x2");
        ln = mem.alloc_n<floatX>((size_t)B * C, "decode ln");
        qkv = mem.alloc_n<floatX>((size_t)B * 3 * C, "decode qkv");
        atty = mem.alloc_n<floatX>((size_t)B * C, "decode atty");
        proj = mem.alloc_n<floatX>((size_t)B * C, "decode proj");
        fch = mem.alloc_n<floatX>((size_t)B * 4 * C, "decode fch");
        fch_gelu = mem.alloc_n<floatX>((size_t)B * 4 * C, "decode fch_gelu");
        mean = mem.alloc_n<float>(B, "decode mean");
        rstd = mem.alloc_n<float>(B, "decode rstd");
        logits = mem.alloc_n<floatX>((size_t)B * c.padded_vocab_size, "decode logits");
        tokens = mem.alloc_n<int>(B, "decode tokens");
        logits_host.resize((size_t)B * c.padded_vocab_size);
        logits_f.resize(logits_host.size());
    }

    // Feeds tokens (B, host) at position pos (0, 1, 2, ... in order: the cache holds positions < pos) and
    // returns the next-token logits (B, Vp) as floats on the host; the first V of each row are real.
    const std::vector<float>& step(const int* tok, int pos) {
        const GPT2Config& c = model.config;
        const ParameterTensors& p = model.params;
        const int B = cache.B, C = c.channels, L = c.num_layers, Vp = c.padded_vocab_size;
        const OpContext ctx{model.ks, model.stream};  // these ops need no workspace
        if (pos < 0 || pos >= c.max_seq_len) fail("decode: position %d is outside [0, %d)", pos, c.max_seq_len);
        cudaCheck(cudaMemcpyAsync(tokens, tok, B * sizeof(int), cudaMemcpyHostToDevice, ctx.stream));
        // x = wte[tok] + wpe[pos]: the encoder with T = 1 and wpe starting at row pos
        encoder_forward(ctx, x, tokens, p.wte, p.wpe + (size_t)pos * C, B, 1, C);
        for (int l = 0; l < L; l++) {
            const BlockWeights w = p.block(l, C);
            layernorm_forward(ctx, ln, mean, rstd, x, w.ln1w, w.ln1b, B, C);
            matmul_forward(ctx, qkv, ln, w.qkvw, w.qkvb, B, C, 3 * C);
            attention_decode(atty, cache, l, qkv, pos, C, ctx.stream);
            matmul_forward(ctx, proj, atty, w.attprojw, w.attprojb, B, C, C);
            residual_layernorm_forward(ctx, x2, ln, mean, rstd, x, proj, w.ln2w, w.ln2b, B, C);
            matmul_gelu_forward(ctx, fch_gelu, fch, ln, w.fcw, w.fcb, B, C, 4 * C);
            matmul_forward(ctx, proj, fch_gelu, w.fcprojw, w.fcprojb, B, 4 * C, C);
            residual_forward(ctx, x, x2, proj, (size_t)B * C);  // x for the next layer
        }
        layernorm_forward(ctx, ln, mean, rstd, x, p.lnfw, p.lnfb, B, C);
        matmul_forward(ctx, logits, ln, p.wte, nullptr, B, C, Vp);
        cudaCheck(cudaMemcpyAsync(logits_host.data(), logits, logits_host.size() * sizeof(floatX),
                                  cudaMemcpyDeviceToHost, ctx.stream));
        cudaCheck(cudaStreamSynchronize(ctx.stream));
        floatX_to_floats(logits_host.data(), logits_f.data(), logits_f.size());
        return logits_f;
    }
};

}  // namespace flashgpt2
