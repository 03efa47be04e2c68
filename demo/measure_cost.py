"""Measure per-token decode cost (warm KV cache, one token per forward) of the target and of candidate
draft shapes, to choose a draft for measured speed-up rather than acceptance alone.

    .venv/bin/python demo/measure_cost.py [--threads N] [--shapes 2x256,1x256,2x192] [--draft demo/draft]

Prints one JSON line per model and dtype: ms per token (median of repeats), and ms for a 5-token pass.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, LlamaForCausalLM

DEMO = Path(__file__).resolve().parent


def draft_config(layers: int, hidden: int, vocab: int = 49152) -> LlamaConfig:
    """A small Llama sharing the target's vocabulary, head_dim 64 and rope settings."""
    heads = max(1, hidden // 64)
    return LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, head_dim=64, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
        pad_token_id=2,
    )


@torch.inference_mode()
def per_token_ms(model: torch.nn.Module, prefix: int = 64, steps: int = 48, block: int = 1) -> float:
    """Median wall ms of a `block`-token forward on a warm cache of `prefix` tokens."""
    ids = torch.randint(10, 40000, (1, prefix))
    cache = DynamicCache()
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    times = []
    nxt = torch.randint(10, 40000, (1, block))
    for _ in range(steps):
        t0 = time.perf_counter()
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -block:].argmax(-1)
        times.append(time.perf_counter() - t0)
        if block > 1:
            cache.crop(-(block - 1))  # keep the cache growing by one token a step, as accepted-1 would
    return statistics.median(times[4:]) * 1000


def main() -> int:
    """Measure the target (if converted) and each draft shape in fp32 and bf16."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=int(os.environ.get("DEMO_THREADS", "1")))
    ap.add_argument("--shapes", default="2x256,1x256,2x192,2x128,4x256")
    ap.add_argument("--target", default=str(DEMO / "work" / "target"))
    ap.add_argument("--draft", default=None, help="a saved draft directory to measure too")
    ap.add_argument("--no-target", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models: list[tuple[str, torch.nn.Module]] = []
    if not args.no_target and Path(args.target).exists():
        models.append(("target", AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32)))
    if args.draft:
        models.append(("draft", AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32)))
    for s in filter(None, args.shapes.split(",")):
        layers, hidden = (int(x) for x in s.split("x"))
        models.append((f"draft-{s}", LlamaForCausalLM(draft_config(layers, hidden))))
    for name, model in models:
        model.eval()
        params = sum(p.numel() for p in model.parameters())
        for dtype in (torch.float32, torch.bfloat16):
            model.to(dtype)
            row = {"model": name, "params_M": round(params / 1e6, 1), "dtype": str(dtype).split(".")[-1],
                   "threads": args.threads, "ms_1tok": round(per_token_ms(model), 2)}
            if name == "target":
                row["ms_5tok"] = round(per_token_ms(model, block=5, steps=24), 2)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
