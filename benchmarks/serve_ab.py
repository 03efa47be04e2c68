"""Two `bundle serve` processes of one bundle at one client, taking turns request by request (the finest
interleaving, for differences of a few percent that serve_load.py's batches cannot settle on a noisy machine):
each gets the same warm-up requests first, then the same prompts in an order that alternates every request
(ABBA); reports each server's tokens/s over its own requests, their ratio, what each request did (whether the
draft ran, the guard's reason) and the CPU each server's threads used per token (/proc/PID/task).

    python benchmarks/serve_ab.py [--ref smollm2-spec-gguf:1.0.0] [--a ""] [--b "--no-draft"] [--warm 8] [--requests 12]
    python benchmarks/serve_ab.py --a "--sequences 1 --no-draft" --b llama-server   # against llama-server, 1 slot
    python benchmarks/serve_ab.py --stream ...   # streamed requests, as serve_load.py sends them

Run it twice with --a and --b swapped: the process started first can differ from the second by a percent or two
on a VM, and two identical servers (--a "--no-draft" --b "--no-draft") give the spread to read a ratio against.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from serve_load import Process, _port, gguf_files, llama_server, llama_server_argv, stream  # noqa: E402


def start(args: argparse.Namespace, extra: list[str]) -> Process:
    """`bundle serve` with the extra options; or, for `llama-server`, llama-server on the bundle's target file with one
    slot and the threads bundle serve gives llama.cpp (its binary from serve_load.py --build)."""
    port = _port()
    if extra == ["llama-server"]:
        with gguf_files(args.ref, args.store, args.key) as (files, threads):  # llama-server maps the file at start
            return Process(llama_server_argv(llama_server(build=False), files["target"], port, threads, slots=1), port)
    argv = [sys.executable, "-m", "bundler", "serve", args.ref, "--store", args.store, "--key", args.key, "--port", str(port),
            "--sequences", "8", "--max-queue", "64", *extra]
    return Process(argv, port, {"PYTHONPATH": str(ROOT)})


def ask(url: str, prompt: str, max_tokens: int) -> tuple[float, int, dict]:
    """One greedy chat request, answered whole: its seconds, completion tokens and the server's stats of it."""
    t0 = time.perf_counter()
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=300).json()
    return time.perf_counter() - t0, answer["usage"]["completion_tokens"], answer.get("specbundle", {}).get("stats", {})


def ask_streamed(url: str, prompt: str, max_tokens: int) -> tuple[float, int, dict]:
    """The same request streamed, as serve_load.py sends it (a chunk a token: the event loop's share of the CPU
    shows); a stream brings no server stats."""
    t0 = time.perf_counter()
    tokens = stream(url, prompt, max_tokens)["tokens"]
    return time.perf_counter() - t0, tokens, {}


def thread_cpu(pid: int) -> dict[str, tuple[str, float]]:
    """Each of a process's threads: its name and CPU seconds."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="smollm2-spec-gguf:1.0.0")
    ap.add_argument("--store", default="demo/work/store")
    ap.add_argument("--key", default="demo/work/keys/bundle.pub")
    ap.add_argument("--prompts", default=str(ROOT / "runner" / "bench" / "prompts.jsonl"))
    ap.add_argument("--a", default="", help="server A's extra `bundle serve` options")
    ap.add_argument("--b", default="--no-draft", help="server B's extra `bundle serve` options, or `llama-server`")
    ap.add_argument("--warm", type=int, default=8)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--stream", action="store_true", help="streamed requests (serve_load.py's) instead of whole answers")
    args = ap.parse_args()
    request = ask_streamed if args.stream else ask
    prompts = [json.loads(line)["prompt"] for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    servers = {"a": start(args, args.a.split()), "b": start(args, args.b.split())}
    totals = {name: [0.0, 0] for name in servers}
    try:
        for i in range(args.warm):
            for proc in servers.values():
                request(proc.url, prompts[i % len(prompts)], args.max_tokens)
        before = {name: thread_cpu(proc.proc.pid) for name, proc in servers.items()}
        for i in range(args.requests):
            prompt = prompts[(args.warm + i) % len(prompts)]
            for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
                seconds, tokens, stats = request(servers[name].url, prompt, args.max_tokens)
                totals[name][0] += seconds
                totals[name][1] += tokens
                print(json.dumps({"server": name, "seconds": round(seconds, 3), "tokens": tokens,
                                  "speculative_iterations": stats.get("speculative_iterations"),
                                  "fallback": (stats.get("fallback") or {}).get("reason"),
                                  **{k: stats.get(k) for k in ("acceptance_rate", "cost_ratio", "verify_cost_ratio", "verify_slope",
                                                               "predicted_speedup", "realized_speedup", "plain_steps")}}),
                      file=sys.stderr, flush=True)
        cpu = {}
        for name, proc in servers.items():
            after = thread_cpu(proc.proc.pid)
            used = sorted(((seconds - before[name].get(t, ("", 0.0))[1], thread) for t, (thread, seconds) in after.items()), reverse=True)
            cpu[name] = [[thread, round(u / totals[name][1] * 1e6)] for u, thread in used if u > 0.01]  # us a token, busiest first
    finally:
        for proc in servers.values():
            proc.stop()
    from runner.bench.machine import cpu_info

    tps = {name: tokens / seconds for name, (seconds, tokens) in totals.items()}
    print(json.dumps({"cpu": cpu_info(), "ref": args.ref, "a": args.a, "b": args.b, "stream": args.stream, "tokens_per_second": tps,
                      "a_over_b": tps["a"] / tps["b"], "thread_cpu_us_per_token": cpu}, indent=2))


if __name__ == "__main__":
    main()
