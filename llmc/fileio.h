// Whole-file reads and atomic writes, shared by the data, tokenizer, checkpoint and export code.
// Atomic: the bytes go to "<path>.tmp", which is renamed over <path> only once fully written, so a crash or a
// full disk never leaves a half-written file under the real name (rename is atomic within one file system).
// AtomicWriter streams a file too large to hold in memory the same way; replace_dir() does it for a folder.
#pragma once
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <fcntl.h>  // AT_FDCWD

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <unistd.h>
#include <utility>

#include "llmc/error.h"

namespace flashgpt2 {

// The whole file as bytes; Error naming the file when it cannot be opened or read.
inline std::string read_file(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) fail("%s: cannot open: %s", path.c_str(), strerror(errno));
    std::string s;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    const bool err = ferror(f);
    fclose(f);
    if (err) fail("%s: read error", path.c_str());
    return s;
}

// Writes path piece by piece into "<path>.tmp"; commit() makes it the real file. Destroyed without commit()
// (an error on the way), it removes the .tmp: the real name keeps whatever it held before.
class AtomicWriter {
public:
    explicit AtomicWriter(const std::string& path) : path_(path), tmp_(path + ".tmp") {
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
        if (size != 0 && fwrite(data, 1, size, f_) != size) fail("%s: write failed (disk full?)", tmp_.c_str());
        written_ += size;
    }
    uint64_t bytes_written() const { return written_; }

    void commit() {
        // flush our buffer, then ask the OS to put the bytes on disk before the rename makes them the real file:
        // after a power loss the name then points at either the old file or the complete new one
        bool ok = fflush(f_) == 0 && fsync(fileno(f_)) == 0;
        ok = (fclose(f_) == 0) && ok;
        f_ = nullptr;
        if (!ok) fail("%s: write failed (disk full?)", tmp_.c_str());
        if (rename(tmp_.c_str(), path_.c_str()) != 0)
            fail("%s: cannot rename %s over it: %s", path_.c_str(), tmp_.c_str(), strerror(errno));
        committed_ = true;
    }

private:
    std::string path_, tmp_;
    FILE* f_ = nullptr;
    uint64_t written_ = 0;
    bool committed_ = false;
};

// Writes the given pieces, one after the other, to path atomically (via "<path>.tmp" and rename).
inline void write_file_atomic(const std::string& path, std::initializer_list<std::pair<const void*, size_t>> pieces) {
    AtomicWriter w(path);
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
