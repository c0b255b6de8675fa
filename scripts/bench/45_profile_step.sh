#!/usr/bin/env bash
# Where one training step's time goes, kernel by kernel: GPT-2 124M, B=16 T=1024, flash kernels. First the
# trainer alone (60 steps: the wall-clock step time), with nvidia-smi sampling the SM clock and the power every
# 100 ms; then 3 steps under Nsight Compute with two metrics per kernel (gpu__time_duration and the SM clock,
# sm__cycles_elapsed.avg.per_second), the card's clocks and caches left as they are. scripts/step_profile.py
# keeps the last step and writes doc/results/step_profile.md (per layer and per kernel, and the two clocks: ncu runs
# one kernel at a time, with idle time between them, and the clocks say whether its kernels ran faster than the
# same kernels back to back). Then 12 steps traced by build/libkernel_trace.so (CUPTI's kernel timestamps, no
# serialization): scripts/step_gaps.py says how long the GPU idled between one step's kernels and after which
# handovers, the part of the step that ncu's per-kernel times leave out. Needs ncu (Nsight Compute) on the PATH.
# Wall time about 50 s on the H200.
set -uo pipefail
OUT=${OUT:-log/bench}; mkdir -p "$OUT"
bin=./build/train_gpt2cu_bf16
[[ -x $bin ]] || { echo "missing $bin (see build.log)"; exit 1; }
command -v ncu > /dev/null || { echo "ncu (Nsight Compute) is not on the PATH"; exit 1; }
common=(-i data/tinyshakespeare/tiny_shakespeare_train.bin -j data/tinyshakespeare/tiny_shakespeare_val.bin
        --tokenizer data/gpt2_tokenizer.bin -e d12 --seed 42 -n -1 -b 16 -t 1024 -v 0 -s 0 --kernels flash)
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 100 > "$OUT/profile_smi.csv" &
smi=$!
timeout 120 $bin "${common[@]}" -x 60 -o "$OUT/profile_wall" > "$OUT/profile_wall.txt" 2>&1 ||
  { kill $smi; tail -n 3 "$OUT/profile_wall.txt"; exit 1; }
kill $smi
wall=$(awk '/^summary:/ { for (i = 1; i < NF; i++) if ($(i+1) == "ms/step") print $i }' "$OUT/profile_wall.txt")
# the samples while it trained: from the first to the last that draws more than 100 W above the idle first one
clocks=$(awk -F', *' 'NR == 1 { idle = $2 } { mhz[NR] = $1; w[NR] = $2; if ($2 > idle + 100) { if (!a) a = NR; b = NR } }
  END { for (i = a; i <= b && a; i++) { m += mhz[i]; p += w[i]; n++ }
        if (n) printf "%.0f %.0f %d", m / n, p / n, n }' "$OUT/profile_smi.csv")
timeout 300 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second --csv --print-units base \
  $bin "${common[@]}" -x 3 -o "$OUT/profile_ncu" > "$OUT/step_profile.csv" 2> "$OUT/step_profile.err" ||
  { tail -n 3 "$OUT/step_profile.err"; exit 1; }
header="GPT-2 124M, B=16 T=1024, BF16 build, flash kernels: the last of 3 profiled steps. Card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) · $(date -u '+%Y-%m-%dT%H:%MZ') · \`bash scripts/bench/45_profile_step.sh\` (\`ncu --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second\`, clocks and caches as they are)."
python3 scripts/step_profile.py "$OUT/step_profile.csv" "$wall" "$header" $clocks > "$OUT/step_profile.md" || exit 1
[[ -f build/libkernel_trace.so ]] || { echo "missing build/libkernel_trace.so (make build/libkernel_trace.so)"; exit 1; }
CUDA_INJECTION64_PATH=$PWD/build/libkernel_trace.so KERNEL_TRACE_OUT=$OUT/trace.csv timeout 120 \
  $bin "${common[@]}" -x 12 -o "$OUT/profile_trace" > "$OUT/profile_trace.txt" 2>&1 || { tail -n 3 "$OUT/profile_trace.txt"; exit 1; }
traced=$(awk '/^summary:/ { for (i = 1; i < NF; i++) if ($(i+1) == "ms/step") print $i }' "$OUT/profile_trace.txt")
{ echo; echo "## Between the kernels"; echo
  python3 scripts/step_gaps.py "$OUT/trace.csv" "The same trainer, 12 steps, every kernel's start and end on the GPU's clock (CUPTI, through \`build/libkernel_trace.so\`; kernels not serialized): ${traced} ms per step traced against ${wall} untraced. The second-to-last step:"
} >> "$OUT/step_profile.md" || exit 1
cat "$OUT/step_profile.md"
cp "$OUT/step_profile.md" doc/results/step_profile.md
