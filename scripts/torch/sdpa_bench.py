# PyTorch's causal attention, forward and backward, by each backend of torch.nn.attention.sdpa_kernel: the
# anchors beside which the project's attention kernels are timed (dev/attention/runner bench --anchors FILE).
#
# What it measures: F.scaled_dot_product_attention(q, k, v, is_causal=True) on q, k, v of shape (B, H, T, D),
# bf16, contiguous, requiring grad, forced onto one backend at a time:
#   flash     SDPBackend.FLASH_ATTENTION      (FlashAttention-2, built into PyTorch)
#   cudnn     SDPBackend.CUDNN_ATTENTION      (cuDNN's fused flash attention)
#   efficient SDPBackend.EFFICIENT_ATTENTION  (the memory-efficient kernel, from xFormers)
#   math      SDPBackend.MATH                 (plain matmuls and softmax: S and P materialized, T x T each;
#             skipped, as "failed: out of memory", where an estimate of its T x T buffers exceeds the free memory)
# The forward is timed as training runs it, with grad enabled (so it also keeps what the backward needs). The
# backward is timed alone: the forward runs once, untimed, then each repetition is out.backward(dout,
# retain_graph=True) with one fixed random dout, q/k/v's grads cleared (untimed) before each.
#
# How it times (common.median_kernel_ms): CUDA events around each call, 5 warm-up calls, the L2 flushed (a
# 256 MB write) before every call and the GPU kept busy while the host launches it, the median of up to --reps
# repetitions (at least 10; it stops early once 2 s are spent).
#
# FLOPs (the FlashAttention papers' convention for causal attention: the two T x T matmuls, 2 FLOPs per
# multiply-add, halved for the causal mask): forward 4*B*H*T*T*D / 2, backward 2.5 x forward (five matmuls
# instead of two). TFLOP/s = FLOPs / time; fwd+bwd TFLOP/s = (forward + backward FLOPs) / (fwd + bwd time).
#
# Output, read by dev/harness.cuh's parse_sdpa_log (keep it exactly): the header line (common.header_line,
# with the seed), then one line per (shape, backend):
#   "  (B, H, T, D)  backend  fwd_ms  fwd_tflops  bwd_ms  bwd_tflops  fwdbwd_tflops"
#   "  (B, H, T, D)  backend  failed: <reason>"       (the backend cannot run the shape, or out of memory)
#
# Usage (on the GPU machine): python3 scripts/torch/sdpa_bench.py [--shapes "B,H,T,D;..."]
#                              [--backends flash,cudnn,efficient,math] [--reps 100] [--seed 0]
import argparse
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import common

DEFAULT_SHAPES = "8,12,1024,64;64,12,1024,64;4,12,4096,64;1,12,16384,64;1,12,32768,64;16,16,2048,128;4,16,8192,128"
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
# The math backend holds about this many fp32 T x T tensors at its peak (S, P, and in the backward dP, dS and
# one temporary): an estimate, enough to skip the shapes that cannot fit rather than to predict the ones that do.
MATH_TXT_BUFFERS = 5


def parse_shapes(text):
    """argparse type: "B,H,T,D;B,H,T,D;..." -> [(B, H, T, D), ...], each a positive integer."""
    shapes = []
    for item in text.split(";"):
        shape = common.positive_int_list(item)
        if len(shape) != 4:
            raise argparse.ArgumentTypeError(f"'{item}' in --shapes is not four integers B,H,T,D")
        shapes.append(tuple(shape))
    return shapes


def parse_backends(text):
    names = text.split(",")
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown backend '{unknown[0]}' (known: {', '.join(BACKENDS)})")
    return names


def attention_flops(B, H, T, D):
    forward = 4.0 * B * H * T * T * D / 2
    return forward, 2.5 * forward


def math_fits(B, H, T):
    free_bytes, _ = torch.cuda.mem_get_info()
    return MATH_TXT_BUFFERS * B * H * T * T * 4 <= free_bytes


def time_backend(q, k, v, dout, backend, reps):
    """(forward ms, backward ms) of one backend on q, k, v; raises whatever the backend raises."""
    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def clear_grads():
        q.grad = k.grad = v.grad = None

    with sdpa_kernel(backend):
        fwd_ms = common.median_kernel_ms(forward, max_reps=reps)
        out = forward()
        bwd_ms = common.median_kernel_ms(lambda: out.backward(dout, retain_graph=True), before=clear_grads,
                                         max_reps=reps)
    clear_grads()
    return fwd_ms, bwd_ms


def no_kernel_reason(err, caught):
    """A backend that cannot run a shape raises "No available kernel" and says why in warnings: one line."""
    why = " ".join(" ".join(str(w.message).split()) for w in caught)
    return f"no available kernel: {why[:200]}" if why else common.describe_failure(err)


def random_inputs(shape, seed):
    """q, k, v (requiring grad) and dout: N(0, 1) in bf16, the same for every backend of a shape."""
    torch.manual_seed(seed)
    q, k, v, dout = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout


def bench_row(shape, name, reps, seed):
    """The output line of one backend on one shape."""
    B, H, T, D = shape
    label = f"  ({B}, {H}, {T}, {D})  {name}  "
    if name == "math" and not math_fits(B, H, T):
        return label + "failed: out of memory"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fwd_ms, bwd_ms = time_backend(*random_inputs(shape, seed), BACKENDS[name], reps)
        except Exception as err:  # out of memory, or the backend cannot run the shape: a row, then the next
            if common.is_out_of_memory(err):
                return label + "failed: out of memory"
            return label + "failed: " + no_kernel_reason(err, caught)
    fwd, bwd = attention_flops(B, H, T, D)
    tflops = lambda flops, ms: flops / (ms * 1e-3) / 1e12
    return (label + f"{fwd_ms:.4f}  {tflops(fwd, fwd_ms):.1f}  {bwd_ms:.4f}  {tflops(bwd, bwd_ms):.1f}  "
            f"{tflops(fwd + bwd, fwd_ms + bwd_ms):.1f}")


def main():
    p = common.Parser(description="Causal SDPA forward and backward per backend, bf16 (see the header comment).")
    p.add_argument("--shapes", type=parse_shapes, default=parse_shapes(DEFAULT_SHAPES),
                   help=f'"B,H,T,D;..." (default "{DEFAULT_SHAPES}")')
    p.add_argument("--backends", type=parse_backends, default=list(BACKENDS),
                   help="comma-separated, of flash,cudnn,efficient,math (default: all four)")
    p.add_argument("--reps", type=common.positive_int, default=100,
                   help="at most this many timed repetitions per measurement (default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of q, k, v and dout, drawn anew per row (default 0)")
    args = p.parse_args()
    common.require_cuda()
    print(common.header_line(f"seed {args.seed}"), flush=True)
    for shape in args.shapes:
        for name in args.backends:
            row = bench_row(shape, name, args.reps, args.seed)
            common.free_cuda_memory()  # after bench_row returned: nothing of its shape is referenced any more
            print(row, flush=True)


if __name__ == "__main__":
    main()
