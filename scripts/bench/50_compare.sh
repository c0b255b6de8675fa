#!/usr/bin/env bash
# `make compare` on the GPU: GPT-2 124M (d12), B=4 T=1024, all-naive then all-flash kernels (same seed, same
# data): per-layer forward/backward ms from CUDA events, step ms, tok/s and peak memory side by side. Writes
# log/compare.md (what `make compare` writes) and copies it to $OUT. About 20 s on an H200 (the
# all-naive steps take most of it). (Runs the binary directly: `make compare` would also
# rebuild the data, which needs the CPU tools; the data files are carried.)
set -uo pipefail
OUT=${OUT:-log/bench}; mkdir -p "$OUT"
t0=$(date +%s)
timeout 300 ./build/train_gpt2cu_bf16 --compare -o log
rc=$?
[[ -f log/compare.md ]] && cp log/compare.md "$OUT/compare.md"
echo "== 50_compare rc=$rc in $(( $(date +%s) - t0 )) s"
exit $rc
