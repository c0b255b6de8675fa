// Tests of the Hugging Face export and import (llmc/safetensors.h, llmc/hf_gpt2.h, tools/export_hf, tools/import_hf):
// the exported file's bytes against the safetensors format (header length, padding, names, shapes, offsets), the
// Conv1D transposes read straight from those bytes, the round trip ours -> HF -> ours bit for bit in fp32 and bf16,
// an import of a folder laid out the way the Hub's gpt2 is (bare names, mask buffers, F16, an lm_head copy), and
// one test per kind of bad input. The expected HF layout is written out here by hand, not taken from hf_gpt2.h.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"
#include "llmc/hf_gpt2.h"
#include "llmc/safetensors.h"
#include "llmc/sampler.h"
#include "test/cpu/data_helpers.h"

using namespace flashgpt2;
using namespace flashgpt2::testing;
using std::string;
using std::vector;

namespace {

// V=300 padded to Vp=320 (not V rounded up to 128, 384), so the export must carry Vp for the round trip.
GPT2Config tiny() {
    GPT2Config c;
    c.max_seq_len = 8, c.vocab_size = 300, c.padded_vocab_size = 320, c.num_layers = 2, c.num_heads = 2, c.channels = 8;
    return c;
}

// Offsets of the 16 tensors in the flat parameter vector (llm.c order), written out for the tiny config's shapes.
size_t offset_of(const GPT2Config& c, int i) {
    size_t off = 0;
    for (int k = 0; k < i; k++) off += parameter_sizes(c)[k];
    return off;
}

// Random normal parameters (every tensor, so a misplaced one shows), wte's padding rows zero as the trainers keep them.
vector<float> random_params(const GPT2Config& c, uint64_t seed) {
    MESSAGE("random parameters, seed ", seed);
    Rng rng(seed);
    vector<float> p(num_parameters(c));
    for (float& x : p) x = (float)rng.next_normal();
    for (size_t i = (size_t)c.vocab_size * c.channels; i < (size_t)c.padded_vocab_size * c.channels; i++) p[i] = 0;
    return p;
}

uint64_t u64_at(const string& b, size_t pos) {
    uint64_t v;
    memcpy(&v, b.data() + pos, 8);
    return v;
}
float f32_at(const string& b, size_t pos) {
    float v;
    memcpy(&v, b.data() + pos, 4);
    return v;
}

// The data_offsets BEGIN of a tensor, read from the header text that follows `"name":{...,"data_offsets":[`.
uint64_t begin_of(const string& header, const string& entry_prefix) {
    const size_t at = header.find(entry_prefix);
    REQUIRE_MESSAGE(at != string::npos, entry_prefix);
    return std::stoull(header.substr(at + entry_prefix.size()));
}

// A safetensors file from a raw header text and data (for the malformed-file tests).
void write_raw_safetensors(const string& path, const string& header, size_t data_bytes) {
    const uint64_t n = header.size();
    write_bytes(path, string(reinterpret_cast<const char*>(&n), 8) + header + string(data_bytes, '\0'));
}

// IEEE half of a value that has one exactly (k/64 with |k| <= 64 here): sign, 5-bit exponent biased by 15, 10 bits.
uint16_t exact_f16(float x) {
    if (x == 0) return 0;
    int e;
    const float f = std::frexp(std::fabs(x), &e);  // |x| = f * 2^e, f in [0.5, 1): 1.m * 2^(e-1)
    const uint16_t mant = (uint16_t)std::lround((2 * f - 1) * 1024);
    return (uint16_t)((x < 0 ? 0x8000 : 0) | ((e - 1 + 15) << 10) | mant);
}

// What the error tests change in a hub-style folder.
struct Changes {
    string drop;                        // a tensor left out
    string extra;                       // a tensor added
    string config_edit;                 // "from=to": one replacement in config.json
    const vector<float>* head = nullptr;  // lm_head.weight from these parameters' wte instead
};

// A GPT-2 folder written the way the Hub's openai-community/gpt2 is: bare names (GPT2Model's), the causal-mask buffer
// h.<l>.attn.bias, F16 tensors, an lm_head.weight copy of wte, and its config.json's extra keys. The layout is spelled
// out here: Conv1D weights (in, out) are llm.c's (out, in) transposed.
void write_hub_style_folder(const string& dir, const GPT2Config& c, const vector<float>& p, const Changes& ch = {}) {
    const string &drop = ch.drop, &extra = ch.extra, &config_edit = ch.config_edit;
    const uint64_t C = c.channels, V = c.vocab_size;
    vector<safetensors::TensorOut> ts;
    auto add = [&](const string& name, vector<uint64_t> shape, vector<float> values, const char* dtype = "F16") {
        if (name == drop) return;
        auto data = std::make_shared<vector<uint16_t>>();
        for (float v : values) data->push_back(exact_f16(v));
        ts.push_back({name, dtype, shape, [data](AtomicWriter& w) { w.write(data->data(), data->size() * 2); }});
    };
    auto slice = [&](int i, int l, size_t n) { return vector<float>(p.begin() + offset_of(c, i) + l * n, p.begin() + offset_of(c, i) + (l + 1) * n); };
    auto transposed = [&](int i, int l, size_t out, size_t in) {  // llm.c (out, in) -> (in, out)
        vector<float> t(out * in);
        for (size_t o = 0; o < out; o++)
            for (size_t k = 0; k < in; k++) t[k * out + o] = p[offset_of(c, i) + l * out * in + o * in + k];
        return t;
    };
    add("wte.weight", {V, C}, slice(0, 0, V * C));
    add("wpe.weight", {(uint64_t)c.max_seq_len, C}, slice(1, 0, c.max_seq_len * C));
    for (int l = 0; l < c.num_layers; l++) {
        const string h = "h." + std::to_string(l) + ".";
        add(h + "ln_1.weight", {C}, slice(2, l, C));
        add(h + "ln_1.bias", {C}, slice(3, l, C));
        add(h + "attn.bias", {1, 1, (uint64_t)c.max_seq_len, (uint64_t)c.max_seq_len}, vector<float>(c.max_seq_len * c.max_seq_len, 1.0f));
        add(h + "attn.c_attn.weight", {C, 3 * C}, transposed(4, l, 3 * C, C));
        add(h + "attn.c_attn.bias", {3 * C}, slice(5, l, 3 * C));
        add(h + "attn.c_proj.weight", {C, C}, transposed(6, l, C, C));
        add(h + "attn.c_proj.bias", {C}, slice(7, l, C));
        add(h + "ln_2.weight", {C}, slice(8, l, C));
        add(h + "ln_2.bias", {C}, slice(9, l, C));
        add(h + "mlp.c_fc.weight", {C, 4 * C}, transposed(10, l, 4 * C, C));
        add(h + "mlp.c_fc.bias", {4 * C}, slice(11, l, 4 * C));
        add(h + "mlp.c_proj.weight", {4 * C, C}, transposed(12, l, C, 4 * C));
        add(h + "mlp.c_proj.bias", {C}, slice(13, l, C));
    }
    add("ln_f.weight", {C}, slice(14, 0, C));
    add("ln_f.bias", {C}, slice(15, 0, C));
    add("lm_head.weight", {V, C}, ch.head ? vector<float>(ch.head->begin(), ch.head->begin() + V * C) : slice(0, 0, V * C));
    if (!extra.empty()) add(extra, {C}, vector<float>(C, 0.5f));
    safetensors::write_file(dir + "/model.safetensors", ts, {{"format", "pt"}});
    string config = R"({"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 8, "n_embd": 8, "n_head": 2, "n_layer": 2,
  "n_positions": 8, "resid_pdrop": 0.1, "summary_activation": null, "summary_first_dropout": 0.1,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}}, "vocab_size": 300})";
    if (!config_edit.empty()) {
        const size_t eq = config_edit.find('=');
        const string from = config_edit.substr(0, eq), to = config_edit.substr(eq + 1);
        REQUIRE(config.find(from) != string::npos);
        config.replace(config.find(from), from.size(), to);
    }
    write_bytes(dir + "/config.json", config);
}

// Parameters whose values F16 holds exactly (k/64, |k| <= 64), wte's padding rows zero.
vector<float> f16_exact_params(const GPT2Config& c, uint64_t seed) {
    MESSAGE("F16-exact parameters, seed ", seed);
    Rng rng(seed);
    vector<float> p(num_parameters(c));
    for (float& x : p) x = (float)((int)(rng.next_u32() % 129) - 64) / 64.0f;
    for (size_t i = (size_t)c.vocab_size * c.channels; i < p.size() && i < (size_t)c.padded_vocab_size * c.channels; i++) p[i] = 0;
    return p;
}

}  // namespace

TEST_CASE("hf: the exported model.safetensors follows the format, names and shapes are transformers' GPT-2") {
    TempDir d;
    const GPT2Config c = tiny();
    const vector<float> p = random_params(c, 11);
    save_checkpoint(d / "m.bin", c, p.data());
    CHECK(hf::export_hf(d / "m.bin", d / "hf") == "");

    const string b = read_file(d / "hf/model.safetensors");
    REQUIRE(b.size() > 8);
    const uint64_t n = u64_at(b, 0);  // 8-byte little-endian header length
    REQUIRE(n < b.size() - 8);
    CHECK((8 + n) % 8 == 0);  // the data starts 8-aligned
    const string header = b.substr(8, n);
    CHECK(header[0] == '{');
    const size_t close = header.find_last_of('}');
    CHECK(header.find_first_not_of(' ', close + 1) == string::npos);  // only spaces pad it
    CHECK(contains(header, R"("__metadata__":{"format":"pt","padded_vocab_size":"320"})"));
    // wte has the real 300 rows; offsets count from the data's start; tensors follow each other
    CHECK(contains(header, R"("transformer.wte.weight":{"dtype":"F32","shape":[300,8],"data_offsets":[0,9600]})"));
    CHECK(contains(header, R"("transformer.wpe.weight":{"dtype":"F32","shape":[8,8],"data_offsets":[9600,9856]})"));
    CHECK(contains(header, R"("transformer.h.0.attn.c_attn.weight":{"dtype":"F32","shape":[8,24],)"));
    CHECK(contains(header, R"("transformer.h.1.mlp.c_fc.weight":{"dtype":"F32","shape":[8,32],)"));
    CHECK(contains(header, R"("transformer.h.1.mlp.c_proj.weight":{"dtype":"F32","shape":[32,8],)"));
    CHECK(!contains(header, "lm_head"));  // tied to wte
    size_t entries = 0;
    for (size_t at = header.find("\"dtype\""); at != string::npos; at = header.find("\"dtype\"", at + 1)) entries++;
    CHECK(entries == 2 + 12 * 2 + 2);
    const size_t data_bytes = (num_parameters(c) - (c.padded_vocab_size - c.vocab_size) * c.channels) * 4;
    CHECK(b.size() - 8 - n == data_bytes);
    CHECK(contains(header, "\"transformer.ln_f.bias\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[" +
                               std::to_string(data_bytes - 32) + "," + std::to_string(data_bytes) + "]}"));

    // element by element, straight from the bytes: HF (in, out) = llm.c (out, in) transposed
    const size_t data = 8 + n, C = 8;
    const uint64_t qkv = begin_of(header, R"("transformer.h.1.attn.c_attn.weight":{"dtype":"F32","shape":[8,24],"data_offsets":[)");
    const uint64_t fcproj = begin_of(header, R"("transformer.h.0.mlp.c_proj.weight":{"dtype":"F32","shape":[32,8],"data_offsets":[)");
    for (size_t in = 0; in < C; in++)
        for (size_t out = 0; out < 3 * C; out++)
            CHECK(f32_at(b, data + qkv + (in * 3 * C + out) * 4) == p[offset_of(c, 4) + 1 * 3 * C * C + out * C + in]);
    for (size_t in = 0; in < 4 * C; in++)
        for (size_t out = 0; out < C; out++)
            CHECK(f32_at(b, data + fcproj + (in * C + out) * 4) == p[offset_of(c, 12) + out * 4 * C + in]);
    for (size_t i = 0; i < 300 * C; i++) CHECK(f32_at(b, data + i * 4) == p[i]);  // wte as it is

    const string config = read_file(d / "hf/config.json");
    for (const char* want : {"\"model_type\": \"gpt2\"", "\"vocab_size\": 300", "\"n_positions\": 8", "\"n_embd\": 8",
                             "\"n_layer\": 2", "\"n_head\": 2", "\"activation_function\": \"gelu_new\"",
                             "\"layer_norm_epsilon\": 1e-05", "\"tie_word_embeddings\": true", "\"torch_dtype\": \"float32\""})
        CHECK_MESSAGE(contains(config, want), want);
    CHECK(json::parse(config, "config.json").is(json::Value::Type::object));
}

TEST_CASE("hf: ours -> safetensors -> ours is bit-identical, for fp32 and for bf16 checkpoints") {
    TempDir d;
    const GPT2Config c = tiny();
    SUBCASE("fp32 (version 3): F32 tensors") {
        const vector<float> p = random_params(c, 12);
        save_checkpoint(d / "m.bin", c, p.data());
        hf::export_hf(d / "m.bin", d / "hf");
        hf::import_hf(d / "hf", d / "back.bin");
        CHECK(read_file(d / "back.bin") == read_file(d / "m.bin"));
    }
    SUBCASE("bf16 (version 5): BF16 tensors, imported back as version 5") {
        const vector<float> p = random_params(c, 13);
        vector<uint16_t> h(p.size());
        for (size_t i = 0; i < p.size(); i++) h[i] = float_to_bf16(p[i]);
        write_checkpoint_file(d / "m.bin", c, CHECKPOINT_VERSION_BF16, h.data(), h.size() * 2);
        hf::export_hf(d / "m.bin", d / "hf");
        CHECK(contains(read_file(d / "hf/model.safetensors"), R"("transformer.wte.weight":{"dtype":"BF16","shape":[300,8])"));
        CHECK(contains(read_file(d / "hf/config.json"), "\"torch_dtype\": \"bfloat16\""));
        hf::import_hf(d / "hf", d / "back.bin");
        CHECK(read_file(d / "back.bin") == read_file(d / "m.bin"));
    }
    SUBCASE("non-zero padding rows: a note, and zeros there after the round trip") {
        vector<float> p = random_params(c, 14);
        p[(size_t)c.vocab_size * c.channels + 5] = 1.5f;
        save_checkpoint(d / "m.bin", c, p.data());
        CHECK(contains(hf::export_hf(d / "m.bin", d / "hf"), "padding rows (300..319) are not all zero"));
        hf::import_hf(d / "hf", d / "back.bin");
        vector<float> back;
        load_checkpoint(d / "back.bin", back);
        p[(size_t)c.vocab_size * c.channels + 5] = 0;
        CHECK(back == p);
    }
    CHECK(!std::filesystem::exists(d / "back.bin.tmp"));
}

TEST_CASE("hf: imports a folder laid out as the Hub's gpt2 is: bare names, mask buffers, F16, an lm_head copy") {
    CHECK(safetensors::f16_to_float(0x3C00) == 1.0f);
    CHECK(safetensors::f16_to_float(0xC000) == -2.0f);
    CHECK(safetensors::f16_to_float(0x0001) == std::ldexp(1.0f, -24));  // the smallest subnormal
    CHECK(safetensors::f16_to_float(0x7BFF) == 65504.0f);               // the largest normal
    CHECK(std::isinf(safetensors::f16_to_float(0x7C00)));
    CHECK(std::isnan(safetensors::f16_to_float(0x7E00)));

    TempDir d;
    GPT2Config c = tiny();
    c.padded_vocab_size = 384;  // no padded_vocab_size in the file's metadata: V rounded up to 128
    const vector<float> p = f16_exact_params(c, 15);
    std::filesystem::create_directories(d / "hub");
    write_hub_style_folder(d / "hub", c, p);
    const auto r = run_command(tool("import_hf") + " '" + (d / "hub") + "' '" + (d / "m.bin") + "'");
    REQUIRE_MESSAGE(r.rc == 0, r.err);
    CHECK(contains(r.out, "fp32, L=2 NH=2 C=8 maxT=8 V=300 Vp=384"));
    vector<float> got;
    const GPT2Config gc = load_checkpoint(d / "m.bin", got);
    CHECK(gc.padded_vocab_size == 384);
    CHECK(read_checkpoint_header(d / "m.bin").version == CHECKPOINT_VERSION_FP32);
    CHECK(got == p);
}

TEST_CASE("hf: bad input is one clear error, and no checkpoint is half-written") {
    TempDir d;
    const GPT2Config c = tiny();
    GPT2Config c384 = c;
    c384.padded_vocab_size = 384;
    const vector<float> p = f16_exact_params(c384, 16);
    std::filesystem::create_directories(d / "hub");
    auto import_error = [&] { return error_of([&] { hf::import_hf(d / "hub", d / "out.bin"); }); };

    SUBCASE("malformed safetensors files") {
        const string st = d / "x.safetensors";
        auto open_error = [&] { return error_of([&] { safetensors::File f(st); }); };
        write_bytes(st, "abc");
        CHECK(contains(open_error(), "shorter than its 8-byte header length"));
        write_raw_safetensors(st, "{}", 0);
        CHECK(open_error() == "(no error)");  // an empty file with an empty header is valid
        uint64_t huge = 1000;
        write_bytes(st, string(reinterpret_cast<const char*>(&huge), 8) + "{}");
        CHECK(contains(open_error(), "beyond the end of the file"));
        write_raw_safetensors(st, R"([1])", 0);
        CHECK(contains(open_error(), "does not begin with '{'"));
        write_raw_safetensors(st, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16);
        CHECK(contains(open_error(), "tensor \"b\" starts at byte 12 of the data, expected 8 (gap or overlap)"));
        write_raw_safetensors(st, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
        CHECK(contains(open_error(), "data_offsets span 8 bytes, its shape and dtype need 12"));
        write_raw_safetensors(st, R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1);
        CHECK(contains(open_error(), "unknown dtype Q7"));
        write_raw_safetensors(st, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
        CHECK(contains(open_error(), "repeated key \"a\""));
        write_raw_safetensors(st, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8);
        CHECK(contains(open_error(), "the tensors cover 4 bytes of data, the file holds 8"));
        write_raw_safetensors(st, R"({"__metadata__":{"format":1}})", 0);
        CHECK(contains(open_error(), "__metadata__ \"format\" is not a string"));
    }
    SUBCASE("a missing tensor") {
        Changes ch;
        ch.drop = "h.1.ln_2.bias";
        write_hub_style_folder(d / "hub", c384, p, ch);
        CHECK(contains(import_error(), "no tensor \"h.1.ln_2.bias\""));
    }
    SUBCASE("a tensor GPT-2 does not have") {
        Changes ch;
        ch.extra = "h.2.ln_1.weight";  // layer 2 of a 2-layer model
        write_hub_style_folder(d / "hub", c384, p, ch);
        CHECK(contains(import_error(), "tensor \"h.2.ln_1.weight\" is not part of a GPT-2 with this config.json"));
    }
    SUBCASE("config.json: shapes that disagree, another activation, another model type, a missing size") {
        const std::pair<const char*, const char*> cases[] = {
            {"\"n_positions\": 8=\"n_positions\": 16", "tensor \"wpe.weight\" has a shape that does not match config.json"},
            {"\"gelu_new\"=\"relu\"", "activation_function \"relu\": ours is GELU's tanh form"},
            {"\"gpt2\"=\"llama\"", "model_type \"llama\": only GPT-2"},
            {"\"n_layer\": 2,=", "needs \"n_layer\", a positive integer"},
            {"1e-05=1e-06", "layer_norm_epsilon 1e-06: ours is 1e-05"},
        };
        for (const auto& [edit, message] : cases) {
            CAPTURE(edit);
            Changes ch;
            ch.config_edit = edit;
            write_hub_style_folder(d / "hub", c384, p, ch);
            CHECK(contains(import_error(), message));
        }
    }
    SUBCASE("an lm_head that is not a copy of wte (an untied output layer)") {
        vector<float> head = p;
        head[7] += 0.5f;
        Changes ch;
        ch.head = &head;
        write_hub_style_folder(d / "hub", c384, p, ch);
        CHECK(contains(import_error(), "lm_head.weight is not a copy of wte"));
        ch.head = nullptr;
        ch.drop = "lm_head.weight";  // no head at all is the tied case too
        write_hub_style_folder(d / "hub", c384, p, ch);
        CHECK(import_error() == "(no error)");
        std::filesystem::remove(d / "out.bin");
    }
    SUBCASE("a checkpoint that is not there") {
        CHECK(contains(error_of([&] { hf::export_hf(d / "nope.bin", d / "hf"); }), d / "nope.bin"));
        CHECK(!std::filesystem::exists(d / "hf/model.safetensors"));
    }
    SUBCASE("a --bpe folder without gpt2/encoder.json: named, and nothing written") {
        save_checkpoint(d / "m.bin", c384, p.data());
        CHECK(contains(error_of([&] { hf::export_hf(d / "m.bin", d / "hf", d / "hub"); }), "gpt2/encoder.json"));
        CHECK(!std::filesystem::exists(d / "hf"));
    }
    CHECK(!std::filesystem::exists(d / "out.bin"));
    CHECK(!std::filesystem::exists(d / "out.bin.tmp"));
}
