// safetensors, Hugging Face's tensor file, read and written here (llmc/hf_gpt2.h uses it for `make export-hf` and
// `make import-hf`). The layout, as the format's specification (github.com/huggingface/safetensors) gives it:
//   8 bytes   N, the header's length: an unsigned 64-bit little-endian integer
//   N bytes   the header: UTF-8 JSON, an object that begins with '{' and may be padded at its end with spaces.
//             Each key names a tensor: {"dtype": "F32", "shape": [768, 2304], "data_offsets": [BEGIN, END]};
//             the one other key, "__metadata__", maps to an object of strings (transformers wants "format": "pt").
//   the rest  the data: each tensor's elements, little-endian, in C (row-major) order, at [BEGIN, END) counted
//             from the start of the data. The tensors tile the data exactly: no gap, no overlap.
// The writer pads the header with spaces so the data starts at a multiple of 8 bytes (as the reference writer
// does, so that every tensor can be used in place once mapped into memory). The reader checks everything above
// before it reads a byte of data, and refuses headers over 100 MB (the reference reader's limit).
#pragma once
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "llmc/checkpoint.h"  // bf16_to_float
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/json.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors (and llm.c's files) are little-endian");

namespace flashgpt2::safetensors {

constexpr uint64_t MAX_HEADER_BYTES = 100000000;

// Bytes per element of a dtype named as the format names them; 0 for a name it does not define.
inline size_t dtype_size(const std::string& d) {
    if (d == "F64" || d == "I64" || d == "U64") return 8;
    if (d == "F32" || d == "I32" || d == "U32") return 4;
    if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
    if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
    return 0;
}

// IEEE 754 half precision (1 sign, 5 exponent, 10 mantissa bits) widened to float, exactly.
inline float f16_to_float(uint16_t h) {
    const float sign = (h & 0x8000) ? -1.0f : 1.0f;
    const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0) return sign * std::ldexp((float)m, -24);  // zero and subnormals: m * 2^-24
    if (e == 31) return m ? NAN : sign * INFINITY;
    return sign * std::ldexp((float)(1024 + m), e - 25);  // (1 + m/1024) * 2^(e-15)
}

struct TensorInfo {
    std::string name, dtype;
    std::vector<uint64_t> shape;
    uint64_t begin = 0, end = 0;  // byte range in the data

    uint64_t numel() const {
        uint64_t n = 1;
        for (uint64_t d : shape) n *= d;
        return n;
    }
};

struct Header {
    std::vector<TensorInfo> tensors;                            // in the header's order
    std::vector<std::pair<std::string, std::string>> metadata;  // "__metadata__"

    const TensorInfo* find(const std::string& name) const {
        for (const TensorInfo& t : tensors)
            if (t.name == name) return &t;
        return nullptr;
    }
    std::string meta(const std::string& key) const {
        for (const auto& [k, v] : metadata)
            if (k == key) return v;
        return "";
    }
};

// Parses the header JSON and checks it against the format for a data section of data_bytes bytes.
inline Header parse_header(const std::string& text, uint64_t data_bytes, const std::string& where) {
    if (text.empty() || text[0] != '{') fail("%s: the header does not begin with '{'", where.c_str());
    const json::Value root = json::parse(text, where);
    if (!root.is(json::Value::Type::object)) fail("%s: the header is not a JSON object", where.c_str());
    Header h;
    for (const auto& [name, v] : root.members) {
        const char* n = name.c_str();
        if (name == "__metadata__") {
            if (!v.is(json::Value::Type::object)) fail("%s: __metadata__ is not an object", where.c_str());
            for (const auto& [k, s] : v.members) {
                if (!s.is(json::Value::Type::string)) fail("%s: __metadata__ \"%s\" is not a string", where.c_str(), k.c_str());
                h.metadata.emplace_back(k, s.text);
            }
            continue;
        }
        const json::Value *dtype = v.find("dtype"), *shape = v.find("shape"), *offsets = v.find("data_offsets");
        if (!v.is(json::Value::Type::object) || !dtype || !shape || !offsets || v.members.size() != 3)
            fail("%s: tensor \"%s\" needs exactly dtype, shape and data_offsets", where.c_str(), n);
        TensorInfo t;
        t.name = name;
        t.dtype = dtype->text;
        const size_t es = dtype->is(json::Value::Type::string) ? dtype_size(t.dtype) : 0;
        if (es == 0) fail("%s: tensor \"%s\": unknown dtype %s", where.c_str(), n, dtype->text.c_str());
        if (!shape->is(json::Value::Type::array)) fail("%s: tensor \"%s\": shape is not a list", where.c_str(), n);
        uint64_t numel = 1;
        for (const json::Value& d : shape->items) {
            uint64_t x;
            if (!d.to_u64(&x) || (x != 0 && numel > UINT64_MAX / 8 / x))
                fail("%s: tensor \"%s\": shape entries must be non-negative integers of sane size", where.c_str(), n);
            t.shape.push_back(x);
            numel *= x;
        }
        if (!offsets->is(json::Value::Type::array) || offsets->items.size() != 2 || !offsets->items[0].to_u64(&t.begin) ||
            !offsets->items[1].to_u64(&t.end) || t.begin > t.end)
            fail("%s: tensor \"%s\": data_offsets must be [BEGIN, END] with BEGIN <= END", where.c_str(), n);
        if (t.end - t.begin != numel * es)
            fail("%s: tensor \"%s\": data_offsets span %llu bytes, its shape and dtype need %llu", where.c_str(), n,
                 (unsigned long long)(t.end - t.begin), (unsigned long long)(numel * es));
        h.tensors.push_back(std::move(t));
    }
    // the tensors, in data order, must cover [0, data_bytes) exactly
    std::vector<const TensorInfo*> order;
    for (const TensorInfo& t : h.tensors) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
    uint64_t at = 0;
    for (const TensorInfo* t : order) {
        if (t->begin != at)
            fail("%s: tensor \"%s\" starts at byte %llu of the data, expected %llu (gap or overlap)", where.c_str(),
                 t->name.c_str(), (unsigned long long)t->begin, (unsigned long long)at);
        at = t->end;
    }
    if (at != data_bytes)
        fail("%s: the tensors cover %llu bytes of data, the file holds %llu", where.c_str(), (unsigned long long)at,
             (unsigned long long)data_bytes);
    return h;
}

// An open safetensors file: its checked header, and reads of one tensor at a time.
class File {
public:
    Header header;

    explicit File(const std::string& path) : path_(path) {
        f_ = fopen(path.c_str(), "rb");
        if (!f_) fail("%s: cannot open: %s", path.c_str(), strerror(errno));
        uint64_t n = 0;
        const bool sized = fseeko(f_, 0, SEEK_END) == 0;
        const uint64_t size = sized ? (uint64_t)ftello(f_) : 0;
        if (!sized || fseeko(f_, 0, SEEK_SET) != 0 || size < 8 || fread(&n, 8, 1, f_) != 1)
            fail("%s: not a safetensors file: shorter than its 8-byte header length", path.c_str());
        if (n > MAX_HEADER_BYTES || n > size - 8)
            fail("%s: header length %llu is %s", path.c_str(), (unsigned long long)n,
                 n > MAX_HEADER_BYTES ? "over the format's 100 MB limit" : "beyond the end of the file");
        std::string text(n, '\0');
        if (n && fread(text.data(), 1, n, f_) != n) fail("%s: read error in the header", path.c_str());
        while (!text.empty() && text.back() == ' ') text.pop_back();  // the padding
        data_start_ = 8 + n;
        header = parse_header(text, size - data_start_, path);
    }
    ~File() {
        if (f_) fclose(f_);
    }
    File(const File&) = delete;
    File& operator=(const File&) = delete;

    // The tensor's raw bytes, as stored.
    std::vector<uint8_t> read_raw(const TensorInfo& t) const {
        std::vector<uint8_t> b(t.end - t.begin);
        if (fseeko(f_, (off_t)(data_start_ + t.begin), SEEK_SET) != 0 || (!b.empty() && fread(b.data(), 1, b.size(), f_) != b.size()))
            fail("%s: read error in tensor \"%s\"", path_.c_str(), t.name.c_str());
        return b;
    }

    // The tensor as floats: F32 as it is, BF16 and F16 widened (exactly); other dtypes are an error.
    std::vector<float> read_f32(const TensorInfo& t) const {
        const std::vector<uint8_t> b = read_raw(t);
        std::vector<float> out(t.numel());
        if (t.dtype == "F32") {
            if (!out.empty()) memcpy(out.data(), b.data(), b.size());
        } else if (t.dtype == "BF16" || t.dtype == "F16") {
            for (size_t i = 0; i < out.size(); i++) {
                uint16_t h;
                memcpy(&h, &b[2 * i], 2);
                out[i] = t.dtype == "BF16" ? bf16_to_float(h) : f16_to_float(h);
            }
        } else {
            fail("%s: tensor \"%s\" is %s; only F32, BF16 and F16 are read", path_.c_str(), t.name.c_str(), t.dtype.c_str());
        }
        return out;
    }

private:
    std::string path_;
    FILE* f_ = nullptr;
    uint64_t data_start_ = 0;
};

// ---- writing ----------------------------------------------------------------------------------------------

// A tensor to write: its header entry, and a function that writes exactly its bytes when called.
struct TensorOut {
    std::string name, dtype;
    std::vector<uint64_t> shape;
    std::function<void(AtomicWriter&)> write_data;
};

inline uint64_t byte_size(const TensorOut& t) {
    uint64_t n = dtype_size(t.dtype);
    for (uint64_t d : t.shape) n *= d;
    return n;
}

// The header for these tensors (laid out one after the other, in order), padded with spaces to a multiple of 8.
inline std::string header_json(const std::vector<TensorOut>& tensors,
                               const std::vector<std::pair<std::string, std::string>>& metadata) {
    std::string h = "{";
    if (!metadata.empty()) {
        h += "\"__metadata__\":{";
        for (size_t i = 0; i < metadata.size(); i++)
            h += (i ? "," : "") + json::quote(metadata[i].first) + ":" + json::quote(metadata[i].second);
        h += "}";
    }
    uint64_t at = 0;
    for (const TensorOut& t : tensors) {
        if (h.size() > 1) h += ",";
        h += json::quote(t.name) + ":{\"dtype\":" + json::quote(t.dtype) + ",\"shape\":[";
        for (size_t i = 0; i < t.shape.size(); i++) h += (i ? "," : "") + std::to_string(t.shape[i]);
        const uint64_t end = at + byte_size(t);
        h += "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(end) + "]}";
        at = end;
    }
    h += "}";
    h.append((8 - h.size() % 8) % 8, ' ');
    return h;
}

// Writes the file atomically (llmc/fileio.h), checking that every tensor wrote the bytes its header says.
inline void write_file(const std::string& path, const std::vector<TensorOut>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata) {
    for (const TensorOut& t : tensors)
        if (dtype_size(t.dtype) == 0) fail("%s: tensor \"%s\": unknown dtype %s", path.c_str(), t.name.c_str(), t.dtype.c_str());
    const std::string h = header_json(tensors, metadata);
    const uint64_t n = h.size();
    AtomicWriter w(path);
    w.write(&n, 8);
    w.write(h.data(), h.size());
    for (const TensorOut& t : tensors) {
        const uint64_t before = w.bytes_written();
        t.write_data(w);
        if (w.bytes_written() - before != byte_size(t))
            fail("%s: tensor \"%s\" wrote %llu bytes, its header says %llu", path.c_str(), t.name.c_str(),
                 (unsigned long long)(w.bytes_written() - before), (unsigned long long)byte_size(t));
    }
    w.commit();
}

}  // namespace flashgpt2::safetensors
