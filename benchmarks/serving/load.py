"""`bundle serve` under load against `llama-server` on the same GGUF files, threads and machine, and against
vLLM's CPU engine on the same safetensors files (mode `load`).

- `llama-server` is llama.cpp's own, built from the source the installed llama-cpp-python vendors
  (benchmarks/llamacpp_tools.py; opt-in: `--build`, cached in ~/.cache/specbundle/llama-server);
- vLLM is its CPU build in its own venv (`make vllm`; `--vllm-python`, default .venv-vllm/bin/python), started
  with the command line `bundle serve --runtime vllm` gives it (benchmarks/serving/vllm.py);
- one client for all: streamed `/v1/chat/completions` over the prompt set, greedy, a fresh connection per
  request, at 1, 4 and 8 concurrent clients;
- per configuration: aggregate tokens/s (all completion tokens over the wall time), time to first token
  p50/p99, inter-token latency p50/p99 (the gaps between streamed pieces of text, over the tokens in them);
- servers (`--servers`): `bundle` (as shipped), `bundle-plain` (`--no-draft`: its own plain serving),
  `bundle-1` (`--sequences 1`: one request at a time, what batching gains), `llama` (`llama-server -np N`),
  `llama-draft` (with the draft: `--spec-type draft-simple --spec-draft-n-max` --draft-max),
  `llama-ngram-simple` and `llama-ngram-map-k` (`--spec-type ngram-simple` / `ngram-map-k`, no draft model, on
  llama.cpp's defaults: a 12-token lookup, drafts up to 48 tokens; --draft-max sets llama-draft's only);
  `vllm-fp32-bind` and `vllm-bf16-bind` (fp32 / bf16, the engine bound to every core:
  `VLLM_CPU_OMP_THREADS_BIND=0-<n-1>`), `vllm-fp32` and `vllm-bf16` (vLLM's own thread defaults), and
  `vllm-draft-bind` (fp32 bound, the bundle's draft as vLLM's speculative model). A GGUF bundle runs the bundle
  and llama-* servers (without a draft, all but `llama-draft`); a safetensors bundle the bundle and vllm-* servers;
- per concurrency, besides the fixed ratios, `best_llama` and `best_vllm`: the llama-* / vllm-* server of the run
  with the most tokens/s over the run, and `bundle` and `bundle-plain` over it (tokens/s over the run and per
  round, TTFT p99 per round and of the rounds' medians), the figure of "at least the peer's best set-up"
  whichever it is;
- `--pause-idle`: every server but the one taking its turn is stopped (SIGSTOP to its session, SIGCONT for its
  turn): an idle vLLM CPU engine keeps a core 50-90% busy, which on 2 cores slowed the other servers' turns.

    serve_bench.py --mode load --servers bundle,llama,llama-draft,llama-ngram-simple,llama-ngram-map-k \\
        [--clients 1] [--prompts grounded]
    serve_bench.py --mode load --ref smollm2-spec:1.0.0 \\
        --servers bundle,bundle-plain,vllm-fp32-bind,vllm-bf16-bind,vllm-fp32,vllm-bf16 [--vllm-python PY]

All servers are started first and stay up, once per concurrency N (`llama-server -np N`, `bundle serve
--sequences N`: each pair sees the same requests in the same order, so their prompt caches hold the same), but
each vLLM server once for the run (`--max-num-seqs` the largest N: it takes minutes to start); they take turns
of N x --requests-per-client requests, as many turns a round as give each server --min-requests, in an order
that reverses at every turn (ABBA ABBA): short turns that alternate often share a drift of the machine's speed
out evenly, where one long turn a server lets a swell favour the servers in the middle.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from serving import vllm
from serving.common import (
    Process, add_bundle_options, bundle_serve_argv, checked_bundle, free_port, gguf_files, machine, percentile,
    read_prompt_set, stream,
)

# llama-server's servers: name -> its --spec-type (None: plain)
LLAMA_SERVERS = {"llama": None, "llama-draft": "draft-simple", "llama-ngram-simple": "ngram-simple",
                 "llama-ngram-map-k": "ngram-map-k"}
SERVERS = ("bundle", "bundle-plain", "bundle-1", *LLAMA_SERVERS, *vllm.VLLM_SERVERS)
RATIOS = (("bundle", "llama"), ("bundle", "bundle-plain"), ("bundle", "bundle-1"), ("llama-draft", "llama"),
          ("llama-ngram-simple", "llama"), ("llama-ngram-map-k", "llama"), ("vllm-draft-bind", "vllm-fp32-bind"))
PEERS = {"llama": LLAMA_SERVERS, "vllm": vllm.VLLM_SERVERS}  # best_<family>: the family's server with the most tokens/s


def add_options(parser: argparse.ArgumentParser) -> None:
    add_bundle_options(parser)
    parser.add_argument("--clients", default="1,4,8")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--min-requests", type=int, default=16,
                        help="requests each server answers in a round at every concurrency, at least (in turns of N x "
                             "--requests-per-client)")
    parser.add_argument("--warmup", type=int, default=4,
                        help="whole requests each server answers before the rounds (a bundle server with no run history "
                             "for this machine speculates in its first three and then knows whether the draft pays)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-max", type=int, default=4,
                        help="llama-draft's --spec-draft-n-max (the n-gram servers keep llama.cpp's defaults)")
    parser.add_argument("--servers", default="bundle,bundle-plain,llama,llama-draft",
                        help="comma-separated, of: " + ", ".join(SERVERS))
    parser.add_argument("--build", action="store_true", help="build llama-server if it is not cached")
    parser.add_argument("--pause-idle", action="store_true",
                        help="every server but the one taking its turn stopped (SIGSTOP to its session, SIGCONT for its "
                             "turn): an idle vLLM CPU engine keeps a core busy and would slow the others' turns")
    parser.add_argument("--dtype", help="bundle serve's --dtype (a safetensors bundle; default: the bundle's)")
    vllm.add_options(parser)


def _starter(args: argparse.Namespace, binary: Path | None, files: dict[str, Path | None], threads: int):
    """start(name, clients) -> the bundle or llama-* server `name` with room for `clients` at once."""
    from llamacpp_tools import server_argv

    def start(name: str, clients: int) -> Process:
        port = free_port()
        if name.startswith("bundle"):
            extra = ["--sequences", str(1 if name == "bundle-1" else clients)]  # as llama-server's -np N
            extra += (["--dtype", args.dtype] if args.dtype else []) + (["--no-draft"] if name == "bundle-plain" else [])
            return Process(bundle_serve_argv(args, port, extra), port, own_session=args.pause_idle)
        draft = name == "llama-draft"
        return Process(server_argv(binary, files["target"], port, threads, slots=clients, spec_type=LLAMA_SERVERS[name],
                                   draft=files["draft"] if draft else None,
                                   draft_max=args.draft_max if draft else None), port, own_session=args.pause_idle)

    return start


def drive(proc: Process, prompts: list[str], clients: int, max_tokens: int) -> tuple[list[dict], float]:
    """`clients` threads, each streaming its share of the prompts one after another: each request's result and
    the turn's wall time."""
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda p: stream(proc.url, p, max_tokens, proc.model), prompts))
    return results, time.perf_counter() - start


def summarize(requests: list[dict], wall: float) -> dict:
    """A server's turns of a round at one concurrency: aggregate tokens/s, TTFT and inter-token percentiles."""
    ttft = [r["ttft_s"] for r in requests]
    itl = [g for r in requests for g in r["itl_s"]]
    tokens = sum(r["tokens"] for r in requests)
    return {"requests": len(requests), "tokens": tokens, "wall_s": wall, "tokens_per_second": tokens / wall,
            "ttft_p50_s": percentile(ttft, 0.5), "ttft_p99_s": percentile(ttft, 0.99),
            "itl_p50_s": percentile(itl, 0.5), "itl_p99_s": percentile(itl, 0.99)}


def _rounds(args: argparse.Namespace, procs: dict[tuple[str, int], Process], prompts: list[str], servers: list[str],
            levels: list[int]) -> dict[str, dict[str, list[dict]]]:
    """Every round at every concurrency, the servers taking turns: each server's summary per round."""
    results: dict[str, dict[str, list[dict]]] = {s: {str(c): [] for c in levels} for s in servers}
    offset = 0
    for round_ in range(args.rounds):
        for clients in levels:
            size = clients * args.requests_per_client
            turns = max(1, -(-args.min_requests // size))
            answered: dict[str, list[dict]] = {name: [] for name in servers}
            walls = dict.fromkeys(servers, 0.0)
            for t in range(turns):  # the same prompts for every server in a turn, the next slice in the next
                batch = [prompts[(offset + i) % len(prompts)] for i in range(size)]
                offset += size
                for name in (servers if (round_ * turns + t) % 2 == 0 else servers[::-1]):
                    if args.pause_idle:  # only the server taking its turn runs
                        for proc in {id(p): p for p in procs.values()}.values():
                            (proc.resume if proc is procs[(name, clients)] else proc.pause)()
                    requests, wall = drive(procs[(name, clients)], batch, clients, args.max_tokens)
                    answered[name] += requests
                    walls[name] += wall
            for name in servers:
                result = summarize(answered[name], walls[name])
                results[name][str(clients)].append(result)
                print(json.dumps({"round": round_, "clients": clients, "server": name, "turns": turns,
                                  **{k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}}),
                      file=sys.stderr, flush=True)
    return results


def _versus_best(family: str, per: dict[str, list[dict]], run: dict[str, float], row: dict[str, dict],
                 over_run: dict[str, float], rounds: dict[str, list[float]]) -> str | None:
    """best_<family>: the family's server with the most tokens/s over the run; `bundle` and `bundle-plain` over
    it in tokens/s (over the run and per round) and in TTFT p99 (per round, and of the rounds' medians)."""
    peers = [name for name in per if name in PEERS[family]]
    if not peers:
        return None
    best = max(peers, key=run.__getitem__)
    for ours in (name for name in ("bundle", "bundle-plain") if name in per):
        key = f"{ours.replace('-', '_')}_over_best_{family}"
        over_run[key + "_tps"] = run[ours] / run[best]
        rounds[key + "_tps"] = [x["tokens_per_second"] / y["tokens_per_second"] for x, y in zip(per[ours], per[best])]
        rounds[key + "_ttft_p99"] = [x["ttft_p99_s"] / y["ttft_p99_s"] for x, y in zip(per[ours], per[best])]
        over_run[key + "_ttft_p99_of_medians"] = row[ours]["ttft_p99_s"] / row[best]["ttft_p99_s"]
    return best


def _summary(results: dict[str, dict[str, list[dict]]], servers: list[str], clients: int) -> dict[str, Any]:
    """One concurrency: each server's medians over the rounds, its tokens over its wall time in all rounds (they
    took turns, so each ratio is of the same machine), and the ratios over the run and per round."""
    per = {name: results[name][str(clients)] for name in servers}

    def median(name: str, key: str) -> float | None:
        values = [r[key] for r in per[name] if r[key] is not None]
        return statistics.median(values) if values else None

    row = {name: {k: median(name, k) for k in ("tokens_per_second", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")}
           for name in servers}
    run = {name: sum(r["tokens"] for r in per[name]) / sum(r["wall_s"] for r in per[name]) for name in servers}
    key = lambda a, b: f"{a.replace('-', '_')}_over_{b.replace('-', '_')}"  # noqa: E731
    over_run = {key(a, b) + "_tps": run[a] / run[b] for a, b in RATIOS if a in run and b in run}
    rounds = {key(a, b) + "_tps": [x["tokens_per_second"] / y["tokens_per_second"] for x, y in zip(per[a], per[b])]
              for a, b in RATIOS if a in per and b in per}
    if "bundle" in per and "llama" in per:
        rounds["bundle_over_llama_ttft_p99"] = [x["ttft_p99_s"] / y["ttft_p99_s"] for x, y in zip(per["bundle"], per["llama"])]
    best = {f"best_{family}": _versus_best(family, per, run, row, over_run, rounds) for family in PEERS}
    return {"medians": row, "tokens_per_second_over_run": run, **best, "ratios_over_run": over_run,
            "ratios_per_round": rounds}


def _servers(args: argparse.Namespace) -> list[str]:
    servers = args.servers.split(",")
    if unknown := [s for s in servers if s not in SERVERS]:
        raise SystemExit(f"unknown server {', '.join(unknown)} in --servers: one of {', '.join(SERVERS)}")
    if any(s in vllm.VLLM_SERVERS for s in servers):
        vllm.check_python(args)
    return servers


def _check_files(args: argparse.Namespace, servers: list[str], binary: Path | None, files: dict[str, Path | None]) -> None:
    """Refuse, before any server starts, a peer the bundle's files cannot feed."""
    if binary and not files["target"]:
        raise SystemExit(f"{args.ref} is not a GGUF bundle: llama-server cannot serve it (--servers bundle,bundle-1 or vllm-*)")
    if "llama-draft" in servers and not files["draft"]:
        raise SystemExit(f"{args.ref} has no draft: llama-draft needs one (the n-gram servers do not)")
    if files["target"] and any(s in vllm.VLLM_SERVERS for s in servers):
        raise SystemExit(f"{args.ref} is a GGUF bundle: the vllm-* servers run a safetensors bundle (--ref smollm2-spec:1.0.0)")


def _start(args: argparse.Namespace, servers: list[str], levels: list[int], prompts: list[str], start, checked: Any,
           procs: dict[tuple[str, int], Process], shown: dict[str, Any]) -> None:
    """Every server up and warmed, into procs (and each vLLM's command line into shown): the others once per
    concurrency, vLLM once for the run with room for the most clients."""
    for name in servers:
        if name in vllm.VLLM_SERVERS:
            proc, shown[name] = vllm.start(checked, name, args, max(levels))
            mine = [proc]
            procs.update({(name, clients): proc for clients in levels})
        else:
            mine = []
            for clients in levels:
                procs[(name, clients)] = proc = start(name, clients)
                mine.append(proc)
        for proc in mine:
            for i in range(args.warmup):  # the same for every server, from the end of the prompts
                stream(proc.url, prompts[-1 - i % len(prompts)], args.max_tokens, proc.model)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from llamacpp_tools import tool

    prompts = read_prompt_set(args.prompts)
    levels = [int(c) for c in args.clients.split(",")]
    servers = _servers(args)
    binary = tool("llama-server", build=args.build) if any(s in LLAMA_SERVERS for s in servers) else None
    procs: dict[tuple[str, int], Process] = {}
    shown: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        files, threads = stack.enter_context(gguf_files(args.ref, args.store, args.key))
        _check_files(args, servers, binary, files)
        checked = (stack.enter_context(checked_bundle(args.ref, args.store, args.key, vllm.footprint(args, max(levels))))
                   if any(s in vllm.VLLM_SERVERS for s in servers) else None)
        try:
            _start(args, servers, levels, prompts, _starter(args, binary, files, threads), checked, procs, shown)
            results = _rounds(args, procs, prompts, servers, levels)
        finally:
            for proc in {id(p): p for p in procs.values()}.values():
                proc.stop()
    return {**machine(), "threads": threads, "ref": args.ref, "dtype": args.dtype, "prompts": args.prompts,
            "max_tokens": args.max_tokens, "rounds": args.rounds, "requests_per_client": args.requests_per_client,
            "pause_idle": args.pause_idle,
            "min_requests": args.min_requests, "warmup": args.warmup, "llama_server": str(binary) if binary else None,
            "vllm": shown, "summary": {str(c): _summary(results, servers, c) for c in levels}, "runs": results}
