#!/usr/bin/env bash
# Where do the BF16 naive and flash trajectories part (40_train.sh's diagnostic pair at 4,096 tokens per step,
# one micro-batch of B=4, with its loss spike at step 7)? One layer naive at a time, every other layer flash,
# same seed, B=4 T=1024, 20 steps, each run's train losses against the all-flash run's; and
# flash against itself (the trainer is deterministic). Writes doc/results/naive_vs_flash.md, spliced into README.md
# between the naive-vs-flash markers. About 2 minutes on an H200 (the naive-matmul run is the longest).
set -uo pipefail
OUT=${OUT:-log/bench}; mkdir -p "$OUT/nf_layers"
bin=./build/train_gpt2cu_bf16
[[ -x $bin ]] || { echo "missing $bin (see build.log)"; exit 1; }
common=(-i data/tinyshakespeare/tiny_shakespeare_train.bin -j data/tinyshakespeare/tiny_shakespeare_val.bin
        --tokenizer data/gpt2_tokenizer.bin -e d12 --seed 42 -n -1 -b 4 -t 1024 -x 20 -v 0 -s 0)
run() {  # name flags...
  local name=$1; shift
  timeout 150 $bin "${common[@]}" "$@" -o "$OUT/nf_layers/$name" > "$OUT/nf_layers/$name.txt" 2>&1 || tail -n 2 "$OUT/nf_layers/$name.txt"
}
row() {  # name -> a table row against the flash run: max |diff| and its step, max over steps 0-6, step 7
  paste <(awk '$1=="step" { print $2, $4 }' "$OUT/nf_layers/$1/main.log") \
        <(awk '$1=="step" { print $4 }' "$OUT/nf_layers/flash/main.log") |
    awk -v name="$1" '{ d = $2 - $3; if (d < 0) d = -d; if (d > m) { m = d; at = $1 } if ($1 <= 6 && d > early) early = d
                        if ($1 == 7) d7 = d; n++ }
                      END { if (n != 20) { printf "| %s | run failed | | |\n", name; exit }
                            if (m == 0) { printf "| %s | 0 (the same losses) | 0 | 0 |\n", name; exit }
                            printf "| %s | %.4f (step %d) | %.4f | %.4f |\n", name, m, at, early, d7 }'
}
run flash --kernels flash
run flash-again --kernels flash
layers=(encoder layernorm matmul attention gelu residual classifier adamw)
for l in "${layers[@]}"; do run "$l" --kernels flash --"$l" naive; done
norms=$(awk '$1=="step" && ($2==7 || $2==15) { printf "%s%s", sep, $8; sep=" and " }' "$OUT/nf_layers/flash/main.log")
{
  echo "BF16 build, seed 42, B=4 T=1024, 20 steps: each run has ONE layer naive (the rest flash); its train loss per"
  echo "step against the all-flash run's. Card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) ·" \
       "$(date -u '+%Y-%m-%dT%H:%MZ') · \`bash scripts/bench/42_nf_layers.sh\` (run by scripts/lent_gpu.sh)."
  echo
  echo "| naive layer | max \|diff\| over 20 steps | max over steps 0-6 | step 7 |"
  echo "|---|--:|--:|--:|"
  row flash-again | sed 's/^| flash-again /| none (flash again) /'
  for l in "${layers[@]}"; do row "$l"; done
  echo
  echo "All-flash gradient norm at steps 7 and 15: $norms (clipped to 1.0)."
} > "$OUT/naive_vs_flash.md"
cat "$OUT/naive_vs_flash.md"
cp "$OUT/naive_vs_flash.md" doc/results/naive_vs_flash.md && bash scripts/readme_table.sh doc/results/naive_vs_flash.md naive-vs-flash
