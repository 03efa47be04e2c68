"""Where a batched decoding step's time goes, next to this machine's roofline (mode `profile`; issue 50).

A step of B sequences, each adding one token, through runner.decoding.batching's shared context on the compact
torch forward (as `bundle serve` runs the torch demo bundle), at B = 1, 4, 8, 16, under torch's profiler. Each
operator's own CPU time is put in one of a few bins (matmuls, attention over the cache, casts and copies,
normalisation and activations, sampling, the rest of the operators) and the step's wall time not spent inside an
operator is Python (layers, the batch's bookkeeping). The HTTP and queue layers are not in a step: `--mode
vs-run` measures them (serve against run on the same prompts).

The roofline: the bytes a step must read (the target's weights; the cache is small at CONTEXT positions) over
the memory bandwidth measured here (a sum over a buffer far larger than the caches, all threads), and the
arithmetic peak measured here (a large matmul in the step's dtype). At one sequence a step cannot beat
bandwidth / weight bytes tokens per second; at B sequences it reads the weights once for B tokens, until the
arithmetic (2 x parameters x B flops) binds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from serving.common import machine

CONTEXT = 256
BINS = (  # (bin, operator-name fragments), first match wins
    ("matmul", ("mm", "linear", "matmul", "addmm", "bmm", "baddbmm", "mkldnn", "onednn")),
    ("attention", ("attention", "softmax", "sdpa", "flash")),
    ("casts and copies", ("copy", "to_copy", "::to", "contiguous", "clone", "cat", "index", "gather", "scatter", "slice", "select", "view", "reshape", "transpose", "expand", "empty", "narrow", "stack", "split", "unsqueeze", "permute")),
    ("norm and activations", ("rsqrt", "pow", "mean", "silu", "mul", "add", "neg", "cos", "sin", "sigmoid", "div", "sub")),
    ("sampling", ("argmax", "topk", "sort", "multinomial", "max", "where")),
)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="a safetensors model directory (the bundle's target)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sequences", default="1,4,8,16")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--dtype", default="bfloat16")


def _bin(name: str) -> str:
    low = name.lower()
    for label, parts in BINS:
        if any(p in low for p in parts):
            return label
    return "other operators"


def bandwidth_gbs(threads: int) -> float:
    """Read bandwidth: the best of a few sums over a 1 GiB float32 buffer (far beyond any cache), in GB/s."""
    import torch

    torch.set_num_threads(threads)
    buf = torch.ones(1 << 28, dtype=torch.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - start)
    return buf.numel() * 4 / best / 1e9


def peak_gflops(dtype: str, threads: int) -> float:
    """Arithmetic peak in the step's dtype: the best of a few 2048^3 matmuls."""
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(2048, 2048).to(getattr(torch, dtype))
    b = torch.randn(2048, 2048).to(getattr(torch, dtype))
    a @ b
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 2048**3 / best / 1e9


def _profile(ctx: Any, b: int, prompt: list[int], repeat: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    rows = [(seq, [prompt[seq % len(prompt)]], False) for seq in range(b)]
    walls = []
    for _ in range(3):  # warm
        ctx.decode(rows)
        for seq in range(b):
            ctx.keep(seq, len(prompt))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeat):
            start = time.perf_counter()
            ctx.decode(rows)
            walls.append(time.perf_counter() - start)
            for seq in range(b):
                ctx.keep(seq, len(prompt))
    bins: dict[str, float] = {}
    for event in prof.key_averages():
        bins[_bin(event.key)] = bins.get(_bin(event.key), 0.0) + event.self_cpu_time_total / 1e6
    total_wall = sum(walls)
    # threads run operators in parallel inside one op; self CPU time is the calling thread's, so the sums fit in wall time
    ops = sum(bins.values())
    shares = {k: round(v / total_wall, 3) for k, v in sorted(bins.items(), key=lambda kv: -kv[1])}
    shares["python and the rest"] = round(max(0.0, total_wall - ops) / total_wall, 3)
    step = statistics.median(walls)
    return {"step_ms": round(step * 1e3, 2), "tokens_per_s": round(b / step, 1), "shares_of_wall": shares}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from runner.decoding.batching import shared_context
    from runner.models.loading import ModelFiles, load_models

    torch.set_num_threads(args.threads)
    model = load_models([ModelFiles(Path(args.target))], args.dtype, "cpu", compact=True)[0]
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) if hasattr(model, "parameters") else None
    sizes = [int(b) for b in args.sequences.split(",")]
    ctx = shared_context(model, max(sizes), CONTEXT)
    prompt = list(range(100, 132))
    for seq in range(max(sizes)):
        ctx.decode([(seq, prompt, False)])
    steps = {f"B={b}": _profile(ctx, b, prompt, args.repeat) for b in sizes}
    bw = bandwidth_gbs(args.threads)
    peak = peak_gflops(args.dtype, args.threads)
    roof = {"bandwidth_gbs": round(bw, 1), f"peak_gflops_{args.dtype}": round(peak, 1), "weight_bytes": weight_bytes}
    if weight_bytes:
        params = weight_bytes / torch.tensor([], dtype=getattr(torch, args.dtype)).element_size()
        roof["one_sequence_roof_tokens_per_s"] = round(bw * 1e9 / weight_bytes, 1)
        roof["arithmetic_roof_tokens_per_s"] = round(peak * 1e9 / (2 * params), 1)
        one = steps.get("B=1")
        if one:
            roof["B=1_share_of_roof"] = round(one["tokens_per_s"] / roof["one_sequence_roof_tokens_per_s"], 3)
    return {**machine(), "threads": args.threads, "target": args.target, "dtype": args.dtype, "context": CONTEXT,
            "steps": steps, "roofline": roof}
