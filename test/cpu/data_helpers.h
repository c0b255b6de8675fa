// Helpers shared by the tokenizer, data, dataloader and tool tests: temp files, the source directory, the
// GPT-2 BPE (loaded once), catching an Error to look at its message, and running a program.
// Tests run from the repository root (`make test` runs ./build/test_cpu there).
#pragma once
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>
#include <sys/wait.h>

#include "llmc/bpe.h"
#include "llmc/error.h"
#include "llmc/fileio.h"

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

struct CommandResult {
    int rc;                // the exit status (-1: killed by a signal)
    std::string out, err;  // what it wrote on stdout and stderr
};

// Runs cmd with the shell (stdin redirections in cmd work), from the repository root, capturing its output.
inline CommandResult run_command(const std::string& cmd) {
    TempDir d;
    const int status = system((cmd + " >'" + (d / "out") + "' 2>'" + (d / "err") + "'").c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(d / "out"), read_file(d / "err")};
}

// The path of a program `make tools` builds; the test stops (and fails) when it is not there.
inline std::string tool(const std::string& name) {
    const std::string path = "./build/" + name;
    REQUIRE_MESSAGE(std::filesystem::exists(path), "build the tools first: make tools (make test does)");
    return path;
}

// The directory `make data` takes its sources from (llmc/bpe.h asks data/get_sources.sh, the one place that decides).
inline const std::string& source_dir() {
    static const std::string dir = gpt2_source_dir();
    return dir;
}

inline const BPE& gpt2_bpe() {
    static const BPE bpe = load_gpt2_bpe(source_dir());
    return bpe;
}

// One reference encoding of test/cpu/vectors/gpt2_encode.tsv (ids from js-tiktoken's "gpt2", see its header).
struct Vector {
    std::string text;
    bool allow_special;
    std::vector<int> ids;
    std::string label;  // the JSON column, for messages
};

inline std::string unhex(const std::string& h) {
    std::string out;
    for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
    return out;
}

inline std::vector<Vector> load_vectors() {
    const std::string text = read_file("test/cpu/vectors/gpt2_encode.tsv");
    std::vector<Vector> out;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::vector<std::string> cols;
        size_t pos = 0;
        for (;;) {
            const size_t tab = line.find('\t', pos);
            cols.push_back(line.substr(pos, tab == std::string::npos ? std::string::npos : tab - pos));
            if (tab == std::string::npos) break;
            pos = tab + 1;
        }
        REQUIRE(cols.size() == 4);
        Vector v{unhex(cols[0]), cols[1] == "1", {}, cols[3]};
        std::istringstream ids(cols[2]);
        for (int id; ids >> id;) v.ids.push_back(id);
        out.push_back(v);
    }
    return out;
}

}  // namespace flashgpt2::testing
