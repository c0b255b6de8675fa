#!/usr/bin/env bash
# make long-context: GPT-2 124M (d12) at 32,768 tokens per step for T = 1K, 2K, 4K, 8K, 16K, 32K (B = 32768/T), on
# TinyShakespeare: the flash set and the naive-attention set (flash elsewhere; S and P of every layer in HBM),
# each a few timed steps: ms/step, tok/s, MFU (FLOPs per token counting the causal attention: llmc/config.h) and
# peak GPU memory; where the naive set's memory plan does not fit the card, the trainer's refusal (before any
# allocation) with the GiB it needs. With PyTorch installed, scripts/torch/gpt2_train.py in the same run: eager
# with SDPA at every T, compiled with SDPA at 1K, 8K and 32K, eager with the math backend (S and P materialized)
# up to where it runs out of memory. The flash runs also profile their last 2 steps by layer (--profile-steps):
# attention's share of a step at each T. Writes doc/results/long_context.md, spliced into README.md.
# REUSE_OURS=1 keeps $OUT's runs of ours from an earlier call and runs only PyTorch's (a lent GPU's time limit).
set -uo pipefail
OUT=${OUT:-log/long-context}; mkdir -p "$OUT"
bin=./build/train_gpt2cu_bf16
[[ -x $bin ]] || { echo "missing $bin: make build/train_gpt2cu_bf16"; exit 1; }
TOKENS=${TOKENS:-32768} STEPS=${STEPS:-10}
data=(-i data/tinyshakespeare/tiny_shakespeare_train.bin -j data/tinyshakespeare/tiny_shakespeare_val.bin
      --tokenizer data/gpt2_tokenizer.bin -e d12 --seed 42 -n -1 -v 0 -s 0)
status=0
[[ -n ${REUSE_OURS:-} && -s $OUT/ours.txt ]] || { : > "$OUT/ours.txt"; REUSE_OURS=; }
for T in 1024 2048 4096 8192 16384 32768; do
  [[ -n $REUSE_OURS ]] && break
  B=$(( TOKENS / T ))
  for set in flash naive-attention; do
    flags=(--kernels flash --profile-steps 2); [[ $set == naive-attention ]] && flags=(--kernels flash --attention naive)
    log="$OUT/${set}_T$T.txt"
    timeout 300 $bin "${data[@]}" --max-seq-len "$T" -b "$B" -t "$T" -x "$STEPS" "${flags[@]}" -o "$OUT/run_${set}_T$T" > "$log" 2>&1
    rc=$?
    if grep -q "^summary" "$log"; then
      line=$(grep "^summary" "$log")
      ms=$(sed -E 's/.*mean ([0-9.]+) ms.*/\1/' <<< "$line"); tok=$(sed -E 's/.* ([0-9]+) tok\/s.*/\1/' <<< "$line")
      mfu=$(sed -E 's/.*\| ([0-9.]+)% MFU.*/\1/' <<< "$line"); gib=$(sed -E 's/.*peak GPU memory ([0-9.]+) GiB.*/\1/' <<< "$line")
      echo "$set $T $B ok $ms $tok $mfu $gib" >> "$OUT/ours.txt"
    elif grep -q "out of GPU memory: B=.* needs" "$log"; then
      need=$(grep -o "needs [0-9.]* GiB" "$log" | head -1 | sed 's/needs //; s/ GiB//')
      have=$(grep -o "only [0-9.]* GiB of [0-9.]* GiB" "$log" | head -1 | sed -E 's/only ([0-9.]+) GiB of ([0-9.]+) GiB/\1/')
      echo "$set $T $B refused $need $have" >> "$OUT/ours.txt"
    else
      echo "$set $T $B failed rc=$rc" >> "$OUT/ours.txt"; status=1; tail -3 "$log"
    fi
    tail -n 1 "$OUT/ours.txt"
  done
done
head -1 "$OUT/flash_T1024.txt" | sed 's/^/header: /'

: > "$OUT/torch.txt"
if [[ -z "${SKIP_TORCH:-}" ]] && python3 -c "import torch" 2>/dev/null; then
  torch_run() { timeout 400 python3 scripts/torch/gpt2_train.py --tokens-per-step "$TOKENS" --steps "$STEPS" --warmup 3 "$@" 2>&1 | grep "^torch" | tee -a "$OUT/torch.txt"; }
  for T in 1024 2048 4096 8192 16384 32768; do torch_run -t $T --mode eager --attention sdpa; done
  for T in 1024 8192 32768; do torch_run -t $T --mode compiled --attention sdpa; done
  for T in 1024 2048 4096 8192; do torch_run -t $T --mode eager --attention math; done
else
  echo "no PyTorch here (or SKIP_TORCH set): the table gets no PyTorch columns"
fi

# The table: one row per T; ours from ours.txt ("set T B ok ms tok mfu gib" | "set T B refused need free"), PyTorch's
# from torch.txt lines "torch <mode> attn=<a> B=.. T=..: <ms> ms/step <tok> tok/s MFU x% peak <g> GiB" (or "out of memory").
cell_ours() {  # set T -> "tok/s K, GiB" | "refused: needs X GiB (Y free)" | "failed"
  awk -v s="$1" -v t="$2" '$1 == s && $2 == t {
      if ($4 == "ok") printf "%.0fK tok/s, %s ms, %s%% MFU, %s GiB", $6 / 1000, $5, $7, $8
      else if ($4 == "refused") printf "refused: needs %s GiB (%s free)", $5, $6
      else printf "failed" }' "$OUT/ours.txt"
}
cell_torch() {  # mode attn T
  awk -v m="$1" -v a="attn=$2" -v t="T=$3:" '$2 == m && $3 == a && $5 == t {
      if ($0 ~ /out of memory/) { print "out of memory"; exit }
      for (i = 1; i <= NF; i++) { if ($i == "tok/s") tok = $(i-1); if ($i == "GiB") g = $(i-1) }
      printf "%.0fK, %s GiB", tok / 1000, g; exit }' "$OUT/torch.txt"
}
ratio() {  # T -> flash tok/s / compiled tok/s
  local a b; a=$(awk -v t="$1" '$1 == "flash" && $2 == t && $4 == "ok" { print $6 }' "$OUT/ours.txt")
  b=$(awk -v t="T=$1:" '$2 == "compiled" && $5 == t { for (i = 1; i <= NF; i++) if ($i == "tok/s") print $(i-1) }' "$OUT/torch.txt")
  [[ -n $a && -n $b ]] && awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f×", a / b }' || echo "–"
}
{
  echo "GPT-2 124M (d12) on TinyShakespeare, $TOKENS tokens per step (B = $TOKENS/T), BF16, $STEPS steps (mean over the"
  echo "steps after the first). Card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) · $(date -u '+%Y-%m-%dT%H:%MZ') ·"
  echo "\`make long-context\` (scripts/bench/70_long_context.sh). Attention in the flash runs: $(grep -m1 -o 'attention: .*' "$OUT/flash_T1024.txt" | sed 's/^attention: //')."
  echo
  echo "| T | B | flashgpt2, flash | flashgpt2, naive attention | PyTorch compiled, SDPA | PyTorch eager, SDPA | PyTorch eager, math (S, P in HBM) | flash ÷ compiled |"
  echo "|--:|--:|---|---|---|---|---|--:|"
  for T in 1024 2048 4096 8192 16384 32768; do
    c=$(cell_torch compiled sdpa $T); e=$(cell_torch eager sdpa $T); m=$(cell_torch eager math $T)
    echo "| $T | $(( TOKENS / T )) | $(cell_ours flash $T) | $(cell_ours naive-attention $T) | ${c:-–} | ${e:-–} | ${m:-–} | $(ratio $T) |"
  done
  echo
  echo "How a flash step splits as T grows (\`--profile-steps 2\`: CUDA events around every op of the last 2 steps; the"
  echo "rows are the ops' times, which leave out the gaps between kernels):"
  echo
  echo "| T | attention fwd + bwd ms | everything else ms | attention's share |"
  echo "|--:|--:|--:|--:|"
  for T in 1024 2048 4096 8192 16384 32768; do
    f="$OUT/run_flash_T$T/profile.md"
    [[ -f $f ]] || continue
    awk -v t="$T" -F'|' '$2 ~ /^ attention / { a = $5 + 0 } $2 ~ /^ all ops / { all = $5 + 0 }
        END { if (all > 0) printf "| %s | %.2f | %.2f | %.0f%% |\n", t, a, all - a, 100 * a / all }' "$f"
  done
  echo
  echo "\"refused\": the trainer's memory plan (llmc/memory.cuh) predicts the naive set's (L, B, NH, T, T) buffers before"
  echo "allocating anything and stops with one line naming --attention flash. PyTorch: scripts/torch/gpt2_train.py, the same"
  echo "model with a position table of T rows, random tokens; \"–\": not run at that T."
} > "$OUT/long_context.md"
cat "$OUT/long_context.md"
cp "$OUT/long_context.md" doc/results/long_context.md && bash scripts/readme_table.sh doc/results/long_context.md long-context || status=1
exit $status
