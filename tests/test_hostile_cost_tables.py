"""Hostile cost tables (`$SPECBUNDLE_COST_TABLES`, issue 45): a table file that is not a regular file of bounded
size with the documented shape and finite positive numbers counts as no table, with at most one warning line;
`bundle run` then times the pair itself and answers, never exit 1, a hang or a traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import run_bundle
from runner.decoding import cost_prior
from tests.hostile_files import bundle, make_hostile
from tests.tinymodels import make_pair

REF = "tiny-spec:1.0.0"


def _model(**fields: object) -> dict:
    good = {"name": "m", "params": 1000, "step_s": 0.01, "verify_steps": {"1": 1.2, "2": 1.4}}
    return {**good, **fields}


def _table(*models: dict) -> str:
    return json.dumps({"cpu_class": "x", "engines": {"torch": {"F32": list(models)}}})


SHAPES = [
    ("not-json", "{engines: nope"),
    ("empty", ""),
    ("a-list", "[1, 2, 3]"),
    ("no-engines", '{"cpu_class": "x"}'),
    ("engines-a-list", '{"engines": []}'),
    ("quants-a-string", '{"engines": {"torch": "F32"}}'),
    ("models-an-object", '{"engines": {"torch": {"F32": {"params": 1}}}}'),
    ("params-a-string", _table(_model(params="1000"))),
    ("params-a-bool", _table(_model(params=True))),
    ("zero-params", _table(_model(params=0))),
    ("negative-step", _table(_model(step_s=-0.01))),
    ("zero-step", _table(_model(step_s=0))),
    ("nan", _table(_model(step_s=0.01)).replace("0.01", "NaN")),
    ("infinite", _table(_model(step_s=0.01)).replace("0.01", "1e999")),
    ("verify-a-list", _table(_model(verify_steps=[1.2]))),
    ("verify-key-not-a-k", _table(_model(verify_steps={"one": 1.2}))),
    ("verify-key-unicode-digit", _table(_model(verify_steps={"\u00b2": 1.2}))),
    ("verify-negative", _table(_model(verify_steps={"1": -1}))),
    ("deep", '{"engines": ' + "[" * 100_000 + "]" * 100_000 + "}"),
]
KINDS = ["fifo", "dev-zero", "directory", "huge"]


def _hostile_dir(tmp_path: Path, kind: str, text: str = "") -> Path:
    cls = cost_prior.cpu_class()
    if cls is None:
        pytest.skip("a CPU without AVX2 has no cost class")
    directory = tmp_path / "tables"
    directory.mkdir()
    make_hostile(directory / f"{cls}.json", kind, text)
    return directory


@pytest.mark.parametrize("kind", KINDS)
def test_a_table_that_is_no_regular_file_or_too_big_is_no_table(kind: str, tmp_path: Path) -> None:
    directory = _hostile_dir(tmp_path, kind)
    assert cost_prior.load_table(directory=directory) is None


@pytest.mark.parametrize("name, text", SHAPES, ids=[n for n, _ in SHAPES])
def test_a_table_of_the_wrong_shape_is_no_table(name: str, text: str, tmp_path: Path) -> None:
    directory = _hostile_dir(tmp_path, "text", text)
    assert cost_prior.load_table(directory=directory) is None
    with pytest.raises(ValueError):
        cost_prior.read_table(next(directory.iterdir()))


def test_a_well_formed_table_is_read(tmp_path: Path) -> None:
    directory = _hostile_dir(tmp_path, "text", _table(_model()))
    table = cost_prior.load_table(directory=directory)
    assert table is not None and math.isclose(table["engines"]["torch"]["F32"][0]["step_s"], 0.01)


def test_the_shipped_tables_are_well_formed() -> None:
    for path in cost_prior.TABLES.glob("*.json"):
        assert cost_prior.read_table(path)["engines"]


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hostile-tables")
    make_pair(base / "ctx")
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return {"store": base / "store", "pub": keypair[1]}


CLI_CASES = [(k, "") for k in KINDS] + [s for s in SHAPES if s[0] in ("not-json", "empty", "zero-params", "nan", "deep", "params-a-string")]


@pytest.mark.parametrize("kind, text", CLI_CASES, ids=[k for k, _ in CLI_CASES])
def test_run_with_a_hostile_table_times_the_pair_itself(kind: str, text: str, signed: dict[str, Path], tmp_path: Path) -> None:
    directory = _hostile_dir(tmp_path, kind if kind in KINDS else "text", text)
    result = bundle("run", REF, "--prompt", "hello", "--raw", "--max-new-tokens", "4", "--key", str(signed["pub"]),
                    "--store", str(signed["store"]), "--json", env={cost_prior.TABLES_ENV: str(directory)}, timeout=120)
    assert result.code == 0 and "Traceback" not in result.err, result.err[-2000:]
    assert json.loads(result.out)["stats"]["new_tokens"] > 0
    warnings = [line for line in result.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) <= 1 and len(result.err.splitlines()) <= 1
