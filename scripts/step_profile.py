#!/usr/bin/env python3
"""Where one training step's GPU time goes, kernel by kernel: reads Nsight Compute's CSV
(`ncu --metrics gpu__time_duration.sum --csv --print-units base`) of a few training steps, keeps the last
step (from the last encoder forward kernel on), and prints a markdown table per layer and per kernel.

Usage: step_profile.py NCU_CSV [WALL_MS] [HEADER_LINE] [RUN_MHZ RUN_WATTS RUN_SAMPLES]
Kernel durations are measured one kernel at a time (ncu serializes them), so their sum leaves out the gaps
between kernels; WALL_MS, the trainer's own mean step time, shows how large those are. When the CSV also has
the SM clock per kernel (sm__cycles_elapsed.avg.per_second), its time-weighted mean is printed beside
RUN_MHZ / RUN_WATTS, the mean SM clock and power that nvidia-smi sampled while the unprofiled run trained.
"""
import collections
import csv
import io
import sys

# Which layer a kernel belongs to, by a piece of its name (first match wins). cuBLASLt's own kernels
# (nvjet_*, sm90_xmma_*, splitKreduce) are the matmuls.
LAYERS = [("attention", "attention"), ("dbias", "matmul (dbias)"), ("matmul", "matmul"), ("nvjet", "matmul"),
          ("xmma", "matmul"), ("splitKreduce", "matmul"), ("layernorm", "layernorm"), ("classifier", "classifier"),
          ("adamw", "adamw (update)"), ("norm_squared", "adamw (grad norm)"), ("encoder", "encoder"),
          ("DeviceRadixSort", "encoder"), ("gelu", "gelu"), ("residual", "residual")]


def layer_of(name):
    for piece, layer in LAYERS:
        if piece in name:
            return layer
    return "other"


def short(name):
    name = name.split("(")[0].replace("void ", "").replace("flashgpt2::", "")
    return name if len(name) <= 70 else name[:67] + "..."


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: step_profile.py NCU_CSV [WALL_MS] [HEADER_LINE]")
    lines = open(sys.argv[1]).read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"step_profile.py: {sys.argv[1]}: no ncu CSV header (\"ID\",...) found")
    kernels, hz = [], {}  # (name, ms, launch ID) in launch order; SM clock (Hz) by launch ID
    for r in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        value = float(r["Metric Value"].replace(",", ""))
        if r.get("Metric Name") == "gpu__time_duration.sum":
            kernels.append((r["Kernel Name"], value / 1e6, r["ID"]))  # ns -> ms
        elif r.get("Metric Name") == "sm__cycles_elapsed.avg.per_second":
            hz[r["ID"]] = value
    starts = [i for i, (n, _, _) in enumerate(kernels) if "encoder_forward" in n]
    if len(starts) < 2:
        sys.exit("step_profile.py: fewer than 2 steps in the profile (each step starts with the encoder forward)")
    step = kernels[starts[-1]:]
    total = sum(t for _, t, _ in step)
    wall = float(sys.argv[2]) if len(sys.argv) > 2 else None
    if len(sys.argv) > 3:
        print(sys.argv[3] + "\n")
    print(f"{len(step)} kernels, {total:.2f} ms of kernel time"
          + (f" against a {wall:.2f} ms step (wall clock, no profiler): {wall - total:.2f} ms more" if wall else "")
          + ".\n")
    if all(i in hz for _, _, i in step):
        ncu_mhz = sum(t * hz[i] for _, t, i in step) / total / 1e6
        line = f"SM clock: {ncu_mhz:.0f} MHz under ncu (kernels one at a time; mean weighted by kernel time)"
        if len(sys.argv) > 6:
            line += (f"; {float(sys.argv[4]):.0f} MHz at {float(sys.argv[5]):.0f} W in the unprofiled run"
                     f" (nvidia-smi, mean of {sys.argv[6]} samples 100 ms apart while it trained)")
        print(line + ".\n")
    by_layer, by_kernel = collections.defaultdict(lambda: [0, 0.0]), collections.defaultdict(lambda: [0, 0.0])
    for name, t, _ in step:
        for table, key in ((by_layer, layer_of(name)), (by_kernel, short(name))):
            table[key][0] += 1
            table[key][1] += t
    print("| layer | kernels | ms | % of kernel time |\n|---|--:|--:|--:|")
    for k, (n, t) in sorted(by_layer.items(), key=lambda x: -x[1][1]):
        print(f"| {k} | {n} | {t:.3f} | {100 * t / total:.1f}% |")
    print("\n| kernel | calls | ms | us per call |\n|---|--:|--:|--:|")
    for k, (n, t) in sorted(by_kernel.items(), key=lambda x: -x[1][1])[:20]:
        print(f"| `{k}` | {n} | {t:.3f} | {1000 * t / n:.1f} |")


if __name__ == "__main__":
    main()
