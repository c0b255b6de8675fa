#!/usr/bin/env python3
"""What the GPU does between a training step's kernels: reads the timeline that build/libkernel_trace.so wrote
(dev/kernel_trace.cpp: every kernel, memcpy and memset with its GPU start and end, and for kernels when the host
queued the launch and when it was submitted), keeps one whole step, and prints markdown: how much of the step no
kernel ran, by handover (which kind of kernel ended, which began), how much of that idle time the next launch had
not yet been submitted to the GPU (the host's code behind, or its driver holding the launch back), and the largest
gaps.

Usage: step_gaps.py TRACE_CSV [HEADER_LINE]
A trace made with KERNEL_TRACE_API=1 also times the host's waits before copies and memsets (their API calls).
A step runs from one encoder forward kernel (each step's first) to the next one, so the second-to-last step of the
trace is taken: its span includes what the host did between steps, as the trainer's wall-clock step time does.
"""
import collections
import csv
import sys

import step_profile  # (beside this script) the same short names as the kernel table

LIBRARY = ("nvjet", "cublas", "splitKreduce", "xmma", "gemm", "cutlass")  # cuBLAS / cuBLASLt kernels


def kind_of(row):
    if row["kind"] != "kernel":
        return row["kind"]  # memcpy, memset
    return "cuBLAS" if any(p in row["name"] for p in LIBRARY) else "ours"


def short(name):
    """A kernel's name as CUPTI gives it (mangled) -> its last component, e.g. _ZN9flashgpt218adamw_flash_kernelEPf...
    -> adamw_flash_kernel, with <…> where it is a template's instance; then shortened as step_profile.py does
    for Nsight Compute's (demangled) names."""
    if name.startswith("_ZN"):
        i, parts = 3, []
        while i < len(name) and name[i].isdigit():
            j = i
            while name[j].isdigit():
                j += 1
            n = int(name[i:j])
            parts.append(name[j:j + n])
            i = j + n
        if parts:
            name = parts[-1] + ("<…>" if name[i:i + 1] == "I" else "")
    return step_profile.short(name)


def label(row):
    return f"`{short(row['name'])}`" if row["kind"] == "kernel" else f"{row['kind']} of {row['name']}"


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: step_gaps.py TRACE_CSV [HEADER_LINE]")
    everything = list(csv.DictReader(open(sys.argv[1])))
    for r in everything:
        for k in ("start_ns", "end_ns", "queued_ns", "submitted_ns"):
            r[k] = int(r[k])
    # the GPU's timeline; a trace made with KERNEL_TRACE_API=1 also holds the host's API calls, and then a copy's
    # or memset's launch time is known too (its API call's end; CUPTI gives kernels a submitted time of their own)
    rows = [r for r in everything if r["kind"] in ("kernel", "memcpy", "memset")]
    launch_end = {}  # correlation id -> end of the API call that issued it (the runtime's, where there is one)
    for r in everything:
        if r["kind"] == "runtime" or (r["kind"] == "driver" and r.get("correlation") not in launch_end):
            launch_end[r["correlation"]] = r["end_ns"]
    for r in rows:
        if not r["submitted_ns"] and r.get("correlation") in launch_end:
            r["submitted_ns"] = launch_end[r["correlation"]]
    rows.sort(key=lambda r: (r["start_ns"], r["end_ns"]))
    starts = [i for i, r in enumerate(rows) if r["kind"] == "kernel" and "encoder_forward" in r["name"]]
    if len(starts) < 3:
        sys.exit(f"step_gaps.py: {sys.argv[1]}: fewer than 3 steps (each starts with the encoder forward kernel)")
    step = rows[starts[-2]:starts[-1]]
    t0, t1 = step[0]["start_ns"], rows[starts[-1]]["start_ns"]
    # walk the step in start order; a gap is time after everything so far has ended and before the next begins
    by_handover = collections.defaultdict(lambda: [0, 0.0, 0.0])  # (ended, began) -> [count, idle ns, late ns]
    gaps, host_ns, overlap = [], 0.0, 0
    ended_at, last = step[0]["end_ns"], step[0]
    for nxt in step[1:] + [rows[starts[-1]]]:
        gap = nxt["start_ns"] - ended_at
        if gap > 0:
            h = (kind_of(last), kind_of(nxt))
            by_handover[h][0] += 1
            by_handover[h][1] += gap
            gaps.append((gap, last, nxt))
            # the launch reached the GPU only after the stream had drained: that part of the gap waited for it
            if nxt["submitted_ns"] > ended_at:
                late = min(gap, nxt["submitted_ns"] - ended_at)
                host_ns += late
                by_handover[h][2] += late
        else:
            overlap += 1  # began before the previous one ended (programmatic dependent launch)
        if nxt["end_ns"] >= ended_at:
            ended_at, last = nxt["end_ns"], nxt
    span = (t1 - t0) / 1e6
    idle = sum(g for g, _, _ in gaps) / 1e6
    kernels = [r for r in step if r["kind"] == "kernel"]
    if len(sys.argv) > 2:
        print(sys.argv[2] + "\n")
    print(f"One step, {len(kernels)} kernels and {len(step) - len(kernels)} copies or memsets: {span:.2f} ms from its first "
          f"kernel's start to the next step's. No kernel or copy ran for {idle:.2f} ms of it ({100 * idle / span:.1f}%), "
          f"in {len(gaps)} gaps. In {host_ns / 1e6:.2f} ms of those the next launch had not yet reached the GPU (its "
          f"submitted time, CUPTI's, after the GPU had drained): the host's code was behind, or its driver held the launch "
          f"back. {overlap} kernels began before the one before them ended (programmatic dependent launch).\n")
    print("| handover (ended → began) | gaps | idle ms | µs per gap | of it, launch not yet at the GPU (ms) |")
    print("|---|--:|--:|--:|--:|")
    for (a, b), (n, ns, late) in sorted(by_handover.items(), key=lambda kv: -kv[1][1]):
        print(f"| {a} → {b} | {n} | {ns / 1e6:.3f} | {ns / 1e3 / n:.1f} | {late / 1e6:.3f} |")
    if not launch_end:
        print("\n(A copy's or memset's launch time is known only in a trace made with KERNEL_TRACE_API=1: counted 0 here, – below.)")
    print("\nThe largest gaps:\n")
    print("| µs | of it, launch not yet at the GPU (µs) | ended | began |")
    print("|--:|--:|---|---|")
    for gap, a, b in sorted(gaps, key=lambda g: -g[0])[:10]:
        late = f"{max(0, min(gap, b['submitted_ns'] - (b['start_ns'] - gap))) / 1e3:.1f}" if b["submitted_ns"] else "–"
        print(f"| {gap / 1e3:.1f} | {late} | {label(a)} | {label(b)} |")


if __name__ == "__main__":
    main()
