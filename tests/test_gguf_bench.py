"""`bundle bench` on a signed tiny GGUF pair: our plain and speculative decoding on the llama.cpp engine
against llama-cpp-python's own greedy generation of the same target file, in one process."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import assert_matches_schema, run_bundle
from tests.tinygguf import write_gguf
from tests.tinymodels import train_tokenizer, write_kitfile, write_tokenizer


def gguf_context(root: Path) -> Path:
    """A bundle context whose target and draft are one GGUF file each (the tokenizer role as usual)."""
    (root / "target").mkdir(parents=True)
    (root / "draft").mkdir()
    write_gguf(root / "target" / "model.gguf", seed=0, hidden=128, layers=2, logit_scale=3)
    # the same seed and width, one layer: the target's own first layer (a layer-skip draft), so it agrees
    # with the target often, not always
    write_gguf(root / "draft" / "model.gguf", seed=0, hidden=128, layers=1, logit_scale=3)
    write_tokenizer(root / "tokenizer", train_tokenizer())
    # guard off: this pair does not pay on a CPU (its draft is half the target), and the bench is to measure
    # speculation throughout, not the guard's fallback
    write_kitfile(root, speculative={"draft_tokens": 3, "min_acceptance": 0.0, "min_size_ratio": 1, "guard": False})
    return root


def test_bench_json_on_a_gguf_bundle_reports_ours_theirs_and_identical_output(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    store = str(tmp_path / "store")
    run_bundle("pack", str(gguf_context(tmp_path / "ctx")), "-t", "tiny-spec:1", "--key", str(keypair[0]), "--store", store, check=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the quick brown fox"}\n{"prompt": "def add(a, b):"}\n')
    result = run_bundle("bench", "tiny-spec:1", "--prompts", str(prompts), "--max-new-tokens", "12", "--repeat", "3",
                        "--key", str(keypair[1]), "--store", store, "--json", check=True)
    out = json.loads(result.out)
    assert_matches_schema(out, "bench-report")
    assert out["engine"] == "llama.cpp" and out["threads"] >= 1
    for run in ("target_only", "runner_plain", "llama_cpp_python", "bundle", "draft_only"):
        assert out["runs"][run]["tokens_per_second"] > 0, run
    # transformers' assisted generation does not run GGUF files: said with null, not left out
    assert out["runs"]["hf_assisted"] is None and out["speedup_vs_hf_assisted"] is None
    # three rounds of both prompts, 12 tokens each (the tiny random models write no eos)
    assert out["runs"]["bundle"]["new_tokens"] == out["runs"]["llama_cpp_python"]["new_tokens"] == 3 * 2 * 12
    for key in ("speedup_vs_target", "speedup_vs_llama_cpp_python", "plain_vs_llama_cpp_python", "speedup_vs_fastest_plain"):
        assert out[key] == sorted(r[key] for r in out["rounds"])[1], key
    for key in ("acceptance_rate", "cost_ratio", "verify_cost_ratio", "theoretical_speedup", "efficiency", "mean_accepted_length",
                "break_even_acceptance"):
        assert key in out, key
    assert 0 < out["acceptance_rate"] < 1  # drafts accepted and rejected
    # greedy: ours (plain and speculative) gives llama-cpp-python's own greedy tokens
    assert out["identical_output"] is True and out["runner_plain_identical"] is True
    assert out["differences"] == [] and out["plain_differences"] == []
    assert len(out["per_prompt"]) == 2 and out["machine"]["engines"]["llama-cpp-python"]
