#!/usr/bin/env bash
# Multi-GPU data parallel training (llmc/distributed.h: NCCL, ZeRO-1, sharded data), on whatever GPUs are here.
#   1. the GPU tests of suite "distributed", FP32 then BF16 (test/gpu/test_distributed.cu): ZeRO-1 slices step
#      bit-for-bit like the whole optimizer; --num-gpus 1 (a 1-rank NCCL communicator) is bit-identical to the plain
#      trainer, resume included; the 2-process test runs only with 2+ GPUs (else it prints SKIPPED);
#   2. the trainer's command line, one GPU: d6 B=4 T=256 20 steps, plain vs --num-gpus 1: every logged train/val loss
#      and the final model file must be identical;
#   3. only with 2+ GPUs: recipe R1 (scripts/r1.sh) at B=8 and the global batch of 16x1024, on 2 GPUs vs on 1 GPU
#      (2 micro-batches): the same data, so within +-0.05 at every val step; throughput at B=16 per GPU, 1 vs 2
#      GPUs (acceptance >= 1.8x).
# NCCL_NVLS_ENABLE=0 is set here and by the trainer itself. Wall time on 1 GPU: not measured yet (estimate < 1 min:
# the tests use a 2-layer model, the CLI runs a 6-layer one for 20 short steps).
set -uo pipefail
OUT=${OUT:-log/bench}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
t_all=$(date +%s); rc=0
stamp() { echo "== $1 ($(( $(date +%s) - t_all )) s elapsed)"; }
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "GPUs here: $ngpu"

# --- 1. tests ---
for prec in fp32 bf16; do
  bin=./build/test_gpu_$prec
  [[ -x $bin ]] || { echo "missing $bin (see build.log)"; rc=1; continue; }
  stamp "test_distributed $prec"
  timeout 180 "$bin" -ts=distributed --duration=true 2>&1 | tee "$OUT/test_distributed_$prec.txt"
  [[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1
done

# --- 2. plain vs --num-gpus 1 on the command line ---
bin=./build/train_gpt2cu_bf16
[[ -x $bin ]] || { echo "missing $bin (see build.log)"; exit 1; }
common=(-i data/tinyshakespeare/tiny_shakespeare_train.bin -j data/tinyshakespeare/tiny_shakespeare_val.bin
        --tokenizer data/gpt2_tokenizer.bin --seed 42)
stamp "CLI: plain vs --num-gpus 1 (d6 B=4 T=256, 20 steps)"
for mode in plain nccl1; do
  extra=(); [[ $mode == nccl1 ]] && extra=(--num-gpus 1)
  timeout 120 $bin "${common[@]}" -e d6 -b 4 -t 256 -x 20 -v 10 -m 8 -s 0 -n 0 "${extra[@]}" -o "$OUT/dist_$mode" \
    > "$OUT/dist_$mode.txt" 2>&1 || { rc=1; tail -n 5 "$OUT/dist_$mode.txt"; }
done
strip() { awk '{ for (i=1; i<=NF; i++) if ($i=="train" || $i=="val") printf "%s %s %s ", $2, $i, $(i+1); print "" }' "$1"; }
if diff <(strip "$OUT/dist_plain/main.log") <(strip "$OUT/dist_nccl1/main.log") > "$OUT/dist_diff.txt" &&
   cmp "$OUT/dist_plain/model_00000020.bin" "$OUT/dist_nccl1/model_00000020.bin"; then
  echo "plain vs --num-gpus 1: $(grep -c train "$OUT/dist_plain/main.log") train losses, val losses and model file identical: OK"
else
  echo "plain vs --num-gpus 1: DIFFERENT (see dist_diff.txt): FAIL"; rc=1
fi

# --- 3. two GPUs: R1 and throughput ---
if (( ngpu < 2 )); then
  echo "2-GPU checks (R1 within +-0.05 of 1 GPU, throughput >= 1.8x): SKIPPED, $ngpu GPU(s) here"
  stamp "60_distributed done, rc=$rc"; exit $rc
fi
# Both runs at B=8 and a global batch of 16x1024: 1 GPU with 2 micro-batches per step, 2 GPUs with one each. Rank r
# of W trains on loader batches r, r+W, ..., the batches the 1-GPU run accumulates, so both see the same data
# (R1's own B=16 run shuffles batches of 16, other data). -m 2 at B=8: the same 16 val sequences as R1's -m 1.
source scripts/r1.sh
r1_8=("${R1_FLAGS[@]}" --seed 42 -s 0 -b 8 -d 16384 -m 2)
stamp "R1 on 1 GPU, B=8 x 2 micro-batches"
timeout 300 $bin "${r1_8[@]}" -o "$OUT/r1_1gpu" > "$OUT/r1_1gpu.txt" 2>&1 || rc=1
ref_log="$OUT/r1_1gpu/main.log"
stamp "R1 on 2 GPUs: B=8 per GPU"
timeout 300 $bin "${r1_8[@]}" --num-gpus 2 -o "$OUT/r1_2gpu" > "$OUT/r1_2gpu.txt" 2>&1 || rc=1
awk 'NR==FNR { ref[$1]=$2; step[++n]=$1; next }
     { got[$1]=$2 }
     END { bad=0; for (i=1; i<=n; i++) { s=step[i]; ok = (s in got) && got[s]-ref[s] <= 0.05 && ref[s]-got[s] <= 0.05; if (!ok) bad=1;
             printf "step %3d val 1 GPU %s 2 GPUs %s %s\n", s, ref[s], (s in got) ? got[s] : "missing", ok ? "OK" : "FAIL" }
           printf "R1 2 GPUs vs 1 GPU: %d val points within +-0.05: %s\n", n, (bad || n == 0) ? "FAIL" : "OK"; exit (bad || n == 0) }' \
  <(r1_vals "$ref_log") <(r1_vals "$OUT/r1_2gpu/main.log") | tee "$OUT/r1_2gpu_check.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1

thr() {  # name extra-flags...: prints the summary's tok/s
  local name=$1; shift
  timeout 240 $bin "${common[@]}" -e d12 -b 16 -t 1024 -x 30 -v 0 -s 0 -n -1 "$@" -o "$OUT/thr_$name" > "$OUT/thr_$name.txt" 2>&1 || rc=1
  grep -E "^summary" "$OUT/thr_$name.txt" | sed -E 's/.* ([0-9]+) tok\/s.*/\1/'
}
stamp "throughput, B=16 T=1024 per GPU"
t1=$(thr 1gpu); t2=$(thr 2gpu --num-gpus 2 -d 32768)
awk -v a="$t1" -v b="$t2" 'BEGIN { if (a == "" || b == "") { print "throughput: missing summary: FAIL"; exit 1 }
  r = b / a; printf "throughput: 1 GPU %d tok/s, 2 GPUs %d tok/s = %.2fx (acceptance >= 1.8x): %s\n", a, b, r, (r >= 1.8) ? "OK" : "FAIL"; exit (r < 1.8) }' |
  tee "$OUT/dist_throughput.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1

# The README table (doc/results/distributed.md): the val curve at the steps R1 checks, the largest gap, the throughput.
{
  echo "Recipe R1 (scripts/r1.sh) at a global batch of 16x1024, seed 42: 1 GPU with 2 micro-batches of B=8 per step"
  echo "against 2 GPUs with B=8 each (the same batches). Card: $ngpu x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) ·"
  echo "$(date -u '+%Y-%m-%dT%H:%MZ') · \`bash scripts/bench/60_distributed.sh\` (run by scripts/lent_gpu.sh)."
  echo
  echo "| step | val loss, 1 GPU | val loss, 2 GPUs | \|diff\| |"
  echo "|--:|--:|--:|--:|"
  awk '$1=="step" { d=$6-$9; if (d<0) d=-d; if (d>m) { m=d; ms=$2 }
                    if ($2==0 || $2==20 || $2==100 || $2==150 || $2==250) printf "| %d | %.3f | %.3f | %.3f |\n", $2, $6, $9, d }
       END { printf "\nLargest gap over the %s val points: %.3f (step %d); acceptance +-0.05.\n", NR - 1, m, ms }' "$OUT/r1_2gpu_check.txt"
  echo
  awk -v a="$t1" -v b="$t2" 'BEGIN { printf "Throughput, GPT-2 124M, B=16 T=1024 per GPU, 30 steps: 1 GPU %d tok/s, 2 GPUs %d tok/s = %.2fx (acceptance >= 1.8x).\n", a, b, b / a }'
} > "$OUT/distributed.md"
cat "$OUT/distributed.md"
cp "$OUT/distributed.md" doc/results/distributed.md && bash scripts/readme_table.sh doc/results/distributed.md distributed
stamp "60_distributed done, rc=$rc"
exit $rc
