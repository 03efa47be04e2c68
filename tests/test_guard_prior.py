"""The guard's prior in a fresh process: `bundle run` reads this CPU's measured cost table before its first
step, and a pair whose measured costs cannot pay decodes plainly from the first token, with no trial step; a
table under which the draft may pay leaves the draft model drafting. `bundle serve` decides alike (both build a
sequence's policy with runner.decoding.policy.Policy.for_sequence): the same reason in each answer's stats, and
the fallback counted in /metrics and /health's window."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from conftest import run_bundle
from runner.decoding import cost_prior
from tests.test_serve import Server
from tests.tinymodels import make_pair

REF = "tiny-spec:1.0.0"
KS = range(1, 17)


def write_table(directory: Path, verify_steps: float) -> Path:
    """A cost table for this CPU's class covering every size (1 to 10^12 parameters) of the torch engine in
    float32, a verify pass of any length costing `verify_steps` single steps; a step's time grows as the square
    root of the parameters (the tiny draft's step about 0.3 of its target's)."""
    cls = cost_prior.cpu_class()
    if cls is None:
        pytest.skip("a CPU without AVX2 has no cost class")
    directory.mkdir(parents=True, exist_ok=True)
    models = [{"name": name, "params": params, "step_s": step_s, "prefill_s": 10 * step_s, "context": 128,
               "verify_steps": {str(k): verify_steps for k in KS}}
              for name, params, step_s in (("small", 1, 1e-6), ("big", 10 ** 12, 1.0))]
    (directory / f"{cls}.json").write_text(json.dumps({"cpu_class": cls, "engines": {"torch": {"F32": models}}}))
    return directory


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> Path:
    """A signed tiny pair whose Kitfile allows the draft model only (no prompt lookup to fall back to)."""
    base = tmp_path_factory.mktemp("prior")
    make_pair(base / "ctx", speculative={"draft_tokens": 4, "methods": ["draft"]})
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return base / "store"


def _run(store: Path, pub: Path, tables: Path) -> dict:
    result = run_bundle("run", REF, "--prompt", "hello world", "--max-new-tokens", "24", "--key", str(pub), "--store",
                        str(store), "--json", env={cost_prior.TABLES_ENV: str(tables)}, check=True)
    return json.loads(result.out)


def test_a_pair_the_cost_table_says_cannot_pay_decodes_plainly_from_its_first_token(
        store: Path, keypair: tuple[Path, Path], tmp_path: Path) -> None:
    out = _run(store, keypair[1], write_table(tmp_path / "tables", verify_steps=50.0))
    stats = out["stats"]
    assert stats["new_tokens"] > 0 and stats["drafted"] == 0 and stats["speculative_iterations"] == 0
    assert stats["fallback"]["at_token"] == 0 and "cost table" in stats["fallback"]["reason"]
    assert stats["fallback"]["retries"] == 0  # no trial of the draft either


def test_a_pair_the_cost_table_says_may_pay_drafts(store: Path, keypair: tuple[Path, Path], tmp_path: Path) -> None:
    out = _run(store, keypair[1], write_table(tmp_path / "tables", verify_steps=1.0))
    stats = out["stats"]
    assert stats["drafted"] > 0
    assert not stats["fallback"] or "cost table" not in stats["fallback"]["reason"]


def test_serve_reports_and_counts_the_cost_tables_verdict_as_run_does(
        store: Path, keypair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tables = write_table(tmp_path / "tables", verify_steps=50.0)
    ran = _run(store, keypair[1], tables)["stats"]
    monkeypatch.setenv(cost_prior.TABLES_ENV, str(tables))  # the server process inherits it
    srv = Server(store, keypair[1], "--sequences", "2")  # the batch worker (a tiny safetensors pair batches on torch)
    try:
        body = {"model": REF, "prompt": "hello world", "max_tokens": 24, "temperature": 0}
        served = httpx.post(srv.url + "/v1/completions", json=body, timeout=120).json()["specbundle"]["stats"]
        metrics, health = srv.metrics(), httpx.get(srv.url + "/health", timeout=10).json()
    finally:
        assert srv.stop() == 0
    assert served["drafted"] == 0 and served["speculative_iterations"] == 0
    assert served["fallback"] == ran["fallback"] and "cost table" in served["fallback"]["reason"]
    assert metrics[("specbundle_fallbacks_total", ())] == 1
    assert "fell back to plain decoding in 1 of the last 1 requests" in json.dumps(health)
