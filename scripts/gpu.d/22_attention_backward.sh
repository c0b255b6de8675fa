#!/usr/bin/env bash
# GPU step: the trainer's attention BACKWARD (llmc/attention_backward.cuh in the BF16 build), run by
# scripts/gpu_run.sh after `make cuda`; logs under $OUT.
# (Its GPU test, test/gpu/test_attention_backward.cu, runs with the others in 10_test_gpu.sh.)
#   1. ./dev/attention/runner bwd: validation at odd T (1, 2, 37, 257, 1000 at HS 64; 257 at HS 128), then
#      (4,12,1024,64) validated and timed; then (16,12,1024,64) and (64,12,1024,64) validated and timed
#      (naive, flash, and flash with the 4-warp dK/dV block)
#   2. compute-sanitizer racecheck + memcheck on one small shape (a shared-memory race or an out-of-bounds
#      copy names its kernel here)
# Prints one table: shape, kernel, ms, TFLOP/s (FlashAttention count: bwd = 2.5 x 4·B·H·T²·D/2).
# Time: 27 s on the H200 (2026-11-29; each part has a timeout).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
status=0
R=./dev/attention/runner
[[ -x $R ]] || { echo "$R is missing: see the build log"; exit 1; }

echo "== 1. runner bwd =="
run() {  # run LOGNAME ARGS...: one runner call with a timeout; prints its FAIL lines
  local log="$OUT/attention_bwd_$1.log"; shift
  local t0=$(date +%s)
  timeout 120 $R bwd "$@" > "$log" 2>&1; local rc=$?
  printf 'runner bwd %-14s rc=%-3s %3ss  %s passed, %s failed\n' "$*" "$rc" "$(( $(date +%s) - t0 ))" \
    "$(grep -c ': PASS' "$log")" "$(grep -c 'FAIL' "$log")"
  grep -E 'FAIL|error' "$log" | head -10
  [[ $rc == 0 ]] || status=1
}
run default
run 16x12x1024x64 16 12 1024 64
run 64x12x1024x64 64 12 1024 64
echo
printf '%-20s %-56s %10s %10s\n' shape kernel ms TFLOP/s
for f in "$OUT"/attention_bwd_default.log "$OUT"/attention_bwd_16x12x1024x64.log "$OUT"/attention_bwd_64x12x1024x64.log; do
  # "  time <kernel...> (B,H,T,D): X ms  Y TFLOP/s ..."
  sed -n 's/^  time \(.*\) \((.*)\): \([0-9.]*\) ms  \([0-9.]*\) TFLOP\/s.*/\2|\1|\3|\4/p' "$f" 2>/dev/null |
    awk -F'|' '{ printf "%-20s %-56s %10s %10s\n", $1, $2, $3, $4 }'
done

echo "== 2. compute-sanitizer on (1,2,257,64) =="
if [[ -n "${SKIP_SANITIZER:-}" ]]; then
  echo "SKIP_SANITIZER set: skipped"
elif command -v compute-sanitizer >/dev/null; then
  for tool in racecheck memcheck; do
    timeout 180 compute-sanitizer --tool $tool --print-limit 20 $R bwd 1 2 257 64 --seed 7 > "$OUT/attention_bwd_$tool.txt" 2>&1
    rc=$?
    echo "$tool rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/attention_bwd_$tool.txt" | head -2 | tr '\n' ' ')"
    [[ $rc == 0 ]] || { status=1; grep -E 'hazard|Invalid|at .* in ' "$OUT/attention_bwd_$tool.txt" | head -10; }
  done
else
  echo "compute-sanitizer not found: skipped"
fi
exit $status
