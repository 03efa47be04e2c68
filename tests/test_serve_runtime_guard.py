"""`bundle serve --runtime R --runtime-speculation auto`: a runtime that cannot switch speculation per request gets
the guard's verdict at start-up, by measurement on this machine. On a real runtime (llama-cpp-python's own server)
and a tiny signed GGUF pair whose signed settings keep the guard on: the signed speculation and plain decoding are
each probed, the faster serves, the verdict is shown (/status.json, the log) and remembered in the store, and the
next start reads it and starts the runtime once. A probe over its limit keeps the signed speculation; `off` and `on`
decide without a probe (a bundle whose signed settings turn the guard off: tests/test_serve_runtime.py)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from conftest import run_bundle
from tests.test_gguf_bench import gguf_context
from tests.test_serve import REF, Server
from tests.tinymodels import write_kitfile

RUNTIME = ("--runtime", "llama-cpp-python")
GUARDED = {"draft_tokens": 3, "min_acceptance": 0.0, "min_size_ratio": 1}  # the guard on, as a Kitfile leaves it by default
STATE = Path(".specbundle") / "runtime-speculation.json"  # the store's private state (bundler.serve.runtimes.guard)


def _store(base: Path, keypair, speculative: dict) -> Path:
    ctx = gguf_context(base / "ctx")
    write_kitfile(ctx, speculative=speculative)
    run_bundle("pack", str(ctx), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return base / "store"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, keypair) -> Path:
    return _store(tmp_path_factory.mktemp("runtime-guard"), keypair, GUARDED)


def _dry_run(store: Path, keypair, *extra: str) -> dict:
    return json.loads(run_bundle("serve", REF, *RUNTIME, *extra, "--dry-run", "--key", str(keypair[1]), "--store", str(store), check=True).out)


def _served(store: Path, keypair, *extra: str) -> tuple[dict, str]:
    """One `bundle serve` up to ready: /status.json's runtime block, then its log once stopped."""
    srv = Server(store, keypair[1], *RUNTIME, *extra)
    try:
        runtime = httpx.get(srv.url + "/status.json").json()["runtime"]
        answer = httpx.post(srv.url + "/v1/completions", json={"prompt": "a b", "max_tokens": 3, "temperature": 0}, timeout=60)
        assert answer.status_code == 200
    finally:
        assert srv.stop() == 0
    return runtime, srv.proc.stderr.read()


def _starts(log: str) -> int:
    """How many times the runtime was started: llama-cpp-python's server (uvicorn) says so once per start."""
    return sum(1 for line in log.splitlines() if line.startswith("[llama-cpp-python] ") and "Uvicorn running on" in line)


def test_auto_measures_both_then_a_second_start_reads_the_remembered_verdict(tmp_path: Path, keypair) -> None:
    store = _store(tmp_path, keypair, GUARDED)
    assert _dry_run(store, keypair)["guard"]["source"] == "would probe"
    first, log = _served(store, keypair)
    guard = first["guard"]
    assert guard["mode"] == "auto" and guard["source"] == "measured"
    assert guard["speculative_tokens_per_second"] > 0 and guard["plain_tokens_per_second"] > 0  # both probes ran
    faster = "plain" if guard["plain_tokens_per_second"] > guard["speculative_tokens_per_second"] else "speculative"
    assert guard["choice"] == faster
    assert first["speculation"]["method"] == ("plain" if faster == "plain" else "ngram")
    assert f"runtime speculation: {faster} (measured: " in log
    assert _starts(log) == (2 if faster == "plain" else 3)  # speculative, plain, and speculative again if it won
    assert len(json.loads((store / STATE).read_text())) == 1

    second, log = _served(store, keypair)
    assert second["guard"]["source"] == "cached" and second["guard"]["choice"] == faster
    assert {k: second["guard"][k] for k in ("speculative_tokens_per_second", "plain_tokens_per_second")} == \
           {k: guard[k] for k in ("speculative_tokens_per_second", "plain_tokens_per_second")}
    assert second["speculation"] == first["speculation"]
    assert _starts(log) == 1  # no probe: the runtime started once, as the verdict says


def test_a_probe_over_its_limit_keeps_the_signed_speculation_and_remembers_nothing(guarded: Path, keypair) -> None:
    runtime, log = _served(guarded, keypair, "--runtime-probe-limit", "0.001")
    guard = runtime["guard"]
    assert guard["source"] == "unmeasured" and guard["choice"] == "speculative"
    assert "the probe took longer than 0.001 s" in guard["reason"] and runtime["speculation"]["method"] == "ngram"
    assert _starts(log) == 1 and not (guarded / STATE).exists()


def test_off_serves_the_target_alone_without_a_probe(guarded: Path, keypair) -> None:
    shown = _dry_run(guarded, keypair, "--runtime-speculation", "off")
    assert shown["speculation"] == {"method": "plain"} and "--draft_model" not in shown["argv"]
    assert shown["guard"]["choice"] == "plain" and shown["guard"]["source"] == "option"
    assert shown["notes"] == ["guard: --runtime-speculation off: the target alone"]


def test_on_speculates_as_signed_without_a_probe(guarded: Path, keypair) -> None:
    shown = _dry_run(guarded, keypair, "--runtime-speculation", "on")
    assert shown["guard"]["source"] == "option" and shown["guard"]["choice"] == "speculative"
    assert shown["speculation"]["method"] == "ngram"
