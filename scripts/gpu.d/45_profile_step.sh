#!/usr/bin/env bash
# Where one training step's time goes, kernel by kernel: GPT-2 124M, B=16 T=1024, flash kernels. First the
# trainer alone (12 steps: the wall-clock step time), then 3 steps under Nsight Compute with one metric per
# kernel (gpu__time_duration), the card's clocks and caches left as they are; scripts/step_profile.py keeps the
# last step and writes doc/step_profile.md (per layer and per kernel). Needs ncu (Nsight Compute) on the PATH.
# Wall time about 22 s on the H200 (2026-11-29: the 21:07 UTC run of the same commands).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
bin=./build/train_gpt2cu_bf16
[[ -x $bin ]] || { echo "missing $bin (see build.log)"; exit 1; }
command -v ncu > /dev/null || { echo "ncu (Nsight Compute) is not on the PATH"; exit 1; }
common=(-i data/tinyshakespeare/tiny_shakespeare_train.bin -j data/tinyshakespeare/tiny_shakespeare_val.bin
        --tokenizer data/gpt2_tokenizer.bin -e d12 --seed 42 -n -1 -b 16 -t 1024 -v 0 -s 0 --kernels flash)
timeout 120 $bin "${common[@]}" -x 12 -o "$OUT/profile_wall" > "$OUT/profile_wall.txt" 2>&1 || { tail -n 3 "$OUT/profile_wall.txt"; exit 1; }
wall=$(awk '/^summary:/ { for (i = 1; i < NF; i++) if ($(i+1) == "ms/step") print $i }' "$OUT/profile_wall.txt")
timeout 300 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
  $bin "${common[@]}" -x 3 -o "$OUT/profile_ncu" > "$OUT/step_profile.csv" 2> "$OUT/step_profile.err" ||
  { tail -n 3 "$OUT/step_profile.err"; exit 1; }
header="GPT-2 124M, B=16 T=1024, BF16 build, flash kernels: the last of 3 profiled steps. Card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) · $(date -u '+%Y-%m-%d %H:%M UTC') · \`bash scripts/gpu.d/45_profile_step.sh\` (\`ncu --metrics gpu__time_duration.sum\`, clocks and caches as they are)."
python3 scripts/step_profile.py "$OUT/step_profile.csv" "$wall" "$header" > "$OUT/step_profile.md" || exit 1
cat "$OUT/step_profile.md"
cp "$OUT/step_profile.md" doc/step_profile.md
