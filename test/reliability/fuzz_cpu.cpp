// fuzz_cpu: thousands of seeded mutations of every file type the project reads, through the real loaders,
// built with AddressSanitizer and UndefinedBehaviorSanitizer (make fuzz; `make test` runs it).
//
// Formats and what reads them:
//   shard      llm.c token shard       DataLoader: built over the file, or the file replaced during a run
//   tokenizer  llm.c tokenizer         Tokenizer::load, then every id decoded
//   model      llm.c model file        load_checkpoint, with its CRC-32C side file, without it, or with it damaged
//   state      our state file          read_state_file, check_state_layout, DataLoader::restore, a few batches
//   record     run_settings.txt        read_run_record, record_differences
//   text       the data tool's source  check_utf8 + BPE encode (llmc/bpe.h) of an excerpt of input.txt, and the
//                                      decode of what it accepts must give the text back
// Mutations (test/reliability/fuzz_inputs.h, with the base files): flipped bits, random bytes, truncations
// (inside the header, at its end, anywhere), appended bytes, header words set to extremes (0, -1, INT_MIN,
// INT_MAX, ...), lengths just past the end, spliced chunks;
// for state files, half the cases re-seal the header's checksum after the damage (as a bug, not a disk, would
// write it), so that every field's own check is reached.
//
// Each case runs in a worker process with a time limit (a case that does not finish is a hang: the worker is
// killed and the next one starts). What counts as a failure: a crash (a signal), a hang, a sanitizer report,
// an error that is not one line of flashgpt2::Error naming the file, a single allocation above the file's size
// plus 64 KiB (bf16 model files: twice their size, as their weights are returned widened to fp32; text: 8 times,
// as 4-byte token ids), a damaged file accepted in spite of its checksum, or accepted text that does not decode
// back to itself. Any failure: exit 1.
//
// usage: fuzz_cpu --text input.txt --encoder encoder.json --merges vocab.bpe --tokenizer gpt2_tokenizer.bin
//                 [--cases N] [--seed S] [--jobs J] [--time-limit SEC] [--report FILE] [--case I]
// --case I runs case I alone, in this process, printing what it did (to replay a reported failure).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "llmc/bpe.h"
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/run_record.h"
#include "llmc/tokenizer.h"
#include "test/cpu/alloc_watch.h"
#include "test/reliability/fuzz_inputs.h"

using namespace flashgpt2;
using namespace flashgpt2::fuzz;
namespace fs = std::filesystem;

extern "C" const char* __asan_default_options() { return "detect_leaks=1:abort_on_error=0:exitcode=86"; }
extern "C" const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }

namespace {

enum Format { SHARD, TOKENIZER, MODEL, STATE, RECORD, TEXT, NUM_FORMATS };
const char* FORMAT_NAMES[NUM_FORMATS] = {"shard", "tokenizer", "model", "state", "record", "text"};

enum Outcome { REJECTED, ACCEPTED, UNCLEAR, OVER_ALLOC, DAMAGE_ACCEPTED, WRONG, CRASH, HANG, SANITIZER, NUM_VERDICTS };
const char* VERDICT_NAMES[NUM_VERDICTS] = {"rejected with a clear error", "accepted", "unclear errors",
                                           "over-allocations", "damaged files accepted", "wrong results",
                                           "crashes", "hangs", "sanitizer reports"};

struct Options {
    std::string text, encoder, merges, tokenizer, report;
    long cases = 30000, only = -1;
    uint64_t seed = 1;
    int jobs = 2;
    double time_limit = 20.0;
};

// ---- one case ----

struct Case {
    Format format;
    std::string what;  // the mutation, in words
    int outcome = ACCEPTED;
    size_t largest = 0, size = 0;
};

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// What a worker needs besides the bases: the BPE (loaded once), the base shards' directory, its own directory.
struct Worker {
    const Bases& b;
    const BPE& bpe;
    std::string base_dir, dir;
};

// Writes the mutated file(s) for case i into the worker's directory and runs the loader; sets outcome.
void run_case(long i, const Options& o, Worker& w, Case& c) {
    std::mt19937_64 g(o.seed * 0x9E3779B97F4A7C15ull + (uint64_t)i);
    c.format = (Format)(i % NUM_FORMATS);
    const Bases& b = w.b;
    const std::string path = w.dir + "/case_" + FORMAT_NAMES[c.format] + ".bin";
    std::string base, bytes;
    int word = 4, words = 8;
    const int mode = (int)(g() % 4);  // a per-format variant (see below)
    switch (c.format) {
        case SHARD: base = mode == 0 ? b.shard1 : b.shard0, words = 4; break;
        case TOKENIZER: base = mode == 0 ? b.real_tokenizer : b.tokenizer, words = 5; break;
        case MODEL: base = mode == 1 ? b.model16 : b.model32, words = 9; break;
        case STATE: base = (mode & 1) ? b.state_master : b.state, word = 8, words = 40; break;
        case RECORD: base = b.record, word = 1, words = 64; break;
        case TEXT: {
            const size_t at = g() % (b.text.size() - 4096);
            base = b.text.substr(at, 1 + g() % 4096), word = 1, words = 64;
            break;
        }
        default: break;
    }
    bytes = base;
    const int k = 1 + (int)(g() % 3);
    for (int j = 0; j < k; j++) mutate_once(bytes, g, word, words, c.what);
    if (c.format == STATE && (mode & 2) && bytes.size() >= STATE_HEADER_BYTES) {  // re-seal both checksums
        int64_t h[STATE_HEADER_WORDS];
        std::memcpy(h, bytes.data(), sizeof h);
        h[29] = crc32c(bytes.data() + sizeof h, bytes.size() - sizeof h);
        h[255] = crc32c(h, 255 * 8);
        std::memcpy(&bytes[0], h, sizeof h);
        c.what += "re-sealed; ";
    }
    // damaged: the bytes a reader uses changed (a shard's unused header words are not read; a model's and a state
    // file's checksums cover every byte)
    const bool damaged = c.format == SHARD ? bytes.size() != base.size() || bytes.compare(0, 12, base, 0, 12) != 0 ||
                                                 bytes.compare(1024, std::string::npos, base, 1024) != 0
                                           : bytes != base;

    // the files the loader will read
    std::vector<std::string> paths = {path};
    bool checksum_guards = false;  // a damaged file accepted here is a failure
    if (c.format == SHARD && mode >= 2) {  // changed during a run: the loader is built on the good shards first
        write_bytes_file(w.dir + "/run_0.bin", b.shard0);
        write_bytes_file(w.dir + "/run_1.bin", b.shard1);
    } else if (c.format == MODEL) {
        write_bytes_file(path, bytes);
        if (mode == 2) fs::remove(checksum_path(path));  // an llm.c file: header checks only
        else {
            FileChecksum sum{crc32c(base.data(), base.size()), base.size()};
            write_checksum_file(path, sum);
            if (mode == 3) {  // the side file damaged instead
                std::string side = read_file(checksum_path(path));
                mutate_once(side, g, 1, 16, c.what);
                write_bytes_file(checksum_path(path), side);
                c.what += "(in the checksum file); ";
                bytes = base;  // the model file itself is intact
                write_bytes_file(path, bytes);
            } else {
                checksum_guards = true;
            }
        }
    }
    if (c.format == STATE && !(mode & 2)) checksum_guards = true;
    if (c.format == SHARD && mode >= 2) checksum_guards = true;  // the loader's CRC of the first read
    if (c.format != MODEL) write_bytes_file(c.format == SHARD && mode >= 2 ? w.dir + "/case_run.bin" : path, bytes);
    c.size = bytes.size();
    // the allocation bound: the file's size plus 64 KiB; bf16 weights are returned widened to fp32 (twice their
    // bytes), and text becomes 4-byte token ids (at most one per byte) in a vector that grows by doubling
    const double factor = c.format == TEXT ? 8.0 : c.format == MODEL && mode == 1 ? 2.0 : 1.0;
    const size_t limit = (size_t)(factor * (double)c.size) + (64 << 10);

    // text: the BPE's word cache (which grows over all the texts a BPE has encoded) holds only this case's words
    w.bpe.clear_cache();
    testing::alloc_reset();
    testing::alloc_limit(limit);
    std::string error;
    bool threw_error = false, threw_other = false, wrong = false;
    try {
        switch (c.format) {
            case SHARD:
                if (mode < 2) {
                    DataLoader dl(path, B, T, mode == 1, 3);
                    for (size_t j = 0; j < dl.num_batches() + 1; j++) dl.next_batch();
                } else {
                    DataLoader dl(w.dir + "/run_*.bin", B, T, mode == 3, 3);
                    fs::rename(w.dir + "/case_run.bin", w.dir + "/run_1.bin");  // the shard changes under it
                    for (size_t j = 0; j < 3 * dl.num_batches(); j++) dl.next_batch();
                }
                break;
            case TOKENIZER: {
                const Tokenizer t = Tokenizer::load(path);
                size_t total = 0;
                for (uint32_t id = 0; id < t.vocab_size; id++) total += t.decode((int)id).size();
                if (total > c.size) wrong = true;
                break;
            }
            case MODEL: {
                std::vector<float> params;
                load_checkpoint(path, params);
                break;
            }
            case STATE: {
                const StateFile sf = read_state_file(path);
                check_state_layout(path, sf.layout, (mode & 1) ? b.layout_master : b.layout);
                DataLoader dl(w.base_dir + "/base_*.bin", B, T, true, 7);
                dl.restore(sf.state.loader, path);
                for (int j = 0; j < 20; j++) dl.next_batch();
                break;
            }
            case RECORD: {
                const RunRecord r = read_run_record(path);
                record_differences(r, RunRecord::parse(b.record, "base"));
                break;
            }
            case TEXT: {
                const std::vector<int> ids = w.bpe.encode(bytes, /*allow_special=*/mode & 1, path);
                if (w.bpe.decode(ids) != bytes) wrong = true;
                break;
            }
            default: break;
        }
    } catch (const Error& e) {
        threw_error = true;
        error = e.what();
    } catch (const std::bad_alloc&) {
        threw_other = true;
        error = "std::bad_alloc";
    } catch (const std::exception& e) {
        threw_other = true;
        error = std::string("std::exception: ") + e.what();
    }
    testing::alloc_limit(0);
    c.largest = testing::alloc_largest();
    const std::string name = fs::path(path).filename().string(), run1 = "run_1.bin";
    const bool names_file = error.find(name) != std::string::npos || error.find(run1) != std::string::npos;
    if (testing::alloc_refused() > 0 || c.largest > limit) c.outcome = OVER_ALLOC;
    else if (wrong) c.outcome = WRONG;
    else if (threw_other || (threw_error && (error.empty() || error.find('\n') != std::string::npos || !names_file)))
        c.outcome = UNCLEAR;
    else if (threw_error) c.outcome = REJECTED;
    else c.outcome = damaged && checksum_guards ? DAMAGE_ACCEPTED : ACCEPTED;
    if (o.only >= 0)
        printf("case %ld: %s, %s%zu bytes, largest allocation %zu: %s%s\n", i, FORMAT_NAMES[c.format], c.what.c_str(),
               c.size, c.largest, VERDICT_NAMES[c.outcome], error.empty() ? "" : (" (" + error + ")").c_str());
}

// ---- workers and the parent ----

struct Report {  // one line from a worker per finished case: index, outcome, largest allocation, file size
    long index;
    int outcome;
    size_t largest, size;
};

// A worker runs cases first, first + stride, ... and reports each as it starts (outcome -1) and ends.
[[noreturn]] void worker_main(long first, long stride, const Options& o, Worker& w, int fd) {
    for (long i = first; i < o.cases; i += stride) {
        Report r{i, -1, 0, 0};
        if (write(fd, &r, sizeof r) != sizeof r) _exit(3);
        Case c;
        run_case(i, o, w, c);
        r = Report{i, c.outcome, c.largest, c.size};
        if (write(fd, &r, sizeof r) != sizeof r) _exit(3);
    }
    close(fd);
    exit(0);  // a normal exit: LeakSanitizer checks for leaks here
}

struct Child {
    pid_t pid = -1;
    int fd = -1;
    long next;        // the next case it would start
    long running = -1;  // the case it is in, or -1
    std::chrono::steady_clock::time_point started;
    std::string err;  // its stderr file
};

struct Tally {
    long count[NUM_FORMATS][NUM_VERDICTS] = {};
    size_t excess[NUM_FORMATS] = {};  // the largest (largest allocation - file size)
    double slowest = 0;
    std::vector<std::string> failures;
};

void start_child(Child& ch, long stride, const Options& o, Worker w, int id) {
    w.dir = w.base_dir + "/w" + std::to_string(id);
    fs::create_directories(w.dir);
    int fd[2];
    if (pipe(fd) != 0) fail("pipe: %s", strerror(errno));
    ch.err = w.dir + "/stderr_" + std::to_string(id) + "_" + std::to_string(ch.next) + ".txt";
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) fail("fork: %s", strerror(errno));
    if (pid == 0) {
        close(fd[0]);
        if (!freopen(ch.err.c_str(), "w", stderr)) _exit(4);
        worker_main(ch.next, stride, o, w, fd[1]);
    }
    close(fd[1]);
    ch.pid = pid, ch.fd = fd[0], ch.running = -1;
}

// A worker that ended: how (a signal, a sanitizer's exit, a report in its stderr), charged to its open case.
void reap(Child& ch, long stride, Tally& t, const Options& o, bool hung) {
    int status = 0;
    waitpid(ch.pid, &status, 0);
    close(ch.fd);
    const std::string err = fs::exists(ch.err) ? read_file(ch.err) : std::string();
    const bool sanitizer = err.find("Sanitizer") != std::string::npos || err.find("runtime error") != std::string::npos;
    const bool clean = !hung && WIFEXITED(status) && WEXITSTATUS(status) == 0 && !sanitizer;
    if (!clean) {
        const int outcome = hung ? HANG : sanitizer ? SANITIZER : CRASH;
        const long i = ch.running >= 0 ? ch.running : ch.next - stride;  // a leak report comes after the last case
        t.count[i % NUM_FORMATS][outcome]++;
        char line[512];
        snprintf(line, sizeof line, "case %ld (%s): %s%s%s (replay: fuzz_cpu ... --seed %llu --case %ld)", i,
                 FORMAT_NAMES[i % NUM_FORMATS], VERDICT_NAMES[outcome], err.empty() ? "" : ": ",
                 first_line(err.substr(err.find_first_not_of("= \n") == std::string::npos ? 0 : err.find_first_not_of("= \n"))).c_str(),
                 (unsigned long long)o.seed, i);
        t.failures.push_back(line);
        if (ch.running >= 0) ch.next = ch.running + stride;
    }
    std::error_code ec;
    fs::remove(ch.err, ec);
    ch.pid = -1, ch.running = -1;
}

void run_all(const Options& o, Worker& w, Tally& t) {
    const long stride = o.jobs;
    std::vector<Child> kids(o.jobs);
    for (int k = 0; k < o.jobs; k++) {
        kids[k].next = k;
        if (kids[k].next < o.cases) start_child(kids[k], stride, o, w, k);
    }
    for (;;) {
        std::vector<pollfd> fds;
        std::vector<int> who;
        for (int k = 0; k < o.jobs; k++)
            if (kids[k].pid > 0) fds.push_back({kids[k].fd, POLLIN, 0}), who.push_back(k);
        if (fds.empty()) break;
        poll(fds.data(), fds.size(), 200);
        const auto now = std::chrono::steady_clock::now();
        for (size_t f = 0; f < fds.size(); f++) {
            Child& ch = kids[who[f]];
            if (fds[f].revents & (POLLIN | POLLHUP)) {
                Report r;
                const ssize_t got = read(ch.fd, &r, sizeof r);
                if (got == (ssize_t)sizeof r && r.outcome < 0) {
                    ch.running = r.index, ch.started = now;
                } else if (got == (ssize_t)sizeof r) {
                    const int fmt = (int)(r.index % NUM_FORMATS);
                    t.count[fmt][r.outcome]++;
                    if (r.largest > r.size) t.excess[fmt] = std::max(t.excess[fmt], r.largest - r.size);
                    t.slowest = std::max(t.slowest, std::chrono::duration<double>(now - ch.started).count());
                    if (r.outcome != REJECTED && r.outcome != ACCEPTED) {
                        char line[256];
                        snprintf(line, sizeof line, "case %ld (%s): %s (replay: fuzz_cpu ... --seed %llu --case %ld)",
                                 r.index, FORMAT_NAMES[fmt], VERDICT_NAMES[r.outcome], (unsigned long long)o.seed, r.index);
                        t.failures.push_back(line);
                    }
                    ch.running = -1, ch.next = r.index + stride;
                } else {  // the worker is gone
                    reap(ch, stride, t, o, false);
                    if (ch.next < o.cases) start_child(ch, stride, o, w, who[f]);
                    continue;
                }
            }
            if (ch.pid > 0 && ch.running >= 0 &&
                std::chrono::duration<double>(now - ch.started).count() > o.time_limit) {
                kill(ch.pid, SIGKILL);
                reap(ch, stride, t, o, true);
                if (ch.next < o.cases) start_child(ch, stride, o, w, who[f]);
            }
        }
    }
}

long total(const Tally& t, int outcome) {
    long n = 0;
    for (int f = 0; f < NUM_FORMATS; f++) n += t.count[f][outcome];
    return n;
}

// The per-format table, in markdown (for --report and doc/reliability.md).
std::string table(const Tally& t) {
    std::string s = "| format | cases | rejected (clear error) | accepted | failures | largest allocation beyond the file's size |\n"
                    "|---|--:|--:|--:|--:|--:|\n";
    for (int f = 0; f < NUM_FORMATS; f++) {
        long cases = 0, bad = 0;
        for (int k = 0; k < NUM_VERDICTS; k++) cases += t.count[f][k];
        for (int k = UNCLEAR; k < NUM_VERDICTS; k++) bad += t.count[f][k];
        char line[200];
        snprintf(line, sizeof line, "| %s | %ld | %ld | %ld | %ld | %zu bytes |\n", FORMAT_NAMES[f], cases,
                 t.count[f][REJECTED], t.count[f][ACCEPTED], bad, t.excess[f]);
        s += line;
    }
    return s;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int a = 1; a < argc; a++) {
        const std::string f = argv[a];
        if (a + 1 >= argc) fail("%s: missing its value", f.c_str());
        const std::string v = argv[++a];
        if (f == "--text") o.text = v;
        else if (f == "--encoder") o.encoder = v;
        else if (f == "--merges") o.merges = v;
        else if (f == "--tokenizer") o.tokenizer = v;
        else if (f == "--report") o.report = v;
        else if (f == "--cases") o.cases = std::stol(v);
        else if (f == "--case") o.only = std::stol(v);
        else if (f == "--seed") o.seed = std::stoull(v);
        else if (f == "--jobs") o.jobs = std::max(1, std::stoi(v));
        else if (f == "--time-limit") o.time_limit = std::stod(v);
        else fail("%s: unknown flag", f.c_str());
    }
    if (o.text.empty() || o.encoder.empty() || o.merges.empty() || o.tokenizer.empty())
        fail("usage: fuzz_cpu --text F --encoder F --merges F --tokenizer F [--cases N] [--seed S] [--jobs J] ...");
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    return run_main([&] {
        const Options o = parse(argc, argv);
        char templ[] = "/tmp/fuzz_cpu_XXXXXX";
        if (!mkdtemp(templ)) fail("mkdtemp: %s", strerror(errno));
        const std::string dir = templ;
        const auto t0 = std::chrono::steady_clock::now();
        const Bases bases = make_bases(o.seed, o.text, o.tokenizer, dir);
        const BPE bpe = BPE::load(o.encoder, o.merges);
        Worker w{bases, bpe, dir, dir};
        if (o.only >= 0) {
            Case c;
            run_case(o.only, o, w, c);
            fs::remove_all(dir);
            return 0;
        }
        Tally t;
        run_all(o, w, t);
        fs::remove_all(dir);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        for (const std::string& f : t.failures) printf("FAIL %s\n", f.c_str());
        const long failures = total(t, UNCLEAR) + total(t, OVER_ALLOC) + total(t, DAMAGE_ACCEPTED) + total(t, WRONG) +
                              total(t, CRASH) + total(t, HANG) + total(t, SANITIZER);
        size_t excess = 0;
        for (size_t e : t.excess) excess = std::max(excess, e);
        char summary[640];
        snprintf(summary, sizeof summary,
                 "fuzz_cpu: %ld cases (seed %llu, %d workers, %.0f s; slowest case %.2f s, limit %.0f s) | "
                 "rejected with a clear error %ld | accepted %ld | crashes %ld | hangs %ld | sanitizer reports %ld | "
                 "unclear errors %ld | over-allocations %ld | damaged files accepted %ld | wrong results %ld | "
                 "largest allocation beyond the file's size %zu bytes\n",
                 o.cases, (unsigned long long)o.seed, o.jobs, s, t.slowest, o.time_limit, total(t, REJECTED),
                 total(t, ACCEPTED), total(t, CRASH), total(t, HANG), total(t, SANITIZER), total(t, UNCLEAR),
                 total(t, OVER_ALLOC), total(t, DAMAGE_ACCEPTED), total(t, WRONG), excess);
        printf("%s", table(t).c_str());
        printf("%s", summary);
        if (!o.report.empty()) write_file_atomic(o.report, table(t) + "\n" + summary);
        return failures == 0 ? 0 : 1;
    });
}
