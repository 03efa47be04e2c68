"""Two servers of one bundle at one client, taking turns request by request (mode `ab`): the finest interleaving,
for differences of a few percent that a load round cannot settle on a noisy machine.

Each server gets the same warm-up requests first, then the same prompts in an order that alternates every
request (ABBA); reported: each server's tokens/s over its own requests, their ratio, what each request did
(whether the draft ran, the guard's reason) and the CPU each server's threads used a token (/proc/PID/task).
`--b llama-server` is llama.cpp's server with one slot on the bundle's target file (benchmarks/llamacpp_tools.py).
Run it twice with --a and --b swapped: the process started first can differ from the second by a percent or two
on a VM, and two identical servers (--a "--no-draft" --b "--no-draft") give the spread to read a ratio against.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from serving.common import (
    Process, add_bundle_options, bundle_serve_argv, free_port, gguf_files, machine, proc_cpu, read_prompt_set, stream, whole,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    add_bundle_options(parser)
    parser.add_argument("--a", default="", help="server A's extra `bundle serve` options")
    parser.add_argument("--b", default="--no-draft", help="server B's extra `bundle serve` options, or `llama-server`")
    parser.add_argument("--warm", type=int, default=8)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--stream", action="store_true", help="streamed requests (as mode load sends them) instead of whole answers")


def start(args: argparse.Namespace, extra: list[str]) -> Process:
    """`bundle serve` with the extra options and 8 sequences; or, for `llama-server`, llama-server on the bundle's
    target file with one slot and the threads bundle serve gives llama.cpp."""
    port = free_port()
    if extra == ["llama-server"]:
        from llamacpp_tools import server_argv, tool

        with gguf_files(args.ref, args.store, args.key) as (files, threads):  # llama-server maps the file at start
            return Process(server_argv(tool("llama-server"), files["target"], port, threads, slots=1), port)
    return Process(bundle_serve_argv(args, port, ["--sequences", "8", *extra]), port)


def ask(url: str, prompt: str, max_tokens: int, streamed: bool) -> tuple[float, int, dict]:
    """One greedy chat request: its seconds, completion tokens and the server's stats of it (none when streamed:
    a stream is answered a chunk a token, so the event loop's share of the CPU shows)."""
    t0 = time.perf_counter()
    if streamed:
        tokens, stats = stream(url, prompt, max_tokens)["tokens"], {}
    else:
        answer = whole(url, prompt, max_tokens)
        tokens, stats = answer["usage"]["completion_tokens"], answer.get("specbundle", {}).get("stats", {})
    return time.perf_counter() - t0, tokens, stats


def thread_cpu(pid: int) -> dict[str, tuple[str, float]]:
    """Each of a process's threads: its name and CPU seconds."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[tid] = proc_cpu(f"/proc/{pid}/task/{tid}/stat")
        except FileNotFoundError:
            continue
    return out


def _log(name: str, seconds: float, tokens: int, stats: dict) -> None:
    keys = ("acceptance_rate", "cost_ratio", "verify_cost_ratio", "verify_slope", "predicted_speedup", "realized_speedup", "plain_steps")
    print(json.dumps({"server": name, "seconds": round(seconds, 3), "tokens": tokens,
                      "speculative_iterations": stats.get("speculative_iterations"),
                      "fallback": (stats.get("fallback") or {}).get("reason"), **{k: stats.get(k) for k in keys}}),
          file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts = read_prompt_set(args.prompts)
    servers = {"a": start(args, args.a.split()), "b": start(args, args.b.split())}
    totals = {name: [0.0, 0] for name in servers}
    try:
        for i in range(args.warm):
            for proc in servers.values():
                ask(proc.url, prompts[i % len(prompts)], args.max_tokens, args.stream)
        before = {name: thread_cpu(proc.proc.pid) for name, proc in servers.items()}
        for i in range(args.requests):
            prompt = prompts[(args.warm + i) % len(prompts)]
            for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
                seconds, tokens, stats = ask(servers[name].url, prompt, args.max_tokens, args.stream)
                totals[name][0] += seconds
                totals[name][1] += tokens
                _log(name, seconds, tokens, stats)
        cpu = {}
        for name, proc in servers.items():
            after = thread_cpu(proc.proc.pid)
            used = sorted(((seconds - before[name].get(t, ("", 0.0))[1], thread) for t, (thread, seconds) in after.items()), reverse=True)
            cpu[name] = [[thread, round(u / max(1, totals[name][1]) * 1e6)] for u, thread in used if u > 0.01]  # us a token, busiest first
    finally:
        for proc in servers.values():
            proc.stop()
    tps = {name: tokens / seconds for name, (seconds, tokens) in totals.items()}
    return {**machine(), "ref": args.ref, "prompts": args.prompts, "a": args.a, "b": args.b, "stream": args.stream,
            "tokens_per_second": tps, "a_over_b": tps["a"] / tps["b"], "thread_cpu_us_per_token": cpu}
