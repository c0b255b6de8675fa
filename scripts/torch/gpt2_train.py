# GPT-2 training-step throughput in PyTorch: the PyTorch rows beside the project's trainer (README training
# table, and the long-context sweep).
#
# What it measures: full training steps of common.py's GPT-2 (tied wte / LM head, tanh GELU, pre-layernorm,
# llm.c's init, vocabulary padded to 50,304 rows as llm.c pads it): forward and loss under bf16 autocast with
# fp32 weights, backward, grad-norm clip to 1.0, fused AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay
# 0.1 on the 2-D weights), grads set to None. --mode compiled runs the model through torch.compile (default
# options), eager does not; --attention sdpa lets PyTorch pick its SDPA backend, math forces
# SDPBackend.MATH (S and P materialized, B*NH*T*T each; under torch.compile, its decomposition is traced).
# The batches (random tokens, or consecutive windows of a token file) are on the GPU before the first step.
#
# How it times (common.median_step_ms): --warmup steps (torch.compile compiles in the first), then --steps
# steps back to back with a CUDA event between every two; ms/step is the median step, tok/s = B*T / that.
# Peak memory: torch.cuda.max_memory_allocated over the timed steps (the counter is reset after the warm-up).
#
# FLOPs per token: 6*N + 6*L*C*T. N is every parameter of the model as built (the padded wte once, it is
# tied; wpe with its max-seq-len rows), as the project's C++ trainer counts them: 2 FLOPs per parameter in the
# forward, 4 in the backward. 6*L*C*T is attention's two T x T matmuls (QK^T and PV): 2*T*C FLOPs per token
# per layer in the forward once the causal half is dropped, x3 for forward and backward. (The nanoGPT / PaLM
# count keeps the masked half: 12*L*C*T.) MFU = FLOPs per token * tok/s / --peak-tflops, by default llmc/peak.h's bf16 ceiling (790 TFLOP/s),
# the bf16 matmul ceiling measured on the H200.
#
# Output, read by awk in the project's GPU scripts (keep it exactly): the header line, then one line per run:
#   "torch compiled attn=sdpa B=16 T=1024: 35.12 ms/step 466500 tok/s MFU 40.1% peak 15.10 GiB"
#   "torch eager attn=math B=4 T=8192: out of memory"
#   "torch eager attn=sdpa B=16 T=1024: failed: <error type: first line>"    (the exit status is then 1)
#
# Usage (on the GPU machine):
#   python3 scripts/torch/gpt2_train.py [--depth 12|24|48] [-b 16[,64]] [-t 1024] [--mode compiled[,eager]]
#       [--attention sdpa|math] [--tokens-per-step N] [--max-seq-len N] [--steps 20] [--warmup 5]
#       [--data random|PATH] [--seed 0] [--peak-tflops 790]
#   python3 scripts/torch/gpt2_train.py --sweep long      # d12, 32,768 tokens per step, T = 1024 ... 32768
import argparse
import contextlib
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import common

LONG_SWEEP_T = (1024, 2048, 4096, 8192, 16384, 32768)
LONG_SWEEP_RUNS = (("compiled", "sdpa"), ("eager", "sdpa"), ("eager", "math"))  # (mode, attention) per T
LONG_SWEEP_TOKENS = 32768
LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP = 6e-4, (0.9, 0.95), 1e-8, 0.1, 1.0


def flops_per_token(model, depth, T):
    _, channels = common.GPT2_SHAPES[depth]
    n_params = sum(p.numel() for p in model.parameters())
    return 6.0 * n_params + 6.0 * depth * channels * T


def make_batches(args, B, T, count):
    """count (inputs, targets) pairs of shape (B, T) on the GPU: random tokens drawn from --seed, or windows
    of B*T+1 consecutive tokens of the --data file, one after the other (wrapping around)."""
    n = B * T + 1
    if args.data == "random":
        g = torch.Generator().manual_seed(args.seed)
        windows = [torch.randint(0, common.VOCAB, (n,), generator=g) for _ in range(count)]
    else:
        tokens = args.tokens  # main checked that it holds at least n
        starts = [(i * (n - 1)) % (len(tokens) - n + 1) for i in range(count)]
        windows = [tokens[s:s + n] for s in starts]
    return [(w[:-1].view(B, T).cuda(), w[1:].view(B, T).cuda()) for w in windows]


def attention_backend(attention):
    return sdpa_kernel(SDPBackend.MATH) if attention == "math" else contextlib.nullcontext()


def train_run(args, mode, attention, B, T, max_seq_len):
    """(ms/step, tok/s, MFU %, peak GiB) of one configuration; raises what PyTorch raises (out of memory...)."""
    torch.manual_seed(args.seed)
    model = common.gpt2(args.depth, max_seq_len).cuda()
    forward = torch.compile(model) if mode == "compiled" else model
    opt = torch.optim.AdamW(common.decay_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS, eps=EPS, fused=True)
    batches = make_batches(args, B, T, args.warmup + args.steps)
    next_batch = iter(batches)

    def step():
        x, y = next(next_batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)

    with attention_backend(attention):
        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        ms = common.median_step_ms(step, args.steps)
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    tok_s = B * T / (ms * 1e-3)
    mfu = 100.0 * flops_per_token(model, args.depth, T) * tok_s / (args.peak_tflops * 1e12)
    return ms, tok_s, mfu, peak_gib


def run_line(args, mode, attention, B, T, max_seq_len):
    """The output line of one run, and whether it failed for a reason other than memory."""
    label = f"torch {mode} attn={attention} B={B} T={T}: "
    try:
        ms, tok_s, mfu, peak_gib = train_run(args, mode, attention, B, T, max_seq_len)
    except Exception as err:  # out of memory, or torch.compile / cuDNN / cuBLAS refusing: a row, then the next run
        why = common.describe_failure(err)
        return label + (why if why == "out of memory" else "failed: " + why), why != "out of memory"
    return label + f"{ms:.2f} ms/step {tok_s:.0f} tok/s MFU {mfu:.1f}% peak {peak_gib:.2f} GiB", False


def planned_runs(args):
    """(mode, attention, B, T, max_seq_len) of every run the flags ask for."""
    if args.sweep == "long":
        if args.batch is not None or args.seq_len is not None or args.max_seq_len is not None:
            common.fail("--sweep long chooses B, T and the position table itself: drop -b, -t and --max-seq-len")
        tokens = args.tokens_per_step or LONG_SWEEP_TOKENS
        return [(mode, attention, tokens // T, T, T) for T in LONG_SWEEP_T if tokens % T == 0
                for mode, attention in LONG_SWEEP_RUNS]
    T = args.seq_len or 1024
    if args.tokens_per_step is not None:
        if args.batch is not None:
            common.fail("give -b or --tokens-per-step, not both")
        if args.tokens_per_step % T:
            common.fail(f"--tokens-per-step {args.tokens_per_step} is not a multiple of T = {T}")
        batches = [args.tokens_per_step // T]
    else:
        batches = args.batch or [16]
    max_seq_len = args.max_seq_len or T
    if max_seq_len < T:
        common.fail(f"--max-seq-len {max_seq_len} is shorter than T = {T}: the position table needs T rows")
    return [(mode, args.attention, B, T, max_seq_len) for mode in args.mode for B in batches]


def parse_modes(text):
    modes = text.split(",")
    if any(m not in ("compiled", "eager") for m in modes):
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of compiled, eager")
    return modes


def parse_args():
    p = common.Parser(description="GPT-2 training-step throughput in PyTorch (see the header comment).")
    p.add_argument("--depth", type=int, choices=sorted(common.GPT2_SHAPES), default=12,
                   help="12 (124M: C=768, NH=12), 24 (C=1024, NH=16) or 48 (C=1600, NH=25); default 12")
    p.add_argument("-b", "--batch", type=common.positive_int_list, help="batch size(s), e.g. 16,64 (default 16)")
    p.add_argument("-t", "--seq-len", type=common.positive_int, help="sequence length T (default 1024)")
    p.add_argument("--tokens-per-step", type=common.positive_int, help="B = this / T, instead of -b")
    p.add_argument("--max-seq-len", type=common.positive_int, help="rows of the position table (default T)")
    p.add_argument("--mode", type=parse_modes, default=["compiled"], help="compiled, eager or both: compiled,eager")
    p.add_argument("--attention", choices=("sdpa", "math"), default="sdpa",
                   help="sdpa: PyTorch's choice of backend; math: SDPBackend.MATH (default sdpa)")
    p.add_argument("--steps", type=common.positive_int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=common.positive_int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--data", default="random", help="random, or an llm.c token file (default random)")
    p.add_argument("--seed", type=int, default=0, help="seed of the init and of the random tokens (default 0)")
    p.add_argument("--peak-tflops", type=float, default=common.peak_bf16_tflops(),
                   help="MFU's denominator (default llmc/peak.h's bf16 ceiling)")
    p.add_argument("--sweep", choices=("long",), help="long: the long-context sweep (see the header comment)")
    args = p.parse_args()
    if not args.peak_tflops > 0:
        common.fail(f"--peak-tflops {args.peak_tflops} is not positive")
    return args


def main():
    args = parse_args()
    runs = planned_runs(args)
    if not runs:
        common.fail(f"--tokens-per-step {args.tokens_per_step} is a multiple of none of T = {LONG_SWEEP_T}")
    args.tokens = None if args.data == "random" else common.load_tokens(args.data)
    longest = max(B * T + 1 for _, _, B, T, _ in runs)
    if args.tokens is not None and len(args.tokens) < longest:
        common.fail(f"{args.data}: {len(args.tokens)} tokens, fewer than one batch of B*T+1 = {longest}")
    common.require_cuda()
    print(common.header_line(f"GPT-2 d{args.depth}", f"seed {args.seed}"), flush=True)
    failed = False
    for mode, attention, B, T, max_seq_len in runs:
        line, bad = run_line(args, mode, attention, B, T, max_seq_len)
        common.free_cuda_memory()  # run_line has returned: the model, optimizer and batches are unreferenced
        print(line, flush=True)
        failed = failed or bad
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
