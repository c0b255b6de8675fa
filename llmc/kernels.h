// The kernel registry and the "layer ops" the trainer calls.
//
// Every layer of GPT-2 exists twice (DESIGN.md, "The layers and their two kernels"): a naive kernel that
// writes its intermediates to HBM, and a flash kernel that keeps them on chip (tiled, fused). A KernelSet
// picks one variant per layer at run time (--kernels naive|flash, --attention naive, ...). The layer ops
// below dispatch on it, so train_gpt2.cu reads like the model and never names a kernel.
//
// Conventions for every op:
//   - tensors are device pointers; activations/weights/grads are floatX (bf16, or fp32 in the FP32 build),
//     layernorm mean/rstd, attention lse, losses, AdamW state and master weights are fp32;
//   - parameter gradients ACCUMULATE (+=, for gradient accumulation over micro-batches);
//     activation gradients are OVERWRITTEN, except layernorm_backward's dinp, which accumulates (+=) so the
//     residual stream's gradient (dresidual) sums its two paths, as in llm.c;
//   - `ws` is the one transient workspace the caller allocates once with workspace_bytes(); ops run on
//     one stream, one after another, so they all share it;
//   - ops only launch work on `stream`: no allocation (except cuBLAS handles and their workspace, created
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
// Selection: one variant per layer.
// (enum class Variant { naive, flash } lives in llmc/kernel_common.cuh, included by every layer file.)

constexpr int NUM_LAYER_KINDS = 8;
constexpr std::array<const char*, NUM_LAYER_KINDS> LAYER_KINDS = {
    "encoder", "layernorm", "matmul", "attention", "gelu", "residual", "classifier", "adamw"};

inline const char* variant_name(Variant v) { return v == Variant::naive ? "naive" : "flash"; }

inline Variant parse_variant(const std::string& s, const std::string& what) {
    if (s == "naive") return Variant::naive;
    if (s == "flash") return Variant::flash;
    fail("%s: unknown kernel variant '%s' (expected naive or flash)", what.c_str(), s.c_str());
}

struct KernelSet {
    Variant encoder = Variant::flash, layernorm = Variant::flash, matmul = Variant::flash,
            attention = Variant::flash, gelu = Variant::flash, residual = Variant::flash,
            classifier = Variant::flash, adamw = Variant::flash;

    static KernelSet all(Variant v) {
        KernelSet ks;
        for (const char* name : LAYER_KINDS) ks.at(name) = v;
        return ks;
    }
    static KernelSet all(const std::string& v) { return all(parse_variant(v, "--kernels")); }

    // The slot of a layer by name ("attention"); throws flashgpt2::Error for an unknown layer.
    Variant& at(const std::string& layer) {
        if (layer == "encoder") return encoder;
        if (layer == "layernorm") return layernorm;
        if (layer == "matmul") return matmul;
        if (layer == "attention") return attention;
        if (layer == "gelu") return gelu;
        if (layer == "residual") return residual;
        if (layer == "classifier") return classifier;
        if (layer == "adamw") return adamw;
        fail("--%s: unknown layer (expected one of encoder, layernorm, matmul, attention, gelu, residual, "
             "classifier, adamw)", layer.c_str());
    }
    Variant at(const std::string& layer) const { return const_cast<KernelSet*>(this)->at(layer); }

    // --attention naive  ->  ks.set("attention", "naive")
    void set(const std::string& layer, const std::string& variant) {
        at(layer) = parse_variant(variant, "--" + layer);
    }

    // "flash" / "naive" when uniform, else "encoder=flash layernorm=naive ..." (for logs and tables).
    std::string str() const {
        bool same = true;
        for (const char* name : LAYER_KINDS) same = same && at(name) == encoder;
        if (same) return variant_name(encoder);
        std::string s;
        for (const char* name : LAYER_KINDS) {
            if (!s.empty()) s += ' ';
            s += std::string(name) + "=" + variant_name(at(name));
        }
        return s;
    }

    bool operator==(const KernelSet& o) const {
        for (const char* name : LAYER_KINDS)
            if (at(name) != o.at(name)) return false;
        return true;
    }
};

// --list-kernels: layer -> naive kernel, flash kernel, and what each does.
inline void print_kernel_registry(FILE* f) {
    struct Row { const char *layer, *naive, *naive_does, *flash, *flash_does; };
    static const Row rows[] = {
        {"encoder", "encoder_{forward,backward}_naive",
         "one thread per element; backward adds into dwte/dwpe with atomics (order varies: not deterministic)",
         "encoder_{forward,backward}_flash",
         "16-byte vector loads; backward sorts positions by token (stable radix sort) and sums each token's "
         "rows in order: deterministic"},
        {"layernorm", "layernorm_{forward,backward}_naive",
         "separate passes over HBM: mean, variance, normalize (backward: row sums, dinp, dw/db)",
         "layernorm_{forward,backward}_flash",
         "one warp per row, the row read once into shared memory; dw/db from per-block partials, "
         "reduced in a fixed order"},
        {"matmul", "matmul_{forward,backward}_naive",
         "one thread per output element, operands read from global memory",
         "matmul_{forward,backward}_flash",
         "cuBLASLt tensor-core GEMM with bias (and GELU) fused in the epilogue; dbias by a deterministic "
         "two-stage column sum"},
        {"attention", "attention_{forward,backward}_naive",
         "standard attention: S=QK^T and P=softmax(S) written to HBM, (B,NH,T,T) per layer, then O=PV "
         "(cuBLAS batched GEMMs + softmax kernel)",
         "attention_{forward,backward}_flash",
         "tiled online softmax, S and P never leave the chip, saves lse (B,NH,T); backward recomputes P "
         "from lse (FA2); bf16 build on Hopper: forward = the ladder's top rung (wgmma + TMA, ping-pong), "
         "backward = the same two kernels on wgmma; elsewhere mma.sync / fp32 tiles"},
        {"gelu", "gelu_{forward,backward}_naive", "its own elementwise kernel (tanh approximation)",
         "gelu_{forward,backward}_flash",
         "fused into the matmul epilogue (cuBLASLt GELU_AUX / DGELU) when the matmul is flash; else a "
         "vectorized kernel"},
        {"residual", "residual_forward_naive",
         "its own kernel: out = a + b (backward: none, the gradient passes through)",
         "residual_forward_flash",
         "fused with the next layernorm (residual_layernorm_forward_flash) when layernorm is flash; "
         "else vectorized"},
        {"classifier", "classifier_naive",
         "softmax probabilities materialized in HBM (N,Vp) fp32, then loss, then dlogits: three passes",
         "classifier_flash",
         "one fused pass per row: online softmax, loss, dlogits written in place over the logits"},
        {"adamw", "adamw_update_naive",
         "one launch per parameter tensor (16), grad norm per tensor",
         "adamw_update_flash",
         "one launch over all parameters, 4 per thread (16-byte loads); grad norm in one launch (both "
         "deterministic)"},
    };
    fprintf(f, "%-11s %-38s %s\n", "layer", "kernel", "what it does");
    for (const Row& r : rows) {
        fprintf(f, "%-11s %-38s naive: %s\n", r.layer, r.naive, r.naive_does);
        fprintf(f, "%-11s %-38s flash: %s\n", "", r.flash, r.flash_does);
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
    take(encoder_backward_workspace_bytes(ks.encoder, B, T, C, Vp));
    take(layernorm_backward_workspace_bytes(ks.layernorm, N, C));
    take(matmul_backward_workspace_bytes(ks.matmul, N, Vp > 4 * C ? Vp : 4 * C));
    take(attention_workspace_bytes(ks.attention, B, T, C, NH));
    take(classifier_workspace_bytes(ks.classifier, N, Vp));
    take(global_norm_workspace_bytes(ks.adamw));
    return bytes;
}

// What one layer's attention keeps from forward to backward, in bytes (allocate one per layer):
// flash: lse (B,NH,T) fp32; naive: P = softmax(S) (B,NH,T,T) floatX.
inline size_t attention_saved_bytes(const KernelSet& ks, int B, int T, int NH) {
    return attention_saved_bytes(ks.attention, B, T, NH);
}

// Throws flashgpt2::Error when a kernel in the set cannot run this shape (call once at setup).
inline void check_kernel_support(const KernelSet& ks, int C, int NH) {
    attention_check_shape(ks.attention, C, NH);
    // (the flash matmul's dbias reads rows of C, 3C and 4C channels as 16-byte vectors)
    if ((ks.encoder == Variant::flash || ks.layernorm == Variant::flash || ks.matmul == Variant::flash) &&
        C % X128 != 0)
        fail("channels %d: the flash encoder, layernorm and matmul read 16-byte vectors, so channels must be a "
             "multiple of %d (or use --encoder naive --layernorm naive --matmul naive)", C, X128);
}

// ---------------------------------------------------------------------------------------------------------
// Layer ops. Shapes: N = B*T rows; C channels; NH heads; HS = C/NH; V real vocab, Vp padded vocab.

// out (B,T,C) = wte[inp] + wpe[t];  inp (B,T) int token ids on the device; wte (Vp,C), wpe (maxT,C).
inline void encoder_forward(const KernelSet& ks, floatX* out, const int* inp, const floatX* wte,
                            const floatX* wpe, int B, int T, int C, cudaStream_t stream) {
    if (ks.encoder == Variant::naive) encoder_forward_naive(out, inp, wte, wpe, B, T, C, stream);
    else encoder_forward_flash(out, inp, wte, wpe, B, T, C, stream);
}

// dwte (Vp,C) += scatter of dout by token; dwpe (maxT,C) += sum over b of dout.  dout (B,T,C).
inline void encoder_backward(const KernelSet& ks, floatX* dwte, floatX* dwpe, void* ws, const floatX* dout,
                             const int* inp, int B, int T, int C, int Vp, cudaStream_t stream) {
    if (ks.encoder == Variant::naive) encoder_backward_naive(dwte, dwpe, ws, dout, inp, B, T, C, Vp, stream);
    else encoder_backward_flash(dwte, dwpe, ws, dout, inp, B, T, C, Vp, stream);
}

// out (N,C) = layernorm(inp) * w + b; mean, rstd (N) fp32 saved for the backward (eps 1e-5).
inline void layernorm_forward(const KernelSet& ks, floatX* out, float* mean, float* rstd, const floatX* inp,
                              const floatX* w, const floatX* b, int N, int C, cudaStream_t stream) {
    if (ks.layernorm == Variant::naive) layernorm_forward_naive(out, mean, rstd, inp, w, b, N, C, stream);
    else layernorm_forward_flash(out, mean, rstd, inp, w, b, N, C, stream);
}

// out = inp1 + inp2 (n elements).
inline void residual_forward(const KernelSet& ks, floatX* out, const floatX* inp1, const floatX* inp2,
                             size_t n, cudaStream_t stream) {
    if (ks.residual == Variant::naive) residual_forward_naive(out, inp1, inp2, n, stream);
    else residual_forward_flash(out, inp1, inp2, n, stream);
}

// residual_out (N,C) = inp1 + inp2;  ln_out (N,C) = layernorm(residual_out) * w + b.
// Both flash: one fused kernel (one warp per row, one pass). Otherwise residual, then layernorm.
inline void residual_layernorm_forward(const KernelSet& ks, floatX* residual_out, floatX* ln_out, float* mean,
                                       float* rstd, const floatX* inp1, const floatX* inp2, const floatX* w,
                                       const floatX* b, int N, int C, cudaStream_t stream) {
    if (ks.residual == Variant::flash && ks.layernorm == Variant::flash) {
        residual_layernorm_forward_flash(residual_out, ln_out, mean, rstd, inp1, inp2, w, b, N, C, stream);
    } else {
        residual_forward(ks, residual_out, inp1, inp2, (size_t)N * C, stream);
        layernorm_forward(ks, ln_out, mean, rstd, residual_out, w, b, N, C, stream);
    }
}

// dinp (N,C) += ..., dw (C) += ..., db (C) += ...;  dout (N,C), inp (N,C) the forward input.
inline void layernorm_backward(const KernelSet& ks, floatX* dinp, floatX* dw, floatX* db, void* ws,
                               const floatX* dout, const floatX* inp, const floatX* w, const float* mean,
                               const float* rstd, int N, int C, cudaStream_t stream) {
    if (ks.layernorm == Variant::naive)
        layernorm_backward_naive(dinp, dw, db, ws, dout, inp, w, mean, rstd, N, C, stream);
    else
        layernorm_backward_flash(dinp, dw, db, ws, dout, inp, w, mean, rstd, N, C, stream);
}

// out (N,OC) = inp (N,C) @ w^T + bias;  w (OC,C) as in llm.c; bias (OC) or nullptr.
inline void matmul_forward(const KernelSet& ks, floatX* out, const floatX* inp, const floatX* w,
                           const floatX* bias, int N, int C, int OC, cudaStream_t stream) {
    if (ks.matmul == Variant::naive) matmul_forward_naive(out, inp, w, bias, N, C, OC, stream);
    else matmul_forward_flash(out, inp, w, bias, N, C, OC, nullptr, stream);
}

// out (n) = gelu(inp) (tanh approximation).
inline void gelu_forward(const KernelSet& ks, floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
    if (ks.gelu == Variant::naive) gelu_forward_naive(out, inp, n, stream);
    else gelu_forward_flash(out, inp, n, stream);
}

// dinp (n) = dout * gelu'(inp); dinp may be dout (in place).
inline void gelu_backward(const KernelSet& ks, floatX* dinp, const floatX* inp, const floatX* dout, size_t n,
                          cudaStream_t stream) {
    if (ks.gelu == Variant::naive) gelu_backward_naive(dinp, inp, dout, n, stream);
    else gelu_backward_flash(dinp, inp, dout, n, stream);
}

// pre_gelu (N,OC) = inp @ w^T + bias;  out_gelu (N,OC) = gelu(pre_gelu).
// Flash matmul + flash gelu: one cuBLASLt call with the GELU_AUX_BIAS epilogue (writes both).
inline void matmul_gelu_forward(const KernelSet& ks, floatX* out_gelu, floatX* pre_gelu, const floatX* inp,
                                const floatX* w, const floatX* bias, int N, int C, int OC, cudaStream_t stream) {
    if (ks.matmul == Variant::flash && ks.gelu == Variant::flash) {
        matmul_forward_flash(out_gelu, inp, w, bias, N, C, OC, pre_gelu, stream);
    } else {
        matmul_forward(ks, pre_gelu, inp, w, bias, N, C, OC, stream);
        gelu_forward(ks, out_gelu, pre_gelu, (size_t)N * OC, stream);
    }
}

// dinp (N,C) = dout (N,OC) @ w;  dw (OC,C) += dout^T @ inp;  dbias (OC) += colsum(dout) (dbias may be null).
// pre_gelu (N,C) non-null: the input of this matmul was gelu(pre_gelu), and dinp is returned already
// multiplied by gelu'(pre_gelu) (flash+flash: cuBLASLt DGELU epilogue; otherwise the gelu backward kernel).
inline void matmul_backward(const KernelSet& ks, floatX* dinp, floatX* dw, floatX* dbias, void* ws,
                            const floatX* dout, const floatX* inp, const floatX* w, const floatX* pre_gelu,
                            int N, int C, int OC, cudaStream_t stream) {
    const bool fuse_gelu = pre_gelu && ks.matmul == Variant::flash && ks.gelu == Variant::flash;
    if (ks.matmul == Variant::naive)
        matmul_backward_naive(dinp, dw, dbias, dout, inp, w, N, C, OC, stream);
    else
        matmul_backward_flash(dinp, dw, dbias, ws, dout, inp, w, fuse_gelu ? pre_gelu : nullptr, N, C, OC, stream);
    if (pre_gelu && !fuse_gelu) gelu_backward(ks, dinp, pre_gelu, dinp, (size_t)N * C, stream);
}

// out (B,T,C) = causal self-attention of qkv (B,T,3,NH,HS), softmax scale 1/sqrt(HS).
// saved: attention_saved_bytes() per layer (flash: lse (B,NH,T) fp32; naive: P (B,NH,T,T)).
inline void attention_forward(const KernelSet& ks, floatX* out, void* saved, void* ws, const floatX* qkv,
                              int B, int T, int C, int NH, cudaStream_t stream) {
    if (ks.attention == Variant::naive) attention_forward_naive(out, (floatX*)saved, ws, qkv, B, T, C, NH, stream);
    else attention_forward_flash(out, (float*)saved, qkv, B, T, C, NH, stream);
}

// dqkv (B,T,3C) = gradient of the attention w.r.t. qkv given dout (B,T,C) (overwritten, not accumulated).
// out is the forward's output (flash uses it for D = rowsum(dO*O)); saved as written by the forward.
inline void attention_backward(const KernelSet& ks, floatX* dqkv, void* ws, const floatX* dout,
                               const floatX* qkv, const floatX* out, const void* saved, int B, int T, int C,
                               int NH, cudaStream_t stream) {
    if (ks.attention == Variant::naive)
        attention_backward_naive(dqkv, ws, dout, qkv, (const floatX*)saved, B, T, C, NH, stream);
    else
        attention_backward_flash(dqkv, ws, dout, qkv, out, (const float*)saved, B, T, C, NH, stream);
}

// logits (B,T,Vp) -> losses (B,T) fp32 = -log softmax(logits[:V])[target]; if write_dlogits, logits is
// overwritten in place by dlogits = (softmax - onehot(target)) * dloss_scale, with 0 in padded columns V..Vp.
// (dloss_scale is usually 1/(B*T*grad_accum_steps): the gradient of the mean loss.)
inline void fused_classifier(const KernelSet& ks, floatX* logits, float* losses, void* ws, const int* targets,
                             int B, int T, int V, int Vp, float dloss_scale, bool write_dlogits,
                             cudaStream_t stream) {
    if (ks.classifier == Variant::naive)
        classifier_naive(logits, losses, ws, targets, B * T, V, Vp, dloss_scale, write_dlogits, stream);
    else
        classifier_flash(logits, losses, targets, B * T, V, Vp, dloss_scale, write_dlogits, stream);
}

// One AdamW step over every parameter tensor of `layout` (ParamLayout::gpt2(cfg) for the model).
// master (fp32) may be nullptr (then params, which must then be fp32, are updated directly); else master
// is updated and params = round(master). grads are multiplied by hp.grad_scale first (clipping).
inline void adamw_update(const KernelSet& ks, float* master, floatX* params, const floatX* grads, float* m,
                         float* v, const ParamLayout& layout, const AdamWHyper& hp, cudaStream_t stream) {
    if (ks.adamw == Variant::naive) adamw_update_naive(master, params, grads, m, v, layout, hp, stream);
    else adamw_update_flash(master, params, grads, m, v, layout, hp, stream);
}

// out (1 float, device) = sum of squares of every gradient in layout, deterministic. Copy it to the host
// and clip with hp.grad_scale = min(1, clip / sqrt(out)).
inline void global_norm_squared(const KernelSet& ks, float* out, void* ws, const floatX* grads,
                                const ParamLayout& layout, cudaStream_t stream) {
    if (ks.adamw == Variant::naive) global_norm_squared_naive(out, ws, grads, layout, stream);
    else global_norm_squared_flash(out, ws, grads, layout, stream);
}

}  // namespace flashgpt2
