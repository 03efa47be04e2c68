"""A bundle without a draft model (target + tokenizer) that asks for draft-free speculation (methods: [ngram]):
packed, verified and run, greedy output identical to the target alone; without that ask it is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import run_bundle, tree_digest
from runner.decoding.speculative import generate_plain
from runner.models.lean_tokenizer import load_tokenizer
from runner.models.loading import load_model
from runner.pair import prompt_ids
from tests.tinymodels import make_pair

PROMPT = "one two three four one two three four one two"
REF = "tiny-spec:1"


def draftless(root: Path, speculative: str) -> Path:
    make_pair(root)
    shutil.rmtree(root / "draft")
    kitfile = root / "Kitfile"
    text = kitfile.read_text().replace("    - {name: draft, path: draft/, type: draft}\n", "")
    kitfile.write_text(text.replace("speculative: {draft_tokens: 4, min_acceptance: 0.0}", f"speculative: {speculative}"))
    return root


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("draftless")
    ctx = draftless(base / "ctx", "{methods: [ngram], ngram: {min_n: 1, max_n: 3, draft_tokens: 4}}")
    result = run_bundle("pack", str(ctx), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    assert "no draft" in result.out
    return {"ctx": ctx, "store": base / "store"}


def test_a_draftless_bundle_verifies(signed: dict[str, Path], keypair: tuple[Path, Path]) -> None:
    result = run_bundle("verify", REF, "--key", str(keypair[1]), "--store", str(signed["store"]), "--json", check=True)
    assert json.loads(result.out)["ok"] is True


def test_a_draftless_bundle_runs_to_the_target_alones_greedy_output(signed: dict[str, Path], keypair: tuple[Path, Path]) -> None:
    result = run_bundle("run", REF, "--prompt", PROMPT, "--max-new-tokens", "24", "--key", str(keypair[1]),
                        "--store", str(signed["store"]), "--json", check=True)
    out = json.loads(result.out)
    target = load_model(signed["ctx"] / "target", "float32", "cpu", role="target")
    ids = prompt_ids(load_tokenizer(signed["ctx"] / "tokenizer"), PROMPT, False)
    assert out["tokens"] == generate_plain(target, ids, 24).tokens


def test_bench_of_a_draftless_bundle_has_no_assisted_peer_and_the_target_alones_output(signed: dict[str, Path],
                                                                                        keypair: tuple[Path, Path]) -> None:
    result = run_bundle("bench", REF, "--prompts", "grounded", "--limit", "2", "--max-new-tokens", "8", "--key", str(keypair[1]),
                        "--store", str(signed["store"]), "--json", check=True)
    out = json.loads(result.out)
    assert out["runs"]["hf_assisted"] is None and out["speedup_vs_hf_assisted"] is None
    assert out["runs"]["hf_prompt_lookup"]["tokens_per_second"] > 0
    assert out["identical_output"] is True
    assert all(p["method"] in ("ngram", "plain", "ngram, then plain") for p in out["per_prompt"])


def test_tune_of_a_draftless_context_tries_prompt_lookup_alone(signed: dict[str, Path]) -> None:
    result = run_bundle("tune", str(signed["ctx"]), "--max-k", "3", "--max-new-tokens", "6", "--limit", "1", "--held-out", "none",
                        "--json", check=True)
    out = json.loads(result.out)
    assert [(r["method"], r["k"]) for r in out["rows"]] == [("plain", 0), ("ngram", 1), ("ngram", 2), ("ngram", 3)]
    assert out["drafts"] == [] and out["settings"]["methods"] == ["ngram"]


@pytest.mark.parametrize("speculative", ["{draft_tokens: 4}", "{methods: [ngram, draft]}", "{methods: [draft]}"])
def test_a_bundle_without_a_draft_that_does_not_ask_for_draft_free_speculation_is_refused(tmp_path: Path, speculative: str) -> None:
    ctx = draftless(tmp_path / "ctx", speculative)
    store = tmp_path / "store"
    store.mkdir()
    before = tree_digest(store)
    result = run_bundle("pack", str(ctx), "-t", REF, "--store", str(store))
    assert result.code == 6 and result.err.startswith("error: [invalid-kitfile] ") and "draft" in result.err
    assert tree_digest(store) == before


def test_init_without_a_draft_lays_out_a_context_for_draft_free_speculation(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    pair = make_pair(tmp_path / "made")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (pair["tokenizer"] / name).is_file():
            shutil.copyfile(pair["tokenizer"] / name, pair["target"] / name)
    out = tmp_path / "ctx"
    result = run_bundle("init", "--target", str(pair["target"]), "-o", str(out), "--name", "tiny-ngram", check=True)
    assert "no draft" in result.out and not (out / "draft").exists()
    kitfile = (out / "Kitfile").read_text()
    assert "type: draft" not in kitfile and 'methods: ["ngram"]' in kitfile
    run_bundle("pack", str(out), "-t", "tiny-ngram:1.0.0", "--key", str(keypair[0]), "--store", str(tmp_path / "store"), check=True)


def test_a_draftless_gguf_target_runs_on_the_llama_cpp_engine_to_its_greedy_output(tmp_path: Path) -> None:
    from runner.engines import llamacpp
    from runner.run import run_unpacked
    from tests.tinygguf import write_gguf

    (tmp_path / "target").mkdir()
    write_gguf(tmp_path / "target" / "model.gguf", seed=0, hidden=128, layers=2)
    text = "the quick brown fox the quick brown fox the quick"
    result = run_unpacked(tmp_path, {"target": "target"}, {"methods": ["ngram"]}, text, max_new_tokens=16, raw=True)
    assert result["engine"] == "llama.cpp" and result["pairing"]["draft_parameters"] == 0
    target = llamacpp.load(tmp_path / "target" / "model.gguf", n_ctx=64, threads=1)
    prompt = target.llm.tokenize(text.encode(), add_bos=False)
    assert result["tokens"] == generate_plain(target, prompt, 16, eos_ids={2}).tokens
