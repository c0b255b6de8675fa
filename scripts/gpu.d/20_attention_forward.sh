#!/usr/bin/env bash
# GPU step: the attention forward ladder (issue 4). Run by scripts/gpu_run.sh on the lent H200 after it has
# built every CUDA program; writes everything under $OUT.
#   1. ./dev/attention/runner fwd V for every rung id in the table: validation on odd shapes (T = 1, 2, 17, 65,
#      257, 1000; HS 64 and 128) and (8,12,1024,64), then timing at (8,12,1024,64)  -> $OUT/attention_fwd_V.log
#   2. PyTorch's SDPA anchors in the same session: sdpa_bench.py                    -> $OUT/sdpa.log
#   3. make bench-attention ANCHORS=$OUT/sdpa.log: every rung on the five anchor shapes -> $OUT/bench_attention.log
#      and doc/attention_forward.{csv,md,png}, copied to $OUT (the README splice needs the lead's markers).
# A rung that fails is reported and the script goes on; the exit status is non-zero if anything failed.
# Time: not measured yet; expected ~1 min (1) + ~1 min (2) + < 4 min (3); each part has a timeout.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
status=0
make dev-attention > "$OUT/attention_build.log" 2>&1 || { echo "build of dev/attention/runner failed:"; tail -20 "$OUT/attention_build.log"; exit 1; }
./dev/attention/runner --list | tee "$OUT/attention_list.txt"

echo "== 1. fwd V: validation at odd T, then timing =="
for v in $(./dev/attention/runner --list | awk 'NR > 1 { print $1 }' | sort -nu); do
  t0=$(date +%s)
  timeout 300 ./dev/attention/runner fwd "$v" > "$OUT/attention_fwd_$v.log" 2>&1; rc=$?
  printf 'fwd %-2s rc=%-3s %3ss  %s passed, %s failed\n' "$v" "$rc" "$(( $(date +%s) - t0 ))" \
    "$(grep -c ': PASS' "$OUT/attention_fwd_$v.log")" "$(grep -c ': FAIL' "$OUT/attention_fwd_$v.log")"
  grep -E '^  time |FAIL|error' "$OUT/attention_fwd_$v.log" | head -8
  [[ $rc == 0 ]] || status=1
done

echo "== 2. anchors: PyTorch SDPA (flash, cudnn, ...) =="
timeout 300 python3 .gpu-carry/anchors/sdpa_bench.py > "$OUT/sdpa.log" 2>&1 || echo "sdpa_bench.py failed (rc=$?)"
cat "$OUT/sdpa.log" | head -30
anchors=""
grep -qE '\) +cudnn +[0-9]' "$OUT/sdpa.log" && anchors="$OUT/sdpa.log"

echo "== 3. bench: every rung on the anchor shapes =="
t0=$(date +%s)
timeout 400 make bench-attention ANCHORS="$anchors" > "$OUT/bench_attention.log" 2>&1; rc=$?
echo "bench-attention rc=$rc in $(( $(date +%s) - t0 )) s"
grep -E '^== |FAIL|skip|error|wrote|spliced' "$OUT/bench_attention.log" | head -40
[[ $rc == 0 ]] || status=1
cp doc/attention_forward.csv doc/attention_forward.md doc/attention_forward.png "$OUT/" 2>/dev/null || echo "no bench outputs to copy"
[[ -f "$OUT/attention_forward.md" ]] && cat "$OUT/attention_forward.md"
exit $status
