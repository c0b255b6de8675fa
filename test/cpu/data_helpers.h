// Helpers shared by the tokenizer, data and dataloader tests: temp files, the source directory, the
// GPT-2 BPE (loaded once), and catching an Error to look at its message.
// Tests run from the repository root (`make test` runs ./build/test_cpu there).
#pragma once
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "llmc/bpe.h"
#include "llmc/error.h"

namespace flashgpt2::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at scope exit.
struct TempDir {
    std::string path;
    TempDir() {
        const char* base = getenv("TMPDIR");
        std::string templ = std::string(base && *base ? base : "/tmp") + "/flashgpt2_test_XXXXXX";
        if (!mkdtemp(templ.data())) FAIL("cannot create a temp dir");
        path = templ;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string operator/(const std::string& name) const { return path + "/" + name; }
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    FILE* f = fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    fclose(f);
}

// The message of the flashgpt2::Error that f throws, or "(no error)" when it throws none.
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The directory `make data` takes its sources from (llmc/bpe.h asks data/get_sources.sh, the one place that decides).
inline const std::string& source_dir() {
    static const std::string dir = gpt2_source_dir();
    return dir;
}

inline const BPE& gpt2_bpe() {
    static const BPE bpe = load_gpt2_bpe(source_dir());
    return bpe;
}

}  // namespace flashgpt2::testing
