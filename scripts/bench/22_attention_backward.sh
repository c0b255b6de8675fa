#!/usr/bin/env bash
# make bench-attention-bwd: the trainer's attention BACKWARD (BF16 build: llmc/attention/wgmma_backward.cuh on an
# H100/H200, llmc/attention/mma_backward.cuh on mma.sync before it); logs under $OUT. (Its GPU test,
# test/gpu/test_attention_backward.cu, runs with the others in `make test-gpu`.)
#   1. ./dev/attention/runner bwd: validation at odd T (1, 2, 37, 257, 1000 at HS 64; 257 at HS 128), then
#      (4,12,1024,64) validated and timed; then (16,12,1024,64) and (64,12,1024,64) validated and timed
#      (naive; the trainer's flash; the other flash kernels: runner_bwd.cuh lists them)
#   2. PyTorch's SDPA backends in the same session (scripts/torch/sdpa_bench.py): cuDNN's and FA2's backward
#   3. compute-sanitizer racecheck + memcheck on one small shape (a shared-memory race or an out-of-bounds
#      copy names its kernel here)
# Prints one table: shape, kernel, ms, TFLOP/s (FlashAttention count: bwd = 2.5 x 4·B·H·T²·D/2), and writes
# it with the anchors to doc/results/attention_backward.md, spliced into README.md (marker attention-backward).
# Each part has a timeout (the whole script takes about a minute on an H200).
set -uo pipefail
OUT=${OUT:-log/bench-attention-bwd}; mkdir -p "$OUT"
status=0
R=./dev/attention/runner

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
# Every timing line of the three runs, "  time <kernel...> (B,H,T,D): X ms  Y TFLOP/s ...", as shape|kernel|ms|TFLOP/s
timings() {
  for f in "$OUT"/attention_bwd_default.log "$OUT"/attention_bwd_16x12x1024x64.log "$OUT"/attention_bwd_64x12x1024x64.log; do
    sed -n 's/^  time \(.*\) \((.*)\): \([0-9.]*\) ms  \([0-9.]*\) TFLOP\/s.*/\2|\1|\3|\4/p' "$f" 2>/dev/null
  done
}
echo
printf '%-20s %-70s %10s %10s\n' shape kernel ms TFLOP/s
timings | awk -F'|' '{ printf "%-20s %-70s %10s %10s\n", $1, $2, $3, $4 }'

echo "== 2. anchors: scripts/torch/sdpa_bench.py =="
if python3 -c "import torch" 2>/dev/null; then
  timeout 300 python3 scripts/torch/sdpa_bench.py --shapes "64,12,1024,64" --backends flash,cudnn > "$OUT/sdpa.log" 2> "$OUT/sdpa.err" ||
    echo "sdpa_bench.py failed (rc=$?)"
  grep -E '^ *\(64, 12, 1024, 64\) +(flash|cudnn) ' "$OUT/sdpa.log"
else
  echo "no PyTorch here: no anchors"
fi
# sdpa.log line: "(B, H, T, D)  backend  fwd-ms fwd-TFLOP/s bwd-ms bwd-TFLOP/s ..." -> bwd TFLOP/s of a backend
anchor_bwd() { awk -v be="$1" '$0 ~ /^ *\(64, 12, 1024, 64\)/ && $5 == be { print $9 }' "$OUT/sdpa.log" 2>/dev/null; }
{
  echo "Causal, bf16, FLOPs = 2.5 × the forward's 4·B·H·T²·D/2. Card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
       "· $(date -u '+%Y-%m-%dT%H:%MZ') · \`make bench-attention-bwd\` (scripts/bench/22_attention_backward.sh)." \
       "Every kernel validated against the oracle first; median of many runs, L2 flushed."
  echo
  echo "| shape | kernel | ms | TFLOP/s |"
  echo "|---|---|--:|--:|"
  timings | awk -F'|' '{ printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4 }'
  cud=$(anchor_bwd cudnn) fa2=$(anchor_bwd flash)
  ours=$(timings | awk -F'|' '$1 == "(64,12,1024,64)" && $2 ~ /^attention_backward_flash \(/ { print $4 }')
  if [[ -n "$cud" && -n "$fa2" && -n "$ours" ]]; then
    echo
    echo "Same run, scripts/torch/sdpa_bench.py at (64,12,1024,64): cuDNN's backward $cud TFLOP/s, PyTorch's FlashAttention-2 $fa2." \
         "The trainer's flash backward: $ours TFLOP/s = $(awk -v a="$ours" -v b="$cud" 'BEGIN { printf "%.2f", a / b }')× cuDNN," \
         "$(awk -v a="$ours" -v b="$fa2" 'BEGIN { printf "%.2f", a / b }')× FA2."
  fi
} > "$OUT/attention_backward.md"
if [[ $status == 0 ]]; then
  cp "$OUT/attention_backward.md" doc/results/attention_backward.md && bash scripts/readme_table.sh doc/results/attention_backward.md attention-backward
else
  echo "a runner check failed: doc/results/attention_backward.md and README.md left as they were"
fi

echo "== 3. compute-sanitizer on (1,2,257,64) =="
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
