# Recipe R1, "the quality recipe": GPT-2 124M trained from scratch on TinyShakespeare exactly as llm.c's reference
# run (doc/design.md, "The quality recipe"), so its val curve can be held against llm.c's. Sourced by
# scripts/bench/40_train.sh and 41_r1_spread.sh; scripts/torch/r1.py is the same recipe in PyTorch.
# Seed 42 is llm.c's: our init and data order are drawn as llm.c draws them, so the seed-42 run starts from the
# reference run's weights and reads its batches in its order (the arithmetic still differs: cuDNN vs ours).
# GPT-2 124M from scratch, B=16 T=1024, AdamW lr 6e-4, 20 warm-up steps, cosine to 10%, weight decay 0.1, clip
# 1.0, 250 steps, val every 10 steps, flash kernels. The reference curve is llm.c's, and llm.c's val loader cuts
# its one val shard into whole B*T+1 batches: at B=16 T=1024 the 32,768-token split holds ONE such batch, which
# llm.c re-reads for every val batch (its loader wraps to the same shard). So llm.c's "whole val split" loss is
# the loss on the split's first 16,384 tokens; -m 1 measures the same thing, our first val batch of 16 sequences.
# (Over our whole split, -m -1, one run gave 6.31 / 5.49 / 5.24 / 5.09 at steps 20 / 100 / 150 / 250: other text.)
R1_FLAGS=(-i data/tinyshakespeare/tiny_shakespeare_train.bin -j data/tinyshakespeare/tiny_shakespeare_val.bin
          --tokenizer data/gpt2_tokenizer.bin -e d12 -n -1
          -b 16 -t 1024 -l 6e-4 -u 20 -q 0.1 -c 0.1 --grad-clip 1.0 -x 250 -v 10 -m 1 --kernels flash)
# step:val loss of one llm.c + cuDNN run of this recipe (llm.c's train_gpt2cu with USE_CUDNN=1, -e d12, seed 42, on
# an H200; the project's anchors, 2026-11-29), and the steps the acceptance checks (within +-0.1).
R1_REFERENCE="0:11.008 10:8.055 20:6.401 50:6.039 100:5.666 150:5.329 200:5.352 250:5.344"
R1_ACCEPT_STEPS="20 100 150 250"

# main.log of the trainer -> "step val" lines.
r1_vals() {
  awk '$1=="step" { for (i=3; i<NF; i++) if ($i=="val") print $2, $(i+1) }' "$1"
}

# main.log of the trainer -> one line: step 0's val and train loss beside llm.c's. Our init and data order are
# llm.c's for the same seed (llmc/torch_rng.h), so at seed 42 both should match to float noise.
r1_start() {
  awk '$1=="step" && $2==0 { for (i=3; i<NF; i++) { if ($i=="val") v=$(i+1); if ($i=="train") t=$(i+1) } }
       END { printf "R1 step 0: val %.3f, train loss %.3f; llm.c'"'"'s run (seed 42): 11.008, 10.98\n", v, t }' "$1"
}

# "step val" lines -> one line per accepted step, OK or FAIL; returns 1 if a step misses or is missing.
r1_check() {
  awk -v refs="$R1_REFERENCE" -v steps="$R1_ACCEPT_STEPS" '
    BEGIN { n = split(refs, a, " "); for (i = 1; i <= n; i++) { split(a[i], kv, ":"); ref[kv[1]] = kv[2] } }
    { val[$1] = $2 }
    END { bad = 0; n = split(steps, st, " ")
          for (i = 1; i <= n; i++) { s = st[i]; ok = (s in val) && val[s] - ref[s] <= 0.1 && ref[s] - val[s] <= 0.1
            if (!ok) bad = 1
            printf "R1 val loss at step %3d: %s (reference %.3f, +-0.1) %s\n", s, (s in val) ? val[s] : "missing", ref[s], ok ? "OK" : "FAIL" }
          exit bad }'
}
