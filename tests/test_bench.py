"""`bundle bench` on a signed tiny pair: every figure of the contract, in one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import assert_matches_schema, run_bundle
from runner.bench.torch_bench import bf16_step, first_difference, replay
from runner.bench.runs import break_even_acceptance
from runner.decoding.stats import best_predicted_speedup
from runner.models.compact_llama import CompactLlama
from runner.decoding.speculative import generate_plain, generate_speculative
from tests.tinymodels import layer_skip_draft, make_pair, tiny_llama


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> str:
    """A store holding the tiny pair as tiny-spec:1 (packed once for this module's benches)."""
    base = tmp_path_factory.mktemp("bench")
    make_pair(base / "ctx")
    run_bundle("pack", str(base / "ctx"), "-t", "tiny-spec:1", "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return str(base / "store")


def test_bench_json_reports_every_figure(tmp_path: Path, store: str, keypair: tuple[Path, Path]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello world"}\n{"prompt": "a second prompt"}\n')
    result = run_bundle("bench", "tiny-spec:1", "--prompts", str(prompts), "--max-new-tokens", "10", "--repeat", "3", "--key", str(keypair[1]), "--store", store, "--json", check=True)
    out = json.loads(result.out)
    assert_matches_schema(out, "bench-report")
    for run in ("target_only", "runner_plain", "hf_assisted", "bundle", "hf_assisted_default", "hf_assisted_k", "target_only_float32",
                "target_only_bfloat16"):
        assert out["runs"][run]["tokens_per_second"] > 0
    for key in ("speedup_vs_target", "speedup_vs_hf_assisted", "acceptance_rate", "cost_ratio", "theoretical_speedup", "identical_output",
                "mean_accepted_length", "break_even_acceptance", "verify_cost_ratio"):
        assert key in out
    assert out["identical_output"] is True and out["exactly_identical"] is True  # fp32: token for token
    # The tiny target is a Llama: our plain decoding runs it through runner.models.compact_llama, to the same tokens.
    assert out["runner_plain_identical"] is True
    assert out["prompts"] == 2
    # Three rounds over both prompts: tokens/s over all of them, each speed-up the median of the rounds'.
    assert len(out["rounds"]) == 3 and out["runs"]["bundle"]["new_tokens"] == 3 * 10 * 2
    for key in ("speedup_vs_target", "speedup_vs_runner_plain", "speedup_vs_hf_assisted", "speedup_vs_fastest_plain"):
        assert out[key] == sorted(r[key] for r in out["rounds"])[1]
    assert len(out["per_prompt"]) == 2
    assert out["fastest_plain"] in ("target_only_float32", "target_only_bfloat16", "runner_plain")


def test_bench_reports_each_category_the_method_chosen_and_prompt_lookup_as_a_peer(tmp_path: Path, store: str, keypair: tuple[Path, Path]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "one two three one two", "category": "copy"}\n{"prompt": "hello world", "category": "open"}\n'
                       '{"prompt": "a b c a b", "category": "copy"}\n')
    result = run_bundle("bench", "tiny-spec:1", "--prompts", str(prompts), "--max-new-tokens", "8", "--key", str(keypair[1]),
                        "--store", store, "--json", check=True)
    out = json.loads(result.out)
    assert_matches_schema(out, "bench-report")
    assert out["runs"]["hf_prompt_lookup"]["tokens_per_second"] > 0 and "speedup_vs_hf_prompt_lookup" in out
    assert list(out["categories"]) == ["copy", "open"]
    copy = out["categories"]["copy"]
    assert copy["prompts"] == 2 and sum(copy["methods"].values()) == 2
    assert set(copy["tokens_per_second"]) >= {"bundle", "runner_plain", "hf_prompt_lookup"}
    assert all(p["method"] for p in out["per_prompt"])


def test_bench_takes_a_shipped_prompt_set_by_name(store: str, keypair: tuple[Path, Path]) -> None:
    result = run_bundle("bench", "tiny-spec:1", "--prompts", "grounded", "--limit", "2", "--max-new-tokens", "4", "--key", str(keypair[1]),
                        "--store", store, "--json", check=True)
    out = json.loads(result.out)
    assert out["prompts"] == 2 and set(out["categories"]) <= {"edit-code", "rewrite", "extract-json", "answer-from-context", "multi-turn"}


def test_bench_refuses_an_unknown_prompt_set(tmp_path: Path) -> None:
    result = run_bundle("bench", "tiny-spec:1", "--prompts", "no-such-set", "--store", str(tmp_path / "s"))
    assert result.code == 2 and result.err.startswith("error: [usage] ") and "open" in result.err


def test_bench_reads_the_packaged_default_prompts_from_any_directory(tmp_path: Path, store: str, keypair: tuple[Path, Path]) -> None:
    elsewhere = tmp_path / "elsewhere"  # no benchmarks/ here: the default comes with the package
    elsewhere.mkdir()
    result = run_bundle("bench", "tiny-spec:1", "--limit", "1", "--max-new-tokens", "4", "--key", str(keypair[1]),
                        "--store", store, "--json", cwd=elsewhere, check=True)
    assert json.loads(result.out)["prompts"] == 1


def test_bench_refuses_a_prompts_file_that_is_not_json_lines(tmp_path: Path) -> None:
    bad = tmp_path / "p.jsonl"
    bad.write_text("not json\n")
    result = run_bundle("bench", "tiny-spec:1", "--prompts", str(bad), "--store", str(tmp_path / "s"))
    assert result.code == 2 and result.err.startswith("error: [usage] ")


def test_first_difference_measures_the_gap_on_the_target_alones_own_path() -> None:
    target = tiny_llama(64, seed=0, hidden=32, layers=2, init_std=0.3)
    prompt = [5, 9, 12]
    alone = generate_plain(target, prompt, 8)
    expected, calls = alone.tokens, alone.stats.target_calls
    got = expected[:3] + [(expected[3] + 1) % 64] + expected[4:]
    diff = first_difference(target, prompt, expected, got, "float32", calls)
    assert diff["position"] == 3 and diff["gap"] >= 0.0
    with torch.inference_mode():
        logits = target(input_ids=torch.tensor([prompt + expected[:3]])).logits[0, -1]
    assert int(logits.argmax()) == expected[3]
    assert first_difference(target, prompt, expected, expected, "float32", calls) is None


class _Recorder(torch.nn.Module):
    """A target that keeps every call's logits, row by row, with the cache length the call started at."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner, self.config, self.rows = inner, inner.config, {}

    @property
    def device(self):
        return self.inner.device

    def new_cache(self, tokens: int = 0):
        return self.inner.new_cache(tokens)

    def forward(self, input_ids, cache=None, **kwargs):
        start = cache.get_seq_length()
        out = self.inner(input_ids=input_ids, cache=cache, **kwargs)
        for r, row in enumerate(out.logits[0]):  # the latest call computing a position is the one that decided it
            self.rows[start + r + 1] = row.float().clone()
        return out


def test_replay_recomputes_a_speculative_runs_own_logits_bit_for_bit() -> None:
    """bf16, where a verify pass rounds differently from single steps: replaying the run's recorded calls,
    with filler where it had rejected drafts, gives the very logits that chose each of its tokens."""
    target = tiny_llama(320, seed=4, hidden=64, layers=3, heads=4, kv_heads=2, init_std=0.15, dtype=torch.bfloat16)
    recorder, prompt = _Recorder(CompactLlama(target)), [5, 17, 40, 9, 33, 2]
    run = generate_speculative(recorder, CompactLlama(layer_skip_draft(target, 1)), prompt, 60, draft_tokens=4, guard=False)
    assert run.stats.rejections > 0 and len(run.stats.target_calls) == run.stats.target_passes
    sequence = prompt + run.tokens
    for position in range(len(prompt), len(sequence)):
        got = replay(CompactLlama(target), sequence, run.stats.target_calls, position)
        assert torch.equal(got, recorder.rows[position]) and int(got.argmax()) == sequence[position]


def test_first_difference_replays_the_bundles_pass_and_judges_ties_in_both() -> None:
    """A token the bundle did not pick: not the bundle's computation's choice, and in float32 no tie."""
    target = tiny_llama(64, seed=0, hidden=32, layers=2, init_std=0.3)
    prompt = [5, 9, 12]
    run = generate_speculative(target, layer_skip_draft(target, 1), prompt, 8, draft_tokens=3, guard=False)
    alone = generate_plain(target, prompt, 8)
    expected = alone.tokens
    assert run.tokens == expected  # fp32: token for token
    got = expected[:3] + [(expected[3] + 1) % 64] + expected[4:]
    diff = first_difference(target, prompt, expected, got, "float32", alone.stats.target_calls, run.stats.target_calls, target)
    assert diff["position"] == 3 and diff["replayed"] is False and diff["bundle_pass_gap_bf16_steps"] < 0
    assert diff["tie"] is False and diff["target_alone_gap_bf16_steps"] > 0


def test_break_even_acceptance_is_where_the_best_prediction_reaches_one() -> None:
    a = break_even_acceptance(0.1, 1.1, 8)
    assert abs(best_predicted_speedup(a, 0.1, 1.1, 8)[0] - 1.0) < 1e-3
    assert bf16_step(29.6) == 0.125 and bf16_step(12.5) == 0.0625
