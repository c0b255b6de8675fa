// Data-parallel training over several GPUs with NCCL: which process is which, how the processes meet, and
// the four collectives the trainer needs. One process per GPU ("rank" r of "world" W processes).
//
// How the processes are started (train_gpt2.cu's main):
//   - by the trainer itself: `--num-gpus N` and no rank: the first process becomes a launcher that runs N
//     copies of the same binary with the same flags plus `--rank r --init-file F` (fork + exec, before any
//     CUDA call), waits for them, and stops the others if one fails (they would wait for it forever);
//   - by mpirun (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK) or a torchrun-style launcher (RANK, WORLD_SIZE,
//     LOCAL_RANK), with --init-file PATH on a file system every rank sees (several hosts: a shared one);
//   - by hand: `--num-gpus N --rank R --init-file PATH` on each process.
// Meeting: NCCL needs one ncclUniqueId shared by all ranks. Rank 0 draws it and writes it to the init file
// atomically (tmp + rename); the others poll until the file appears. ncclCommInitRank returns only once every
// rank has joined, so by then all have read the file and rank 0 deletes it (a stale id never lingers).
// NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set before the communicator is created.
//
// No --num-gpus and no launcher variables: the plain single-GPU trainer, no NCCL call at all (comm == nullptr;
// every collective below is then a no-op). `--num-gpus 1` runs the distributed code path on a 1-rank
// communicator, whose sums are identities: bit-identical to the plain trainer (test/gpu/test_distributed.cu).
// A build without NCCL (the Makefile found no nccl.h: FLASHGPT2_NO_NCCL) is the plain trainer; --num-gpus then
// stops with one line saying so.
#pragma once
#if !defined(FLASHGPT2_NO_NCCL)
#include <nccl.h>
#endif
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "llmc/common.cuh"
#include "llmc/error.h"
#include "llmc/fileio.h"

namespace flashgpt2 {

#if defined(FLASHGPT2_NO_NCCL)
constexpr bool NCCL_AVAILABLE = false;
typedef struct ncclComm* ncclComm_t;  // never created in this build
#else
constexpr bool NCCL_AVAILABLE = true;
inline void nccl_check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) fail("NCCL: %s failed: %s", what, ncclGetErrorString(r));
}
#if defined(ENABLE_FP32)
constexpr ncclDataType_t NCCL_FLOATX = ncclFloat32;
#else
constexpr ncclDataType_t NCCL_FLOATX = ncclBfloat16;
#endif
#endif

// The first of the environment variables that is set, as an int; -1 when none is.
inline int env_int(const char* a, const char* b) {
    for (const char* name : {a, b}) {
        const char* s = getenv(name);
        if (s && *s) {
            char* end = nullptr;
            const long v = strtol(s, &end, 10);
            if (*end != '\0' || v < 0 || v > 1 << 20) fail("environment: %s='%s' is not a rank or a size", name, s);
            return (int)v;
        }
    }
    return -1;
}

// A launcher (mpirun, torchrun) told this process its rank.
inline bool launched_by_launcher() { return env_int("OMPI_COMM_WORLD_RANK", "RANK") >= 0; }

struct Distributed {
    int rank = 0, world = 1, local_rank = 0;  // local_rank: the GPU of this host this process uses
    ncclComm_t comm = nullptr;                // nullptr: the plain single-GPU trainer
    std::string init_file;
    double* scratch = nullptr;                // (1) device value for the host-value sums

    Distributed() = default;
    Distributed(const Distributed&) = delete;
    Distributed& operator=(const Distributed&) = delete;
    ~Distributed() {
#if !defined(FLASHGPT2_NO_NCCL)
        if (comm) ncclCommDestroy(comm);  // no check: destructors must not exit
#endif
        if (scratch) cudaFree(scratch);
    }

    bool active() const { return comm != nullptr; }
    bool is_main() const { return rank == 0; }

    // Who am I: from the flags (num_gpus 0 = not given, rank -1 = not given) and the launcher's variables.
    // No CUDA or NCCL call yet (the caller picks the device first, then calls connect()).
    void configure(int num_gpus, int rank_flag, const std::string& init_path) {
        const int env_rank = env_int("OMPI_COMM_WORLD_RANK", "RANK");
        const int env_size = env_int("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE");
        const int env_local = env_int("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK");
        distributed_ = num_gpus > 0 || env_rank >= 0;
        if (!distributed_) return;  // the plain trainer
        if (!NCCL_AVAILABLE)
            fail("--num-gpus: this build has no NCCL (no nccl.h when it was compiled): multi-GPU training is off");
        world = num_gpus > 0 ? num_gpus : env_size;
        if (world < 1) fail("--num-gpus: the launcher set a rank (RANK / OMPI_COMM_WORLD_RANK) but no world size; give --num-gpus N");
        if (num_gpus > 0 && env_size > 0 && env_size != num_gpus)
            fail("--num-gpus %d: the launcher says the world has %d processes", num_gpus, env_size);
        rank = rank_flag >= 0 ? rank_flag : env_rank >= 0 ? env_rank : world == 1 ? 0 : -1;
        if (rank < 0) fail("--num-gpus %d: this process has no rank (give --rank R, or let the trainer start the ranks)", world);
        if (rank >= world) fail("--rank %d: out of range for --num-gpus %d", rank, world);
        int devices = 0;  // counting devices does not create a context
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) devices = 1;  // ensure_gpu says it
        local_rank = env_local >= 0 ? env_local : rank % devices;
        init_file = init_path;
        if (world > 1 && init_file.empty())
            fail("--num-gpus %d: --init-file PATH is needed to exchange NCCL's id (a file every rank can read)", world);
    }

    // Creates the communicator (distributed runs only). The device must be set already.
    void connect() {
        if (!distributed_) return;
#if !defined(FLASHGPT2_NO_NCCL)
        setenv("NCCL_NVLS_ENABLE", "0", 1);  // no NVLink multicast, ever (before any NCCL call)
        ncclUniqueId id;
        if (rank == 0) {
            nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
            if (world > 1) write_file_atomic(init_file, {{&id, sizeof id}});
        } else {
            id = wait_for_id();
        }
        nccl_check(ncclCommInitRank(&comm, world, id, rank), "ncclCommInitRank");
        if (rank == 0 && world > 1) std::remove(init_file.c_str());  // everyone has joined, so has read it
        cudaCheck(cudaMalloc(&scratch, sizeof(double)));
#endif
    }

    // ---- collectives: on `stream`, asynchronous unless said otherwise; no-ops without a communicator ----
#if !defined(FLASHGPT2_NO_NCCL)

    // In place: buf holds world * shard values; afterwards buf[rank*shard, (rank+1)*shard) holds their sum
    // over the ranks (the rest is left as it was). ZeRO-1's gradient step.
    void reduce_scatter_sum(floatX* buf, size_t shard, cudaStream_t stream) const {
        if (!comm) return;
        nccl_check(ncclReduceScatter(buf, buf + (size_t)rank * shard, shard, NCCL_FLOATX, ncclSum, comm, stream),
                   "ncclReduceScatter");
    }
    // In place: every rank's slice buf[r*shard, (r+1)*shard) is copied to every rank. ZeRO-1's weights step.
    void all_gather(floatX* buf, size_t shard, cudaStream_t stream) const {
        if (!comm) return;
        nccl_check(ncclAllGather(buf + (size_t)rank * shard, buf, shard, NCCL_FLOATX, comm, stream), "ncclAllGather");
    }
    // In place: buf (n floats) = its sum over the ranks.
    void all_reduce_sum(float* buf, size_t n, cudaStream_t stream) const {
        if (!comm) return;
        nccl_check(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, stream), "ncclAllReduce");
    }
    // Blocking: the sum over the ranks of one host value per rank. One rank: x itself, untouched.
    double sum_host(double x, cudaStream_t stream) const {
        if (!comm || world == 1) return x;
        cudaCheck(cudaMemcpyAsync(scratch, &x, sizeof x, cudaMemcpyHostToDevice, stream));
        nccl_check(ncclAllReduce(scratch, scratch, 1, ncclFloat64, ncclSum, comm, stream), "ncclAllReduce");
        cudaCheck(cudaMemcpyAsync(&x, scratch, sizeof x, cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        return x;
    }
#else  // without NCCL there is never a communicator: every collective is a no-op
    void reduce_scatter_sum(floatX*, size_t, cudaStream_t) const {}
    void all_gather(floatX*, size_t, cudaStream_t) const {}
    void all_reduce_sum(float*, size_t, cudaStream_t) const {}
    double sum_host(double x, cudaStream_t) const { return x; }
#endif
    // Blocking: returns once every rank has reached it (e.g. every checkpoint shard is written).
    void barrier(cudaStream_t stream) const { sum_host(0.0, stream); }

private:
    bool distributed_ = false;

#if !defined(FLASHGPT2_NO_NCCL)
    ncclUniqueId wait_for_id() const {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
        for (;;) {
            std::error_code ec;
            if (std::filesystem::file_size(init_file, ec) == sizeof(ncclUniqueId) && !ec) {
                const std::string bytes = read_file(init_file);
                ncclUniqueId id;
                if (bytes.size() == sizeof id) {
                    memcpy(&id, bytes.data(), sizeof id);
                    return id;
                }
            }
            if (std::chrono::steady_clock::now() > deadline)
                fail("--init-file %s: rank %d waited 120 s for rank 0 to write NCCL's id", init_file.c_str(), rank);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
#endif
};

// ---------------------------------------------------------------------------------------------------------
// The launcher: `--num-gpus N` without a rank. Runs N copies of this very binary (/proc/self/exe) with argv
// plus `--rank r --init-file F`, F a fresh name in /tmp, and returns 0 when all of them exit with 0. When one
// fails, the others are stopped (SIGTERM to the processes started here, by pid): NCCL would wait for the lost
// rank forever. Called before any CUDA call (a forked CUDA context is unusable; exec starts afresh anyway).
inline int launch_ranks(int argc, char** argv, int n) {
    if (!NCCL_AVAILABLE) fail("--num-gpus: this build has no NCCL (no nccl.h when it was compiled): multi-GPU training is off");
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) fail("--num-gpus: cannot find this program's path (/proc/self/exe): %s", strerror(errno));
    self[len] = '\0';
    const std::string init_file = (std::filesystem::temp_directory_path() /
                                   ("flashgpt2_nccl_id_" + std::to_string(getpid()))).string();
    std::remove(init_file.c_str());
    setenv("NCCL_NVLS_ENABLE", "0", 1);  // the ranks inherit it (each sets it again anyway)
    std::vector<pid_t> pids;
    for (int r = 0; r < n; r++) {
        std::vector<std::string> args(argv, argv + argc);
        args.insert(args.end(), {"--rank", std::to_string(r), "--init-file", init_file});
        std::vector<char*> cargs;
        for (std::string& a : args) cargs.push_back(a.data());
        cargs.push_back(nullptr);
        const pid_t pid = fork();
        if (pid < 0) fail("--num-gpus: fork failed: %s", strerror(errno));
        if (pid == 0) {
            execv(self, cargs.data());
            fprintf(stderr, "error: --num-gpus: exec %s failed: %s\n", self, strerror(errno));
            _exit(127);
        }
        pids.push_back(pid);
    }
    int failed = 0;
    std::vector<bool> running(pids.size(), true);
    for (size_t done = 0; done < pids.size(); done++) {
        int status = 0;
        const pid_t pid = wait(&status);
        if (pid < 0) break;
        for (size_t i = 0; i < pids.size(); i++)
            if (pids[i] == pid) running[i] = false;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !failed) {
            failed = WIFEXITED(status) && WEXITSTATUS(status) != 0 ? WEXITSTATUS(status) : 1;
            for (size_t i = 0; i < pids.size(); i++)
                if (running[i]) kill(pids[i], SIGTERM);
        }
    }
    std::remove(init_file.c_str());
    return failed;
}

}  // namespace flashgpt2
