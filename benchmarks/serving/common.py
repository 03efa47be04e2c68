"""What the serving benchmark's modes share: the bundle and prompt options, a server process on loopback,
one streamed request, percentiles, and the JSON result."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]

GGUF_REF = "smollm2-spec-gguf:1.0.0"  # the GGUF demo bundle (`make demo`)
TORCH_REF = "smollm2-spec:1.0.0"  # the safetensors demo bundle


def add_bundle_options(parser: argparse.ArgumentParser, ref: str = GGUF_REF) -> None:
    """--ref, --store, --key (the demo's by default) and --prompts."""
    parser.add_argument("--ref", default=ref)
    parser.add_argument("--store", default=str(ROOT / "demo" / "work" / "store"))
    parser.add_argument("--key", default=str(ROOT / "demo" / "work" / "keys" / "bundle.pub"))
    add_prompt_option(parser)


def add_prompt_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", default="open",
                        help="a prompt set by name (open, grounded: runner/bench) or a file (JSON lines with \"prompt\", "
                             "or one prompt a line)")


def read_prompt_set(spec: str) -> list[str]:
    """The prompts of a shipped set by name, as `bundle bench` reads them (runner.bench.prompt_sets), or of a file."""
    try:
        from runner.bench.prompt_sets import read_prompts
    except ImportError:  # a tree without named sets: the open set is the held-out prompts file
        path = ROOT / "runner" / "bench" / "prompts.jsonl" if spec == "open" else Path(spec)
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        return [json.loads(line)["prompt"] if line.lstrip().startswith("{") else line.strip() for line in lines]
    from core.errors import BundleError

    try:
        return [p.text for p in read_prompts(spec)]
    except BundleError as err:
        raise SystemExit(err.line()) from None


def trusted_keys(key: str) -> dict[str, Any]:
    """key id -> public key, for the one key file the bundle is signed with."""
    from bundler.trust.keys import key_id, load_public_key

    public = load_public_key(Path(key))
    return {key_id(public): public}


@contextlib.contextmanager
def gguf_files(ref: str, store: str, key: str) -> Iterator[tuple[dict[str, Path | None], int]]:
    """The bundle's target and draft GGUF files (None where a role has none) in its verified checkout, and the
    threads `bundle serve` gives llama.cpp; the checkout stays while the context is open."""
    from bundler.store.layout import Store
    from bundler.store.refs import parse_ref
    from bundler.verbs.run import runner_args, verified_view
    from runner.decoding.settings import thread_count

    with verified_view(Store(Path(store)), parse_ref(ref), trusted_keys(key)) as checkout:
        bundle_args = runner_args(checkout.report)
        roles = bundle_args["roles"]
        yield ({role: next((checkout.root / roles[role]).glob("*.gguf"), None) if role in roles else None
                for role in ("target", "draft")}, thread_count(bundle_args["params"]))


@contextlib.contextmanager
def checked_bundle(ref: str, store: str, key: str, footprint: dict[str, Any]) -> Iterator[Any]:
    """The safetensors counterpart of gguf_files: the bundle verified, written out whole and checked as `bundle
    serve --runtime` checks it (bundler.serve.runtimes.checked.prepared: every file hashed as written, into a
    private read-only directory; the tokenizer gate, pairing, the memory preflight for `footprint`, {"context",
    "sequences", "dtype"}). Yields its Prepared (target, draft and tokenizer directories, `model_view`), kept while
    the context is open; a refusal is the one-line error."""
    from bundler.serve.runtimes.checked import prepared
    from bundler.serve.sources import StoreSource
    from bundler.store.layout import Store
    from bundler.store.refs import parse_ref
    from core.errors import BundleError

    try:
        with prepared(StoreSource(Store(Path(store)), parse_ref(ref)), trusted_keys(key), footprint) as checked:
            yield checked
    except BundleError as err:
        raise SystemExit(err.line()) from None


def proc_stat(stat_path: str | Path) -> tuple[str, list[str]]:
    """A /proc stat file's name (in parentheses: it may hold spaces and parentheses) and the fields after it, from
    the state (field 3) on."""
    stat = Path(stat_path).read_text()
    return stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()


def proc_cpu(stat_path: str) -> tuple[str, float]:
    """A /proc stat file's (a process's, or one thread's under task/) name and CPU seconds so far, user +
    system (fields 14 and 15; a process's own, its children not counted)."""
    name, fields = proc_stat(stat_path)
    return name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bundle_serve_argv(args: argparse.Namespace, port: int, extra: list[str]) -> list[str]:
    """`bundle serve` of args.ref from args.store on 127.0.0.1:port, with the extra options."""
    return [sys.executable, "-m", "bundler", "serve", args.ref, "--store", args.store, "--key", args.key,
            "--port", str(port), "--max-queue", "64", *extra]


def stop_servers_on_sigterm() -> None:
    """SIGTERM to a benchmark unwinds it as Ctrl-C does, so each Process's `finally` stops its server by its pid
    (by default SIGTERM ended the benchmark alone and left its servers running)."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def session_pids(sid: int) -> list[int]:
    """The processes of one session (field 6 of /proc/PID/stat)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            _name, fields = proc_stat(stat)
        except OSError:  # ended meanwhile
            continue
        if int(fields[3]) == sid:
            pids.append(int(stat.parent.name))
    return pids


class Process:
    """A server process on 127.0.0.1, up once `ready_path` answers 200 (within `timeout_s`); stopped by its pid
    with SIGTERM. `env` goes on top of this process's environment (a None value removes the name); `model` is the
    name its requests give (vLLM answers only the name it serves)."""

    def __init__(self, argv: list[str], port: int, env: dict[str, str | None] | None = None, ready_path: str = "/health",
                 timeout_s: float = 300.0, model: str = "m", own_session: bool = False) -> None:
        self.url, self.model = f"http://127.0.0.1:{port}", model
        # The log goes to a file, never an unread pipe: a server that logs every request (llama-server, or
        # `serve --runtime`, which passes its runtime's log on) would block on a full pipe and stall mid-benchmark.
        self.log = tempfile.TemporaryFile(mode="w+")
        merged = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        # own_session: the server in a session of its own, as a service manager starts one; where the kernel groups
        # CPU time by session (autogroup, no cgroup per service), a server in the benchmark's session shares one
        # share with the benchmark's clients.
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.log, text=True,
                                     env={k: v for k, v in merged.items() if v is not None}, start_new_session=own_session)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{argv[0]} exited {self.proc.returncode}: {self.log.read()[-2000:]}")
            try:
                if httpx.get(self.url + ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"{argv[0]} did not come up within {timeout_s:.0f} s")

    def pause(self) -> None:
        """Every process of the server's session stopped (SIGSTOP): between its turns a server takes no CPU from the
        one being measured (an idle vLLM CPU worker kept a core 50-90% busy: benchmarks/serve_runtime_bench.py)."""
        self._signal_session(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_session(signal.SIGCONT)

    def _signal_session(self, sig: int) -> None:
        if self.proc.poll() is not None:
            return
        if os.getsid(self.proc.pid) != self.proc.pid:
            raise RuntimeError("pause/resume: the server must lead a session of its own (own_session=True)")
        for pid in session_pids(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(RuntimeError):
                self.resume()  # a stopped process would hold the SIGTERM until it runs again
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def stream(url: str, prompt: str, max_tokens: int, model: str = "m", client: httpx.Client | None = None,
           trace: Callable[[str, dict[str, Any]], None] | None = None) -> dict:
    """One streamed greedy chat completion (each server applies the model's chat template: the demo's instruct
    model answers a raw question with its end token at once): time to first text, the gaps between pieces of
    text per token, tokens in all, and the client's rate (tokens after the first over first to last piece).
    client: one the caller keeps across its requests (its connection kept alive); else a new one per request.
    trace: httpx's trace callback for the request's phases (benchmarks/serve_runtime_bench.py); `first_at` is the
    first text's perf_counter, on the clock such a trace reads."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "model": model}
    start = time.perf_counter()
    pieces: list[float] = []
    usage = None
    own = client is None
    client = httpx.Client(timeout=600) if client is None else client
    try:
        with client.stream("POST", url + "/v1/chat/completions", json=body,
                           extensions={"trace": trace} if trace is not None else None) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if chunk.get("choices") and (chunk["choices"][0].get("delta") or {}).get("content"):
                    pieces.append(time.perf_counter())
    finally:
        if own:
            client.close()
    tokens = int(usage["completion_tokens"]) if usage else len(pieces)
    gaps = [b - a for a, b in zip(pieces, pieces[1:])]
    # a piece may hold several tokens (accepted drafts, text held back at a stop string's start)
    per_token = (tokens - 1) / len(gaps) if gaps else 1.0
    span = pieces[-1] - pieces[0] if len(pieces) > 1 else 0.0
    first_at = pieces[0] if pieces else time.perf_counter()
    return {"ttft_s": first_at - start, "first_at": first_at, "tokens": tokens,
            "itl_s": [g / per_token for g in gaps], "client_tps": (tokens - 1) / span if span > 0 else None}


def whole(url: str, prompt: str, max_tokens: int, model: str = "m") -> dict:
    """One greedy chat completion answered whole: its JSON (with the server's `specbundle.stats`)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0, "model": model}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def machine() -> dict[str, Any]:
    """The CPU (model, vector extensions, cores) and the load average at the end of the run."""
    from runner.bench.machine import cpu_info

    return {"cpu": cpu_info(), "load_average": os.getloadavg()}


def emit(result: dict[str, Any], out: str | None) -> None:
    """The result as JSON on stdout, and in `out` too when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
