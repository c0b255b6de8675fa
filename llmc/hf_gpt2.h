// A way out of (and back into) the llm.c world: an llm.c checkpoint <-> a Hugging Face GPT-2 folder, the layout
// transformers' GPT2LMHeadModel.from_pretrained(dir) loads (config.json + model.safetensors). `make export-hf` and
// `make import-hf` run it (tools/export_hf.cpp, tools/import_hf.cpp); llm.c issues 502 and 571 ask for it.
//
// What differs between the two layouts, tensor by tensor (llm.c's names and shapes are in llmc/config.h):
//   names    transformers' state-dict names: transformer.wte.weight, transformer.h.<l>.attn.c_attn.weight, ...;
//            llm.c stacks the L layers of each tensor in one (L, ...) array, HF has one tensor per layer.
//   weights  GPT-2's Conv1D keeps its weight as (in, out); llm.c's matmul weights are (out, in) (OC, C). So qkvw,
//            attprojw, fcw and fcprojw are transposed on the way out and back on the way in.
//   vocab    HF's wte has the real V = 50,257 rows; llm.c pads it to Vp (50,304: a multiple of 128, for aligned
//            matmuls) with rows the model never uses. Export drops them (and says so when they are not zero);
//            import adds them back as zeros, with Vp from the exported file's metadata or V rounded up to 128.
//   lm head  tied to wte in both (tie_word_embeddings): nothing is written for it. An imported file that holds
//            an lm_head.weight must hold a copy of wte.
// The dtype stays: an fp32 checkpoint (version 3) becomes F32 tensors, a bf16 one (version 5) BF16 tensors, and
// import turns all-BF16 files back into version 5 and anything else (F32, F16, a mix) into fp32. So
// ours -> safetensors -> ours gives back the checkpoint bit for bit in both precisions (test/cpu/test_hf.cpp),
// provided wte's padding rows were zero (as the trainers keep them: init zero, gradient zero).
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"
#include "llmc/config.h"
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/json.h"
#include "llmc/safetensors.h"

namespace flashgpt2::hf {

// One llm.c tensor in HF's layout: its name (under "transformer.", and "h.<l>." when it is per layer), and
// whether its (per layer) matrix is stored transposed.
struct Name {
    const char* name;
    bool per_layer, transposed;
};
// In llm.c's tensor order (config.h's PARAMETER_NAMES): wte wpe ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b
// fcw fcb fcprojw fcprojb lnfw lnfb.
inline const std::array<Name, NUM_PARAMETER_TENSORS> NAMES = {{
    {"wte.weight", false, false},        {"wpe.weight", false, false},
    {"ln_1.weight", true, false},        {"ln_1.bias", true, false},
    {"attn.c_attn.weight", true, true},  {"attn.c_attn.bias", true, false},
    {"attn.c_proj.weight", true, true},  {"attn.c_proj.bias", true, false},
    {"ln_2.weight", true, false},        {"ln_2.bias", true, false},
    {"mlp.c_fc.weight", true, true},     {"mlp.c_fc.bias", true, false},
    {"mlp.c_proj.weight", true, true},   {"mlp.c_proj.bias", true, false},
    {"ln_f.weight", false, false},       {"ln_f.bias", false, false},
}};

inline std::string hf_name(int i, int layer, const std::string& prefix = "transformer.") {
    return prefix + (NAMES[i].per_layer ? "h." + std::to_string(layer) + "." : "") + NAMES[i].name;
}

// Tensor i's shape in HF's file (one layer's, for a per-layer tensor). llm.c's matrices are (out, in).
inline std::vector<uint64_t> hf_shape(int i, const GPT2Config& c) {
    const uint64_t C = c.channels;
    switch (i) {
        case 0: return {(uint64_t)c.vocab_size, C};
        case 1: return {(uint64_t)c.max_seq_len, C};
        case 4: return {C, 3 * C};  // qkvw: llm.c (3C, C)
        case 5: return {3 * C};
        case 6: return {C, C};      // attprojw: llm.c (C, C)
        case 10: return {C, 4 * C}; // fcw: llm.c (4C, C)
        case 11: return {4 * C};
        case 12: return {4 * C, C}; // fcprojw: llm.c (C, 4C)
        default: return {C};        // layernorm gains and biases, attprojb, fcprojb
    }
}

// rows x cols elements of es bytes each -> their transpose, cols x rows.
inline std::vector<uint8_t> transpose(const std::vector<uint8_t>& in, size_t rows, size_t cols, size_t es) {
    std::vector<uint8_t> out(in.size());
    for (size_t r = 0; r < rows; r++)
        for (size_t k = 0; k < cols; k++) memcpy(&out[(k * rows + r) * es], &in[(r * cols + k) * es], es);
    return out;
}

// ---- config.json ---------------------------------------------------------------------------------------------

inline std::string config_json(const GPT2Config& c, bool bf16) {
    char b[1024];
    snprintf(b, sizeof b,
             "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": %d,\n"
             "  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n"
             "  \"n_inner\": null,\n  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
             "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n  \"initializer_range\": 0.02,\n"
             "  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": true,\n%s  \"torch_dtype\": \"%s\"\n}\n",
             c.vocab_size, c.max_seq_len, c.max_seq_len, c.channels, c.num_layers, c.num_heads,
             c.vocab_size == 50257 ? "  \"bos_token_id\": 50256,\n  \"eos_token_id\": 50256,\n" : "",
             bf16 ? "bfloat16" : "float32");
    return b;
}

// The model shape of a GPT-2 config.json, refusing the options that would make it a different function from ours.
inline GPT2Config read_config(const std::string& path) {
    const json::Value v = json::parse(read_file(path), path);
    if (!v.is(json::Value::Type::object)) fail("%s: not a JSON object", path.c_str());
    auto integer = [&](const char* key, const char* other) {
        const json::Value* x = v.find(key);
        if (!x && other) x = v.find(other);
        uint64_t n;
        if (!x || !x->to_u64(&n) || n > (1u << 30)) fail("%s: needs \"%s\", a positive integer", path.c_str(), key);
        return (int)n;
    };
    auto text = [&](const char* key) { const json::Value* x = v.find(key); return x && x->is(json::Value::Type::string) ? x->text : ""; };
    auto is_true = [&](const char* key, bool dflt) { const json::Value* x = v.find(key); return x ? x->is(json::Value::Type::boolean) && x->boolean : dflt; };
    if (!text("model_type").empty() && text("model_type") != "gpt2")
        fail("%s: model_type \"%s\": only GPT-2 (\"gpt2\") is imported", path.c_str(), text("model_type").c_str());
    const std::string act = text("activation_function");
    if (!act.empty() && act != "gelu_new" && act != "gelu_pytorch_tanh")
        fail("%s: activation_function \"%s\": ours is GELU's tanh form (gelu_new)", path.c_str(), act.c_str());
    if (const json::Value* eps = v.find("layer_norm_epsilon"); eps && std::fabs(std::atof(eps->text.c_str()) - 1e-5) > 1e-12)
        fail("%s: layer_norm_epsilon %s: ours is 1e-05", path.c_str(), eps->text.c_str());
    if (!is_true("scale_attn_weights", true) || is_true("scale_attn_by_inverse_layer_idx", false) || !is_true("tie_word_embeddings", true))
        fail("%s: scale_attn_weights, scale_attn_by_inverse_layer_idx or tie_word_embeddings differ from GPT-2's", path.c_str());
    GPT2Config c;
    c.vocab_size = integer("vocab_size", nullptr);
    c.max_seq_len = integer("n_positions", "n_ctx");
    c.channels = integer("n_embd", nullptr);
    c.num_layers = integer("n_layer", nullptr);
    c.num_heads = integer("n_head", nullptr);
    if (const json::Value* inner = v.find("n_inner"); inner && !inner->is(json::Value::Type::null)) {
        uint64_t n;
        if (!inner->to_u64(&n) || n != 4 * (uint64_t)c.channels) fail("%s: n_inner must be null or 4 * n_embd", path.c_str());
    }
    c.padded_vocab_size = (c.vocab_size + 127) / 128 * 128;
    return c;
}

// ---- export ------------------------------------------------------------------------------------------------

// A checkpoint's bytes at an offset (the export reads one tensor slice at a time, never the whole file).
class FileReader {
public:
    explicit FileReader(const std::string& path) : path_(path), f_(fopen(path.c_str(), "rb")) {
        if (!f_) fail("%s: cannot open: %s", path.c_str(), strerror(errno));
    }
    ~FileReader() { fclose(f_); }
    FileReader(const FileReader&) = delete;
    FileReader& operator=(const FileReader&) = delete;
    std::vector<uint8_t> read(uint64_t offset, size_t n) const {
        std::vector<uint8_t> b(n);
        if (fseeko(f_, (off_t)offset, SEEK_SET) != 0 || (n && fread(b.data(), 1, n, f_) != n))
            fail("%s: read error at byte %llu (file changed while reading?)", path_.c_str(), (unsigned long long)offset);
        return b;
    }

private:
    std::string path_;
    FILE* f_;
};

// Byte offset of tensor i in a checkpoint, whose parameters are es bytes each.
inline uint64_t tensor_offset(const GPT2Config& c, int i, size_t es) {
    uint64_t off = CHECKPOINT_HEADER_INTS * sizeof(int32_t);
    const auto sizes = parameter_sizes(c);
    for (int k = 0; k < i; k++) off += sizes[k] * es;
    return off;
}

// Writes out_dir/model.safetensors and then out_dir/config.json (a folder transformers can load only once both are
// there); with a bpe_dir, also its encoder.json and vocab.bpe as vocab.json and merges.txt, the files GPT-2's
// tokenizer loads in transformers. Returns a note for the user, empty when there is nothing to say.
inline std::string export_hf(const std::string& ckpt, const std::string& out_dir, const std::string& bpe_dir = "") {
    const CheckpointHeader hdr = read_checkpoint_header(ckpt);
    const GPT2Config& c = hdr.config;
    const size_t es = checkpoint_bytes_per_param(hdr.version), L = c.num_layers, C = c.channels;
    const bool bf16 = hdr.version == CHECKPOINT_VERSION_BF16;
    const FileReader in(ckpt);
    const auto sizes = parameter_sizes(c);
    // the vocabulary files are read before anything is written: a wrong --bpe leaves no half-made folder
    std::string vocab, merges;
    if (!bpe_dir.empty()) vocab = read_file(bpe_dir + "/gpt2/encoder.json"), merges = read_file(bpe_dir + "/gpt2/vocab.bpe");

    std::vector<safetensors::TensorOut> out;
    auto add = [&](int i, size_t l) {
        const size_t n = i == 0 ? (size_t)c.vocab_size * C : sizes[i] / (NAMES[i].per_layer ? L : 1);
        const uint64_t off = tensor_offset(c, i, es) + l * n * es;
        const std::vector<uint64_t> shape = hf_shape(i, c);
        out.push_back({hf_name(i, (int)l), bf16 ? "BF16" : "F32", shape, [&in, off, n, es, i, shape](AtomicWriter& w) {
                           std::vector<uint8_t> b = in.read(off, n * es);
                           if (NAMES[i].transposed) b = transpose(b, shape[1], shape[0], es);  // (out, in) -> (in, out)
                           w.write(b.data(), b.size());
                       }});
    };
    add(0, 0), add(1, 0);
    for (size_t l = 0; l < L; l++)
        for (int i = 2; i < 14; i++) add(i, l);
    add(14, 0), add(15, 0);

    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (!std::filesystem::is_directory(out_dir, ec)) fail("%s: cannot create the folder: %s", out_dir.c_str(), ec.message().c_str());
    safetensors::write_file(out_dir + "/model.safetensors", out,
                            {{"format", "pt"}, {"padded_vocab_size", std::to_string(c.padded_vocab_size)}});
    write_file_atomic(out_dir + "/config.json", config_json(c, bf16));
    if (!bpe_dir.empty()) {
        write_file_atomic(out_dir + "/vocab.json", vocab);
        write_file_atomic(out_dir + "/merges.txt", merges);
    }
    const std::vector<uint8_t> pad = in.read(tensor_offset(c, 0, es) + (uint64_t)c.vocab_size * C * es,
                                             (size_t)(c.padded_vocab_size - c.vocab_size) * C * es);
    for (uint8_t b : pad)
        if (b) return "note: wte's padding rows (" + std::to_string(c.vocab_size) + ".." + std::to_string(c.padded_vocab_size - 1) +
                      ") are not all zero; they are not exported, and an import gives zeros there";
    return "";
}

// ---- import ------------------------------------------------------------------------------------------------

inline bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Writes an llm.c checkpoint (version 5 when every tensor is BF16, else 3) from a HF GPT-2 folder.
inline void import_hf(const std::string& dir, const std::string& out_ckpt) {
    const std::string st_path = dir + "/model.safetensors";
    const safetensors::File st(st_path);
    GPT2Config c = read_config(dir + "/config.json");
    if (const std::string vp = st.header.meta("padded_vocab_size"); !vp.empty()) c.padded_vocab_size = std::atoi(vp.c_str());
    validate_config(c, (dir + "/config.json").c_str());
    // names: transformers writes "transformer.wte.weight"; a bare GPT2Model (and openai-community/gpt2) "wte.weight"
    const std::string prefix = st.header.find("transformer.wte.weight") ? "transformer." : "";
    bool all_bf16 = true;
    for (const safetensors::TensorInfo& t : st.header.tensors) {
        const std::string n = t.name.substr(t.name.rfind(prefix, 0) == 0 ? prefix.size() : 0);
        const bool buffer = ends_with(n, ".attn.bias") || ends_with(n, ".attn.masked_bias");  // the causal mask
        if (buffer) continue;
        bool known = n == "lm_head.weight";
        for (int i = 0; i < NUM_PARAMETER_TENSORS && !known; i++)
            for (int l = 0; l < (NAMES[i].per_layer ? c.num_layers : 1) && !known; l++) known = t.name == hf_name(i, l, prefix);
        if (!known) fail("%s: tensor \"%s\" is not part of a GPT-2 with this config.json", st_path.c_str(), t.name.c_str());
        all_bf16 = all_bf16 && t.dtype == "BF16";
    }
    const int version = all_bf16 ? CHECKPOINT_VERSION_BF16 : CHECKPOINT_VERSION_FP32;
    const size_t es = checkpoint_bytes_per_param(version);
    auto bytes_of = [&](const safetensors::TensorInfo& t) {  // in the checkpoint's element type
        if (all_bf16) return st.read_raw(t);
        const std::vector<float> f = st.read_f32(t);
        std::vector<uint8_t> b(f.size() * sizeof(float));
        if (!b.empty()) memcpy(b.data(), f.data(), b.size());
        return b;
    };

    const auto header = checkpoint_header(c, version, out_ckpt);
    AtomicWriter w(out_ckpt);
    w.write(header.data(), sizeof header);
    std::vector<uint8_t> wte;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++)
        for (int l = 0; l < (NAMES[i].per_layer ? c.num_layers : 1); l++) {
            const std::string name = hf_name(i, l, prefix);
            const safetensors::TensorInfo* t = st.header.find(name);
            const std::vector<uint64_t> shape = hf_shape(i, c);
            if (!t) fail("%s: no tensor \"%s\"", st_path.c_str(), name.c_str());
            if (t->shape != shape) fail("%s: tensor \"%s\" has a shape that does not match config.json", st_path.c_str(), name.c_str());
            std::vector<uint8_t> b = bytes_of(*t);
            if (NAMES[i].transposed) b = transpose(b, shape[0], shape[1], es);  // (in, out) -> (out, in)
            w.write(b.data(), b.size());
            if (i == 0) {
                wte = std::move(b);
                const std::vector<uint8_t> zeros((size_t)(c.padded_vocab_size - c.vocab_size) * c.channels * es, 0);
                w.write(zeros.data(), zeros.size());
            }
        }
    if (const safetensors::TensorInfo* head = st.header.find("lm_head.weight")) {
        if (head->shape != hf_shape(0, c) || bytes_of(*head) != wte)
            fail("%s: lm_head.weight is not a copy of wte: an untied output layer is not GPT-2's", st_path.c_str());
    }
    w.commit();
}

}  // namespace flashgpt2::hf
