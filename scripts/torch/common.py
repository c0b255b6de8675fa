# What the PyTorch comparison scripts of scripts/torch/ share, so that each is written once:
#   - fail() and Parser: bad input gets one line on stderr and exit status 1 (argparse's own error prints two);
#   - header_line(): the first output line of every script, naming PyTorch, CUDA and the device;
#   - median_kernel_ms() times one kernel (or one library call): CUDA events around each repetition, a 256 MB
#     write before each to flush the L2 cache, then a short GPU spin that hides the host's launch latency,
#     warm-up first, the median of many repetitions;
#   - median_step_ms() times a sequence run back to back (a training step): events between the steps, no sync,
#     no flush, so the time is what the GPU sustains, launch gaps included;
#   - describe_failure() and free_cuda_memory(): an out-of-memory configuration becomes one "out of memory"
#     word in the output and the script goes on with the next one, with the memory given back;
#   - GPT: GPT-2 as llm.c's train_gpt2.cu builds it (tied wte / LM head, tanh GELU, pre-layernorm blocks, llm.c's
#     init), and load_tokens() for llm.c's token files.
# Imported by sdpa_bench.py, gpt2_train.py, step_floor.py and r1.py (run from anywhere: Python puts the script's
# own folder, this one, first on its import path).
import argparse
import gc
import math
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 50257         # GPT-2's tokens
PADDED_VOCAB = 50304  # rounded up to a multiple of 128, as llm.c pads wte, for aligned LM-head matmuls
# GPT-2 shapes by depth L: (heads NH, channels C), as the project's C++ trainer names them with -e dL.
GPT2_SHAPES = {12: (12, 768), 24: (16, 1024), 48: (25, 1600)}


# ---- bad input: one line, non-zero exit ----

def peak_bf16_tflops():
    """The bf16 matmul ceiling every MFU of the project is measured against: read from llmc/peak.h, its one home."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "llmc", "peak.h")) as f:
        for line in f:
            if line.startswith("constexpr double PEAK_BF16_TFLOPS"):
                return float(line.split("=")[1].strip().rstrip(";"))
    raise RuntimeError("llmc/peak.h has no PEAK_BF16_TFLOPS")


def fail(message):
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line ("error: ... (see --help)") and exit status 1."""

    def error(self, message):
        fail(f"{message} (see --help)")


def positive_int(text):
    """argparse type: a positive integer; anything else is a one-line error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive integer")
    return value


def positive_int_list(text):
    """argparse type: "16" or "16,64" -> [16] or [16, 64], each a positive integer."""
    return [positive_int(s) for s in text.split(",")]


def require_cuda():
    if not torch.cuda.is_available():
        fail("no CUDA device visible to PyTorch (these scripts time GPU kernels)")


def header_line(*extra):
    """The first line every script prints: PyTorch, CUDA and device, then what the caller adds (its seed).
    No parentheses (sdpa_bench.py's parser reads "(B, H, T, D)" rows) and it does not start with "torch"
    (gpt2_train.py's result lines do)."""
    parts = [f"PyTorch {torch.__version__}", f"CUDA {torch.version.cuda}", torch.cuda.get_device_name()]
    return ", ".join(parts + [str(e) for e in extra])


# ---- timing ----

L2_FLUSH_BYTES = 256 << 20  # well over the H200's 50 MB L2: writing it evicts whatever a kernel left there
# After a synchronization the GPU is idle, so a start event recorded then would also time how long the host
# takes to launch the call (PyTorch's dispatch, the autograd engine: tens of microseconds, a large part of a
# 50-microsecond kernel). A spin kernel of about half a millisecond (at the H200's ~2 GHz), queued before the
# start event, keeps the GPU busy while the host launches: the call is queued before the GPU reaches the event.
LAUNCH_COVER_CYCLES = 1_000_000
_l2_flush_buffer = None


def flush_l2():
    global _l2_flush_buffer
    if _l2_flush_buffer is None:
        _l2_flush_buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    _l2_flush_buffer.zero_()


def median_kernel_ms(run, before=None, warmup=5, max_reps=100, min_reps=10, budget_s=2.0):
    """Median milliseconds of run() between two CUDA events. before() (untimed) runs ahead of every call, the
    warm-up ones too; the L2 is flushed after it. Stops at max_reps, or once min_reps are done and budget_s of
    wall time is spent (slow configurations still get min_reps)."""
    def prepare():
        if before is not None:
            before()
        flush_l2()
        torch.cuda._sleep(LAUNCH_COVER_CYCLES)

    for _ in range(warmup):
        prepare()
        run()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times, t0 = [], time.perf_counter()
    while len(times) < max_reps:
        prepare()
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
        if len(times) >= min_reps and time.perf_counter() - t0 >= budget_s:
            break
    return statistics.median(times)


def median_step_ms(step, steps):
    """Median milliseconds per step() over `steps` calls run back to back: an event is recorded between every
    two steps and the host waits only at the end, so it can queue ahead as in a training loop. Warm up first."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for i in range(steps):
        step()
        events[i + 1].record()
    events[-1].synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(events, events[1:]))


# ---- failures ----

def is_out_of_memory(err):
    """True if err, or an error it was raised from, is the GPU running out of memory (torch.compile and
    cuDNN wrap it in their own exceptions)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err)
        if isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower() or "ALLOC_FAILED" in text:
            return True
        err = err.__cause__ or err.__context__
    return False


def describe_failure(err):
    """One line for an output row: "out of memory", or the error's type and the first line of its message."""
    if is_out_of_memory(err):
        return "out of memory"
    lines = str(err).strip().splitlines()
    first = " ".join(lines[0].split()) if lines else ""
    return f"{type(err).__name__}: {first[:160]}" if first else type(err).__name__


def free_cuda_memory():
    """Give back what the last configuration held: its Python objects (call after the exception that ended it
    is gone: its traceback holds the tensors), torch.compile's caches and graphs, and the cached GPU blocks."""
    if "torch._dynamo" in sys.modules:  # imported by torch.compile; its caches may hold the compiled model
        sys.modules["torch._dynamo"].reset()
    gc.collect()
    torch.cuda.empty_cache()


# ---- GPT-2 ----

class Block(nn.Module):
    """One pre-layernorm transformer block: x + attention(ln1(x)), then + MLP(ln2(x)) with tanh GELU."""

    def __init__(self, channels, num_heads):
        super().__init__()
        C = channels
        self.num_heads = num_heads
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.attproj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        heads = (t.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2)
                 for t in self.qkv(self.ln1(x)).split(C, dim=2))
        # causal attention by whichever SDPA backend PyTorch picks (or the one a caller's sdpa_kernel forces)
        y = F.scaled_dot_product_attention(*heads, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.attproj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2 with llm.c's init: N(0, 0.02) for wte, wpe and every matmul weight, the two projections back into
    the residual stream (attproj, fcproj) N(0, 0.02/sqrt(2L)), biases 0, layernorm weights 1, and wte's padding
    rows (vocab_size..padded_vocab_size) 0. The LM head is wte itself (tied), so its matmul is padded_vocab_size
    wide; forward returns the mean cross-entropy over that whole width (the padding rows only add logits that
    training pushes down)."""

    def __init__(self, num_layers, num_heads, channels, vocab_size, padded_vocab_size, max_seq_len):
        super().__init__()
        L, C = num_layers, channels
        self.wte, self.wpe = nn.Embedding(padded_vocab_size, C), nn.Embedding(max_seq_len, C)
        self.blocks = nn.ModuleList(Block(C, num_heads) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if "proj" in name else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("weight"):  # layernorm
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)
        with torch.no_grad():
            self.wte.weight[vocab_size:].zero_()

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:T]
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # the LM head is wte
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def gpt2(depth, max_seq_len):
    """GPT-2 of depth 12, 24 or 48 (124M, 350M, 1.5B) with a position table of max_seq_len rows, on the CPU."""
    num_heads, channels = GPT2_SHAPES[depth]
    return GPT(depth, num_heads, channels, VOCAB, PADDED_VOCAB, max_seq_len)


def decay_groups(model, weight_decay):
    """AdamW's parameter groups as GPT-2 trains: weight decay on the 2-D weights only (wte, wpe, the matmul
    weights), none on biases and layernorm weights."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dim() == 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() != 2], "weight_decay": 0.0}]


# ---- data ----

TOKEN_FILE_MAGIC, TOKEN_FILE_VERSION, TOKEN_HEADER_BYTES = 20240520, 1, 1024


def load_tokens(path, vocab_size=VOCAB):
    """llm.c's token file: a header of 256 int32 (magic 20240520, version 1, token count, then unused), then
    the tokens as uint16. Returns them as an int64 CPU tensor; a file that is not such a file, or holds a
    token the model has no embedding for, is a one-line error."""
    if not os.path.isfile(path):
        fail(f"{path}: no such file")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header = f.read(TOKEN_HEADER_BYTES)
        if len(header) < TOKEN_HEADER_BYTES:
            fail(f"{path}: {size} bytes, shorter than a token file's {TOKEN_HEADER_BYTES}-byte header")
        magic, version, n = struct.unpack("<3i", header[:12])
        if magic != TOKEN_FILE_MAGIC or version != TOKEN_FILE_VERSION:
            fail(f"{path}: not a version-{TOKEN_FILE_VERSION} llm.c token file (magic {magic}, version {version})")
        if n <= 0 or size < TOKEN_HEADER_BYTES + 2 * n:  # checked before reading: no allocation from a bad count
            fail(f"{path}: the header says {n} tokens, the file holds {(size - TOKEN_HEADER_BYTES) // 2}")
        tokens = np.frombuffer(f.read(2 * n), dtype="<u2")
    top = int(tokens.max())
    if top >= vocab_size:
        fail(f"{path}: token id {top} is not below the vocabulary size {vocab_size}")
    return torch.from_numpy(tokens.astype(np.int64))
