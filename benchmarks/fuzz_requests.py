"""A seeded fuzz campaign over `bundle serve`'s request bodies: the server must never answer 5xx, hang, drop
a connection it should answer, or die (`python benchmarks/fuzz.py --surface requests`).

One tiny signed pair is packed and served once, by a real `bundle serve` process on 127.0.0.1. Each case
starts from a valid completion or chat body and changes it the way a hostile or careless client might:
a value of another type or out of range anywhere in the tree (2**64, NaN, lone surrogates, nesting),
a field deleted or added, the JSON text itself cut, flipped or spliced (invalid UTF-8, escapes, number
literals JSON does not have), a body over --max-body (declared or chunked), another Content-Type.

Outcomes per case: `answered` (any status below 500, with a well-formed answer: an OpenAI error body for a
4xx, a completion or an SSE stream ending in [DONE] for a 200), `error` (5xx), `hang` (no answer within the
per-case limit), `dropped` (the connection closed without an answer, other than for an oversized body),
`bad-answer` (a 2xx/4xx whose body is not what it should be) and `crash` (the server process died). At the
end the server is stopped with SIGTERM: any exit status but 0 is counted too (`exit`).
"""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REF = "tiny-spec:1.0.0"  # the name make_pair writes in the Kitfile (the signed name must match)
MAX_BODY = 1 << 20  # the server's default --max-body
BASES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"model": REF, "prompt": "hello there", "max_tokens": 2, "temperature": 0}),
    ("/v1/completions", {"prompt": ["one two"], "max_tokens": 1, "temperature": 0.7, "top_p": 0.9, "seed": 7, "stop": ["\n"]}),
    ("/v1/completions", {"prompt": "why", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"model": REF, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                              "max_completion_tokens": 2, "seed": 1, "n": 1, "user": "u"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 1, "stream": True}),
]
FIELDS = ("model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
          "stream", "stream_options", "n", "user", "logprobs", "top_logprobs", "tools", "tool_choice", "suffix", "echo",
          "best_of", "presence_penalty", "frequency_penalty", "logit_bias", "response_format", "role", "content", "type", "text")
HOSTILE_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 2, 3, 1024, 1025, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**300, 0.5, -0.0, 1.5, 2.5,
    1e300, -1e300, 5e-324, "", "x", "0", "true", "null", "user", "system", "assistant", "tool", "text", "\ud800", "a\udfffb",
    "\x00", "\u202e", "é" * 50, "<|im_end|>", "{{ 7 * 7 }}", [], [1], ["a"], [None], [[[]]], {}, {"include_usage": True},
    {"include_usage": "yes"}, {"role": "user", "content": "hi"}, {"type": "text", "text": 1}, {"a": {"b": {"c": {}}}},
]
CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "APPLICATION/JSON", "text/plain", "",
                 "application/x-www-form-urlencoded", "application/json; charset=latin-1", "application/json;", "multipart/form-data"]
LITERALS = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"-0", b"1e-999", b"00", b"0x10", b"+1", b"9" * 5000,
            b"1" * 4000, b"1.", b".5", b"true1", b"nul"]
MUTATIONS = ("retype", "retype", "retype", "delete", "add", "nest", "bytes", "literal", "oversize", "ctype", "valid")


def _nodes(value: Any, path: tuple = ()) -> list[tuple]:
    """Every path into the body (keys and indexes), the root included."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _nodes(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _nodes(v, path + (i,))
    return out


def _set(body: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return body


def _get(body: Any, path: tuple) -> Any:
    for key in path:
        body = body[key]
    return body


def _nest(value: Any, depth: int, rng: random.Random) -> Any:
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def _dumps(body: Any) -> bytes:
    """JSON text of a body that may hold lone surrogates (as escapes, as a client would send them)."""
    return json.dumps(body, ensure_ascii=True).encode()


def make_case(seed: int, case: int) -> dict[str, Any]:
    """One case: the path, the headers and the body bytes (or a chunked body), and what was done."""
    rng = random.Random(seed * 1_000_003 + case)
    path, base = rng.choice(BASES)
    body = copy.deepcopy(base)
    how = rng.choice(MUTATIONS)
    headers = {"content-type": "application/json"}
    raw: bytes | None = None
    chunked = False
    if how == "retype":
        for _ in range(rng.randint(1, 3)):
            body = _set(body, rng.choice(_nodes(body)[1:]), copy.deepcopy(rng.choice(HOSTILE_VALUES)))
    elif how == "delete":
        parents = [p for p in _nodes(body) if isinstance(_get(body, p), dict) and _get(body, p)]
        parent = _get(body, rng.choice(parents))
        del parent[rng.choice(list(parent))]
    elif how == "add":
        target = _get(body, rng.choice([p for p in _nodes(body) if isinstance(_get(body, p), dict)]))
        target[rng.choice(FIELDS)] = copy.deepcopy(rng.choice(HOSTILE_VALUES))
    elif how == "nest":
        where = rng.choice(_nodes(body))
        depth = rng.choice([2, 31, 32, 33, 200, 5000, 100_000])
        if depth > 1000:  # past the stdlib's own recursion: build the text directly
            inner = _dumps(_get(body, where))
            raw = _dumps(_set(body, where, "\x00HOLE\x00")).replace(b'"\\u0000HOLE\\u0000"', b"[" * depth + inner + b"]" * depth)
        else:
            body = _set(body, where, _nest(_get(body, where), depth, rng))
    elif how == "bytes":
        data = bytearray(_dumps(body))
        op = rng.choice(["flip", "truncate", "splice", "utf8", "escape", "bom", "double"])
        i = rng.randrange(len(data))
        if op == "flip":
            data[i] ^= 1 << rng.randrange(8)
        elif op == "truncate":
            del data[i:]
        elif op == "splice":
            data[i : i + rng.randint(0, 8)] = rng.randbytes(rng.randint(1, 8))
        elif op == "utf8":
            data[i:i] = rng.choice([b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\x80"])
        elif op == "escape":
            data[i:i] = rng.choice([b"\\ud800", b"\\udfff", b"\\u0000", b"\\x41", b"\\", b"\\uZZZZ"])
        elif op == "bom":
            data[0:0] = b"\xef\xbb\xbf"
        else:
            data = data + data
        raw = bytes(data)
    elif how == "literal":
        text = _dumps(body)
        numbers = [k for k in ("max_tokens", "temperature", "seed", "top_p", "n") if f'"{k}": '.encode() in text]
        key = rng.choice(numbers) if numbers else "temperature"
        body[key] = 123456789
        raw = _dumps(body).replace(b"123456789", rng.choice(LITERALS))
    elif how == "oversize":
        chunked = rng.random() < 0.5
        pad = "x" * (MAX_BODY + rng.randint(1, 4096))
        body["user"] = pad
    elif how == "ctype":
        headers["content-type"] = rng.choice(CONTENT_TYPES)
        if not headers["content-type"]:
            del headers["content-type"]
    data = raw if raw is not None else _dumps(body)
    return {"case": case, "path": path, "mutation": how, "headers": headers, "body": data, "chunked": chunked,
            "oversize": len(data) > MAX_BODY}


def _well_formed(status: int, response: Any, stream: bool) -> bool:
    """A 4xx carries an OpenAI error object; a 200 a completion, or an SSE stream ending in [DONE]."""
    text = response.text
    try:
        if status >= 400:
            return set(json.loads(text)["error"]) >= {"message", "type", "code"}
        if stream or response.headers.get("content-type", "").startswith("text/event-stream"):
            lines = [line for line in text.splitlines() if line]
            return bool(lines) and lines[-1] == "data: [DONE]"
        return bool(json.loads(text)["choices"])
    except (ValueError, KeyError, TypeError):
        return False


def run_case(client: Any, url: str, case: dict[str, Any], alive: Any) -> dict[str, Any]:
    import httpx

    content: Any = case["body"]
    if case["chunked"]:
        data = case["body"]
        content = (data[i : i + 65536] for i in range(0, len(data), 65536))
    result = {k: case[k] for k in ("case", "path", "mutation")}
    try:
        r = client.post(url + case["path"], content=content, headers=case["headers"])
    except httpx.TimeoutException:
        return {**result, "outcome": "hang"}
    except httpx.TransportError as exc:
        if not alive():
            return {**result, "outcome": "crash", "error": repr(exc)[:200]}
        return {**result, "outcome": "answered" if case["oversize"] else "dropped", "status": None, "error": repr(exc)[:200]}
    result["status"] = r.status_code
    if r.status_code >= 500:
        return {**result, "outcome": "error", "error": r.text[:200]}
    stream = b'"stream": true' in case["body"]
    if not _well_formed(r.status_code, r, stream):
        return {**result, "outcome": "bad-answer", "error": r.text[:200]}
    return {**result, "outcome": "answered"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(root: Path) -> tuple[subprocess.Popen, str]:
    """Pack and sign a tiny pair, then start `bundle serve` on it; (the process, its URL) once it answers."""
    import httpx

    sys.path.insert(0, str(ROOT / "tests"))
    from tinymodels import make_pair

    env = {k: v for k, v in os.environ.items() if k not in ("BUNDLE_TRUSTED_KEYS", "BUNDLE_HOME")}
    env.update(PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    bundle = [sys.executable, "-m", "bundler"]
    make_pair(root / "ctx", speculative={"draft_tokens": 3})
    subprocess.run([*bundle, "keygen", "-o", str(root / "keys")], check=True, env=env, capture_output=True)
    subprocess.run([*bundle, "pack", str(root / "ctx"), "-t", REF, "--key", str(root / "keys" / "bundle.key"),
                    "--store", str(root / "store")], check=True, env=env, capture_output=True)
    port = _free_port()
    log = open(root / "serve.log", "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([*bundle, "serve", REF, "--key", str(root / "keys" / "bundle.pub"), "--store", str(root / "store"),
                             "--port", str(port), "--time-limit", "5"], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited {proc.returncode}: {(root / 'serve.log').read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("serve did not come up")


def campaign(cases: int, seed: int = 1, workers: int = 2, timeout: float = 20.0, progress: bool = False) -> dict[str, Any]:
    """Run `cases` seeded request cases against one `bundle serve`; the tally and every case that went wrong."""
    import httpx

    with tempfile.TemporaryDirectory(prefix="specbundle-fuzz-requests-") as tmp:
        proc, url = _serve(Path(tmp))
        alive = lambda: proc.poll() is None  # noqa: E731
        tally: Counter[str] = Counter()
        statuses: Counter[str] = Counter()
        bad: list[dict[str, Any]] = []
        lock = threading.Lock()
        started = time.perf_counter()
        try:
            def work(worker: int) -> None:
                with httpx.Client(timeout=timeout) as client:
                    for case in range(worker, cases, workers):
                        if not alive():
                            with lock:
                                tally["crash"] += 1
                            return
                        result = run_case(client, url, make_case(seed, case), alive)
                        with lock:
                            tally[result["outcome"]] += 1
                            statuses[str(result.get("status"))] += 1
                            if result["outcome"] != "answered":
                                bad.append(result)
                            done = sum(tally.values())
                        if progress and done % 500 == 0:
                            print(f"{done}/{cases} {dict(tally)} {time.perf_counter() - started:.0f}s", file=sys.stderr)

            with ThreadPoolExecutor(max(1, workers)) as pool:
                list(pool.map(work, range(max(1, workers))))
            health = httpx.get(url + "/health", timeout=5).status_code if alive() else None
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        if code != 0:
            tally["exit"] += 1
            bad.append({"outcome": "exit", "error": f"serve exited {code}: {(Path(tmp) / 'serve.log').read_text()[-500:]}"})
        seconds = time.perf_counter() - started
        return {"surface": "requests", "cases": cases, "seed": seed, "workers": workers, "seconds": round(seconds, 1),
                "cases_per_second": round(cases / seconds, 1), "outcomes": dict(tally), "statuses": dict(statuses.most_common()),
                "health_after": health, "serve_exit": code, "bad": bad[:50]}
