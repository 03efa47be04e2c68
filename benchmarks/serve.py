"""`bundle serve` against `bundle run` on the same bundle, same prompts, same machine (run after `make demo`):

- tokens/s of one streamed request (server-side decode rate from the response's stats, and as the client sees
  it: completion tokens over the time from the first to the last chunk) against `bundle run`'s (in this
  process, the same library call `bundle run` makes);
- time to first token of a streamed request (client side, from sending to the first text chunk);
- throughput with 4 concurrent clients (all completion tokens over the wall time).

    python benchmarks/serve.py [--ref smollm2-spec:1.0.0] [--store demo/work/store] [--key demo/work/keys/bundle.pub]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bundler.trust.keys import key_id, load_public_key  # noqa: E402
from bundler.store.refs import parse_ref  # noqa: E402
from bundler.verbs.run import run_bundle  # noqa: E402
from bundler.store.layout import Store  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stream(url: str, ref: str, prompt: str, max_tokens: int) -> dict:
    start = time.perf_counter()
    first = last = None
    body = {"model": ref, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    usage = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
    tokens = usage["completion_tokens"] if usage else 0
    return {"ttft_s": (first or start) - start, "tokens": tokens,
            "client_tps": (tokens - 1) / (last - first) if first and last and last > first else None}


def _whole(url: str, ref: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": ref, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def _run(store: str, ref: str, trusted: dict, prompt: str, max_tokens: int) -> dict:
    """bundle run's own library call (verify, load, generate), with when each piece of text reached on_text."""
    seen: list[float] = []
    result = run_bundle(Store(Path(store)), parse_ref(ref), trusted, prompt, max_new_tokens=max_tokens,
                        on_text=lambda _t: seen.append(time.perf_counter()))
    stats = result["stats"]
    stream = (stats["new_tokens"] - 1) / (seen[-1] - seen[0]) if len(seen) > 1 and seen[-1] > seen[0] else None
    return {"tps": stats["tokens_per_second"], "stream_tps": stream}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", default="smollm2-spec:1.0.0")
    ap.add_argument("--store", default="demo/work/store")
    ap.add_argument("--key", default="demo/work/keys/bundle.pub")
    ap.add_argument("--prompts", default="runner/bench/prompts.jsonl")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    prompts = [json.loads(line)["prompt"] for line in Path(args.prompts).read_text().splitlines() if line.strip()][: args.limit]
    key = load_public_key(Path(args.key))
    trusted = {key_id(key): key}

    port = _port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "bundler", "serve", args.ref, "--store", args.store, "--key", args.key, "--port", str(port)],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    runs, single, served = [], [], []
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        _stream(url, args.ref, prompts[0], 8)  # warm-up
        # Prompt by prompt, bundle run (in this process) and the server (idle while run decodes, and the other
        # way round) take turns, so a drift of the machine's speed falls on both alike.
        for _ in range(args.rounds):
            for p in prompts:
                runs.append(_run(args.store, args.ref, trusted, p, args.max_tokens))
                single.append(_stream(url, args.ref, p, args.max_tokens))
                served.append(_whole(url, args.ref, p, args.max_tokens)["specbundle"]["stats"]["tokens_per_second"])
        start = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            concurrent = list(pool.map(lambda p: _stream(url, args.ref, p, args.max_tokens), prompts * 2))
        wall = time.perf_counter() - start
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    run_tps = [r["tps"] for r in runs]
    run_client_tps = [r["stream_tps"] for r in runs if r["stream_tps"]]
    client_tps = [s["client_tps"] for s in single if s["client_tps"]]
    out = {
        "prompts": len(prompts), "rounds": args.rounds, "max_tokens": args.max_tokens,
        # The decoder's own rate (stats.tokens_per_second: new tokens over the generation's time, prefill in),
        # bundle run's against a non-streamed request's.
        "run_tokens_per_second_median": statistics.median(run_tps),
        "serve_tokens_per_second_median": statistics.median(served),
        "serve_over_run": statistics.median(served) / statistics.median(run_tps),
        # As a reader sees it: tokens after the first over the time from the first piece of text to the last,
        # bundle run's on_text against a streamed request's chunks.
        "run_stream_tokens_per_second_median": statistics.median(run_client_tps) if run_client_tps else None,
        "serve_stream_client_tokens_per_second_median": statistics.median(client_tps) if client_tps else None,
        "serve_stream_over_run_stream": statistics.median(client_tps) / statistics.median(run_client_tps)
        if client_tps and run_client_tps else None,
        "ttft_s_median": statistics.median(s["ttft_s"] for s in single),
        "concurrent4_tokens_per_second": sum(c["tokens"] for c in concurrent) / wall,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
