"""`bundle bench` on a signed tiny pair: every figure of the contract, in one process."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from conftest import assert_matches_schema, run_bundle
from runner.bench import bf16_step, break_even_acceptance, first_difference
from runner.metrics import best_predicted_speedup
from runner.speculative import generate_plain
from tests.tinymodels import make_pair, tiny_llama


def test_bench_json_reports_every_figure(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    make_pair(tmp_path / "ctx")
    store = str(tmp_path / "store")
    run_bundle("pack", str(tmp_path / "ctx"), "-t", "tiny:1", "--key", str(keypair[0]), "--store", store, check=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello world"}\n{"prompt": "a second prompt"}\n')
    result = run_bundle("bench", "tiny:1", "--prompts", str(prompts), "--max-new-tokens", "10", "--repeat", "3", "--key", str(keypair[1]), "--store", store, "--json", check=True)
    out = json.loads(result.out)
    assert_matches_schema(out, "bench-report")
    for run in ("target_only", "hf_assisted", "bundle", "hf_assisted_default", "hf_assisted_k", "target_only_float32", "target_only_bfloat16"):
        assert out["runs"][run]["tokens_per_second"] > 0
    for key in ("speedup_vs_target", "speedup_vs_hf_assisted", "acceptance_rate", "cost_ratio", "theoretical_speedup", "identical_output",
                "mean_accepted_length", "break_even_acceptance", "verify_cost_ratio"):
        assert key in out
    assert out["identical_output"] is True and out["exactly_identical"] is True  # fp32: token for token
    assert out["prompts"] == 2
    # Three rounds over both prompts: tokens/s over all of them, each speed-up the median of the rounds'.
    assert len(out["rounds"]) == 3 and out["runs"]["bundle"]["new_tokens"] == 3 * 10 * 2
    for key in ("speedup_vs_target", "speedup_vs_hf_assisted", "speedup_vs_fastest_plain"):
        assert out[key] == sorted(r[key] for r in out["rounds"])[1]
    assert len(out["per_prompt"]) == 2


def test_bench_refuses_a_prompts_file_that_is_not_json_lines(tmp_path: Path) -> None:
    bad = tmp_path / "p.jsonl"
    bad.write_text("not json\n")
    result = run_bundle("bench", "tiny:1", "--prompts", str(bad), "--store", str(tmp_path / "s"))
    assert result.code == 2 and result.err.startswith("error: [usage] ")


def test_first_difference_measures_the_gap_on_the_target_alones_own_path() -> None:
    target = tiny_llama(64, seed=0, hidden=32, layers=2, init_std=0.3)
    prompt = [5, 9, 12]
    expected = generate_plain(target, prompt, 8).tokens
    got = expected[:3] + [(expected[3] + 1) % 64] + expected[4:]
    diff = first_difference(target, prompt, expected, got, "float32")
    assert diff["position"] == 3 and diff["gap"] >= 0.0
    with torch.inference_mode():
        logits = target(input_ids=torch.tensor([prompt + expected[:3]])).logits[0, -1]
    assert int(logits.argmax()) == expected[3]
    assert first_difference(target, prompt, expected, expected, "float32") is None


def test_break_even_acceptance_is_where_the_best_prediction_reaches_one() -> None:
    a = break_even_acceptance(0.1, 1.1, 8)
    assert abs(best_predicted_speedup(a, 0.1, 1.1, 8)[0] - 1.0) < 1e-3
    assert bf16_step(29.6) == 0.125 and bf16_step(12.5) == 0.0625
