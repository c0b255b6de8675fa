#!/usr/bin/env bash
# ONLY FOR THE PROJECT'S LENT, REMOTE GPU (a machine reached through a tool that copies the checkout there, runs
# one command of at most 10 minutes, and returns at most 8 files). A user with a GPU runs the `make test-gpu`,
# `make bench-...` targets directly and never needs this file.
# What it adds for that machine: the header-only dependencies from a staged folder (.gpu-carry, which the remote
# machine lacks), one build of every CUDA program, then each script of scripts/bench/ (the make targets'
# implementations, in name order) under a shared deadline, and every log packed into one file.
# Usage:  here, first   bash scripts/lent_gpu.sh stage; make data
#                        (then carry .gpu-carry data/tinyshakespeare data/gpt2_tokenizer.bin with the checkout)
#         there          bash scripts/lent_gpu.sh [regex of step names, e.g. "10_|2[01]_"]
set -uo pipefail
if [[ "${1:-}" == stage ]]; then  # copy the header-only dependencies the remote machine lacks (git-ignored folder)
  rm -rf .gpu-carry && mkdir -p .gpu-carry/include &&
    cp -r /usr/include/eigen3 /usr/include/doctest /usr/include/stb .gpu-carry/include/ &&
    du -sh .gpu-carry && exit 0
  echo "error: staging needs libeigen3-dev doctest-dev libstb-dev installed here" >&2; exit 1
fi
# The device tool returns at most 8 files: every step logs into $OUT/raw, packed into $OUT/logs.tgz at the end.
FINAL=${OUT:-$PWD/log/lent-gpu}; OUT=$FINAL/raw; mkdir -p "$OUT"
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
for s in scripts/bench/*.sh; do
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
