#!/usr/bin/env bash
# Training runs of the CUDA trainer (BF16 build) on TinyShakespeare, against the acceptance figures:
#   1. recipe R1: GPT-2 124M from scratch, B=16 T=1024, lr 6e-4, 20 warm-up steps, cosine to 10%, wd 0.1, clip 1.0,
#      250 steps, val loss over the whole val split every 10 steps, flash kernels; val loss vs the reference
#      (llm.c+cuDNN: step 20 6.401, 100 5.666, 150 5.329, 250 5.344; acceptance: within +-0.1);
#   2. all-naive vs all-flash, same seed, B=4 T=1024, 20 steps: train losses within 0.02 at every step;
#   3. throughput at T=1024, B=16 and B=64: flash, flash with naive attention (llm.c's materialized attention),
#      and all-naive at B=16 only (a few steps: one-thread-per-output matmuls make it ~100x slower);
#   4. the PyTorch anchor (torch.compile + SDPA) on the same card, for the side-by-side.
# Logs and main.log files go to $OUT. Wall time: not measured yet (estimate 4-6 min, most of it the all-naive runs
# and torch.compile); every command has its own timeout.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
bin=./build/train_gpt2cu_bf16
t_all=$(date +%s); rc=0
stamp() { echo "== $1 ($(( $(date +%s) - t_all )) s elapsed)"; }
[[ -x $bin ]] || { echo "missing $bin (see build.log)"; exit 1; }
common=(-i data/tinyshakespeare/tiny_shakespeare_train.bin -j data/tinyshakespeare/tiny_shakespeare_val.bin
        --tokenizer data/gpt2_tokenizer.bin -e d12 --seed 42 -n -1)

# --- 1. recipe R1 ---
stamp "R1: d12 B=16 T=1024 250 steps, flash"
timeout 300 $bin "${common[@]}" -b 16 -t 1024 -l 6e-4 -u 20 -q 0.1 -c 0.1 --grad-clip 1.0 -x 250 -v 10 -m -1 \
  -s 50 -g 64 --kernels flash -o "$OUT/r1" | tee "$OUT/r1.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1
awk 'BEGIN { ref[20]=6.401; ref[100]=5.666; ref[150]=5.329; ref[250]=5.344; bad=0 }
     $1=="step" { for (i=3; i<NF; i++) if ($i=="val") val[$2]=$(i+1) }
     END { for (s in ref) { ok = (s in val) && val[s]-ref[s] <= 0.1 && ref[s]-val[s] <= 0.1; if (!ok) bad=1;
             printf "R1 val loss at step %3d: %s (reference %.3f, +-0.1) %s\n", s, (s in val) ? val[s] : "missing", ref[s], ok ? "OK" : "FAIL" }
           exit bad }' "$OUT/r1/main.log" | sort -k6 -n | tee "$OUT/r1_check.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1

# --- 2. naive vs flash, same seed, 20 steps ---
for k in naive flash; do
  stamp "naive-vs-flash: $k, B=4 T=1024 20 steps"
  timeout 240 $bin "${common[@]}" -b 4 -t 1024 -x 20 -v 0 -s 0 --kernels $k -o "$OUT/nf_$k" | tail -n 4
  [[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1
done
paste <(awk '$1=="step" && $3=="train" { print $2, $4 }' "$OUT/nf_naive/main.log") \
      <(awk '$1=="step" && $3=="train" { print $4 }' "$OUT/nf_flash/main.log") |
  awk 'BEGIN { bad=0; n=0 } { n++; d=$2-$3; if (d<0) d=-d; if (!(d<=0.02)) bad=1; if (d>m) m=d;
       printf "step %2d naive %.4f flash %.4f |diff| %.4f\n", $1, $2, $3, d }
       END { if (n!=20) bad=1; printf "naive vs flash: %d steps, max |diff| %.4f (acceptance <= 0.02): %s\n", n, m, bad ? "FAIL" : "OK"; exit bad }' |
  tee "$OUT/naive_vs_flash.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1

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
thr naive-attention 16 30 --kernels flash --attention naive
thr naive-attention 64 20 --kernels flash --attention naive
thr all-naive 16 3 --kernels naive
echo "anchors (shared/anchors, same card class): llm.c materialized attention 354K tok/s (B=16) / 374K (B=64);" \
     "llm.c+cuDNN 509K / 547K; goal 600K" | tee -a "$OUT/throughput.txt"

# --- 4. PyTorch anchor ---
stamp "PyTorch anchor"
if [[ -n "${SKIP_TORCH_ANCHOR:-}" ]]; then
  echo "SKIP_TORCH_ANCHOR set: skipped"
elif [[ -f .gpu-carry/anchors/torch_gpt2_train.py ]]; then
  timeout 300 python3 .gpu-carry/anchors/torch_gpt2_train.py 2>&1 | tee "$OUT/torch_gpt2_train.txt"
else
  echo "no .gpu-carry/anchors/torch_gpt2_train.py: skipped"
fi
stamp "40_train done, rc=$rc"
exit $rc
