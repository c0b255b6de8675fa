// The reliability pieces both trainers share: CRC-32C (llmc/checksum.h), atomic writes and directories
// (llmc/fileio.h), the divergence guard (llmc/guard.h) and the run-settings record with the output-directory
// rules (llmc/run_record.h). The trainers' own use of them is tested end to end by test/reliability/trainer.sh
// and fault.sh, and the readers under fuzzing by test/reliability/fuzz_cpu.cpp.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "llmc/checksum.h"
#include "llmc/fileio.h"
#include "llmc/guard.h"
#include "llmc/run_record.h"
#include "llmc/sampler.h"
#include "test/cpu/alloc_watch.h"
#include "test/cpu/data_helpers.h"
#include "test/cpu/seed.h"

using namespace flashgpt2;
using namespace flashgpt2::testing;
namespace fs = std::filesystem;

namespace {

// CRC-32C one bit at a time, straight from the definition (reflected polynomial 0x82F63B78): the reference the
// table-driven crc32c is checked against.
uint32_t crc32c_bitwise(const std::string& s) {
    uint32_t r = 0xFFFFFFFFu;
    for (unsigned char c : s) {
        r ^= c;
        for (int b = 0; b < 8; b++) r = (r >> 1) ^ ((r & 1u) ? 0x82F63B78u : 0u);
    }
    return ~r;
}

// Runs f as an unprivileged user (nobody) when the tests run as root, where permission bits do not stop a write;
// returns the message of the Error f throws, as error_of does.
template <class F>
std::string error_as_unprivileged(F&& f) {
    if (geteuid() != 0) return error_of(f);
    int fd[2];
    REQUIRE(pipe(fd) == 0);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        std::string msg = "(could not drop privileges)";
        if (setgid(65534) == 0 && setuid(65534) == 0) msg = error_of(f);
        const ssize_t w = write(fd[1], msg.data(), msg.size());
        _exit(w == (ssize_t)msg.size() ? 0 : 1);
    }
    close(fd[1]);
    std::string msg;
    char buf[512];
    for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) msg.append(buf, n);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return msg;
}

RunRecord sample_record() {
    RunRecord r;
    r.set("trainer", std::string("test"));
    r.set("lr", (double)6e-4f);  // a float setting, as the trainers pass them
    r.set("steps", 250LL);
    r.set("train_data", std::string("1 file(s), 100 tokens, crc32c 0badcafe"));
    return r;
}

}  // namespace

TEST_CASE("crc32c: the catalogue's check value, the bitwise definition, and chaining") {
    CHECK(crc32c("123456789", 9) == 0xE3069283u);  // the CRC catalogue's check value for CRC-32C
    CHECK(crc32c("", 0) == 0u);
    Rng rng(test_seed("crc32c: random buffers", 41));
    for (int trial = 0; trial < 200; trial++) {
        std::string s(rng.next_u32() % 100, '\0');
        for (char& c : s) c = (char)rng.next_u32();
        CAPTURE(s.size());
        CHECK(crc32c(s.data(), s.size()) == crc32c_bitwise(s));
        const size_t cut = s.empty() ? 0 : rng.next_u32() % s.size();  // a CRC continues over a second piece
        CHECK(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)) == crc32c_bitwise(s));
    }
}

TEST_CASE("fileio: read_file allocates the file's size once; errors carry errno's reason") {
    TempDir d;
    const std::string big(300000, 'x');
    write_bytes(d / "big.txt", big);
    alloc_reset();
    CHECK(read_file(d / "big.txt") == big);
    CHECK(alloc_largest() <= big.size() + 1);  // not the up to 2x of a string grown by doubling
    CHECK(contains(error_of([&] { read_file(d / "missing"); }), "No such file or directory"));
    CHECK(contains(error_of([&] { read_file(d.path); }), "not a regular file"));
    // a directory where the temp file goes: the write fails with the OS's reason, the target is untouched
    write_bytes(d / "target", "old");
    fs::create_directories(d / "target.tmp");
    CHECK(contains(error_of([&] { write_file_atomic(d / "target", std::string("new")); }), "Is a directory"));
    CHECK(read_file(d / "target") == "old");
    // a directory without write permission says so (not "No such file")
    fs::create_directories(d / "locked");
    fs::permissions(d / "locked", fs::perms::owner_read | fs::perms::owner_exec | fs::perms::others_read |
                                      fs::perms::others_exec);
    CHECK(contains(error_as_unprivileged([&] { write_file_atomic(d / "locked/f", std::string("x")); }),
                   "Permission denied"));
    fs::permissions(d / "locked", fs::perms::owner_all);
}

TEST_CASE("fileio: make_directories reports why, and remove_empty_directories undoes only what it made") {
    TempDir d;
    CHECK(make_directories(d / "a/b/c", "-o") == d / "a");
    CHECK(fs::is_directory(d / "a/b/c"));
    CHECK(make_directories(d / "a/b/c/", "-o") == "");  // already there
    write_bytes(d / "a/keep.txt", "x");
    remove_empty_directories(d / "a/b/c", d / "a");  // removes c and b, stops at a (not empty)
    CHECK_FALSE(fs::exists(d / "a/b"));
    CHECK(fs::exists(d / "a/keep.txt"));
    write_bytes(d / "file", "x");
    CHECK(contains(error_of([&] { make_directories(d / "file/sub", "-o"); }), "cannot create the directory"));
    CHECK(contains(error_of([&] { make_directories(d / "file", "-o"); }), "-o " + (d / "file") + ": cannot create"));
    fs::permissions(d.path, fs::perms::owner_all | fs::perms::others_read | fs::perms::others_exec);
    CHECK(contains(error_as_unprivileged([&] { make_directories(d / "new/run", "-o"); }), "Permission denied"));
}

TEST_CASE("guard: a non-finite value stops with the step and the quantity named") {
    require_finite(3, "gradient norm", 1e30);  // large but finite: fine
    CHECK(contains(error_of([] { require_finite(12, "gradient norm", NAN); }), "step 12: the gradient norm is NaN"));
    CHECK(contains(error_of([] { require_finite(0, "training loss", INFINITY); }), "step 0: the training loss is +inf"));
    CHECK(contains(error_of([] { require_finite(5, "validation loss", -INFINITY); }), "before the update"));
}

TEST_CASE("guard: the loss z-score against the last 64 losses; spikes skipped, the third in a row accepted") {
    SpikeGuard g(4.0f);
    Rng rng(test_seed("guard: loss window", 42));
    std::vector<float> window;
    for (int i = 0; i < GuardState::WINDOW; i++) {
        const float loss = 5.0f + 0.1f * (float)rng.next_normal();
        window.push_back(loss);
        const SpikeVerdict v = g.check(loss);
        CHECK(std::isnan(v.z));  // the window is not full yet: no judgement
        CHECK_FALSE(v.skip);
    }
    double mean = 0, var = 0;  // this test's own z for the next loss
    for (float x : window) mean += x / 64.0;
    for (float x : window) var += (x - mean) * (x - mean) / 64.0;
    const float next = 5.05f;
    const SpikeVerdict ok = g.check(next);
    CHECK(ok.z == doctest::Approx((next - mean) / std::sqrt(var)));
    CHECK_FALSE(ok.skip);
    // a spike far above: skipped, and it does not join the window (the guard would grow lenient)
    const GuardState before = g.state;
    const SpikeVerdict spike = g.check(9.0f);
    CHECK(spike.z > 4.0);
    CHECK(spike.skip);
    CHECK(g.state.losses == before.losses);
    CHECK(g.state.skipped_in_a_row == 1);
    CHECK(g.check(9.0f).skip);
    CHECK(g.state.losses == before.losses);
    CHECK(g.check(9.0f).skip);  // the third in a row: still skipped, but now it joins (a level shift is real)
    CHECK(g.state.losses[GuardState::WINDOW - 1] == 9.0f);
    // z_max 0: measure only, never skip
    SpikeGuard measure(0.0f);
    measure.state = before;
    const SpikeVerdict m = measure.check(9.0f);
    CHECK(m.z > 4.0);
    CHECK_FALSE(m.skip);
    // the state is all there is: a copy continues exactly as the original (what a resume relies on)
    SpikeGuard a(3.0f), b(3.0f);
    a.state = before;
    b.state = before;
    for (int i = 0; i < 100; i++) {
        const float loss = 5.0f + (i % 17 == 0 ? 2.0f : 0.1f * (float)rng.next_normal());
        const SpikeVerdict va = a.check(loss), vb = b.check(loss);
        CHECK(va.skip == vb.skip);
        CHECK(va.z == vb.z);
    }
}

TEST_CASE("run record: text round trip, strict parsing, and the differences spelled out") {
    const RunRecord r = sample_record();
    const std::string text = r.text();
    CHECK(contains(text, "lr = 0.000600000028\n"));  // a float's 9 digits: the float exactly
    const RunRecord back = RunRecord::parse(text, "run_settings.txt");
    CHECK(back.fields == r.fields);
    CHECK(record_differences(back, r).empty());
    RunRecord other = r;
    other.set("lr", (double)1e-3f);
    other.set("seed", 7LL);
    CHECK(record_differences(r, other) == "lr: 0.000600000028 -> 0.00100000005; seed: (absent) -> 7");
    CHECK(contains(error_of([] { RunRecord::parse("lr 0.1\n", "f.txt"); }), "f.txt: line 1 is not 'key = value'"));
    CHECK(contains(error_of([] { RunRecord::parse("a = 1\na = 2\n", "f.txt"); }), "line 2 repeats the key 'a'"));
    CHECK(contains(error_of([] { RunRecord::parse("Bad Key = 1\n", "f.txt"); }), "bad key"));
    RunRecord bad;
    CHECK(contains(error_of([&] { bad.set("k", std::string("two\nlines")); }), "spans lines"));
}

TEST_CASE("open_run_dir: a fresh run refuses another run's checkpoints unless --overwrite; resume checks settings") {
    TempDir d;
    const std::string dir = d / "run";
    const RunRecord rec = sample_record();
    // fresh, in a new directory: created, the record written
    CHECK(open_run_dir(dir, rec, false, false) == -1);
    CHECK(read_file(run_record_path(dir)) == rec.text());
    // resume without a checkpoint
    CHECK(contains(error_of([&] { open_run_dir(dir, rec, true, false); }), "no complete checkpoint"));
    // the debris of a run stopped before its first checkpoint (no DONE marker) does not block a fresh run: deleted
    write_bytes(d / "run/model_00000004.bin", "x");
    write_bytes(d / "run/state_00000004.bin.tmp", "x");
    CHECK(open_run_dir(dir, rec, false, false) == -1);
    CHECK(checkpoint_files(dir).empty());
    // a checkpoint appears: a fresh run is refused, naming the newest step and the two ways out
    for (const char* f : {"model_00000010.bin", "model_00000010.bin.crc32c", "state_00000010.bin", "DONE_00000010",
                          "model_00000020.bin"})
        write_bytes(d / ("run/" + std::string(f)), "x");
    write_bytes(d / "run/notes.txt", "mine");
    const std::string refused = error_of([&] { open_run_dir(dir, rec, false, false); });
    CHECK(contains(refused, "already holds a run's checkpoints (5 files, newest complete step 10)"));
    CHECK(contains(refused, "--overwrite"));
    // resume: the same settings continue from step 10; other settings are refused with every difference
    CHECK(open_run_dir(dir, rec, true, false) == 10);
    RunRecord changed = rec;
    changed.set("lr", (double)1e-3f);
    changed.set("steps", 300LL);
    const std::string diff = error_of([&] { open_run_dir(dir, changed, true, false); });
    CHECK(contains(diff, "lr: 0.000600000028 -> 0.00100000005; steps: 250 -> 300"));
    CHECK(contains(error_of([&] { open_run_dir(dir, rec, true, true); }), "contradict"));
    // --overwrite deletes the checkpoint files, and only them
    CHECK(open_run_dir(dir, changed, false, true) == -1);
    CHECK(checkpoint_files(dir).empty());
    CHECK(read_file(d / "run/notes.txt") == "mine");
    CHECK(read_file(run_record_path(dir)) == changed.text());
    // checkpoints without a record (another tool's directory) cannot be resumed: nothing to check them against
    write_bytes(d / "run/DONE_00000030", "");
    fs::remove(run_record_path(dir));
    CHECK(contains(error_of([&] { open_run_dir(dir, rec, true, false); }), "no run_settings.txt"));
}

TEST_CASE("open_run_dir: an unwritable -o is a permission error before any training, and leaves no folder") {
    TempDir d;
    fs::create_directories(d / "locked");
    fs::permissions(d / "locked", fs::perms::owner_read | fs::perms::owner_exec | fs::perms::others_read |
                                      fs::perms::others_exec);
    const RunRecord rec = sample_record();
    CHECK(contains(error_as_unprivileged([&] { open_run_dir(d / "locked/run", rec, false, false); }),
                   "-o " + (d / "locked/run") + ": cannot create the directory: Permission denied"));
    fs::permissions(d / "locked", fs::perms::owner_all);
    // a directory that exists but cannot be written: the record's write says so
    fs::create_directories(d / "ro");
    fs::permissions(d / "ro", fs::perms::owner_read | fs::perms::owner_exec | fs::perms::others_read |
                                  fs::perms::others_exec);
    CHECK(contains(error_as_unprivileged([&] { open_run_dir(d / "ro", rec, false, false); }), "Permission denied"));
    fs::permissions(d / "ro", fs::perms::owner_all);
    CHECK(fs::is_empty(d / "ro"));
}
