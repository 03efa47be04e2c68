"""`bundle serve` against `bundle run`'s own decoding (mode `vs-run`): the server is started, then prompt by prompt
`bundle run`'s library call in this process and the server take turns (each idle while the other decodes), so a
drift of the machine's speed falls on both alike.

Compared like with like: the decoder's rate (`stats.tokens_per_second`, prefill included; `bundle run` against
a request answered whole) and the streamed rate (tokens after the first over the time from the first piece of
text to the last; `bundle run`'s `on_text` against a streamed request's chunks); also the time to first token
of a streamed request and the aggregate tokens/s of 4 concurrent clients.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from serving.common import (
    TORCH_REF, Process, add_bundle_options, bundle_serve_argv, free_port, machine, read_prompt_set, stream, trusted_keys, whole,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    add_bundle_options(parser, TORCH_REF)
    parser.add_argument("--limit", type=int, default=4, help="the first N prompts of the set")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)


def _run(args: argparse.Namespace, trusted: dict, prompt: str) -> dict:
    """bundle run's own library call (verify, load, generate), with when each piece of text reached on_text."""
    from bundler.store.layout import Store
    from bundler.store.refs import parse_ref
    from bundler.verbs.run import run_bundle

    seen: list[float] = []
    result = run_bundle(Store(Path(args.store)), parse_ref(args.ref), trusted, prompt, max_new_tokens=args.max_tokens,
                        on_text=lambda _t: seen.append(time.perf_counter()))
    stats = result["stats"]
    streamed = (stats["new_tokens"] - 1) / (seen[-1] - seen[0]) if len(seen) > 1 and seen[-1] > seen[0] else None
    return {"tps": stats["tokens_per_second"], "stream_tps": streamed}


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v]
    return statistics.median(kept) if kept else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts = read_prompt_set(args.prompts)[: args.limit]
    trusted = trusted_keys(args.key)
    port = free_port()
    server = Process(bundle_serve_argv(args, port, []), port)
    runs, single, served = [], [], []
    try:
        stream(server.url, prompts[0], 8, model=args.ref)  # warm-up
        for _ in range(args.rounds):
            for p in prompts:
                runs.append(_run(args, trusted, p))
                single.append(stream(server.url, p, args.max_tokens, model=args.ref))
                served.append(whole(server.url, p, args.max_tokens, model=args.ref)["specbundle"]["stats"]["tokens_per_second"])
        start = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            concurrent = list(pool.map(lambda p: stream(server.url, p, args.max_tokens, model=args.ref), prompts * 2))
        wall = time.perf_counter() - start
    finally:
        server.stop()
    run_tps, run_stream = _median([r["tps"] for r in runs]), _median([r["stream_tps"] for r in runs])
    serve_tps, serve_stream = _median(served), _median([s["client_tps"] for s in single])
    return {
        **machine(), "ref": args.ref, "prompts": args.prompts, "limit": len(prompts), "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "run_tokens_per_second_median": run_tps, "serve_tokens_per_second_median": serve_tps,
        "serve_over_run": serve_tps / run_tps if serve_tps and run_tps else None,
        "run_stream_tokens_per_second_median": run_stream, "serve_stream_client_tokens_per_second_median": serve_stream,
        "serve_stream_over_run_stream": serve_stream / run_stream if serve_stream and run_stream else None,
        "ttft_s_median": statistics.median(s["ttft_s"] for s in single),
        "concurrent4_tokens_per_second": sum(c["tokens"] for c in concurrent) / wall,
    }
