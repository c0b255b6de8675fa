#!/usr/bin/env bash
# How much does recipe R1's val curve move from run to run? The acceptance compares ONE run with ONE llm.c run
# at four steps (±0.1); this measures the spread that window has to hold: R1 (as in 40_train.sh) with several
# seeds in our BF16 build, a few in the FP32 build, and the same recipe in PyTorch (scripts/torch/r1.py: its own
# implementation, bf16 autocast with fp32 weights). Writes doc/results/r1_spread.md: per step, the reference, and each
# system's mean [min, max] and how many of its runs fall within ±0.1 of the reference; spliced into README.md.
# Seeds: R1_SEEDS (default 42 1..5), R1_SEEDS_FP32 (42; empty: none), R1_SEEDS_TORCH (42 1..4). About 6 minutes on an
# H200: a BF16 run takes about 16 s, a PyTorch run 26 s, an FP32 run 105 s (fp32 matmuls).
set -uo pipefail
OUT=${OUT:-log/bench}; mkdir -p "$OUT/spread"
t_all=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t_all )) s elapsed)"; }
source scripts/r1.sh
ours() {  # precision seeds...
  local prec=$1; shift
  for seed in "$@"; do
    stamp "R1 $prec seed $seed"
    local d="$OUT/spread/${prec}_$seed"
    timeout 200 ./build/train_gpt2cu_$prec "${R1_FLAGS[@]}" -s 0 --seed "$seed" -o "$d" > "$d.txt" 2>&1 || { tail -n 3 "$d.txt"; continue; }
    r1_vals "$d/main.log" > "$d.vals"
  done
}
# Each run leaves spread/<system>_<seed>.vals: its "step val" lines.
ours bf16 ${R1_SEEDS:-42 1 2 3 4 5}
stamp "R1 in PyTorch"
if python3 -c "import torch" 2>/dev/null; then
  timeout 300 python3 scripts/torch/r1.py ${R1_SEEDS_TORCH:-42 1 2 3 4} > "$OUT/spread/torch.log" 2>&1 || tail -n 5 "$OUT/spread/torch.log"
  for seed in ${R1_SEEDS_TORCH:-42 1 2 3 4}; do
    awk -v s="$seed" '$1=="seed" && $2==s && $3=="step" { print $4, $6 }' "$OUT/spread/torch.log" > "$OUT/spread/torch_$seed.vals"
  done
fi
fp32_seeds=${R1_SEEDS_FP32-42}   # R1_SEEDS_FP32="" skips the FP32 runs (~105 s each)
ours fp32 $fp32_seeds
for f in "$OUT"/spread/*.vals; do b=$(basename "$f" .vals); sed "s/^/${b%_*} /" "$f"; done > "$OUT/spread/all.txt"
{
  echo "Recipe R1 from run to run: val loss (llm.c's protocol, the first 16 val sequences) of several seeds per system."
  echo "Card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) · $(date -u '+%Y-%m-%dT%H:%MZ') ·" \
       "\`bash scripts/bench/41_r1_spread.sh\` (make r1-spread). Reference: one llm.c + cuDNN run, its figures cited in scripts/r1.sh."
  echo
  echo "| step | llm.c reference | flashgpt2 BF16 | flashgpt2 FP32 | PyTorch (scripts/torch/r1.py) |"
  echo "|--:|--:|---|---|---|"
  awk -v refs="$R1_REFERENCE" '
       BEGIN { nref = split(refs, a, " "); for (i = 1; i <= nref; i++) { split(a[i], kv, ":"); ref[kv[1]] = kv[2]; steps[i] = kv[1] } }
       { k=$1 SUBSEP $2; n[k]++; s[k]+=$3; if (!(k in lo) || $3<lo[k]) lo[k]=$3; if (!(k in hi) || $3>hi[k]) hi[k]=$3
         if ($2 in ref && $3-ref[$2] <= 0.1 && ref[$2]-$3 <= 0.1) ok[k]++ }
       function cell(sys, step,   k) { k=sys SUBSEP step; if (!(k in n)) return "–"
         return sprintf("%.3f [%.3f, %.3f], %d/%d within ±0.1", s[k]/n[k], lo[k], hi[k], ok[k]+0, n[k]) }
       END { for (i=1; i<=nref; i++) { t=steps[i]; printf "| %d | %.3f | %s | %s | %s |\n", t, ref[t], cell("bf16", t), cell("fp32", t), cell("torch", t) } }' \
      "$OUT/spread/all.txt"
  echo
  echo "Seeds: BF16 ${R1_SEEDS:-42 1 2 3 4 5}; FP32 ${fp32_seeds:-none}; PyTorch ${R1_SEEDS_TORCH:-42 1 2 3 4}. Ours draw init and data order as llm.c"
  echo "does (seed 42: the reference run's weights and batch order); PyTorch's draw from its own generators."
  echo "Runs within ±0.1 at all of steps $R1_ACCEPT_STEPS (the acceptance):"
  counts=()
  for sys in bf16 fp32 torch; do
    runs=0 good=0
    for f in "$OUT"/spread/${sys}_*.vals; do
      [[ -e $f ]] || continue
      runs=$((runs + 1)); r1_check < "$f" > /dev/null && good=$((good + 1))
    done
    counts+=("$sys $good of $runs")
  done
  (IFS=';'; echo "${counts[*]}" | sed 's/;/; /g')
} > "$OUT/r1_spread.md"
cat "$OUT/r1_spread.md"
cp "$OUT/r1_spread.md" doc/results/r1_spread.md && bash scripts/readme_table.sh doc/results/r1_spread.md r1-spread
stamp "41_r1_spread done"
