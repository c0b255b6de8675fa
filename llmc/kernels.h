// The kernel registry and the "layer ops" the model calls.
//
// Every layer of GPT-2 exists twice (doc/design.md, "The layers and their two kernels"): a naive kernel that
// writes its intermediates to HBM, and a flash kernel that keeps them on chip (tiled, fused). A KernelSet
// picks one variant per layer at run time (--kernels naive|flash, --attention naive, ...), and for the flash
// attention an engine (--attention flash:wgmma|mma|fp32; plain flash = the best one here). The layer ops below
// dispatch on it, so llmc/model.cuh reads like the model and never names a kernel. They also make every fusion
// decision (flash layernorm + residual add, flash matmul + GELU), once, here, and charge each op's time to its
// layer when a profiler is attached (llmc/profile.h).
//
// Conventions for every op:
//   - tensors are device pointers; activations/weights/grads are floatX (bf16, or fp32 in the FP32 build),
//     layernorm mean/rstd, attention lse, losses, AdamW state and master weights are fp32;
//   - parameter gradients ACCUMULATE (+=, for gradient accumulation over micro-batches);
//     activation gradients are OVERWRITTEN, except layernorm_backward's dinp, which accumulates (+=) so the
//     residual stream's gradient (dresidual) sums its two paths, as in llm.c;
//   - ctx.ws is the one transient workspace the caller allocates once with workspace_bytes(); ops run on one
//     stream, one after another, so they all share it;
//   - ops only launch work on ctx.stream: no allocation (except cuBLAS handles and their workspace, created
//     once on first use: see blas() in matmul.cuh), no synchronization;
//   - every backward of the flash set is deterministic (bit-identical when run twice). The naive encoder
//     backward uses atomics on purpose (its lesson), so the naive set is not.
#pragma once
#include <array>
#include <cstdio>
#include <string>

#include "llmc/common.cuh"
#include "llmc/config.h"
#include "llmc/error.h"
#include "llmc/layer.h"
#include "llmc/profile.h"

#include "llmc/encoder.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/residual.cuh"
#include "llmc/gelu.cuh"
#include "llmc/matmul.cuh"
#include "llmc/attention.cuh"
#include "llmc/classifier.cuh"
#include "llmc/adamw.cuh"

namespace flashgpt2 {

// ---------------------------------------------------------------------------------------------------------
// Selection: one variant per layer, and the flash attention's engine.

inline Variant parse_variant(const std::string& s, const std::string& what) {
    if (s == "naive") return Variant::naive;
    if (s == "flash") return Variant::flash;
    fail("%s: unknown kernel variant '%s' (expected naive or flash)", what.c_str(), s.c_str());
}

struct KernelSet {
    std::array<Variant, NUM_LAYERS> variant;         // indexed by Layer
    AttnEngine attention_engine = AttnEngine::best;  // what `--attention flash[:engine]` asked for
    MatmulEngine matmul_engine = MatmulEngine::best;  // what `--matmul flash[:engine]` asked for (GELU matmuls)

    KernelSet() { variant.fill(Variant::flash); }
    static KernelSet all(Variant v) {
        KernelSet ks;
        ks.variant.fill(v);
        return ks;
    }
    static KernelSet all(const std::string& v) { return all(parse_variant(v, "--kernels")); }

    Variant operator[](Layer l) const { return variant[static_cast<int>(l)]; }
    bool naive(Layer l) const { return (*this)[l] == Variant::naive; }
    bool flash(Layer l) const { return (*this)[l] == Variant::flash; }

    // The layer of that name ("attention"); an Error for an unknown one.
    static Layer layer_named(const std::string& name) {
        for (int i = 0; i < NUM_LAYERS; i++)
            if (name == LAYER_NAMES[i]) return layer_at(i);
        std::string all;
        for (const char* n : LAYER_NAMES) all += std::string(all.empty() ? "" : ", ") + n;
        fail("--%s: unknown layer (expected one of %s)", name.c_str(), all.c_str());
    }

    // --attention naive  ->  ks.set("attention", "naive");  --attention flash:mma  ->  flash with engine mma;
    // --matmul flash:cublaslt  ->  flash matmuls, the GELU ones on cuBLASLt too.
    void set(const std::string& layer, const std::string& value) {
        const Layer l = layer_named(layer);
        const size_t colon = value.find(':');
        const bool has_engine = l == Layer::attention || l == Layer::matmul;
        if (colon != std::string::npos && has_engine && value.substr(0, colon) == "flash") {
            variant[static_cast<int>(l)] = Variant::flash;
            if (l == Layer::attention) attention_engine = parse_engine(value.substr(colon + 1), "--attention");
            else matmul_engine = parse_matmul_engine(value.substr(colon + 1), "--matmul");
            return;
        }
        variant[static_cast<int>(l)] = parse_variant(value, "--" + layer);
        if (l == Layer::attention) attention_engine = AttnEngine::best;
        if (l == Layer::matmul) matmul_engine = MatmulEngine::best;
    }

    // "flash" / "naive" when uniform, else "encoder=flash layernorm=naive ..."; an engine asked for by name is
    // part of it ("flash attention=flash:mma"). For logs and tables.
    std::string str() const {
        bool same = true;
        for (Variant v : variant) same = same && v == variant[0];
        const std::string engine = attention_engine == AttnEngine::best ? "" : std::string(":") + engine_name(attention_engine);
        const std::string mm = matmul_engine == MatmulEngine::best ? "" : std::string(":") + engine_name(matmul_engine);
        if (same)
            return variant_name(variant[0]) + (engine.empty() ? "" : " attention=flash" + engine) +
                   (mm.empty() ? "" : " matmul=flash" + mm);
        std::string s;
        for (int i = 0; i < NUM_LAYERS; i++) {
            s += std::string(s.empty() ? "" : " ") + LAYER_NAMES[i] + "=" + variant_name(variant[i]);
            if (layer_at(i) == Layer::attention && variant[i] == Variant::flash) s += engine;
            if (layer_at(i) == Layer::matmul && variant[i] == Variant::flash) s += mm;
        }
        return s;
    }

    bool operator==(const KernelSet& o) const {
        return variant == o.variant && attention_engine == o.attention_engine && matmul_engine == o.matmul_engine;
    }
};

// What runs for attention, forward and backward, at head size HS: "naive" or "flash (forward wgmma, backward
// mma)" — the engines attention_engine() picks (an Error when the requested one cannot run).
inline std::string attention_kernels_str(const KernelSet& ks, int HS) {
    if (ks.naive(Layer::attention)) return "naive";
    return std::string("flash (forward ") + engine_name(attention_engine(ks.attention_engine, Pass::forward, HS)) +
           ", backward " + engine_name(attention_engine(ks.attention_engine, Pass::backward, HS)) + ")";
}

// What runs for the matmuls of a model of width C: "naive" or "flash (cuBLASLt; GELU matmuls wgmma)".
inline std::string matmul_kernels_str(const KernelSet& ks, int C) {
    if (ks.naive(Layer::matmul)) return "naive";
    if (ks.naive(Layer::gelu)) return "flash (cuBLASLt)";  // no GELU in any matmul
    // both are (N, 4C) outputs, C deep: fc's forward and fcproj's dinp
    return std::string("flash (cuBLASLt; GELU matmuls ") + engine_name(gelu_matmul_engine(ks.matmul_engine, 4 * C, C)) + ")";
}

// --list-kernels: layer -> naive kernel, flash kernel, and what each does; one row per Layer, in its order.
inline void print_kernel_registry(FILE* f) {
    struct Row { const char *naive, *naive_does, *flash, *flash_does; };
    static const Row rows[NUM_LAYERS] = {
        {"encoder_{forward,backward}_naive",
         "one thread per element; backward adds into dwte/dwpe with atomics (order varies: not deterministic)",
         "encoder_{forward,backward}_flash",
         "16-byte vector loads; backward sorts positions by token (stable radix sort) and sums each token's "
         "rows in order: deterministic"},
        {"layernorm_{forward,backward}_naive",
         "separate passes over HBM: mean, variance, normalize (backward: row sums, dinp, dw/db)",
         "layernorm_{forward,backward}_flash",
         "one warp per row, the row read once into shared memory; dw/db from per-block partials, "
         "reduced in a fixed order"},
        {"matmul_{forward,backward}_naive", "one thread per output element, operands read from global memory",
         "matmul_{forward,backward}_flash",
         "cuBLASLt tensor-core GEMM with bias (and GELU) fused in the epilogue; dbias by a deterministic "
         "two-stage column sum; on Hopper (BF16) the two GELU matmuls run our wgmma GEMM "
         "(llmc/matmul/wgmma_gelu.cuh; --matmul flash:cublaslt keeps them on cuBLASLt)"},
        {"attention_{forward,backward}_naive",
         "standard attention: S=QK^T and P=softmax(S) written to HBM, (B,NH,T,T) per layer, then O=PV "
         "(cuBLAS batched GEMMs + softmax kernel)",
         "attention_{forward,backward}_flash",
         "tiled online softmax, S and P never leave the chip, saves lse (B,NH,T); backward recomputes P "
         "from lse (FlashAttention-2); three engines, below"},
        {"gelu_{forward,backward}_naive", "its own elementwise kernel (tanh approximation)",
         "gelu_{forward,backward}_flash",
         "fused into the matmul epilogue (the wgmma GEMM's, or cuBLASLt GELU_AUX / DGELU) when the matmul is "
         "flash; else a vectorized kernel"},
        {"residual_forward_naive", "its own kernel: out = a + b (backward: none, the gradient passes through)",
         "residual_forward_flash",
         "fused with the next layernorm (residual_layernorm_forward_flash) when layernorm is flash; "
         "else vectorized"},
        {"classifier_naive",
         "softmax probabilities materialized in HBM (N,Vp) fp32, then loss, then dlogits: three passes",
         "classifier_flash", "one fused pass per row: online softmax, loss, dlogits written in place over the logits"},
        {"adamw_update_naive", "one launch per parameter tensor (16), grad norm per tensor", "adamw_update_flash",
         "one launch over all parameters, 4 per thread (16-byte loads); grad norm in one launch (both "
         "deterministic)"},
    };
    struct Engine { AttnEngine e; const char *files, *does; };
    static const Engine engines[] = {
        {AttnEngine::wgmma, "llmc/attention/wgmma_{forward,backward}.cuh",
         "Hopper wgmma + TMA (sm_90a, BF16 build), HS 64/128: forward warp-specialized ping-pong, backward wgmma (its dK/dV "
         "warp-specialized at HS 128; at HS 64 from T = 4096 one fused kernel, dQ by a warpgroup of its own in fixed point)"},
        {AttnEngine::mma, "llmc/attention/mma_{forward,backward}.cuh",
         "bf16 mma.sync tensor cores (sm_80 on, BF16 build), HS 64"},
        {AttnEngine::fp32, "llmc/attention/fp32_{forward,backward}.cuh",
         "fp32 arithmetic on the CUDA cores, any build, HS 16/32/64/128"},
    };
    fprintf(f, "%-11s %-38s %s\n", "layer", "kernel", "what it does");
    for (int i = 0; i < NUM_LAYERS; i++) {
        fprintf(f, "%-11s %-38s naive: %s\n", LAYER_NAMES[i], rows[i].naive, rows[i].naive_does);
        fprintf(f, "%-11s %-38s flash: %s\n", "", rows[i].flash, rows[i].flash_does);
        if (layer_at(i) != Layer::attention) continue;
        for (const Engine& e : engines)
            fprintf(f, "%-11s   --attention flash:%-5s %s: %s\n", "", engine_name(e.e), e.files, e.does);
        fprintf(f, "%-11s   --attention flash: the first of wgmma, mma, fp32 that runs here, per pass\n", "");
    }
}

// ---------------------------------------------------------------------------------------------------------
// Memory the caller allocates.

// The one transient workspace every op shares, in bytes, for a model of these shapes (N = B*T rows).
// The naive set needs the big ones: attention's (B,NH,T,T) scores, the classifier's (N,Vp) fp32 probs and
// the encoder's fp32 dwte (Vp,C).
inline size_t workspace_bytes(const KernelSet& ks, int B, int T, int C, int NH, int Vp) {
    const int N = B * T;
    size_t bytes = 0;
    auto take = [&](size_t b) { bytes = b > bytes ? b : bytes; };
    take(encoder_backward_workspace_bytes(ks[Layer::encoder], B, T, C, Vp));
    take(layernorm_backward_workspace_bytes(ks[Layer::layernorm], N, C));
    take(matmul_backward_workspace_bytes(ks[Layer::matmul], N, Vp > 4 * C ? Vp : 4 * C, 4 * C));
    take(attention_workspace_bytes(ks[Layer::attention], B, T, C, NH));
    take(classifier_workspace_bytes(ks[Layer::classifier], N, Vp));
    take(global_norm_workspace_bytes(ks[Layer::adamw]));
    return bytes;
}

// What one layer's attention keeps from forward to backward, in bytes (allocate one per layer):
// flash: lse (B,NH,T) fp32; naive: P = softmax(S) (B,NH,T,T) floatX.
inline size_t attention_saved_bytes(const KernelSet& ks, int B, int T, int NH) {
    return attention_saved_bytes(ks[Layer::attention], B, T, NH);
}

// Throws flashgpt2::Error when a kernel in the set cannot run this shape (call once at setup).
inline void check_kernel_support(const KernelSet& ks, int C, int NH) {
    attention_check_shape(ks[Layer::attention], ks.attention_engine, C, NH);
    // (the flash matmul's dbias reads rows of C, 3C and 4C channels as 16-byte vectors)
    if ((ks.flash(Layer::encoder) || ks.flash(Layer::layernorm) || ks.flash(Layer::matmul)) && C % X128 != 0)
        fail("channels %d: the flash encoder, layernorm and matmul read 16-byte vectors, so channels must be a "
             "multiple of %d (or use --encoder naive --layernorm naive --matmul naive)", C, X128);
    if (ks.flash(Layer::layernorm) && layernorm_backward_flash_smem(C) > LN_MAX_SMEM)
        fail("channels %d: the flash layernorm backward keeps 3 accumulators of the row per warp, %zu bytes of shared "
             "memory, over the 227 KiB of a block (at most 2304 channels; or use --layernorm naive)", C,
             layernorm_backward_flash_smem(C));
    // an engine asked for by name for the GELU matmuls must run here (an Error that names the alternative)
    if (ks.flash(Layer::matmul) && ks.flash(Layer::gelu)) gelu_matmul_engine(ks.matmul_engine, 4 * C, C);
}

// ---------------------------------------------------------------------------------------------------------
// Layer ops. Shapes: N = B*T rows; C channels; NH heads; HS = C/NH; V real vocab, Vp padded vocab.

// What every op needs besides its tensors.
struct OpContext {
    KernelSet ks;
    cudaStream_t stream = nullptr;
    void* ws = nullptr;             // the shared workspace (workspace_bytes()), for the ops that need one
    LayerProfiler* prof = nullptr;  // when set, every op's time is charged to its layer and pass
};

// out (B,T,C) = wte[inp] + wpe[t];  inp (B,T) int token ids on the device; wte (Vp,C), wpe (maxT,C).
inline void encoder_forward(const OpContext& ctx, floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                            int B, int T, int C) {
    ProfileSpan s(ctx.prof, Layer::encoder, Pass::forward, ctx.stream);
    if (ctx.ks.naive(Layer::encoder)) encoder_forward_naive(out, inp, wte, wpe, B, T, C, ctx.stream);
    else encoder_forward_flash(out, inp, wte, wpe, B, T, C, ctx.stream);
}

// dwte (Vp,C) += scatter of dout by token; dwpe (maxT,C) += sum over b of dout.  dout (B,T,C).
inline void encoder_backward(const OpContext& ctx, floatX* dwte, floatX* dwpe, const floatX* dout, const int* inp,
                             int B, int T, int C, int Vp) {
    ProfileSpan s(ctx.prof, Layer::encoder, Pass::backward, ctx.stream);
    if (ctx.ks.naive(Layer::encoder)) encoder_backward_naive(dwte, dwpe, ctx.ws, dout, inp, B, T, C, Vp, ctx.stream);
    else encoder_backward_flash(dwte, dwpe, ctx.ws, dout, inp, B, T, C, Vp, ctx.stream);
}

// out (N,C) = layernorm(inp) * w + b; mean, rstd (N) fp32 saved for the backward (eps 1e-5).
inline void layernorm_forward(const OpContext& ctx, floatX* out, float* mean, float* rstd, const floatX* inp,
                              const floatX* w, const floatX* b, int N, int C) {
    ProfileSpan s(ctx.prof, Layer::layernorm, Pass::forward, ctx.stream);
    if (ctx.ks.naive(Layer::layernorm)) layernorm_forward_naive(out, mean, rstd, inp, w, b, N, C, ctx.stream);
    else layernorm_forward_flash(out, mean, rstd, inp, w, b, N, C, ctx.stream);
}

// out = inp1 + inp2 (n elements).
inline void residual_forward(const OpContext& ctx, floatX* out, const floatX* inp1, const floatX* inp2, size_t n) {
    ProfileSpan s(ctx.prof, Layer::residual, Pass::forward, ctx.stream);
    if (ctx.ks.naive(Layer::residual)) residual_forward_naive(out, inp1, inp2, n, ctx.stream);
    else residual_forward_flash(out, inp1, inp2, n, ctx.stream);
}

// residual_out (N,C) = inp1 + inp2;  ln_out (N,C) = layernorm(residual_out) * w + b.
// Both flash: one fused kernel (one warp per row, one pass), charged to layernorm. Otherwise residual, then
// layernorm.
inline void residual_layernorm_forward(const OpContext& ctx, floatX* residual_out, floatX* ln_out, float* mean,
                                       float* rstd, const floatX* inp1, const floatX* inp2, const floatX* w,
                                       const floatX* b, int N, int C) {
    if (ctx.ks.flash(Layer::residual) && ctx.ks.flash(Layer::layernorm)) {
        ProfileSpan s(ctx.prof, Layer::layernorm, Pass::forward, ctx.stream);
        residual_layernorm_forward_flash(residual_out, ln_out, mean, rstd, inp1, inp2, w, b, N, C, ctx.stream);
    } else {
        residual_forward(ctx, residual_out, inp1, inp2, (size_t)N * C);
        layernorm_forward(ctx, ln_out, mean, rstd, residual_out, w, b, N, C);
    }
}

// dinp (N,C) += ..., dw (C) += ..., db (C) += ...;  dout (N,C), inp (N,C) the forward input.
// dsum (C) += the column sums of dinp after the add, or nullptr. In a block dinp is the residual stream's
// gradient, so dsum is the bias gradient of the matmul whose output joined the stream there.
inline void layernorm_backward(const OpContext& ctx, floatX* dinp, floatX* dw, floatX* db, floatX* dsum,
                               const floatX* dout, const floatX* inp, const floatX* w, const float* mean,
                               const float* rstd, int N, int C) {
    ProfileSpan s(ctx.prof, Layer::layernorm, Pass::backward, ctx.stream);
    if (ctx.ks.naive(Layer::layernorm))
        layernorm_backward_naive(dinp, dw, db, dsum, ctx.ws, dout, inp, w, mean, rstd, N, C, ctx.stream);
    else
        layernorm_backward_flash(dinp, dw, db, dsum, ctx.ws, dout, inp, w, mean, rstd, N, C, ctx.stream);
}

// out (N,OC) = inp (N,C) @ w^T + bias;  w (OC,C) as in llm.c; bias (OC) or nullptr.
inline void matmul_forward(const OpContext& ctx, floatX* out, const floatX* inp, const floatX* w, const floatX* bias,
                           int N, int C, int OC) {
    ProfileSpan s(ctx.prof, Layer::matmul, Pass::forward, ctx.stream);
    if (ctx.ks.naive(Layer::matmul)) matmul_forward_naive(out, inp, w, bias, N, C, OC, ctx.stream);
    else matmul_forward_flash(out, inp, w, bias, N, C, OC, nullptr, ctx.stream);
}

// out (n) = gelu(inp) (tanh approximation).
inline void gelu_forward(const OpContext& ctx, floatX* out, const floatX* inp, size_t n) {
    ProfileSpan s(ctx.prof, Layer::gelu, Pass::forward, ctx.stream);
    if (ctx.ks.naive(Layer::gelu)) gelu_forward_naive(out, inp, n, ctx.stream);
    else gelu_forward_flash(out, inp, n, ctx.stream);
}

// dinp (n) = dout * gelu'(inp); dinp may be dout (in place).
inline void gelu_backward(const OpContext& ctx, floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    ProfileSpan s(ctx.prof, Layer::gelu, Pass::backward, ctx.stream);
    if (ctx.ks.naive(Layer::gelu)) gelu_backward_naive(dinp, inp, dout, n, ctx.stream);
    else gelu_backward_flash(dinp, inp, dout, n, ctx.stream);
}

// The flash matmul carries the GELU in its epilogue when both layers are flash.
inline bool gelu_fused(const KernelSet& ks) { return ks.flash(Layer::matmul) && ks.flash(Layer::gelu); }

// pre_gelu (N,OC) = inp @ w^T + bias;  out_gelu (N,OC) = gelu(pre_gelu).
// Flash matmul + flash gelu: one GEMM writes both, GELU in its epilogue (the wgmma engine's, or cuBLASLt's
// GELU_AUX_BIAS), charged to matmul.
inline void matmul_gelu_forward(const OpContext& ctx, floatX* out_gelu, floatX* pre_gelu, const floatX* inp,
                                const floatX* w, const floatX* bias, int N, int C, int OC) {
    if (gelu_fused(ctx.ks)) {
        ProfileSpan s(ctx.prof, Layer::matmul, Pass::forward, ctx.stream);
        matmul_forward_flash(out_gelu, inp, w, bias, N, C, OC, pre_gelu, ctx.stream, ctx.ks.matmul_engine);
    } else {
        matmul_forward(ctx, pre_gelu, inp, w, bias, N, C, OC);
        gelu_forward(ctx, out_gelu, pre_gelu, (size_t)N * OC);
    }
}

// dinp (N,C) = dout (N,OC) @ w;  dw (OC,C) += dout^T @ inp;  dbias (OC) += colsum(dout) (dbias may be null).
// pre_gelu (N,C) non-null: the input of this matmul was gelu(pre_gelu), and dinp is returned already
// multiplied by gelu'(pre_gelu) (flash+flash: the GEMM's epilogue, wgmma's or cuBLASLt's DGELU; otherwise the
// gelu backward op). dbias_pre (C) non-null: += colsum(dinp), the bias gradient of the matmul that made
// pre_gelu (flash+flash: the wgmma engine sums dinp's tiles while they are on chip; workspace_bytes sizes its
// sums for the model's GELU matmul, C = 4 * the model's C).
inline void matmul_backward(const OpContext& ctx, floatX* dinp, floatX* dw, floatX* dbias, const floatX* dout,
                            const floatX* inp, const floatX* w, const floatX* pre_gelu, int N, int C, int OC,
                            floatX* dbias_pre = nullptr) {
    const bool fuse_gelu = pre_gelu && gelu_fused(ctx.ks);
    {
        ProfileSpan s(ctx.prof, Layer::matmul, Pass::backward, ctx.stream);
        if (ctx.ks.naive(Layer::matmul))
            matmul_backward_naive(dinp, dw, dbias, dout, inp, w, N, C, OC, ctx.stream);
        else
            matmul_backward_flash(dinp, dw, dbias, ctx.ws, dout, inp, w, fuse_gelu ? pre_gelu : nullptr, N, C, OC,
                                  ctx.stream, ctx.ks.matmul_engine, fuse_gelu ? dbias_pre : nullptr);
    }
    if (pre_gelu && !fuse_gelu) gelu_backward(ctx, dinp, pre_gelu, dinp, (size_t)N * C);
    if (dbias_pre && !fuse_gelu) {  // the column sum of the finished dinp, charged to matmul like any dbias
        ProfileSpan s(ctx.prof, Layer::matmul, Pass::backward, ctx.stream);
        if (ctx.ks.naive(Layer::matmul)) colsum_naive(dbias_pre, dinp, N, C, ctx.stream);
        else colsum_flash(dbias_pre, ctx.ws, (const floatX*)dinp, N, C, ctx.stream);
    }
}

// out (B,T,C) = causal self-attention of qkv (B,T,3,NH,HS), softmax scale 1/sqrt(HS).
// saved: attention_saved_bytes() per layer (flash: lse (B,NH,T) fp32; naive: P (B,NH,T,T)).
inline void attention_forward(const OpContext& ctx, floatX* out, void* saved, const floatX* qkv, int B, int T, int C,
                              int NH) {
    ProfileSpan s(ctx.prof, Layer::attention, Pass::forward, ctx.stream);
    if (ctx.ks.naive(Layer::attention)) attention_forward_naive(out, (floatX*)saved, ctx.ws, qkv, B, T, C, NH, ctx.stream);
    else attention_forward_flash(out, (float*)saved, qkv, B, T, C, NH, ctx.ks.attention_engine, ctx.stream);
}

// dqkv (B,T,3C) = gradient of the attention w.r.t. qkv given dout (B,T,C) (overwritten, not accumulated).
// out is the forward's output (flash uses it for D = rowsum(dO*O)); saved as written by the forward.
inline void attention_backward(const OpContext& ctx, floatX* dqkv, const floatX* dout, const floatX* qkv,
                               const floatX* out, const void* saved, int B, int T, int C, int NH) {
    ProfileSpan s(ctx.prof, Layer::attention, Pass::backward, ctx.stream);
    if (ctx.ks.naive(Layer::attention))
        attention_backward_naive(dqkv, ctx.ws, dout, qkv, (const floatX*)saved, B, T, C, NH, ctx.stream);
    else
        attention_backward_flash(dqkv, ctx.ws, dout, qkv, out, (const float*)saved, B, T, C, NH, ctx.ks.attention_engine,
                                 ctx.stream);
}

// logits (N,Vp) -> losses (N) fp32 = -log softmax(logits[:V])[target]; if write_dlogits, logits is
// overwritten in place by dlogits = (softmax - onehot(target)) * dloss_scale, with 0 in padded columns V..Vp.
// (dloss_scale is usually 1/(B*T*grad_accum_steps): the gradient of the mean loss.) Charged to the forward.
inline void fused_classifier(const OpContext& ctx, floatX* logits, float* losses, const int* targets, int N, int V,
                             int Vp, float dloss_scale, bool write_dlogits) {
    ProfileSpan s(ctx.prof, Layer::classifier, Pass::forward, ctx.stream);
    if (ctx.ks.naive(Layer::classifier))
        classifier_naive(logits, losses, ctx.ws, targets, N, V, Vp, dloss_scale, write_dlogits, ctx.stream);
    else
        classifier_flash(logits, losses, targets, N, V, Vp, dloss_scale, write_dlogits, ctx.stream);
}

// Rows of logits the LM head holds at once for N = B*T positions (flash: chunks; naive: all of them).
inline int lm_head_rows(const KernelSet& ks, int N) { return classifier_chunk_rows(ks[Layer::classifier], N); }

// One AdamW step over every parameter tensor of `layout` (ParamLayout::gpt2(cfg) for the model).
// master (fp32) may be nullptr (then params, which must then be fp32, are updated directly); else master
// is updated and params = round(master). grads are multiplied by hp.grad_scale first (clipping), or by the
// factor the kernel derives from hp.norm2 on the device (then a norm that is not finite updates nothing).
inline void adamw_update(const OpContext& ctx, float* master, floatX* params, const floatX* grads, float* m, float* v,
                         const ParamLayout& layout, const AdamWHyper& hp) {
    ProfileSpan s(ctx.prof, Layer::adamw, Pass::forward, ctx.stream);
    if (ctx.ks.naive(Layer::adamw)) adamw_update_naive(master, params, grads, m, v, layout, hp, ctx.stream);
    else adamw_update_flash(master, params, grads, m, v, layout, hp, ctx.stream);
}

// out (1 float, device) = sum of squares of every gradient in layout, deterministic. Clip with it: hp.norm2 = out
// (on the device), or hp.grad_scale = min(1, clip / sqrt(out)) from a copy on the host.
inline void global_norm_squared(const OpContext& ctx, float* out, const floatX* grads, const ParamLayout& layout) {
    ProfileSpan s(ctx.prof, Layer::adamw, Pass::forward, ctx.stream);
    if (ctx.ks.naive(Layer::adamw)) global_norm_squared_naive(out, ctx.ws, grads, layout, ctx.stream);
    else global_norm_squared_flash(out, ctx.ws, grads, layout, ctx.stream);
}

}  // namespace flashgpt2
