// The run-settings record, shared by both trainers: <out_dir>/run_settings.txt, written by a fresh run before its
// first step and compared by every --resume, so that a resume continues the run that wrote the checkpoint and
// nothing else.
//
// Why: a checkpoint holds the weights, the optimizer moments and the data position, but not the recipe. Resuming
// with another learning rate, schedule length, batch, seed, kernel set or data set "works" and silently trains a
// different run; and a new run started in an old directory would leave the old run's later checkpoints there for
// a later --resume to pick. So:
//   - a fresh run refuses an -o that holds a complete checkpoint (llmc/checkpoint.h's DONE marker) unless
//     --overwrite, which deletes the checkpoint files (and only them) first;
//   - a resume reads the record and refuses to start when any setting differs, listing every difference.
// The record holds every setting that changes the trajectory (each trainer passes its own: optimizer, schedule,
// steps, batch, seed, kernel set by name, model shape, init) and the data's identity: each split's token count and
// CRC-32C over its shards (DataLoader::fingerprint), so renamed files match and edited ones do not.
//
// Format: text, one "key = value" per line, in the order the trainer set them; '#' starts a comment line.
//   # flashgpt2 run settings: a --resume must match every line (llmc/run_record.h)
//   trainer = train_gpt2 (CPU, Eigen reference, fp32)
//   lr = 0.00499999989
// Floats are written with 9 significant digits, which round-trips every float exactly.
#pragma once
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "llmc/checkpoint.h"  // checkpoint_files, latest_checkpoint_step
#include "llmc/error.h"
#include "llmc/fileio.h"

namespace flashgpt2 {

constexpr const char* RUN_RECORD_NAME = "run_settings.txt";
constexpr size_t RUN_RECORD_MAX_BYTES = 1 << 16;

inline std::string run_record_path(const std::string& dir) { return (std::filesystem::path(dir) / RUN_RECORD_NAME).string(); }

struct RunRecord {
    std::vector<std::pair<std::string, std::string>> fields;  // in the order they were set

    // key: lower-case letters, digits and '_'; value: one line. Setting a key again replaces its value.
    void set(const std::string& key, const std::string& value) {
        if (key.empty() || key.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
            fail("run record: bad key '%s'", key.c_str());
        if (value.find_first_of("\r\n") != std::string::npos) fail("run record: the value of %s spans lines", key.c_str());
        for (auto& [k, v] : fields)
            if (k == key) {
                v = value;
                return;
            }
        fields.emplace_back(key, value);
    }
    void set(const std::string& key, long long value) { set(key, std::to_string(value)); }
    void set(const std::string& key, double value) {
        char s[40];
        snprintf(s, sizeof s, "%.9g", value);
        set(key, std::string(s));
    }

    const std::string* get(const std::string& key) const {
        for (const auto& [k, v] : fields)
            if (k == key) return &v;
        return nullptr;
    }

    std::string text() const {
        std::string out = "# flashgpt2 run settings: a --resume must match every line (llmc/run_record.h)\n";
        for (const auto& [k, v] : fields) out += k + " = " + v + "\n";
        return out;
    }

    // The inverse of text(); anything else (a line without " = ", a bad or repeated key) is an Error naming where.
    static RunRecord parse(const std::string& text, const std::string& where) {
        RunRecord r;
        size_t pos = 0, line_no = 0;
        while (pos < text.size()) {
            size_t end = text.find('\n', pos);
            if (end == std::string::npos) end = text.size();
            const std::string line = text.substr(pos, end - pos);
            pos = end + 1;
            line_no++;
            if (line.empty() || line[0] == '#') continue;
            const size_t eq = line.find(" = ");
            if (eq == std::string::npos) fail("%s: line %zu is not 'key = value'", where.c_str(), line_no);
            const std::string key = line.substr(0, eq);
            if (r.get(key)) fail("%s: line %zu repeats the key '%s'", where.c_str(), line_no, key.c_str());
            try {
                r.set(key, line.substr(eq + 3));
            } catch (const Error& e) {
                fail("%s: line %zu: %s", where.c_str(), line_no, e.what());
            }
        }
        return r;
    }
};

// The optimizer recipe, as both trainers record it (the same keys, values and order in run_settings.txt).
inline void record_recipe(RunRecord& r, double lr, long long warmup, double final_lr_frac, double weight_decay,
                          double grad_clip, double spike_z, unsigned long long seed) {
    r.set("lr", lr), r.set("warmup", warmup), r.set("final_lr_frac", final_lr_frac);
    r.set("schedule", std::string("linear warm-up, cosine decay (llmc/schedule.h)"));
    r.set("adamw", std::string("beta1 0.9 beta2 0.95 eps 1e-08"));
    r.set("weight_decay", weight_decay), r.set("grad_clip", grad_clip);
    r.set("spike_z", spike_z), r.set("seed", (long long)seed);
}

inline RunRecord read_run_record(const std::string& path) {
    if (file_size(path) > RUN_RECORD_MAX_BYTES)
        fail("%s: larger than %zu bytes: not a run settings file", path.c_str(), RUN_RECORD_MAX_BYTES);
    return RunRecord::parse(read_file(path), path);
}

// Every setting that differs, as "key: <saved> -> <now>" joined by "; "; empty when the two agree.
inline std::string record_differences(const RunRecord& saved, const RunRecord& now) {
    std::string out;
    auto add = [&](const std::string& key, const std::string* a, const std::string* b) {
        out += (out.empty() ? "" : "; ") + key + ": " + (a ? *a : "(absent)") + " -> " + (b ? *b : "(absent)");
    };
    for (const auto& [k, v] : saved.fields)
        if (!now.get(k) || *now.get(k) != v) add(k, &v, now.get(k));
    for (const auto& [k, v] : now.fields)
        if (!saved.get(k)) add(k, nullptr, &v);
    return out;
}

// What a run does with its output directory, decided before its first step. Returns the step to resume from,
// or -1 for a fresh run.
//   fresh:  a complete checkpoint in dir is refused unless overwrite; then every checkpoint file is deleted
//           (without a DONE marker they are the debris of a run stopped before its first checkpoint: nothing can
//           resume them). The directory is created (a permission problem is reported as one) and the record
//           written, which also proves it writable before any training. A failure here removes the directories
//           it created.
//   resume: needs a complete checkpoint (DONE_<step>) and the record, and every setting must match.
inline int64_t open_run_dir(const std::string& dir, const RunRecord& now, bool resume, bool overwrite) {
    const std::string record = run_record_path(dir);
    if (resume && overwrite) fail("--resume and --overwrite contradict each other: pick one");
    if (resume) {
        const int64_t step = latest_checkpoint_step(dir);
        if (step < 0) fail("--resume: no complete checkpoint (a DONE_<step> file) in %s", dir.c_str());
        std::error_code ec;
        if (!std::filesystem::exists(record, ec))
            fail("--resume: %s has checkpoints but no %s, so their settings cannot be checked", dir.c_str(), RUN_RECORD_NAME);
        const std::string diff = record_differences(read_run_record(record), now);
        if (!diff.empty())
            fail("--resume: the settings differ from the checkpoint's run (%s): %s. Resume with that run's settings, "
                 "or start a new run in another -o", record.c_str(), diff.c_str());
        write_file_atomic(record, now.text());  // the same bytes: proves the directory still writable
        return step;
    }
    const std::vector<std::string> old = checkpoint_files(dir);
    const int64_t newest = latest_checkpoint_step(dir);
    if (newest >= 0 && !overwrite)
        fail("-o %s already holds a run's checkpoints (%zu files, newest complete step %lld): continue it with "
             "--resume, choose another -o, or pass --overwrite to delete them", dir.c_str(), old.size(),
             (long long)newest);
    for (const std::string& f : old) {
        std::error_code ec;
        if (!std::filesystem::remove(f, ec)) fail("--overwrite: cannot delete %s: %s", f.c_str(), ec.message().c_str());
    }
    const std::string created = make_directories(dir, "-o");
    try {
        write_file_atomic(record, now.text());
    } catch (...) {
        remove_empty_directories(dir, created);
        throw;
    }
    return -1;
}

}  // namespace flashgpt2
