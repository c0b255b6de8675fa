#!/usr/bin/env bash
# make bench-attention: the attention forward ladder, every rung validated against the oracle, then timed, beside
# PyTorch's FlashAttention-2 and cuDNN measured in the same run. Writes under $OUT (default log/bench-attention):
#   1. scripts/torch/sdpa_bench.py (when PyTorch is installed): the anchors          -> $OUT/sdpa.log
#   2. ./dev/attention/runner bench: every rung on the anchor shapes, validated first -> doc/results/attention_forward.
#      {csv,md,png}, doc/results/rungs/<rung>.md; spliced into README.md and each rung page's "Measured" block
#   3. with ODD_T=1 also ./dev/attention/runner fwd V for every rung: validation at odd T (1, 2, 17, 65, 257,
#      1000; HS 64 and 128), then timing at (8,12,1024,64)                        -> $OUT/attention_fwd_V.log
# The exit status is non-zero if any validation failed (the tables mark it FAIL) or a step could not run.
set -uo pipefail
OUT=${OUT:-log/bench-attention}; mkdir -p "$OUT"
status=0

echo "== 1. anchors: PyTorch SDPA (flash, cudnn, ...) in the same run =="
anchors=()
if python3 -c "import torch" 2>/dev/null; then
  timeout 300 python3 scripts/torch/sdpa_bench.py > "$OUT/sdpa.log" 2> "$OUT/sdpa.err" || { echo "sdpa_bench.py failed (rc=$?)"; status=1; }
  head -30 "$OUT/sdpa.log"
  grep -qE '\) +cudnn +[0-9]' "$OUT/sdpa.log" && anchors=(--anchors "$OUT/sdpa.log")
else
  echo "no PyTorch here: the tables get no FA2/cuDNN columns"
fi

echo "== 2. bench: every rung on the anchor shapes =="
t0=$(date +%s)
timeout 500 ./dev/attention/runner bench "${anchors[@]}" --out doc/results > "$OUT/bench_attention.log" 2>&1 || status=1
echo "runner bench: $(( $(date +%s) - t0 )) s"
grep -E '^== |FAIL|skip|error|wrote' "$OUT/bench_attention.log" | head -40
if [[ -f doc/results/attention_forward.md ]]; then
  bash scripts/readme_table.sh doc/results/attention_forward.md attention-forward || status=1
  for page in doc/attention/[0-9]_*.md; do
    block=doc/results/rungs/$(basename "$page")
    [[ -f $block ]] && { bash scripts/readme_table.sh "$block" measured "$page" || status=1; }
  done
fi

if [[ -n "${ODD_T:-}" ]]; then
  echo "== 3. fwd V: validation at odd T, then timing =="
  for v in $(./dev/attention/runner --list | awk '$1 == "fwd" { print $2 }' | sort -nu); do
    t0=$(date +%s)
    timeout 300 ./dev/attention/runner fwd "$v" > "$OUT/attention_fwd_$v.log" 2>&1; rc=$?
    printf 'fwd %-2s rc=%-3s %3ss  %s passed, %s failed\n' "$v" "$rc" "$(( $(date +%s) - t0 ))" \
      "$(grep -c ': PASS' "$OUT/attention_fwd_$v.log")" "$(grep -c ': FAIL' "$OUT/attention_fwd_$v.log")"
    [[ $rc == 0 ]] || status=1
  done
fi
exit $status
