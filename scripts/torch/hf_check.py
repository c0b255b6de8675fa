#!/usr/bin/env python3
"""An exported model (make export-hf) in transformers against ours: the loss of both on the same batch.

    python3 scripts/torch/hf_check.py --hf hf/my-gpt2 --ckpt log/model_00000250.bin \
        --tokens data/tinyshakespeare/tiny_shakespeare_val.bin [-b 4] [-t 64] [--tol 1e-3]

The batch is the token file's first (B, T): inputs its first B*T tokens, targets the same tokens shifted by one,
which is what build/loss evaluates (our Eigen model, fp32, on the CPU). transformers' GPT2LMHeadModel loads the
folder with from_pretrained in fp32, on the GPU when there is one, TF32 off so that fp32 means fp32. Prints both
losses and their difference; exits 0 when it is within --tol, 1 otherwise (and 1 when a weight failed to load,
since transformers would have initialised it at random).
Needs torch and transformers (not installed on the CPU machine; run it where the GPU tests run).
"""
import argparse
import array
import subprocess
import sys

TOKEN_MAGIC, TOKEN_VERSION, HEADER_BYTES = 20240520, 1, 1024  # llm.c's token file (llmc/dataloader.h)


def read_tokens(path, n):
    """The first n tokens of an llm.c token file."""
    with open(path, "rb") as f:
        header = array.array("i")
        header.frombytes(f.read(HEADER_BYTES))
        if header[0] != TOKEN_MAGIC or header[1] != TOKEN_VERSION:
            sys.exit(f"error: {path}: not an llm.c token file (magic {header[0]}, version {header[1]})")
        if header[2] < n:
            sys.exit(f"error: {path}: {header[2]} tokens, the batch needs {n}")
        tokens = array.array("H")
        tokens.frombytes(f.read(2 * n))
    return list(tokens)


def our_loss(args):
    cmd = [args.loss_tool, "--model", args.ckpt, "--tokens", args.tokens, "-b", str(args.b), "-t", str(args.t)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    lines = [l for l in run.stdout.splitlines() if l.startswith("loss ")]
    if run.returncode != 0 or len(lines) != 1:
        sys.exit(f"error: {' '.join(cmd)} failed: {run.stderr.strip() or run.stdout.strip()}")
    return float(lines[0].split()[1])


def their_loss(args):
    import torch
    import torch.nn.functional as F
    from transformers import GPT2LMHeadModel

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, info = GPT2LMHeadModel.from_pretrained(args.hf, torch_dtype=torch.float32, output_loading_info=True)
    buffers = (".attn.bias", ".attn.masked_bias", "lm_head.weight")  # the causal mask; the head is tied to wte
    missing = [k for k in info["missing_keys"] if not k.endswith(buffers)]
    if missing or info["unexpected_keys"]:
        sys.exit(f"error: {args.hf}: missing weights {missing}, unexpected {info['unexpected_keys']}")
    model = model.to(device).eval()
    tokens = torch.tensor(read_tokens(args.tokens, args.b * args.t + 1), dtype=torch.long, device=device)
    x, y = tokens[:-1].view(args.b, args.t), tokens[1:].view(args.b, args.t)
    with torch.no_grad():
        logits = model(x).logits.float()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1)).item(), device


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hf", required=True, help="the folder make export-hf wrote")
    p.add_argument("--ckpt", required=True, help="the llm.c checkpoint it was exported from")
    p.add_argument("--tokens", required=True, help="an llm.c token file; its first (B, T) batch is evaluated")
    p.add_argument("-b", type=int, default=4, help="batch size B (default 4)")
    p.add_argument("-t", type=int, default=64, help="sequence length T (default 64)")
    p.add_argument("--tol", type=float, default=1e-3, help="largest accepted |ours - theirs| (default 1e-3)")
    p.add_argument("--loss-tool", default="./build/loss", help="our loss program (default ./build/loss)")
    args = p.parse_args()

    ours = our_loss(args)
    theirs, device = their_loss(args)
    diff = abs(ours - theirs)
    print(f"batch: first B={args.b} x T={args.t} of {args.tokens}")
    print(f"ours (build/loss, Eigen fp32, CPU)       {ours:.6f}")
    print(f"transformers (GPT2LMHeadModel, fp32, {device}) {theirs:.6f}")
    print(f"|difference| {diff:.2e} (tolerance {args.tol:g}): {'OK' if diff <= args.tol else 'FAIL'}")
    return 0 if diff <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
