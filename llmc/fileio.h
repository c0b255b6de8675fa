// Whole-file reads, atomic writes and directory creation, shared by the data, tokenizer, checkpoint and export code.
// Atomic: the bytes go to "<path>.tmp", which is renamed over <path> only once fully written, so a crash or a
// full disk never leaves a half-written file under the real name (rename is atomic within one file system).
// AtomicWriter streams a file too large to hold in memory the same way; replace_dir() does it for a folder.
// Every error names the file and says why, from errno (a permission problem reads "Permission denied").
// The fault hooks (llmc/fault.h: kill-write:N, enospc:N) stop the N-th atomic write half way, for the tests.
#pragma once
#include <fcntl.h>     // AT_FDCWD
#include <stdio.h>     // renameat2 (glibc >= 2.28)
#include <sys/stat.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
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

// Everything left in an open stream (stdin, a pipe: no size to read first), as bytes; Error naming it on a read error.
inline std::string read_stream(std::FILE* f, const char* what) {
    std::string s;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    if (ferror(f)) fail("%s: read error: %s", what, strerror(errno));
    return s;
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

// Writes path piece by piece into "<path>.tmp"; commit() makes it the real file. Destroyed without commit() (an
// error on the way), it removes the .tmp: the real name keeps whatever it held before. `expected_bytes`, when
// known, lets a planned fault stop the write half way (llmc/fault.h); 0 = unknown (then it stops after the first
// piece).
class AtomicWriter {
public:
    explicit AtomicWriter(const std::string& path, size_t expected_bytes = 0)
        : path_(path), tmp_(path + ".tmp"), half_(expected_bytes / 2) {
        const long long number = next_fault_write();
        kill_ = fault_planned("kill-write", number), full_ = fault_planned("enospc", number);
        f_ = fopen(tmp_.c_str(), "wb");
        if (!f_) fail("%s: cannot open for writing: %s", tmp_.c_str(), strerror(errno));
    }
    ~AtomicWriter() {
        if (f_) fclose(f_);
        if (!committed_) remove(tmp_.c_str());
    }
    AtomicWriter(const AtomicWriter&) = delete;
    AtomicWriter& operator=(const AtomicWriter&) = delete;

    void write(const void* data, size_t size) {
        size_t n = size;
        const bool fault = (kill_ || full_) && (written_ + n >= half_);
        if (fault) n = half_ > written_ ? half_ - written_ : 0;  // stop half way
        if (n > 0 && fwrite(data, 1, n, f_) != n) fail_write(errno ? errno : EIO);
        written_ += n;
        if (fault) planned_fault();
    }
    uint64_t bytes_written() const { return written_; }

    void commit() {
        if (kill_ || full_) planned_fault();  // (an empty file: the fault had no byte to stop at)
        // flush our buffer, then ask the OS to put the bytes on disk before the rename makes them the real file:
        // after a power loss the name then points at either the old file or the complete new one
        int err = 0;
        if (fflush(f_) != 0) err = errno;
        if (!err && fsync(fileno(f_)) != 0) err = errno;
        if (fclose(f_) != 0 && !err) err = errno;
        f_ = nullptr;
        if (err) fail_write(err);
        if (rename(tmp_.c_str(), path_.c_str()) != 0)
            fail("%s: cannot rename %s over it: %s", path_.c_str(), tmp_.c_str(), strerror(errno));
        committed_ = true;
    }

private:
    [[noreturn]] void fail_write(int err) { fail("%s: write failed: %s", tmp_.c_str(), strerror(err)); }
    [[noreturn]] void planned_fault() {
        if (kill_) {  // the bytes so far reach the file, as they would before a real kill
            fflush(f_);
            raise(SIGKILL);
        }
        fail_write(ENOSPC);
    }
    std::string path_, tmp_;
    size_t half_;
    FILE* f_ = nullptr;
    uint64_t written_ = 0;
    bool committed_ = false, kill_ = false, full_ = false;
};

// Writes the given pieces, one after the other, to path atomically (via "<path>.tmp" and rename).
inline void write_file_atomic(const std::string& path, std::initializer_list<std::pair<const void*, size_t>> pieces) {
    size_t total = 0;
    for (const auto& piece : pieces) total += piece.second;
    AtomicWriter w(path, total);
    for (const auto& [data, size] : pieces) w.write(data, size);
    w.commit();
}

inline void write_file_atomic(const std::string& path, const std::string& data) {
    write_file_atomic(path, {{data.data(), data.size()}});
}

// Puts the finished folder tmp in the place of dir in one step, then deletes what dir held before. Linux swaps
// the two names atomically (renameat2 RENAME_EXCHANGE), so dir is at every moment either the old folder or the
// new one; where the file system cannot swap, the old one is moved aside first (a moment without dir, never a
// mix of the two). The caller decides that dir may be replaced at all.
inline void replace_dir(const std::string& tmp, const std::string& dir) {
    std::error_code ec;
    if (!std::filesystem::exists(dir, ec)) {
        if (rename(tmp.c_str(), dir.c_str()) != 0) fail("%s: cannot rename %s to it: %s", dir.c_str(), tmp.c_str(), strerror(errno));
        return;
    }
    const std::string old = dir + ".old";
    if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
        std::filesystem::remove_all(tmp, ec);  // tmp now names the old folder
        return;
    }
    std::filesystem::remove_all(old, ec);
    if (rename(dir.c_str(), old.c_str()) != 0) fail("%s: cannot move it aside to %s: %s", dir.c_str(), old.c_str(), strerror(errno));
    if (rename(tmp.c_str(), dir.c_str()) != 0) {
        const int e = errno;
        rename(old.c_str(), dir.c_str());
        fail("%s: cannot rename %s to it: %s", dir.c_str(), tmp.c_str(), strerror(e));
    }
    std::filesystem::remove_all(old, ec);
}

}  // namespace flashgpt2
