"""The guard's prior (runner.decoding.cost_prior): costs read off a measured table, interpolated by size in
log-parameters, Leviathan's speed-up from them, and no prior where no table fits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from runner.decoding import cost_prior
from runner.decoding.stats import predicted_speedup

KS = range(1, 9)


def model(name: str, params: float, step_s: float, verify: dict[int, float]) -> dict:
    return {"name": name, "params": int(params), "step_s": step_s, "prefill_s": 10 * step_s, "context": 128,
            "verify_steps": {str(k): verify[k] for k in KS}}


def table() -> dict:
    """llama.cpp: a small model whose verify pass grows with its length (compute-bound) and a big one where it
    is nearly free (bandwidth-bound); torch: two small compute-bound models, the smaller a draft of the other."""
    small = model("small", 1e8, 0.01, {k: 1.0 + 0.5 * k for k in KS})
    big = model("big", 1e10, 1.0, {k: 1.0 + 0.02 * k for k in KS})
    torch_models = [model("draft", 1e7, 0.004, {k: 1.0 + 0.7 * k for k in KS}),
                    model("target", 1e8, 0.01, {k: 1.0 + 0.7 * k for k in KS})]
    return {"cpu_class": "avx512_bf16", "engines": {"llama.cpp": {"Q4_0": [big, small]}, "torch": {"BF16": torch_models}}}


def test_costs_are_interpolated_in_log_parameters() -> None:
    c, v = cost_prior.pair_costs("llama.cpp", "Q4_0", int(1e9), int(1e8), 4, table())
    assert c == pytest.approx(0.01 / 0.1)  # the step time halfway in log-size between 10 ms and 1 s: 100 ms
    assert v == pytest.approx((3.0 + 1.08) / 2)


def test_measured_sizes_give_their_own_costs() -> None:
    c, v = cost_prior.pair_costs("llama.cpp", "Q4_0", int(1e10), int(1e8), 8, table())
    assert (c, v) == (pytest.approx(0.01), pytest.approx(1.16))


def test_prior_speedup_is_leviathans_formula_on_the_table_costs() -> None:
    speedup = cost_prior.prior_speedup("llama.cpp", "q4_0", int(1e9), int(1e8), 4, 0.7, table())
    assert speedup == pytest.approx(predicted_speedup(0.7, 4, 0.1, 2.04))


def test_a_compute_bound_pair_cannot_pay_at_the_demos_acceptance() -> None:
    best = cost_prior.best_prior_speedup("torch", "bf16", int(1e8), int(1e7), 0.45, 8, table())
    assert best is not None and best[0] < 1.0
    assert cost_prior.break_even_acceptance("torch", "BF16", int(1e8), int(1e7), 1, table()) == math.inf  # 2 tokens, 2.1 steps


def test_a_bandwidth_bound_pair_pays_and_breaks_even_below_the_demos_acceptance() -> None:
    speedup, k = cost_prior.best_prior_speedup("llama.cpp", "Q4_0", int(1e10), int(1e9), 0.45, 8, table())
    assert speedup > 1.0 and k >= 1
    even = cost_prior.break_even_acceptance("llama.cpp", "Q4_0", int(1e10), int(1e9), 2, table())
    assert 0.0 < even < 0.45
    assert cost_prior.prior_speedup("llama.cpp", "Q4_0", int(1e10), int(1e9), 2, even, table()) == pytest.approx(1.0)


@pytest.mark.parametrize("engine, quant, target, draft", [
    ("llama.cpp", "Q4_K_M", 1e9, 1e8),  # no measurement of that quantization
    ("vllm", "Q4_0", 1e9, 1e8),  # nor of that engine
    ("llama.cpp", "Q4_0", 1e11, 1e9),  # a target past the largest measured size
    ("llama.cpp", "Q4_0", 1e9, 1e6),  # a draft below the smallest
])
def test_no_prior_where_no_table_fits(engine: str, quant: str, target: float, draft: float) -> None:
    assert cost_prior.prior_speedup(engine, quant, int(target), int(draft), 4, 0.8, table()) is None
    assert cost_prior.break_even_acceptance(engine, quant, int(target), int(draft), 4, table()) is None


def test_no_prior_without_a_table_for_the_cpu_class(tmp_path: Path) -> None:
    assert cost_prior.load_table("avx2", tmp_path) is None
    (tmp_path / "avx2.json").write_text(json.dumps(table()))
    assert cost_prior.load_table("avx2", tmp_path)["engines"]["torch"]["BF16"][1]["name"] == "target"


def test_cpu_class_is_the_fastest_extension_present() -> None:
    assert cost_prior.cpu_class(["AVX2", "AVX-512", "AVX-512 BF16", "AMX", "AMX-BF16"]) == "amx"
    assert cost_prior.cpu_class(["AVX2", "AVX-512", "AVX-512 BF16"]) == "avx512_bf16"
    assert cost_prior.cpu_class(["AVX2", "FMA"]) == "avx2"
    assert cost_prior.cpu_class(["FMA"]) is None


def test_quantization_names_follow_the_tables() -> None:
    assert [cost_prior.quant_name(q) for q in ("q4_k_m", "MOSTLY_Q4_0", "bfloat16", "torch.bfloat16", "ALL_F32")] == [
        "Q4_K_M", "Q4_0", "BF16", "BF16", "F32"]
    assert [cost_prior.quant_name(q) for q in (2, "3", 15, "32")] == ["Q4_0", "Q4_1", "Q4_K_M", "BF16"]  # general.file_type


@pytest.mark.parametrize("path", sorted(cost_prior.TABLES.glob("*.json")), ids=lambda p: p.name)
def test_committed_tables_cover_every_k(path: Path) -> None:
    data = json.loads(path.read_text())
    assert data["cpu_class"] == path.stem
    for quants in data["engines"].values():
        for models in quants.values():
            for m in models:
                assert m["params"] > 0 and m["step_s"] > 0
                assert all(m["verify_steps"][str(k)] > 0 for k in KS)
