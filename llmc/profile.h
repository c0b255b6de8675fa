// Per-layer GPU timing with CUDA events: where does a training step's time go?
//
// The idea: every layer op the model launches is bracketed by two events recorded on the same stream,
//     prof.begin(Layer::attention, Pass::backward, stream);  attention_backward(...);  prof.end(stream);
// The layer ops of llmc/kernels.h open these spans themselves (an op that fuses two layers, such as the flash
// layernorm with the residual add, is charged to the layer whose kernel runs), so the model never names one.
// After the step, collect() waits for the last event and adds each pair's elapsed time to a table
// (layer × {forward, backward}). Events are recorded, not waited on, so the GPU keeps running while the CPU
// queues more work; only collect() synchronizes. The events are created once and reused every step.
//
// When nobody asks for a profile the model holds a null LayerProfiler* and calls nothing: training runs pay
// nothing for this. `--compare` turns it on (an event pair costs a few microseconds of GPU idle time per op,
// so profiled steps are a little slower than plain ones; the totals we print come from unprofiled steps).
#pragma once
#include <array>
#include <ctime>
#include <string>
#include <vector>

#include "llmc/common.cuh"
#include "llmc/layer.h"

namespace flashgpt2 {

class LayerProfiler {
public:
    LayerProfiler() = default;
    LayerProfiler(const LayerProfiler&) = delete;
    LayerProfiler& operator=(const LayerProfiler&) = delete;
    ~LayerProfiler() {
        for (cudaEvent_t e : events_) cudaEventDestroy(e);  // no check: destructors must not exit
    }

    // Opens a timed span on `stream`. Spans do not nest: end() closes the last one opened.
    void begin(Layer layer, Pass pass, cudaStream_t stream) {
        const size_t i = spans_.size();
        spans_.push_back({layer, pass});
        cudaCheck(cudaEventRecord(event(2 * i), stream));
    }
    void end(cudaStream_t stream) { cudaCheck(cudaEventRecord(event(2 * spans_.size() - 1), stream)); }

    // Waits for the recorded spans, adds their times to the table, forgets them; returns the ms collected.
    float collect() {
        if (spans_.empty()) return 0.0f;
        cudaCheck(cudaEventSynchronize(events_[2 * spans_.size() - 1]));
        float total = 0.0f;
        for (size_t i = 0; i < spans_.size(); i++) {
            float ms = 0.0f;
            cudaCheck(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]));
            ms_[idx(spans_[i].layer)][idx(spans_[i].pass)] += ms;
            calls_[idx(spans_[i].layer)][idx(spans_[i].pass)] += 1;
            total += ms;
        }
        spans_.clear();
        return total;
    }

    // Accumulated ms of one layer and pass since the last reset(); calls() says how many spans that was.
    double ms(Layer l, Pass p) const { return ms_[idx(l)][idx(p)]; }
    long calls(Layer l, Pass p) const { return calls_[idx(l)][idx(p)]; }
    void reset() {
        spans_.clear();
        ms_ = {};
        calls_ = {};
    }

private:
    struct Span {
        Layer layer;
        Pass pass;
    };
    std::vector<cudaEvent_t> events_;  // grows to 2 × (spans per step) once, then reused
    std::vector<Span> spans_;          // the spans recorded since the last collect()
    std::array<std::array<double, 2>, NUM_LAYERS> ms_{};
    std::array<std::array<long, 2>, NUM_LAYERS> calls_{};

    static int idx(Layer l) { return static_cast<int>(l); }
    static int idx(Pass p) { return p == Pass::forward ? 0 : 1; }
    cudaEvent_t event(size_t i) {
        while (events_.size() <= i) {
            cudaEvent_t e;
            cudaCheck(cudaEventCreate(&e));
            events_.push_back(e);
        }
        return events_[i];
    }
};

// RAII form for one op: `{ ProfileSpan s(prof, Layer::matmul, Pass::forward, stream); matmul_forward_flash(...); }`.
// A null profiler makes it a no-op.
class ProfileSpan {
public:
    ProfileSpan(LayerProfiler* p, Layer l, Pass pass, cudaStream_t s) : p_(p), s_(s) {
        if (p_) p_->begin(l, pass, s_);
    }
    ~ProfileSpan() {
        if (p_) p_->end(s_);
    }
    ProfileSpan(const ProfileSpan&) = delete;
    ProfileSpan& operator=(const ProfileSpan&) = delete;

private:
    LayerProfiler* p_;
    cudaStream_t s_;
};

// The time a measurement was made, for the tables that state it: ISO 8601, universal time ("Z"), to the minute.
inline std::string utc_timestamp() {
    const std::time_t t = std::time(nullptr);
    char b[32];
    std::strftime(b, sizeof b, "%Y-%m-%dT%H:%MZ", std::gmtime(&t));
    return b;
}

}  // namespace flashgpt2
