// Whole-file reads and atomic writes, shared by the data, tokenizer and checkpoint code.
// Atomic: the bytes go to "<path>.tmp", which is renamed over <path> only once fully written, so a crash or a
// full disk never leaves a half-written file under the real name (rename is atomic within one file system).
#pragma once
#include <cerrno>
#include <cstdio>
#include <cstring>
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

// Writes the given pieces, one after the other, to path atomically (via "<path>.tmp" and rename).
inline void write_file_atomic(const std::string& path, std::initializer_list<std::pair<const void*, size_t>> pieces) {
    const std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) fail("%s: cannot open for writing: %s", tmp.c_str(), strerror(errno));
    bool ok = true;
    for (const auto& [data, size] : pieces) ok = ok && (size == 0 || fwrite(data, 1, size, f) == size);
    // flush our buffer, then ask the OS to put the bytes on disk before the rename makes them the real file:
    // after a power loss the name then points at either the old file or the complete new one
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        remove(tmp.c_str());
        fail("%s: write failed (disk full?)", tmp.c_str());
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
