#!/usr/bin/env bash
# make bench-attention-bwd (and the second half of make bench-attention): the attention BACKWARD ladder
# (dev/attention/backward/, the RUNGS_BWD table of dev/attention/runner.cu), every rung validated, then timed
# beside cuDNN's and PyTorch's FlashAttention-2 backward measured in the same run. Logs under $OUT.
#   1. scripts/torch/sdpa_bench.py, the anchors (or $ANCHORS, an sdpa.log of this session)  -> $OUT/sdpa.log
#   2. ./dev/attention/runner bwd all: validation at odd T (1, 2, 17, 63, 65, 1000, 2047; HS 64 and 128), then
#      (4,12,1024,64) validated and timed                                                   -> $OUT/bwd_all.log
#   3. ./dev/attention/runner bench --pass bwd: every rung on the backward's anchor shapes -> doc/results/
#      attention_backward.{csv,md,png}, doc/results/rungs/backward/<rung>.md; spliced into README.md (marker
#      attention-backward) and each rung page's "Measured" block (doc/attention/backward/<rung>.md)
#   4. compute-sanitizer racecheck + memcheck of every rung on one small shape per head size (SKIP_SANITIZER=1
#      skips it)
# The exit status is non-zero if any validation failed (the tables mark it FAIL) or a step could not run.
set -uo pipefail
OUT=${OUT:-log/bench-attention-bwd}; mkdir -p "$OUT"
R=./dev/attention/runner
status=0

echo "== 1. anchors: PyTorch SDPA (cudnn, flash) in the same run =="
anchors=()
if [[ -n "${ANCHORS:-}" && -s "${ANCHORS:-}" ]]; then
  cp "$ANCHORS" "$OUT/sdpa.log"
elif python3 -c "import torch" 2>/dev/null; then
  timeout 300 python3 scripts/torch/sdpa_bench.py > "$OUT/sdpa.log" 2> "$OUT/sdpa.err" || { echo "sdpa_bench.py failed (rc=$?)"; status=1; }
else
  echo "no PyTorch here: the tables get no FA2/cuDNN columns"
fi
[[ -s $OUT/sdpa.log ]] && grep -qE '\) +cudnn +[0-9]' "$OUT/sdpa.log" && anchors=(--anchors "$OUT/sdpa.log")

echo "== 2. runner bwd all: odd T, then (4,12,1024,64) timed =="
t0=$(date +%s)
timeout 300 $R bwd all > "$OUT/bwd_all.log" 2>&1 || status=1
echo "runner bwd all: $(( $(date +%s) - t0 )) s, $(grep -c ': PASS' "$OUT/bwd_all.log") passed, $(grep -c 'FAIL' "$OUT/bwd_all.log") failed"
grep -E 'FAIL|error' "$OUT/bwd_all.log" | head -10

echo "== 3. runner bench --pass bwd: every rung on the anchor shapes =="
t0=$(date +%s)
timeout 580 $R bench --pass bwd "${anchors[@]}" --out doc/results > "$OUT/bench_bwd.log" 2>&1 || status=1
echo "runner bench --pass bwd: $(( $(date +%s) - t0 )) s"
grep -E '^== |FAIL|error|wrote' "$OUT/bench_bwd.log" | head -40
if [[ -f doc/results/attention_backward.md ]] && grep -q "^Attention backward" doc/results/attention_backward.md; then
  bash scripts/readme_table.sh doc/results/attention_backward.md attention-backward || status=1
  for page in doc/attention/backward/[0-9]*_*.md; do
    block=doc/results/rungs/backward/$(basename "$page")
    [[ -f $block ]] && { bash scripts/readme_table.sh "$block" measured "$page" || status=1; }
  done
fi

echo "== 4. compute-sanitizer on (1,2,257,64) and (1,2,257,128) =="
if [[ -n "${SKIP_SANITIZER:-}" ]]; then
  echo "SKIP_SANITIZER set: skipped"
elif command -v compute-sanitizer >/dev/null; then
  for hs in 64 128; do for tool in racecheck memcheck; do
    log=$OUT/bwd_${tool}_hs$hs.txt
    timeout 240 compute-sanitizer --tool $tool --print-limit 20 $R bwd all 1 2 257 $hs --seed 7 > "$log" 2>&1
    rc=$?
    echo "HS $hs $tool rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | head -2 | tr '\n' ' ')"
    [[ $rc == 0 ]] || { status=1; grep -E 'hazard|Invalid|at .* in ' "$log" | head -10; }
  done; done
else
  echo "compute-sanitizer not found: skipped"
fi
exit $status
