// What the two data tools share (data/prepro_tinyshakespeare.cpp and data/prepro_text.cpp): GPT-2 ids as the
// uint16 tokens of llm.c's shards, encoding a large text in pieces (with a progress line), and writing a
// dataset folder so that it is never seen half-written.
//
// The folder is written whole or not at all: every file goes into "<dir>.tmp/", and only when all are written
// does that folder take dir's place (llmc/fileio.h's replace_dir). A failure on the way (bad input found late,
// a full disk) removes the .tmp folder and leaves dir as it was. An existing dir is replaced only when it holds
// nothing but this dataset's own files, so a mistyped name never deletes someone's folder.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "llmc/bpe.h"
#include "llmc/dataloader.h"
#include "llmc/error.h"
#include "llmc/fileio.h"

namespace flashgpt2::prepro {

// Shards hold uint16 ids: GPT-2's 50,257 fit, a larger vocabulary would not.
inline void check_vocab_fits(const BPE& bpe, const std::string& where) {
    if (bpe.vocab_size() > 65536) fail("%s: %d tokens do not fit uint16", where.c_str(), bpe.vocab_size());
}

inline void append_ids(std::vector<uint16_t>& tokens, const std::vector<int>& ids) {
    for (int id : ids) tokens.push_back(static_cast<uint16_t>(id));
}

// ---- encoding in pieces --------------------------------------------------------------------------------------

// Where a text may be cut without changing its encoding: just after a '\n' that follows a visible ASCII character
// and precedes one. GPT-2's split regex (llmc/bpe.h) then ends a word at the cut in the whole text as in the
// piece before it: the '\n' is a word by itself (it cannot join the character before it, and the whitespace
// alternatives stop at the visible one after it), no alternative looks behind, and the only look-ahead, \s+(?!\S),
// sees a visible character in the whole text and the end of the piece, and matches the lone '\n' in both.
inline bool is_safe_cut(const std::string& s, size_t p) {
    auto visible = [](char c) { return c > 0x20 && c < 0x7F; };
    return p >= 2 && p < s.size() && s[p - 1] == '\n' && visible(s[p - 2]) && visible(s[p]);
}

// Encodes text in pieces of about piece_bytes, cut only where is_safe_cut allows (a text without such places is
// one piece), appending the ids to tokens and calling on_piece(bytes done) after each piece. The result is
// exactly bpe.encode(text, allow_special): the special token contains no '\n', so no cut falls inside it.
template <class F>
void encode_in_pieces(const BPE& bpe, const std::string& text, bool allow_special, size_t piece_bytes,
                      std::vector<uint16_t>& tokens, F&& on_piece) {
    size_t pos = 0;
    while (pos < text.size()) {
        size_t cut = pos + std::max<size_t>(piece_bytes, 1);
        while (cut < text.size() && !is_safe_cut(text, cut)) cut++;
        cut = std::min(cut, text.size());
        append_ids(tokens, bpe.encode(text.substr(pos, cut - pos), allow_special));
        pos = cut;
        on_piece(pos);
    }
}

// A progress line for long runs: "\r"-updated on a terminal, else one line per tenth of the work. Quiet when the
// whole job is small (under min_total units).
class Progress {
public:
    Progress(const char* what, double total, double min_total)
        : what_(what), total_(total), enabled_(total >= min_total), tty_(isatty(fileno(stderr))) {}

    // done units of the total are finished; detail is appended (e.g. the token count so far).
    void update(double done, const std::string& detail) {
        if (!enabled_) return;
        const int tenth = (int)(10 * done / total_);
        const double now = seconds();
        if (tty_ ? now - last_ < 0.2 && done < total_ : tenth <= last_tenth_) return;
        last_ = now, last_tenth_ = tenth;
        fprintf(stderr, "%s%s: %.0f%% (%s)%s", tty_ ? "\r" : "", what_, 100 * done / total_, detail.c_str(), tty_ ? "" : "\n");
        if (tty_ && done >= total_) fputc('\n', stderr);
    }

private:
    const char* what_;
    double total_;
    bool enabled_, tty_;
    double last_ = -1;
    int last_tenth_ = -1;
    static double seconds() {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }
};

// ---- writing a dataset folder ------------------------------------------------------------------------------

struct TokenFile {
    std::string name;  // file name inside the folder
    const uint16_t* data;
    size_t n;
};

// Throws unless dir is absent or holds only files named prefix*.bin (a previous run's output, or its .tmp).
inline void check_replaceable(const std::string& dir, const std::string& prefix) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(dir, ec)) return;
    if (!fs::is_directory(dir, ec)) fail("%s: exists and is not a folder: remove it or choose another name", dir.c_str());
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
        const fs::path& p = e.path();
        const std::string n = p.filename().string();
        const bool bin = p.extension() == ".bin" || (p.extension() == ".tmp" && p.stem().extension() == ".bin");
        std::error_code file_ec;
        const bool ours = e.is_regular_file(file_ec) && n.rfind(prefix, 0) == 0 && bin;
        if (!ours)
            fail("%s: exists and holds %s, which is not this dataset's (%s*.bin): remove it or choose another name",
                 dir.c_str(), n.c_str(), prefix.c_str());
    }
}

// Writes the files as llm.c shards into a new dir (replacing a previous dataset there), whole or not at all.
inline void write_token_dir(const std::string& dir, const std::string& prefix, const std::vector<TokenFile>& files) {
    namespace fs = std::filesystem;
    check_replaceable(dir, prefix);
    const std::string tmp = dir + ".tmp";
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a crashed run's leftover
    if (!fs::create_directories(tmp, ec) && ec) fail("%s: cannot create folder: %s", tmp.c_str(), ec.message().c_str());
    try {
        for (const TokenFile& f : files) write_token_file(tmp + "/" + f.name, f.data, f.n);
        replace_dir(tmp, dir);
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
}

}  // namespace flashgpt2::prepro
