"""What a batched pass costs on this machine, in single target steps: B sequences each adding one token (plain
decoding of B requests) or k + 1 tokens (B requests each verifying k drafts), through runner.decoding.batching's shared
context, on a GGUF target (llama.cpp) or a safetensors model directory (torch, our compact forward). This is the
curve the per-sequence guards of `bundle serve` judge with (each request is charged its tokens' share of a
pass): where T(B * (k + 1)) / T(B) approaches k + 1, no draft can pay; and B / T(B) is what batching B requests
gains over decoding them one after another.

    python benchmarks/batch_cost.py TARGET.gguf|MODEL_DIR [--threads 2] [--dtype bfloat16] [--sequences 1,2,4,8] [--k 0,2,4] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.decoding.batching import shared_context  # noqa: E402
from runner.engines.llamacpp import load  # noqa: E402
from runner.models.loading import ModelFiles, load_models  # noqa: E402
from runner.bench.machine import cpu_info  # noqa: E402

CONTEXT = 256  # positions per sequence: a short context, so the pass measures the weights, not attention


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--sequences", default="1,2,4,8")
    ap.add_argument("--k", default="0,2,4")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--dtype", default="bfloat16", help="a model directory's dtype (torch)")
    args = ap.parse_args()
    sizes, ks = [int(b) for b in args.sequences.split(",")], [int(k) for k in args.k.split(",")]
    if Path(args.target).is_dir():  # torch: the compact forward over the directory's weights
        import torch

        torch.set_num_threads(args.threads)
        model = load_models([ModelFiles(Path(args.target))], args.dtype, "cpu", compact=True)[0]
    else:
        model = load(args.target, n_ctx=CONTEXT, threads=args.threads)
    ctx = shared_context(model, max(sizes), CONTEXT)
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
    step = statistics.median(times[(1, 0)])
    out = {"cpu": cpu_info(), "load_average": os.getloadavg(), "threads": args.threads, "target": args.target,
           "engine": type(ctx).__name__, "single_step_s": step,
           "cost_in_steps": {f"B={b} k={k}": round(statistics.median(times[(b, k)]) / step, 3) for b in sizes for k in ks}}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
