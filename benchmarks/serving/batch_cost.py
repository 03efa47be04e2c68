"""What a batched pass costs on this machine, in single target steps (mode `batch-cost`): B sequences each adding
one token (plain decoding of B requests) or k + 1 tokens (B requests each verifying k drafts), through
runner.decoding.batching's shared context, on a GGUF target (llama.cpp) or a safetensors model directory (torch,
the compact forward). The per-request guards of `bundle serve` judge with this curve (each request is charged its
tokens' share of a pass): where T(B * (k + 1)) / T(B) approaches k + 1, no draft can pay; B / T(B) is what
batching B requests gains over decoding them one after another.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from serving.common import machine

CONTEXT = 256  # positions per sequence: a short context, so the pass measures the weights, not attention


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="a GGUF file or a safetensors model directory")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sequences", default="1,2,4,8")
    parser.add_argument("--k", default="0,2,4")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--dtype", default="bfloat16", help="a model directory's dtype (torch)")


def _context(args: argparse.Namespace, sequences: int) -> Any:
    """The engine's batch context over the target, room for `sequences` sequences of CONTEXT positions."""
    from runner.decoding.batching import shared_context

    if Path(args.target).is_dir():  # torch: the compact forward over the directory's weights
        import torch

        from runner.models.loading import ModelFiles, load_models

        torch.set_num_threads(args.threads)
        model = load_models([ModelFiles(Path(args.target))], args.dtype, "cpu", compact=True)[0]
    else:
        from runner.engines.llamacpp import load

        model = load(args.target, n_ctx=CONTEXT, threads=args.threads)
    return shared_context(model, sequences, CONTEXT)


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes, ks = [int(b) for b in args.sequences.split(",")], [int(k) for k in args.k.split(",")]
    ctx = _context(args, max(sizes))
    prompt = list(range(100, 132))
    times: dict[tuple[int, int], list[float]] = {(b, k): [] for b in sizes for k in ks}
    for seq in range(max(sizes)):
        ctx.decode([(seq, prompt, False)])
    for _ in range(args.repeat):  # the shapes take turns, so a drift of the machine falls on all alike
        for b in sizes:
            for k in ks:
                rows = [(seq, [prompt[seq % len(prompt)]] * (k + 1), k > 0) for seq in range(b)]
                start = time.perf_counter()
                ctx.decode(rows)
                times[(b, k)].append(time.perf_counter() - start)
                for seq in range(b):
                    ctx.keep(seq, len(prompt))
    step = statistics.median(times[(1, 0)]) if (1, 0) in times else statistics.median(next(iter(times.values())))
    return {**machine(), "threads": args.threads, "target": args.target, "engine": type(ctx).__name__, "single_step_s": step,
            "cost_in_steps": {f"B={b} k={k}": round(statistics.median(times[(b, k)]) / step, 3) for b in sizes for k in ks}}
