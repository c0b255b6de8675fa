// kernel_trace: when and where every kernel of a CUDA program ran, without changing the program.
//
// Nsight Compute times each kernel alone, so the sum of its kernels leaves out what happens between them: a
// training step's wall-clock time is that sum plus the handovers (the previous kernel draining, the next one
// launched and its blocks started) plus any wait for the host. Nsight Systems would show those; where it is not
// installed, CUPTI's activity API (which it is built on) gives the same timestamps. This is a CUDA injection
// library: the driver loads it into any program started with
//     CUDA_INJECTION64_PATH=$PWD/build/libkernel_trace.so KERNEL_TRACE_OUT=trace.csv ./program ...
// and calls InitializeInjection() before the program's first CUDA call. It asks CUPTI for a record of every
// kernel, memcpy and memset (start and end on the GPU's clock, in ns; for kernels also when the launch was queued
// by the host and when it was submitted to the GPU), and at exit writes them, one CSV line each, in the order
// CUPTI delivered them. With KERNEL_TRACE_API=1 it also records every CUDA runtime and driver API call on the host
// (its start and end on the same clock), so a gap where the GPU waited for the host shows what the host was doing.
// Each row's correlation id ties a kernel or copy to the API call that issued it. scripts/step_gaps.py reads the
// file. CONCURRENT_KERNEL records do not serialize kernels, so programmatic dependent launches still overlap as
// they do untraced.
#include <cupti.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Row {
    const char* kind;
    uint64_t start, end, queued, submitted;
    uint32_t stream, correlation;
    std::string name;
};
std::vector<Row> rows;  // guarded by rows_mutex: CUPTI may hand back buffers from its own thread
std::mutex rows_mutex;
constexpr size_t BUFFER_BYTES = 8u << 20;

void check(CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return;
    const char* s = nullptr;
    cuptiGetResultString(r, &s);
    fprintf(stderr, "kernel_trace: %s failed: %s\n", what, s ? s : "unknown CUPTI error");
    exit(1);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(aligned_alloc(8, BUFFER_BYTES));
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(rows_mutex);
    CUpti_Activity* r = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            // newer CUPTI versions append fields to this record, never move these
            const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
            rows.push_back({"kernel", k->start, k->end, k->queued, k->submitted, k->streamId, k->correlationId,
                            k->name ? k->name : "?"});
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
            rows.push_back({"memcpy", m->start, m->end, 0, 0, m->streamId, m->correlationId,
                            std::to_string(m->bytes) + " bytes"});
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
            rows.push_back({"memset", m->start, m->end, 0, 0, m->streamId, m->correlationId,
                            std::to_string(m->bytes) + " bytes"});
        } else if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME || r->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
            const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(r);
            const bool rt = r->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
            const char* name = nullptr;
            cuptiGetCallbackName(rt ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
            rows.push_back({rt ? "runtime" : "driver", a->start, a->end, 0, 0, a->threadId, a->correlationId,
                            name ? name : "?"});
        }
    }
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
    if (dropped) fprintf(stderr, "kernel_trace: CUPTI dropped %zu records\n", dropped);
    free(buffer);
}

void write_trace() {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    const char* path = getenv("KERNEL_TRACE_OUT");
    const std::string out = path && *path ? path : "kernel_trace.csv";
    const std::string tmp = out + ".tmp";  // written whole, then renamed: never a half-written trace
    FILE* f = fopen(tmp.c_str(), "w");
    if (!f) { fprintf(stderr, "kernel_trace: cannot write %s: %s\n", tmp.c_str(), strerror(errno)); return; }
    std::lock_guard<std::mutex> lock(rows_mutex);
    fprintf(f, "kind,start_ns,end_ns,queued_ns,submitted_ns,stream,correlation,name\n");
    for (const Row& r : rows) {
        std::string name = r.name;  // a C++ name may hold commas: quote it, doubling its quotes
        for (size_t i = 0; (i = name.find('"', i)) != std::string::npos; i += 2) name.insert(i, 1, '"');
        fprintf(f, "%s,%llu,%llu,%llu,%llu,%u,%u,\"%s\"\n", r.kind, (unsigned long long)r.start,
                (unsigned long long)r.end, (unsigned long long)r.queued, (unsigned long long)r.submitted, r.stream,
                r.correlation, name.c_str());
    }
    const bool ok = fclose(f) == 0 && rename(tmp.c_str(), out.c_str()) == 0;
    if (!ok) fprintf(stderr, "kernel_trace: could not finish %s\n", out.c_str());
    else fprintf(stderr, "kernel_trace: %zu records -> %s\n", rows.size(), out.c_str());
}

}  // namespace

extern "C" int InitializeInjection(void) {
    check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enabling memcpy records");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enabling memset records");
    check(cuptiActivityEnableLatencyTimestamps(1), "enabling the queued and submitted timestamps");
    const char* api = getenv("KERNEL_TRACE_API");
    if (api && std::string(api) == "1") {  // (the stream column holds the calling thread's id for these)
        check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enabling runtime API records");
        check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER), "enabling driver API records");
    }
    atexit(write_trace);
    return 1;
}
