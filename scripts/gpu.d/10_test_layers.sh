#!/usr/bin/env bash
# Per-layer GPU tests (test/gpu/test_layers.cu and test_attention.cu, doctest): every layer's naive and flash
# kernels, forward and backward, against the Eigen oracle; the FP32 build, then the BF16 build.
# Both binaries are built by scripts/gpu_run.sh (make cuda). Run time: about a minute (an estimate, not
# measured yet). When a binary fails, it is run once more under compute-sanitizer (memcheck, at most 5
# minutes) so that an out-of-bounds access names its kernel; that log is $OUT/sanitizer_<prec>.txt.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
FILTER='--source-file=*test_layers.cu,*test_attention.cu'
rc=0
for prec in fp32 bf16; do
  bin=build/test_gpu_$prec
  if [[ ! -x $bin ]]; then echo "$bin is missing: see build.log"; rc=1; continue; fi
  t0=$(date +%s)
  "$bin" "$FILTER" --duration=true > "$OUT/test_layers_$prec.txt" 2>&1
  r=$?
  echo "== $bin: rc=$r in $(( $(date +%s) - t0 )) s (log: test_layers_$prec.txt) =="
  grep -E "ERROR|error:|test cases:|assertions:|Status" "$OUT/test_layers_$prec.txt" | head -40
  if [[ $r -ne 0 ]]; then
    rc=1
    if command -v compute-sanitizer >/dev/null; then
      timeout 300 compute-sanitizer --tool memcheck --print-limit 20 "$bin" "$FILTER" > "$OUT/sanitizer_$prec.txt" 2>&1
      echo "compute-sanitizer rc=$?:"; grep -E "Invalid|ERROR SUMMARY|at .*in " "$OUT/sanitizer_$prec.txt" | head -20
    fi
  fi
done
exit $rc
