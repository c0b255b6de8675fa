// The repository's paths as its own files name them: every path under llmc/, dev/, doc/, scripts/, test/ or tools/
// that a source file, script, Makefile or page names must exist, so that moving a file cannot leave a script
// calling nothing (a bench script once called a PyTorch script at its old path, and its table's PyTorch column
// came out empty) or a page pointing readers at nothing. data/ is not checked: its files are made by `make data`
// or are a reader's own. Runs from the repository's root, as `make test` runs the CPU tests.
#include <doctest/doctest.h>

#include <cctype>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "llmc/fileio.h"

namespace fs = std::filesystem;

namespace {

const char* const PREFIXES[] = {"llmc/", "dev/", "doc/", "scripts/", "test/", "tools/"};
const std::set<std::string> EXTENSIONS = {".h",  ".cuh", ".cu",  ".cpp", ".py",  ".sh",
                                          ".md", ".png", ".csv", ".txt", ".json"};
// Named but not ours to have: llm.c's files, cited where an idea or a format comes from, and `make plots`' default
// output.
const std::set<std::string> NOT_HERE = {"dev/data/tinyshakespeare.py", "dev/eval/export_hf.py",
                                        "llmc/outlier_detector.h", "llmc/rand.h", "doc/results/loss.png"};

bool path_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '.' || c == '/' || c == '-'; }

// The repository paths a text names: a prefix not preceded by a path character, then path characters up to the
// first that is not one, ending in one of EXTENSIONS ("llmc/x.h," gives llmc/x.h; "test/gpu/*.cu" gives nothing).
std::vector<std::string> named_paths(const std::string& text) {
    std::vector<std::string> out;
    for (const char* prefix : PREFIXES)
        for (size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, at + 1)) {
            if (at > 0 && path_char(text[at - 1])) continue;
            size_t end = at;
            while (end < text.size() && path_char(text[end])) end++;
            while (end > at && (text[end - 1] == '.' || text[end - 1] == '-' || text[end - 1] == '/')) end--;
            const std::string p = text.substr(at, end - at);
            const size_t dot = p.rfind('.');
            if (dot != std::string::npos && p.find('/', dot) == std::string::npos && EXTENSIONS.count(p.substr(dot)))
                out.push_back(p);
        }
    return out;
}

// The files whose text is checked: the top-level program files, and every source, script and page under the
// checked folders and data/ (there its programs; its token files are not text).
std::vector<fs::path> checked_files() {
    const std::set<std::string> text = {".h", ".cuh", ".cu", ".cpp", ".py", ".sh", ".md"};
    std::vector<fs::path> files = {"README.md", "Makefile", "train_gpt2.cu", "train_gpt2.cpp", ".ci/run",
                                   "dev/attention/runner"};
    for (const char* dir : {"llmc", "dev", "doc", "scripts", "test", "tools", "data"})
        for (const auto& e : fs::recursive_directory_iterator(dir))
            if (e.is_regular_file() && text.count(e.path().extension().string())) files.push_back(e.path());
    return files;
}

}  // namespace

TEST_CASE("repository paths: the paths the sources, scripts and pages name exist") {
    // the scanner itself, on a line made for it
    const auto found =
        named_paths("see llmc/a.cuh, (doc/b.md) and test/gpu/*.cu; not ../x/llmc/c.h nor build/test/d.o.");
    CHECK(found == std::vector<std::string>{"llmc/a.cuh", "doc/b.md"});

    REQUIRE_MESSAGE(fs::exists("llmc/model.cuh"), "run from the repository's root (as make test does)");
    size_t named = 0;
    for (const fs::path& file : checked_files()) {
        if (file == "test/cpu/test_repo_paths.cpp") continue;  // this file: the scanner's made-up examples
        for (const std::string& p : named_paths(flashgpt2::read_file(file.string()))) {
            named++;
            if (NOT_HERE.count(p)) continue;
            CHECK_MESSAGE(fs::exists(p), file.string() << " names " << p << ", which does not exist");
        }
    }
    CHECK(named > 200);  // the scan saw the repository's many cross-references, not an empty tree
}
