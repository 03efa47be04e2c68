"""`bundle tune` on a tiny pair: a row for every (method, k) and candidate draft, the choice checked on
held-out prompts, --json parses, --write edits the Kitfile in place and pack signs what was tuned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import assert_matches_schema, run_bundle
from tests.tinymodels import make_pair

FAST = ("--max-k", "2", "--max-new-tokens", "6", "--limit", "1")
METHODS = ("ngram+draft", "draft", "ngram")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tune")
    make_pair(base / "ctx")
    make_pair(base / "other", seed=5)
    return {"ctx": base / "ctx", "candidate": base / "other" / "draft"}


def test_tune_json_has_a_row_for_every_method_k_and_draft(pairs: dict[str, Path], tmp_path: Path) -> None:
    result = run_bundle("tune", str(pairs["ctx"]), *FAST, "--draft", str(pairs["candidate"]), "--json", check=True)
    out = json.loads(result.out)
    assert_matches_schema(out, "tune-report")
    rows = {(r["method"], r["k"], r["draft"]) for r in out["rows"]}
    drafts = ["bundle", str(pairs["candidate"])]
    expected = {("plain", 0, None)}
    expected |= {(m, k, d) for m in METHODS for k in (1, 2) for d in (drafts if "draft" in m else [None])}
    assert rows == expected
    assert out["drafts"] == drafts
    for r in out["rows"]:
        if r["method"] != "plain":
            assert r["tokens_per_second"] > 0 and len(r["acceptance_at"]) <= r["k"]
    assert out["choice"]["method"] in METHODS
    check = out["held_out"]
    assert check["choice"] == out["choice"]["setting"] and 0 < check["share_of_best"] <= 1
    assert check["within_tolerance"] == (check["share_of_best"] >= 0.95)
    assert out["written"] is None


def test_tune_write_puts_the_choice_in_the_kitfile_and_pack_signs_it(pairs: dict[str, Path], tmp_path: Path,
                                                                      keypair: tuple[Path, Path]) -> None:
    ctx = tmp_path / "ctx"
    import shutil

    shutil.copytree(pairs["ctx"], ctx)
    before = (ctx / "Kitfile").read_text()
    prompts = tmp_path / "mine.txt"
    prompts.write_text("copy this: alpha beta gamma alpha beta\nsay hello\nrepeat: one two one two\n")
    result = run_bundle("tune", str(ctx), "--prompts", str(prompts), "--max-k", "2", "--max-new-tokens", "6", "--write", "--json", check=True)
    out = json.loads(result.out)
    assert out["prompts"] == 2 and out["held_out_prompts"] == 1  # every third prompt of a file is held out
    assert out["written"] == str(ctx / "Kitfile")
    after = (ctx / "Kitfile").read_text()
    speculative = yaml.safe_load(after)["model"]["parameters"]["speculative"]
    assert speculative["methods"][0] == out["choice"]["method"]
    assert {k: speculative[k] for k in out["settings"]} == out["settings"]
    assert speculative["min_acceptance"] == 0.0  # what was there stays
    # only the speculative line changed
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0][1].strip().startswith("speculative:")
    store = tmp_path / "store"
    run_bundle("pack", str(ctx), "-t", "tiny-spec:2", "--key", str(keypair[0]), "--store", str(store), check=True)
    inspected = run_bundle("inspect", "tiny-spec:2", "--key", str(keypair[1]), "--store", str(store), "--json", check=True)
    assert out["choice"]["method"] in inspected.out


def test_tune_of_a_stored_bundle_verifies_it_and_refuses_write(pairs: dict[str, Path], tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    store = tmp_path / "store"
    run_bundle("pack", str(pairs["ctx"]), "-t", "tiny-spec:1", "--key", str(keypair[0]), "--store", str(store), check=True)
    refused = run_bundle("tune", "tiny-spec:1", "--write", "--key", str(keypair[1]), "--store", str(store))
    assert refused.code == 2 and refused.err.startswith("error: [usage] ")
    unsigned = run_bundle("tune", "tiny-spec:1", *FAST, "--store", str(store))
    assert unsigned.code != 0 and unsigned.err.startswith("error: [")
    result = run_bundle("tune", "tiny-spec:1", *FAST, "--held-out", "none", "--key", str(keypair[1]), "--store", str(store), "--json", check=True)
    out = json.loads(result.out)
    assert out["bundle"]["ref"] == "tiny-spec:1" and out["held_out"] is None
    assert len(out["rows"]) == 1 + 3 * 2


def test_tune_prints_the_table_and_the_choice(pairs: dict[str, Path]) -> None:
    result = run_bundle("tune", str(pairs["ctx"]), *FAST, "--held-out", "none", check=True)
    assert "ngram k=2" in result.out and "choice:" in result.out and "settings:" in result.out
