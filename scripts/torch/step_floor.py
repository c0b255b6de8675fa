# The libraries' floor of one GPT-2 training step: how fast a step could be if it were nothing but its matmuls
# (cuBLAS) and its attention (cuDNN), with no other kernel (no layernorm, GELU, softmax-cross-entropy,
# residual add, bias gradient, optimizer) and no gap between launches. A trainer's ms/step against this floor
# says how much its other kernels and its launch gaps cost.
#
# What it runs, in bf16, for --depth L, -b B, -t T (BT = B*T tokens), a step's work back to back:
#   block matmuls, for each of the L layers and each of its four linears (x W^T, W of out x in):
#       qkv (3C x C), attention projection (C x C), fc (4C x C), fc projection (C x 4C):
#       forward y = x W^T (BT x in by in x out), backward dx = dy W and dW = dy^T x;
#   LM head, once: the same three matmuls with wte (50,304 x C): logits, dx, dwte;
#   attention, for each layer: F.scaled_dot_product_attention(q, k, v, is_causal=True) forced onto
#       SDPBackend.CUDNN_ATTENTION, and its backward (torch.autograd.grad with a fixed dout), on (B, NH, T, C/NH)
#       laid out as the model's heads are (B, T, NH, C/NH) transposed.
# The matmuls are torch.mm with out= (no allocation); every matrix is N(0, 1) (a zero matrix would draw less
# power and could clock higher than training does). Each layer has its own weights and weight gradients, as
# in training; the activations (tens of MB and more, well over the L2) are shared between layers.
#
# How it times (common.median_step_ms): --warmup untimed steps, then --reps steps in a tight loop with a CUDA
# event between every two, no synchronization in between; the median. The whole step and each of its three
# parts are timed that way, separately (so the parts need not add up to the step exactly).
#
# Output, one line per batch size (after the header line):
#   "floor d12 B=16 T=1024: 23.10 ms/step 709000 tok/s (block matmuls 12.90 ms, lm head 5.80 ms, attention 4.30 ms)"
#   "floor d12 B=64 T=1024: out of memory"     or "...: failed: <error type: first line>" (exit status 1)
#
# Usage (on the GPU machine): python3 scripts/torch/step_floor.py [--depth 12|24|48] [-b 16[,64]] [-t 1024]
#                              [--reps 20] [--warmup 3] [--seed 0]
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import common


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


class LinearWork:
    """The three matmuls of one linear layer (x W^T with W of out_features x in_features) over BT tokens."""

    def __init__(self, x, y, dx, weight):
        self.x, self.y, self.dx, self.weight = x, y, dx, weight
        self.dweight = randn(*weight.shape)

    def run(self):
        torch.mm(self.x, self.weight.t(), out=self.y)      # forward
        torch.mm(self.y, self.weight, out=self.dx)         # dx = dy W (y's buffer stands in for dy)
        torch.mm(self.y.t(), self.x, out=self.dweight)     # dW = dy^T x


class StepFloor:
    """Every matmul and attention of one training step, with the buffers they need."""

    def __init__(self, depth, B, T):
        NH, C = common.GPT2_SHAPES[depth]
        BT = B * T
        # activations by width, shared by the layers: inputs x, outputs y (and dy), input gradients dx
        x, y, dx = ({width: randn(BT, width) for width in widths}
                    for widths in ((C, 4 * C), (3 * C, C, 4 * C), (C, 4 * C)))
        linear_shapes = ((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C))      # (in, out): qkv, attproj, fc, fcproj
        self.block_linears = [LinearWork(x[i], y[o], dx[i], randn(o, i))
                              for _ in range(depth) for i, o in linear_shapes]
        # the LM head: logits = x wte^T, x the final layernorm's output (BT x C)
        self.lm_head = LinearWork(randn(BT, C), randn(BT, common.PADDED_VOCAB), randn(BT, C),
                                  randn(common.PADDED_VOCAB, C))
        self.depth = depth
        heads = lambda: randn(B, T, NH, C // NH).transpose(1, 2).detach()
        self.q, self.k, self.v = (heads().requires_grad_() for _ in range(3))
        self.dout = heads()

    def block_matmuls(self):
        for linear in self.block_linears:
            linear.run()

    def lm_head_matmuls(self):
        self.lm_head.run()

    def attention(self):
        for _ in range(self.depth):
            out = F.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=True)
            torch.autograd.grad(out, (self.q, self.k, self.v), self.dout)

    def step(self):
        self.block_matmuls()
        self.lm_head_matmuls()
        self.attention()


def timed_ms(run, warmup, reps):
    for _ in range(warmup):
        run()
    return common.median_step_ms(run, reps)


def floor_line(args, B):
    """The output line for batch size B, and whether it failed for a reason other than memory."""
    label = f"floor d{args.depth} B={B} T={args.seq_len}: "
    try:
        torch.manual_seed(args.seed)
        floor = StepFloor(args.depth, B, args.seq_len)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            step_ms = timed_ms(floor.step, args.warmup, args.reps)
            parts = [timed_ms(part, args.warmup, args.reps)
                     for part in (floor.block_matmuls, floor.lm_head_matmuls, floor.attention)]
    except Exception as err:  # out of memory, or cuDNN refusing the shape: a row, then the next batch size
        why = common.describe_failure(err)
        return label + (why if why == "out of memory" else "failed: " + why), why != "out of memory"
    tok_s = B * args.seq_len / (step_ms * 1e-3)
    return (label + f"{step_ms:.2f} ms/step {tok_s:.0f} tok/s (block matmuls {parts[0]:.2f} ms, "
            f"lm head {parts[1]:.2f} ms, attention {parts[2]:.2f} ms)"), False


def main():
    p = common.Parser(description="The cuBLAS + cuDNN floor of one GPT-2 training step (see the header comment).")
    p.add_argument("--depth", type=int, choices=sorted(common.GPT2_SHAPES), default=12,
                   help="12 (124M: C=768, NH=12), 24 (C=1024, NH=16) or 48 (C=1600, NH=25); default 12")
    p.add_argument("-b", "--batch", type=common.positive_int_list, default=[16], help="batch size(s), e.g. 16,64")
    p.add_argument("-t", "--seq-len", type=common.positive_int, default=1024, help="sequence length T (default 1024)")
    p.add_argument("--reps", type=common.positive_int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=common.positive_int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random matrices (default 0)")
    args = p.parse_args()
    common.require_cuda()
    print(common.header_line(f"seed {args.seed}"), flush=True)
    failed = False
    for B in args.batch:
        line, bad = floor_line(args, B)
        common.free_cuda_memory()  # floor_line has returned: its buffers are unreferenced
        print(line, flush=True)
        failed = failed or bad
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
