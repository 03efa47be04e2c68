"""The guard's prior in a fresh process: `bundle run` reads this CPU's measured cost table before its first
step, and a pair whose measured costs cannot pay decodes plainly from the first token, with no trial step; a
table under which the draft may pay leaves the draft model drafting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_bundle
from runner.decoding import cost_prior
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
