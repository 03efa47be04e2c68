"""`bundle serve` under load against `llama-server` on the same GGUF files, threads and machine (run after
`make demo` for the GGUF demo bundle, or on any GGUF bundle):

- `llama-server` is built from the llama.cpp source that the installed llama-cpp-python vendors (opt-in:
  `--build`; the sdist is fetched with pip, built with the engine's flags, and cached in
  ~/.cache/specbundle/llama-server, outside the repository);
- both are driven by the same client: streamed `/v1/chat/completions` over held-out prompts
  (runner/bench/prompts.jsonl), greedy, a fresh connection per request, at 1, 4 and 8 concurrent clients;
- per configuration: aggregate tokens/s (all completion tokens over the wall time), time to first token
  p50/p99, inter-token latency p50/p99 (the gaps between streamed pieces of text, over the tokens in them);
- four servers: `bundle serve` with its draft (the bundle as shipped), `bundle serve --no-draft` (its own
  plain serving), `llama-server -np N`, and `llama-server -np N` with the draft (`--spec-type draft-simple`);
  and on request (`--servers`) `bundle-1`, `bundle serve --sequences 1` (one request at a time, requests
  queue: what batching gains). A safetensors bundle (torch) runs with the bundle servers only.

All servers are started first and stay up, once per concurrency N (`llama-server -np N`, `bundle serve
--sequences N`: each pair sees the same requests in the same order, so their prompt caches hold the same); they
take turns within each round and concurrency, in an order that reverses at every turn, so a drift of the
machine's speed falls on all alike; only one server is driven at a time (an idle one waits without the CPU).
A turn is N x --requests-per-client requests; a round has as many turns per server as give each at least
--min-requests (ABBA ABBA): at one client a round of one turn of 2 requests lasted 2 s a server, and a
2-core VM's speed varies by 10% over seconds (rounds of one run gave 0.91 and 0.99x), while one turn of 8
requests a server spread each round over a minute, in which a swell of the machine's speed favoured the
servers in the middle of the order (rounds of 0.86 and 0.97x). Short turns that alternate often share the
drift out evenly.

    python benchmarks/serve_load.py --build [--ref smollm2-spec-gguf:1.0.0] [--store demo/work/store]
        [--key demo/work/keys/bundle.pub] [--clients 1,4,8] [--rounds 2] [--requests-per-client 2] [--min-requests 16]
        [--max-tokens 128] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bundler.trust.keys import key_id, load_public_key  # noqa: E402
from bundler.store.refs import parse_ref  # noqa: E402
from bundler.verbs.run import runner_args, verified_view  # noqa: E402
from bundler.store.layout import Store  # noqa: E402
from runner.decoding.settings import thread_count  # noqa: E402

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specbundle" / "llama-server"
# llama-cpp-python builds its library with GGML_NATIVE on (the engine's flags); the server the same way,
# statically linked so the binary does not depend on the build tree.
CMAKE_FLAGS = ["-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DCMAKE_BUILD_TYPE=Release"]


def llama_server(build: bool) -> Path:
    """The cached llama-server binary of the installed llama-cpp-python's version; built when asked."""
    import llama_cpp

    version = llama_cpp.__version__
    binary = CACHE / f"build-{version}" / "bin" / "llama-server"
    if binary.exists():
        return binary
    if not build:
        raise SystemExit(f"no llama-server in {binary.parent}: run with --build (it takes 15-30 minutes on 2 cores)")
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(CACHE),
                        f"llama-cpp-python=={version}"], check=True)
    source = CACHE / f"llama_cpp_python-{version}"
    if not source.exists():
        with tarfile.open(sdist) as tar:
            tar.extractall(CACHE, filter="data")
    build_dir = binary.parents[1]
    subprocess.run(["cmake", "-S", str(source / "vendor" / "llama.cpp"), "-B", str(build_dir), *CMAKE_FLAGS], check=True)
    subprocess.run(["nice", "cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(os.cpu_count() or 1)],
                   check=True)
    return binary


@contextlib.contextmanager
def gguf_files(ref: str, store: str, key: str) -> Iterator[tuple[dict[str, Path | None], int]]:
    """The bundle's target and draft GGUF files (None where a role has none) in its verified checkout, and the
    threads `bundle serve` gives llama.cpp; the checkout stays while the context is open."""
    public = load_public_key(Path(key))
    with verified_view(Store(Path(store)), parse_ref(ref), {key_id(public): public}) as checkout:
        bundle_args = runner_args(checkout.report)
        roles = bundle_args["roles"]
        yield ({role: next((checkout.root / roles[role]).glob("*.gguf"), None) for role in ("target", "draft")},
               thread_count(bundle_args["params"]))


def llama_server_argv(binary: Path, target: Path, port: int, threads: int, slots: int, ctx_seq: int = 4096) -> list[str]:
    """llama-server on the target file, with the threads and batch sizes of runner.engines.llamacpp; ctx_seq: the
    context of a slot (bundle serve's prompt and answer limits, bundler.serve.app, fit in 4096)."""
    return [str(binary), "-m", str(target), "--port", str(port), "--host", "127.0.0.1", "-t", str(threads), "-tb", str(threads),
            "-np", str(slots), "-c", str(ctx_seq * slots), "-b", "512", "-ub", "512", "--no-webui", "--log-disable"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A server process on 127.0.0.1, up once /health answers 200; stopped by its pid with SIGTERM."""

    def __init__(self, argv: list[str], port: int, env: dict[str, str] | None = None) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited {self.proc.returncode}: {self.proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"{argv[0]} did not come up")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def stream(url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed greedy chat completion (each server applies the GGUF file's chat template: the demo's
    instruct model answers a raw question with its end token at once): time to first text, the gaps between
    pieces of text, tokens in all."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "model": "m"}
    start = time.perf_counter()
    pieces: list[float] = []
    usage = None
    with httpx.Client(timeout=600) as client, client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices") and (chunk["choices"][0].get("delta") or {}).get("content"):
                pieces.append(time.perf_counter())
    tokens = int(usage["completion_tokens"]) if usage else len(pieces)
    gaps = [b - a for a, b in zip(pieces, pieces[1:])]
    # a piece may hold several tokens (accepted drafts, text held back at a stop string's start)
    per_token = (tokens - 1) / len(gaps) if gaps else 1.0
    return {"ttft_s": (pieces[0] if pieces else time.perf_counter()) - start, "tokens": tokens,
            "itl_s": [g / per_token for g in gaps]}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def drive(url: str, prompts: list[str], clients: int, max_tokens: int) -> tuple[list[dict], float]:
    """`clients` threads, each streaming its share of the prompts one after another: each request's result
    and the turn's wall time."""
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda p: stream(url, p, max_tokens), prompts))
    return results, time.perf_counter() - start


def summarize(requests: list[dict], wall: float) -> dict:
    """A server's turns of a round at one concurrency: aggregate tokens/s, TTFT and inter-token percentiles."""
    ttft = [r["ttft_s"] for r in requests]
    itl = [g for r in requests for g in r["itl_s"]]
    tokens = sum(r["tokens"] for r in requests)
    return {"requests": len(requests), "tokens": tokens, "wall_s": wall, "tokens_per_second": tokens / wall,
            "ttft_p50_s": _pct(ttft, 0.5), "ttft_p99_s": _pct(ttft, 0.99),
            "itl_p50_s": _pct(itl, 0.5), "itl_p99_s": _pct(itl, 0.99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="smollm2-spec-gguf:1.0.0")
    ap.add_argument("--store", default="demo/work/store")
    ap.add_argument("--key", default="demo/work/keys/bundle.pub")
    ap.add_argument("--prompts", default=str(ROOT / "runner" / "bench" / "prompts.jsonl"))
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--min-requests", type=int, default=16,
                    help="requests each server answers in a round at every concurrency, at least (in turns of N x "
                         "--requests-per-client)")
    ap.add_argument("--warmup", type=int, default=4,
                    help="whole requests each server answers before the rounds (a bundle server with no run history "
                         "for this machine speculates in its first three and then knows whether the draft pays)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft-max", type=int, default=4, help="llama-server's --spec-draft-n-max")
    ap.add_argument("--servers", default="bundle,bundle-plain,llama,llama-draft")
    ap.add_argument("--build", action="store_true", help="build llama-server if it is not cached")
    ap.add_argument("--dtype", help="bundle serve's --dtype (a safetensors bundle; default: the bundle's)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    prompts = [json.loads(line)["prompt"] for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    levels = [int(c) for c in args.clients.split(",")]
    servers = args.servers.split(",")
    binary = llama_server(args.build) if any(s.startswith("llama") for s in servers) else None
    with gguf_files(args.ref, args.store, args.key) as (files, threads):
        if binary and not all(files.values()):
            raise SystemExit(f"{args.ref} is not a GGUF bundle: llama-server cannot serve it (--servers bundle,bundle-1)")

        def start(name: str, clients: int) -> Process:
            port = _port()
            if name.startswith("bundle"):
                sequences = 1 if name == "bundle-1" else clients  # as llama-server's -np N
                argv = [sys.executable, "-m", "bundler", "serve", args.ref, "--store", args.store, "--key", args.key,
                        "--port", str(port), "--sequences", str(sequences), "--max-queue", "64"]
                argv += ["--dtype", args.dtype] if args.dtype else []
                return Process(argv + (["--no-draft"] if name == "bundle-plain" else []), port, {"PYTHONPATH": str(ROOT)})
            argv = llama_server_argv(binary, files["target"], port, threads, clients)
            if name == "llama-draft":
                argv += ["--spec-type", "draft-simple", "-md", str(files["draft"]), "--spec-draft-n-max", str(args.draft_max),
                         "-td", str(threads), "-tbd", str(threads)]
            return Process(argv, port)

        results: dict[str, dict[str, list[dict]]] = {s: {str(c): [] for c in levels} for s in servers}
        # Every server stays up throughout (an idle one waits for work and costs nothing), once per concurrency:
        # llama-server with -np N, `bundle serve` with --sequences N, so that each pair of servers answers the
        # same requests in the same order and keeps the same prompts cached (with 24 prompts a later round repeats
        # an earlier one's: a server that saw them at that concurrency answers from its prompt cache). They take
        # turns, in an order that reverses at every turn (ABBA): a drift of the machine's speed within a round then
        # falls on all alike instead of on the one that ran last.
        procs: dict[tuple[str, int], Process] = {}
        try:
            for name in servers:
                for clients in levels:
                    procs[(name, clients)] = proc = start(name, clients)
                    for i in range(args.warmup):  # the same for every server, from the end of the prompts
                        stream(proc.url, prompts[-1 - i % len(prompts)], args.max_tokens)
            offset = 0
            for round_ in range(args.rounds):
                for clients in levels:
                    # Turns of N x requests-per-client requests, as many as give each server --min-requests in the
                    # round, the servers' order reversing at every turn (ABBA ABBA ...); the same prompts for every
                    # server in a turn, the next slice in the next.
                    size = clients * args.requests_per_client
                    turns = max(1, -(-args.min_requests // size))
                    answered: dict[str, list[dict]] = {name: [] for name in servers}
                    walls = dict.fromkeys(servers, 0.0)
                    for t in range(turns):
                        batch = [prompts[(offset + i) % len(prompts)] for i in range(size)]
                        offset += size
                        for name in (servers if (round_ * turns + t) % 2 == 0 else servers[::-1]):
                            requests, wall = drive(procs[(name, clients)].url, batch, clients, args.max_tokens)
                            answered[name] += requests
                            walls[name] += wall
                    for name in servers:
                        result = summarize(answered[name], walls[name])
                        results[name][str(clients)].append(result)
                        print(json.dumps({"round": round_, "clients": clients, "server": name, "turns": turns,
                                          **{k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}}),
                              file=sys.stderr, flush=True)
        finally:
            for proc in procs.values():
                proc.stop()

    def median(name: str, clients: int, key: str) -> float | None:
        values = [r[key] for r in results.get(name, {}).get(str(clients), []) if r[key] is not None]
        return statistics.median(values) if values else None

    from runner.bench.machine import cpu_info

    summary = {}
    for clients in levels:
        row = {name: {k: median(name, clients, k) for k in ("tokens_per_second", "ttft_p50_s", "ttft_p99_s", "itl_p50_s",
                                                             "itl_p99_s")} for name in servers}
        ratios = {}
        if "bundle" in servers and "llama" in servers:
            ratios["bundle_over_llama_tps"] = [b["tokens_per_second"] / l["tokens_per_second"] for b, l in
                                               zip(results["bundle"][str(clients)], results["llama"][str(clients)])]
            ratios["bundle_over_llama_ttft_p99"] = [b["ttft_p99_s"] / l["ttft_p99_s"] for b, l in
                                                    zip(results["bundle"][str(clients)], results["llama"][str(clients)])]
        if "bundle" in servers and "bundle-plain" in servers:
            ratios["bundle_over_bundle_plain_tps"] = [b["tokens_per_second"] / p["tokens_per_second"] for b, p in
                                                      zip(results["bundle"][str(clients)], results["bundle-plain"][str(clients)])]
        if "bundle" in servers and "bundle-1" in servers:
            ratios["bundle_over_bundle_1_tps"] = [b["tokens_per_second"] / q["tokens_per_second"] for b, q in
                                                  zip(results["bundle"][str(clients)], results["bundle-1"][str(clients)])]
        if "llama-draft" in servers and "llama" in servers:
            ratios["llama_draft_over_llama_tps"] = [d["tokens_per_second"] / l["tokens_per_second"] for d, l in
                                                    zip(results["llama-draft"][str(clients)], results["llama"][str(clients)])]
        # The run's figure: each server's tokens over its wall time in all rounds (they took turns, so each ratio
        # is of the same machine), beside the rounds' own ratios.
        run = {name: sum(r["tokens"] for r in results[name][str(clients)]) / sum(r["wall_s"] for r in results[name][str(clients)])
               for name in servers}
        over_run = {f"{a.replace('-', '_')}_over_{b.replace('-', '_')}_tps": run[a] / run[b]
                    for a, b in (("bundle", "llama"), ("bundle", "bundle-plain"), ("bundle", "bundle-1"), ("llama-draft", "llama"))
                    if a in run and b in run}
        summary[str(clients)] = {"medians": row, "tokens_per_second_over_run": run, "ratios_over_run": over_run,
                                 "ratios_per_round": ratios}
    out = {"cpu": cpu_info(), "load_average": os.getloadavg(), "threads": threads, "ref": args.ref, "dtype": args.dtype,
           "max_tokens": args.max_tokens, "rounds": args.rounds, "requests_per_client": args.requests_per_client,
           "min_requests": args.min_requests, "warmup": args.warmup,
           "llama_server": str(binary) if binary else None, "summary": summary, "runs": results}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
