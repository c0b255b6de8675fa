# Recipe R1 in PyTorch, written independently of train_gpt2.cu, as a cross-check of its val curve.
#
# Same model (GPT-2 124M, tied wte/LM head, tanh GELU), same init (llm.c's: N(0, 0.02) for wte, wpe and every
# matmul weight, the two projections back into the residual stream scaled by 1/sqrt(2L), biases 0, layernorm
# weights 1), same AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the 2-D weights only), same schedule
# (linear warm-up 20 steps, cosine to 10% at step 250), clip 1.0, same data rule (each epoch a fresh random
# order of the 18 contiguous B*T+1-token batches of the train file) and the same val protocol as llm.c (the
# first B*T+1 tokens of the val file, before the update of steps 0, 10, ..., 250). bf16 autocast, fp32 weights.
# The generators differ from ours, so the same seed gives a different init and order: compare curves, not bits.
#
# Usage (on the GPU machine): python3 scripts/torch_r1.py [seed ...]   prints "seed S step N val X" lines.
import array, math, struct, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

L, NH, C, V, T, B, STEPS = 12, 12, 768, 50257, 1024, 16, 250
LR, WARMUP, FINAL_FRAC, WD, CLIP = 6e-4, 20, 0.1, 0.1, 1.0
DATA = "data/tinyshakespeare/tiny_shakespeare_"


def load_tokens(path):  # llm.c's token file: 256 int32 header (magic 20240520, version 1, count), then uint16
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack("<3i", data[:12])
    if magic != 20240520 or version != 1 or len(data) < 1024 + 2 * n:
        sys.exit(f"Error: {path}: not a version-1 token file of {n} tokens")
    tokens = array.array("H")
    tokens.frombytes(data[1024:1024 + 2 * n])
    return torch.tensor(tokens, dtype=torch.int64)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.attproj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.attproj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if "proj" in name else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("weight"):  # layernorm
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe.weight[:T]
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # the LM head is wte
        return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))


def lr_at(step):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    r = (step - WARMUP) / (STEPS - WARMUP)
    return FINAL_FRAC * LR + 0.5 * (1 + math.cos(math.pi * r)) * (LR - FINAL_FRAC * LR)


def run(seed, train, val):
    torch.manual_seed(seed)
    model = GPT().cuda()
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8, fused=True)
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
    torch.backends.cuda.matmul.allow_tf32 = True
    train, val = load_tokens(DATA + "train.bin"), load_tokens(DATA + "val.bin")
    for s in sys.argv[1:] or ["42"]:
        run(int(s), train, val)
