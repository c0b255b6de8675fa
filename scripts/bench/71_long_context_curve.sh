#!/usr/bin/env bash
# make long-context-curve: the same 16,384 tokens per step and the same seed, GPT-2 124M (d12) from random weights
# on TinyShakespeare, once at T = 1,024 (B = 16) and once at T = 8,192 (B = 2, --max-seq-len 8192), 300 steps,
# val loss every 25 (at T = 8,192 the val split's 32,768 tokens hold only a few windows: llmc/evaluate.cuh). Draws the
# two val curves (build/plot_loss) and writes their values and the runs' speed to doc/results/long_context_curve.md,
# spliced into doc/long_context.md. About a minute on an H200.
set -uo pipefail
OUT=${OUT:-log/long-context-curve}; mkdir -p "$OUT"
bin=./build/train_gpt2cu_bf16
[[ -x $bin && -x build/plot_loss ]] || { echo "missing $bin or build/plot_loss: make build/train_gpt2cu_bf16 build/plot_loss"; exit 1; }
STEPS=${STEPS:-300}
common=(-i data/tinyshakespeare/tiny_shakespeare_train.bin -j data/tinyshakespeare/tiny_shakespeare_val.bin
        --tokenizer data/gpt2_tokenizer.bin -e d12 --seed 42 -n -1 -s 0 -v 25 -x "$STEPS" --kernels flash)
status=0
run() {  # name flags...
  local name=$1; shift
  rm -rf "$OUT/$name"  # a fresh run each time (no checkpoints are written: -n -1)
  timeout 240 $bin "${common[@]}" "$@" -o "$OUT/$name" > "$OUT/$name.txt" 2>&1 || { status=1; tail -3 "$OUT/$name.txt"; }
  grep "^summary" "$OUT/$name.txt"
}
run T1024 -t 1024 -b 16
run T8192 --max-seq-len 8192 -t 8192 -b 2
[[ -s $OUT/T1024/main.log && -s $OUT/T8192/main.log ]] || { echo "a run wrote no main.log: no chart"; exit 1; }
./build/plot_loss --title "Loss, 16,384 tokens per step: T = 1,024 vs 8,192" --labels "T=1024 B=16,T=8192 B=2" \
  -o doc/results/long_context_curve.png "$OUT/T1024/main.log" "$OUT/T8192/main.log" || status=1
vals() { awk '$1=="step" { for (i=3; i<NF; i++) if ($i=="val") print $2, $(i+1) }' "$1"; }
speed() { sed -nE 's/^summary: .*\| mean ([0-9.]+) ms\/step.*\| ([0-9]+) tok\/s .*peak GPU memory ([0-9.]+) GiB.*/\1 ms, \2 tok\/s, \3 GiB/p' "$1"; }
{
  echo "Card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) · $(date -u '+%Y-%m-%dT%H:%MZ') ·" \
       "\`make long-context-curve\` (scripts/bench/71_long_context_curve.sh): d12 from random weights, seed 42, $STEPS steps."
  echo
  echo "![val loss at T = 1,024 and 8,192](results/long_context_curve.png)"  # the path from doc/long_context.md
  echo
  echo "| step | val loss, T = 1,024 (B = 16) | val loss, T = 8,192 (B = 2) |"
  echo "|--:|--:|--:|"
  join <(vals "$OUT/T1024/main.log" | sort -k1,1) <(vals "$OUT/T8192/main.log" | sort -k1,1) | sort -n |
    awk '{ printf "| %d | %.3f | %.3f |\n", $1, $2, $3 }'
  echo
  echo "Speed (mean over the steps after the first): T = 1,024: $(speed "$OUT/T1024.txt"); T = 8,192: $(speed "$OUT/T8192.txt")."
} > "$OUT/long_context_curve.md"
cat "$OUT/long_context_curve.md"
cp "$OUT/long_context_curve.md" doc/results/long_context_curve.md &&
  bash scripts/readme_table.sh doc/results/long_context_curve.md long-context-curve doc/long_context.md || status=1
exit $status
