#!/usr/bin/env bash
# Training runs of the CUDA trainer (BF16 build) on TinyShakespeare, against the acceptance figures:
#   1. recipe R1 (scripts/r1.sh): GPT-2 124M from scratch, B=16 T=1024, lr 6e-4, 20 warm-up steps, cosine to 10%,
#      wd 0.1, clip 1.0, 250 steps, val loss every 10 steps as llm.c measures it, flash kernels; val loss vs the
#      reference (llm.c+cuDNN: step 20 6.401, 100 5.666, 150 5.329, 250 5.344; acceptance: within +-0.1);
#   2. all-naive vs all-flash, same seed, B=4 T=1024, 20 steps: train losses within 0.02 at every step. The
#      acceptance pair trains R1's recipe with B=4 micro-batches: R1's 16,384 tokens per step are 4 of them
#      (-d 16384). Diagnostic pairs at 4,096 tokens per step (one micro-batch, -d -1), where the trajectory has
#      a loss spike at step 7 that amplifies any rounding difference (README, doc/results/naive_vs_flash.md);
#   3. throughput at T=1024, B=16 and B=64: flash, flash with the matmuls' algorithms timed once before step 1
#      (--matmul-algos tune), flash with naive attention (llm.c's materialized attention),
#      and all-naive at B=16 only (a few steps: one-thread-per-output matmuls make it ~100x slower);
#   4. PyTorch on the same card in the same run (scripts/torch/gpt2_train.py: torch.compile and eager, SDPA), and
#      the libraries' floor of one step (scripts/torch/step_floor.py), for the side-by-side.
# Logs and main.log files go to $OUT. Most of the wall time (about 8 minutes on an H200) is the all-naive runs and
# torch.compile; every command has its own timeout.
# PARTS="acceptance speed" (the default) runs both halves: "acceptance" is 1 and 2 (losses: no timing), "speed" is
# 3 and 4 (ours and PyTorch's timings, together in one call so that their ratios are of the same card and session).
# PARTS=acceptance or PARTS=speed runs one half, each within a 10-minute lent-GPU call; the table (5) is written
# from both halves' logs in $OUT once both are there, each half's date stated.
set -uo pipefail
OUT=${OUT:-log/bench-train}; mkdir -p "$OUT"
bin=./build/train_gpt2cu_bf16
t_all=$(date +%s); rc=0
stamp() { echo "== $1 ($(( $(date +%s) - t_all )) s elapsed)"; }
[[ -x $bin ]] || { echo "missing $bin (see build.log)"; exit 1; }
common=(-i data/tinyshakespeare/tiny_shakespeare_train.bin -j data/tinyshakespeare/tiny_shakespeare_val.bin
        --tokenizer data/gpt2_tokenizer.bin -e d12 --seed 42 -n -1)
PARTS=${PARTS:-acceptance speed}
for part in $PARTS; do [[ $part == acceptance || $part == speed ]] || { echo "PARTS: '$part' (acceptance, speed)"; exit 1; }; done
has_part() { [[ " $PARTS " == *" $1 "* ]]; }
run_stamp="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) · $(date -u '+%Y-%m-%dT%H:%MZ')"  # this call's

if has_part acceptance; then
echo "$run_stamp" > "$OUT/acceptance.stamp"

# --- 1. recipe R1 (scripts/r1.sh) ---
# The acceptance run: seed 42, the default. How far the curve moves with the seed, and the same recipe in PyTorch:
# scripts/bench/41_r1_spread.sh.
source scripts/r1.sh
stamp "R1: d12 B=16 T=1024 250 steps, flash, val on the first val batch as llm.c"
timeout 300 $bin "${R1_FLAGS[@]}" --seed 42 -s 50 -g 64 -o "$OUT/r1" | tee "$OUT/r1.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1
{ r1_start "$OUT/r1/main.log"; r1_vals "$OUT/r1/main.log" | r1_check; } | tee "$OUT/r1_check.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1   # the group's status is r1_check's (pipefail)

# --- 2. naive vs flash, same seed, 20 steps ---
# The acceptance pair: the default BF16 build, all-naive vs all-flash, R1's recipe in B=4 micro-batches (R1's
# 16,384 tokens per step). Then at 4,096 tokens per step: the same pair, BF16 with only attention naive, and
# the FP32 build (no bf16 rounding anywhere).
nf_run() {  # name binary flags...
  local name=$1 b=$2; shift 2
  stamp "naive-vs-flash: $name, B=4 T=1024 20 steps"
  timeout 300 $b "${common[@]}" -b 4 -t 1024 -x 20 -v 0 -s 0 "$@" -o "$OUT/nf_$name" | tail -n 4
  [[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1
}
nf_diff() {  # nameA nameB -> per-step table; exit 1 unless all 20 steps are within 0.02
  paste <(awk '$1=="step" && $3=="train" { print $2, $4 }' "$OUT/nf_$1/main.log") \
        <(awk '$1=="step" && $3=="train" { print $4 }' "$OUT/nf_$2/main.log") |
    awk -v a="$1" -v b="$2" 'BEGIN { bad=0; n=0 } { n++; d=$2-$3; if (d<0) d=-d; if (!(d<=0.02)) bad=1; if (d>m) m=d;
         printf "step %2d %s %.4f %s %.4f |diff| %.4f\n", $1, a, $2, b, $3, d }
         END { if (n!=20) bad=1; printf "%s vs %s: %d steps, max |diff| %.4f (acceptance <= 0.02): %s\n", a, b, n, m, bad ? "FAIL" : "OK"; exit bad }'
}
nf_run naive-16k $bin --kernels naive -d 16384
nf_run flash-16k $bin --kernels flash -d 16384
nf_diff naive-16k flash-16k | tee "$OUT/naive_vs_flash.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1
nf_run naive $bin --kernels naive
nf_run flash $bin --kernels flash
nf_run attention-naive $bin --kernels flash --attention naive
nf_run naive-fp32 ./build/train_gpt2cu_fp32 --kernels naive
nf_run flash-fp32 ./build/train_gpt2cu_fp32 --kernels flash
{ nf_diff naive flash | tail -n 1; nf_diff attention-naive flash | tail -n 1; nf_diff naive-fp32 flash-fp32 | tail -n 1; } |
  tee "$OUT/naive_vs_flash_more.txt"

fi  # acceptance

if has_part speed; then
echo "$run_stamp" > "$OUT/speed.stamp"
# --- 3. throughput (mean over the steps after the first; summary line per run) ---
thr() {  # name B steps kernel-flags...
  local name=$1 B=$2 steps=$3; shift 3
  stamp "throughput: $name B=$B $steps steps"
  timeout 240 $bin "${common[@]}" -b "$B" -t 1024 -x "$steps" -v 0 -s 0 "$@" -o "$OUT/thr_${name}_b$B" > "$OUT/thr_${name}_b$B.txt" 2>&1
  [[ $? -ne 0 ]] && { rc=1; tail -n 3 "$OUT/thr_${name}_b$B.txt"; }
  grep -E "^summary" "$OUT/thr_${name}_b$B.txt" | sed "s/^summary/$name B=$B/" | tee -a "$OUT/throughput.txt"
}
: > "$OUT/throughput.txt"
thr flash 16 30 --kernels flash
thr flash 64 20 --kernels flash
thr flash-tuned 16 30 --kernels flash --matmul-algos tune   # each matmul's algorithm timed once (llmc/matmul.cuh)
thr flash-tuned 64 20 --kernels flash --matmul-algos tune
thr naive-attention 16 30 --kernels flash --attention naive
thr naive-attention 64 20 --kernels flash --attention naive
[[ -n "${WITH_ALL_NAIVE:-}" ]] && thr all-naive 16 3 --kernels naive   # about 30 s: the all-naive set is slow

# --- 4. PyTorch in the same run: scripts/torch/gpt2_train.py (compiled and eager), and the libraries' floor of a step ---
stamp "PyTorch: scripts/torch/gpt2_train.py, scripts/torch/step_floor.py"
: > "$OUT/torch_gpt2_train.txt"
if [[ -n "${SKIP_TORCH:-}" ]]; then
  echo "SKIP_TORCH set: skipped"
elif python3 -c "import torch" 2>/dev/null; then
  timeout 400 python3 scripts/torch/gpt2_train.py --mode compiled,eager -b 16,64 2>&1 | tee "$OUT/torch_gpt2_train.txt"
  timeout 200 python3 scripts/torch/step_floor.py -b 16,64 2>&1 | tee "$OUT/torch_step_floor.txt"
else
  echo "no PyTorch here: skipped"
fi
fi  # speed

# --- 5. the README table: doc/results/training.md, spliced between the training markers of README.md ---
for part in acceptance speed; do
  [[ -s $OUT/$part.stamp ]] || { echo "no table yet: $OUT has no '$part' half (PARTS=$part runs it)"; stamp "40_train done, rc=$rc"; exit $rc; }
done
{
  echo "GPT-2 124M on TinyShakespeare, T=1024, BF16 build. Card: $(cat "$OUT/speed.stamp") · \`make bench-train\`" \
       "(scripts/bench/40_train.sh)"
  echo
  echo "| system | B | ms/step | tok/s | MFU | peak GPU memory |"
  echo "|---|--:|--:|--:|--:|--:|"
  awk -F'|' '{ split($1, a, ":"); name=a[1]; sub(/ B=[0-9]+$/, "", name); b=a[1]; sub(/.*B=/, "", b)
               ms=$2; sub(/^ *mean /, "", ms); sub(/ ms.*/, "", ms); tok=$3; gsub(/[^0-9]/, "", tok)
               mfu=$4; gsub(/ /, "", mfu); sub(/MFU/, "", mfu); mem=$5; sub(/^ *peak GPU memory /, "", mem); sub(/ \(.*/, "", mem)
               tuned = sub(/-tuned$/, "", name); label = name " kernels" (tuned ? ", `--matmul-algos tune`" : "")
               printf "| flashgpt2, %s | %s | %s | %dK | %s | %s |\n", label, b, ms, tok/1000, mfu, mem }' \
      <(grep -E '^[a-z-]+ B=[0-9]+: kernels' "$OUT/throughput.txt")
  if [[ -s "$OUT/torch_gpt2_train.txt" ]]; then
    awk '/^torch .* tok\/s/ { line=$0; sub(/^torch +/, "", line); mode=line; sub(/ .*/, "", mode)
                    match(line, /B= *[0-9]+/); b=substr(line, RSTART+2, RLENGTH-2); gsub(/ /, "", b)
                    sub(/.*T=[0-9]+: */, "", line); split(line, f, / +/)   # f: ms "ms/step" tok "tok/s" "MFU" pct ...
                    printf "| PyTorch %s, scripts/torch/gpt2_train.py in the same run | %s | %s | %dK | %s | – |\n", mode, b, f[1], f[3]/1000, f[6] }' \
      "$OUT/torch_gpt2_train.txt"
  fi
  echo
  echo "Attention in the flash runs: $(grep -m1 -o 'attention: .*' "$OUT/thr_flash_b16.txt" | sed 's/^attention: //') (the trainer's header)."
  echo "\"naive-attention\": every layer flash except attention, which materializes S (fp32) and P (bf16), B·NH·T² each, in HBM, as llm.c's own kernels do (they keep S in bf16)."
  echo "MFU: FLOPs per token 6·N + 6·L·C·T (the causal attention counted; llmc/config.h, and scripts/torch/gpt2_train.py likewise) against the measured 790 TFLOP/s bf16 matmul ceiling."
  [[ -s "$OUT/torch_step_floor.txt" ]] && { echo; echo "The libraries' floor of one step (scripts/torch/step_floor.py: the step's cuBLAS matmuls + cuDNN attention, nothing else):"; echo; grep '^floor' "$OUT/torch_step_floor.txt" | sed 's/^/    /'; }
  echo
  [[ $(cat "$OUT/acceptance.stamp") != $(cat "$OUT/speed.stamp") ]] && { echo "Run separately (PARTS=acceptance): R1 and naive vs flash below, $(cat "$OUT/acceptance.stamp")."; echo; }
  echo "Recipe R1 (llm.c's reference, val on the first val batch as llm.c evaluates it; acceptance ±0.1):"
  echo
  sed 's/^/    /' "$OUT/r1_check.txt"
  echo
  echo "Other seeds, and the same recipe in PyTorch: \`doc/results/r1_spread.md\` (scripts/bench/41_r1_spread.sh)."
  echo
  echo "Naive vs flash, same seed, B=4 T=1024, 20 steps (acceptance: train losses within 0.02 at every step). BF16 build,"
  echo "R1's recipe with its 16,384 tokens per step as 4 micro-batches of B=4:"
  echo
  tail -n 1 "$OUT/naive_vs_flash.txt" | sed 's/^/    /'
  echo
  echo "Diagnostic pairs at 4,096 tokens per step (one micro-batch of B=4 per step: a loss spike at step 7): BF16"
  echo "all-naive vs all-flash, BF16 with only attention naive, and the FP32 build:"
  echo
  sed 's/^/    /' "$OUT/naive_vs_flash_more.txt"
} > "$OUT/training.md"
cat "$OUT/training.md"
cp "$OUT/training.md" doc/results/training.md && bash scripts/readme_table.sh doc/results/training.md training
stamp "40_train done, rc=$rc"
exit $rc
