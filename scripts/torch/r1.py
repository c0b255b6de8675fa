# Recipe R1 in PyTorch, written independently of train_gpt2.cu, as a cross-check of its val curve.
#
# Same model (GPT-2 124M, tied wte/LM head, tanh GELU), same init (llm.c's: N(0, 0.02) for wte, wpe and every
# matmul weight, the two projections back into the residual stream scaled by 1/sqrt(2L), biases 0, layernorm
# weights 1), same AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the 2-D weights only), same schedule
# (linear warm-up 20 steps, cosine to 10% at step 250), clip 1.0, same data rule (each epoch a fresh random
# order of the 18 contiguous B*T+1-token batches of the train file) and the same val protocol as llm.c (the
# first B*T+1 tokens of the val file, before the update of steps 0, 10, ..., 250). bf16 autocast, fp32 weights.
# The generators differ from ours, so the same seed gives a different init and order: compare curves, not bits.
# The model is common.py's GPT (the one gpt2_train.py times), here without vocabulary padding: wte has
# exactly the 50,257 GPT-2 rows and the loss is over them.
#
# Usage (on the GPU machine, from the repository root): python3 scripts/torch/r1.py [seed ...]   (default: 42)
# prints the header line (common.header_line), then "seed S step N val X" lines and one time line per seed.
import math
import time

import torch

import common

L, NH, C, V, T, B, STEPS = 12, 12, 768, 50257, 1024, 16, 250
LR, WARMUP, FINAL_FRAC, WD, CLIP = 6e-4, 20, 0.1, 0.1, 1.0
DATA = "data/tinyshakespeare/tiny_shakespeare_"


def lr_at(step):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    r = (step - WARMUP) / (STEPS - WARMUP)
    return FINAL_FRAC * LR + 0.5 * (1 + math.cos(math.pi * r)) * (LR - FINAL_FRAC * LR)


def run(seed, train, val):
    torch.manual_seed(seed)
    model = common.GPT(L, NH, C, V, V, T).cuda()
    opt = torch.optim.AdamW(common.decay_groups(model, WD), lr=LR, betas=(0.9, 0.95), eps=1e-8, fused=True)
    nbatches = (len(train) - 1) // (B * T)
    gen = torch.Generator().manual_seed(seed)
    order, pos = [], 0
    vbuf = val[:B * T + 1].cuda()
    vx, vy = vbuf[:-1].view(B, T), vbuf[1:].view(B, T)
    t0 = time.time()
    for step in range(STEPS + 1):
        if step % 10 == 0 or step == STEPS:
            model.eval()
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                print(f"seed {seed} step {step} val {model(vx, vy).item():.6f}", flush=True)
            model.train()
        if step == STEPS:
            break
        if pos == len(order):  # a new epoch: a new order of the batches
            order, pos = torch.randperm(nbatches, generator=gen).tolist(), 0
        i = order[pos] * B * T
        pos += 1
        buf = train[i:i + B * T + 1].cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(buf[:-1].view(B, T), buf[1:].view(B, T))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(f"seed {seed}: {STEPS} steps in {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    parser = common.Parser(description="Recipe R1 in PyTorch: val loss every 10 steps (see the header comment).")
    parser.add_argument("seeds", metavar="seed", type=int, nargs="*", default=[42], help="seeds to run (default 42)")
    args = parser.parse_args()
    common.require_cuda()
    print(common.header_line(), flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    train, val = common.load_tokens(DATA + "train.bin", V), common.load_tokens(DATA + "val.bin", V)
    for s in args.seeds:
        run(s, train, val)
