#!/usr/bin/env bash
# One GPU session in one command: build every CUDA program with -arch=sm_90(a), then run each step in
# scripts/gpu.d/ (in name order), each with its own time limit, logging to $OUT/<step>.log.
# Usage on the lent H200:  bash scripts/gpu_run.sh [regex of step names, e.g. "10_|2[01]_"]
# Stage first, here:  bash ../shared/gpu/stage.sh ; make data   (carry: .gpu-carry data/tinyshakespeare data/gpt2_tokenizer.bin)
set -uo pipefail
# The device tool returns at most 8 files: every step logs into $OUT/raw, packed into $OUT/logs.tgz at the end.
FINAL=${OUT:-$PWD/gpu-out}; OUT=$FINAL/raw; mkdir -p "$OUT"
filter=${1:-}                   # a regex on step names, e.g. '10_|2[01]_'
deadline=$(( $(date +%s) + ${GPU_RUN_SECONDS:-540} ))   # the device tool stops a command at 600 s: finish first
inc=$PWD/.gpu-carry/include
export EIGEN_INC=$inc/eigen3 DOCTEST_INC=$inc STB_INC=$inc/stb
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
if [[ -z "${SKIP_BUILD:-}" ]]; then   # SKIP_BUILD=1: a second call on the same warm machine reuses the build
  echo "== build ==" ; t0=$(date +%s)
  make -j16 -k cuda GPU_ARCH=90 EIGEN_INC=$EIGEN_INC DOCTEST_INC=$DOCTEST_INC STB_INC=$STB_INC > "$OUT/build.log" 2>&1
  echo "build rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "error" "$OUT/build.log" | head -20
fi
summary=()
for s in scripts/gpu.d/*.sh; do
  name=$(basename "$s" .sh)
  [[ -n "$filter" && ! "$name" =~ $filter ]] && continue
  t0=$(date +%s); left=$(( deadline - t0 ))
  (( left > 10 )) || { summary+=("$name skipped: out of time"); continue; }
  OUT="$OUT" timeout -k 5 "$left" bash "$s" > "$OUT/$name.log" 2>&1; rc=$?
  summary+=("$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
  echo "== $name rc=$rc =="; tail -n 25 "$OUT/$name.log"
done
echo "== summary =="; printf '%s\n' "${summary[@]}"
# model/state files (*.bin) stay behind: the tool returns files of at most 16 MiB
tar -czf "$FINAL/logs.tgz" --exclude="*.bin" -C "$OUT" . && rm -rf "$OUT"
