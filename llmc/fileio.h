// Whole-file reads, atomic writes and directory creation, shared by the data, tokenizer and checkpoint code.
// Atomic: the bytes go to "<path>.tmp", which is renamed over <path> only once fully written, so a crash or a
// full disk never leaves a half-written file under the real name (rename is atomic within one file system).
// Every error names the file and says why, from errno (a permission problem reads "Permission denied").
#pragma once
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <unistd.h>
#include <utility>

#include "llmc/error.h"
#include "llmc/fault.h"

namespace flashgpt2 {

// A file opened for reading, closed when it goes out of scope (so every early fail() closes it too).
struct InputFile {
    std::FILE* f = nullptr;
    explicit InputFile(const std::string& path) {
        f = std::fopen(path.c_str(), "rb");
        if (!f) fail("%s: cannot open: %s", path.c_str(), strerror(errno));
    }
    ~InputFile() { std::fclose(f); }
    InputFile(const InputFile&) = delete;
    InputFile& operator=(const InputFile&) = delete;
};

// Size in bytes of an open file (fstat) or of a path (stat); Error naming the file when it is not a regular file.
inline size_t file_size(std::FILE* f, const std::string& path) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0) fail("%s: cannot stat: %s", path.c_str(), strerror(errno));
    if (!S_ISREG(st.st_mode)) fail("%s: not a regular file", path.c_str());
    return (size_t)st.st_size;
}

inline size_t file_size(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) fail("%s: cannot open: %s", path.c_str(), strerror(errno));
    if (!S_ISREG(st.st_mode)) fail("%s: not a regular file", path.c_str());
    return (size_t)st.st_size;
}

// The whole file as bytes; Error naming the file when it cannot be opened or read. The buffer is sized from
// the file once, so reading a file of n bytes allocates n bytes, not the up to 2n that growing by doubling would.
inline std::string read_file(const std::string& path) {
    InputFile in(path);
    std::string s;
    s.reserve(file_size(in.f, path));
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in.f)) > 0) s.append(buf, n);
    if (ferror(in.f)) fail("%s: read error: %s", path.c_str(), strerror(errno));
    return s;
}

// "a/b/" and "a/./b" as "a/b": the form the two functions below walk up from.
inline std::filesystem::path normal_dir(const std::string& dir) {
    std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
    return p.has_filename() ? p : p.parent_path();
}

// Creates dir and its missing parents; returns the outermost directory it created ("" when dir existed), for
// remove_empty_directories. Error with the reason ("Permission denied", "File exists" for a file in the way)
// when that fails. `what` names the flag or role in the message.
inline std::string make_directories(const std::string& dir, const char* what) {
    if (dir.empty()) return "";
    std::error_code ec;
    std::filesystem::path top;  // the outermost missing ancestor
    for (std::filesystem::path p = normal_dir(dir); !p.empty() && !std::filesystem::exists(p, ec); p = p.parent_path()) {
        top = p;
        if (p == p.parent_path()) break;
    }
    std::filesystem::create_directories(dir, ec);
    if (ec) fail("%s %s: cannot create the directory: %s", what, dir.c_str(), ec.message().c_str());
    return top.string();
}

// Undoes make_directories after a failure: removes dir, then its parents up to top, each only while empty.
inline void remove_empty_directories(const std::string& dir, const std::string& top) {
    if (top.empty()) return;
    std::error_code ec;
    for (std::filesystem::path p = normal_dir(dir); !p.empty(); p = p.parent_path()) {
        if (!std::filesystem::remove(p, ec)) return;  // not empty (or gone): stop
        if (p == normal_dir(top)) return;
    }
}

// Writes the given pieces, one after the other, to path atomically (via "<path>.tmp" and rename).
// The fault hooks kill-write:N and enospc:N (llmc/fault.h) act half way through the N-th such write.
inline void write_file_atomic(const std::string& path, std::initializer_list<std::pair<const void*, size_t>> pieces) {
    const std::string tmp = path + ".tmp";
    const long long number = next_fault_write();
    const bool kill = fault_planned("kill-write", number), full = fault_planned("enospc", number);
    size_t total = 0, written = 0;
    for (const auto& piece : pieces) total += piece.second;
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) fail("%s: cannot open for writing: %s", tmp.c_str(), strerror(errno));
    int err = 0;  // the first errno of a failed call
    for (const auto& [data, size] : pieces) {
        size_t n = size;
        if ((kill || full) && written + n >= total / 2) n = total / 2 - written;  // stop half way
        if (!err && n > 0 && fwrite(data, 1, n, f) != n) err = errno ? errno : EIO;
        written += n;
        if (n < size) break;
    }
    if (kill) {  // the bytes so far reach the file, as they would before a real kill
        fflush(f);
        raise(SIGKILL);
    }
    if (full && !err) err = ENOSPC;
    // flush our buffer, then ask the OS to put the bytes on disk before the rename makes them the real file:
    // after a power loss the name then points at either the old file or the complete new one
    if (!err && fflush(f) != 0) err = errno;
    if (!err && fsync(fileno(f)) != 0) err = errno;
    if (fclose(f) != 0 && !err) err = errno;
    if (err) {
        remove(tmp.c_str());
        fail("%s: write failed: %s", tmp.c_str(), strerror(err));
    }
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        remove(tmp.c_str());
        fail("%s: cannot rename %s over it: %s", path.c_str(), tmp.c_str(), strerror(e));
    }
}

inline void write_file_atomic(const std::string& path, const std::string& data) {
    write_file_atomic(path, {{data.data(), data.size()}});
}

}  // namespace flashgpt2
