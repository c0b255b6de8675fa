#!/usr/bin/env bash
# `make test-gpu`: the whole GPU test binaries, FP32 build then BF16 build (test/gpu/*.cu, doctest): every
# layer's naive and flash kernels forward and backward against the Eigen oracle, attention forward and
# backward, the whole model (loss + 16 gradients per kernel set, 10 AdamW steps, KV-cache sampling, save ->
# reload -> continue, clear errors) and the data-parallel suite (its 2-process case needs 2 GPUs: skipped, and counted
# as skipped, on fewer); then test/gpu/divergence.sh, the trainer stopped by a planted NaN and resumed.
# Whole binaries, not one suite at a time: a state shared between test files (a "once" flag set by one .cu
# file's launch) only shows when they run in one process, as `make test-gpu` runs them.
# When a binary fails it is run once more under compute-sanitizer memcheck (at most 5 minutes), so that an
# out-of-bounds access names its kernel: $OUT/sanitizer_<prec>.txt. About 1.5 minutes on an H200,
# about half each build.
set -uo pipefail
OUT=${OUT:-log/bench}; mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}   # the 124M oracle runs on the CPU (Eigen, OpenMP)
rc=0
for prec in fp32 bf16; do
  bin=build/test_gpu_$prec
  if [[ ! -x $bin ]]; then echo "$bin is missing: see build.log"; rc=1; continue; fi
  t0=$(date +%s)
  timeout 360 "$bin" --duration=true > "$OUT/test_gpu_$prec.txt" 2>&1
  r=$?
  echo "== $bin: rc=$r in $(( $(date +%s) - t0 )) s (log: test_gpu_$prec.txt) =="
  grep -E "ERROR|error:|test cases:|assertions:|Status" "$OUT/test_gpu_$prec.txt" | head -40
  if [[ $r -ne 0 ]]; then
    rc=1
    if command -v compute-sanitizer >/dev/null; then
      timeout 300 compute-sanitizer --tool memcheck --print-limit 20 "$bin" > "$OUT/sanitizer_$prec.txt" 2>&1
      echo "compute-sanitizer rc=$?:"; grep -E "Invalid|ERROR SUMMARY|at .*in " "$OUT/sanitizer_$prec.txt" | head -20
    fi
  fi
done
echo "== the divergence policy end to end (test/gpu/divergence.sh) =="
bash test/gpu/divergence.sh > "$OUT/divergence.txt" 2>&1 || rc=1
tail -n 12 "$OUT/divergence.txt"
exit $rc
