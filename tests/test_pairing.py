"""Pairing policy and memory preflight: decided from configs and headers, before any weight is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import runner.models.loading
from core.errors import BundleError
from runner.checks.modelinfo import count_parameters, estimate_memory
from runner.checks.memory import check_memory
from runner.checks.pairing import check_pairing
from runner.run import run_unpacked
from tests.tinymodels import make_pair, tiny_llama, truncate_weights_to_header

ROLES = {"target": "target/", "draft": "draft/", "tokenizer": "tokenizer/"}


@pytest.fixture
def weightless_pair(tmp_path):
    """A tiny pair whose weight files hold only their headers: any attempt to load them fails."""
    paths = make_pair(tmp_path)
    truncate_weights_to_header(paths["target"])
    truncate_weights_to_header(paths["draft"])
    return paths


def refused_before_loading(root: Path, params: dict, **options) -> BundleError:
    loads = runner.models.loading.LOADS
    with pytest.raises(BundleError) as caught:
        run_unpacked(root, ROLES, params, "hello", max_new_tokens=8, **options)
    assert runner.models.loading.LOADS == loads, "a model was loaded before the refusal"
    assert caught.value.exit_code == 4
    return caught.value


def test_parameters_are_counted_from_headers_with_tied_embeddings_once(tmp_path):
    model = tiny_llama(320, hidden=64, layers=2)
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert count_parameters(tmp_path) == sum(p.numel() for p in model.parameters())  # parameters() dedups ties


def test_memory_estimate_is_weights_plus_kv_cache(weightless_pair):
    estimate = estimate_memory(weightless_pair["target"], weightless_pair["draft"], "bfloat16", 100)
    # target: 2 layers x 2 kv heads x 16 dims; draft: 1 layer x 1 kv head x 8 dims; keys and values, 2 bytes
    assert estimate["kv_cache_bytes"] == 100 * 2 * 2 * (2 * 2 * 16 + 1 * 1 * 8)
    assert estimate["weights_bytes"] == 2 * (estimate["target_parameters"] + estimate["draft_parameters"])
    parts = ("weights_bytes", "kv_cache_bytes", "activation_bytes", "loader_bytes")
    assert estimate["total_bytes"] == sum(estimate[k] for k in parts)


def test_a_pair_of_one_family_with_a_large_size_gap_passes(weightless_pair):
    found = check_pairing(weightless_pair["target"], weightless_pair["draft"], {})
    assert found["target_family"] == found["draft_family"] == "llama"
    assert found["size_ratio"] >= 4


def test_different_model_family_is_refused_before_loading(weightless_pair):
    config_path = weightless_pair["draft"] / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "model_type": "qwen2"}))
    error = refused_before_loading(weightless_pair["root"], {})
    assert error.code == "model-family"
    assert error.message.startswith("target is llama, draft is qwen2")


def test_different_model_family_passes_when_the_kitfile_allows_it(weightless_pair):
    config_path = weightless_pair["draft"] / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "model_type": "qwen2"}))
    assert check_pairing(weightless_pair["target"], weightless_pair["draft"], {"allow_cross_family": True})


def test_size_ratio_below_the_minimum_is_refused_before_loading(weightless_pair):
    error = refused_before_loading(weightless_pair["root"], {"min_size_ratio": 50})
    assert error.code == "size-ratio"
    assert "ratio 12.65 < 50" in error.message


def test_draft_as_large_as_the_target_is_refused_by_the_default_ratio(tmp_path):
    paths = make_pair(tmp_path, draft_hidden=64, draft_layers=2)
    with pytest.raises(BundleError) as caught:
        check_pairing(paths["target"], paths["draft"], {})
    assert caught.value.code == "size-ratio"


def test_memory_budget_too_small_is_refused_before_loading(weightless_pair):
    error = refused_before_loading(weightless_pair["root"], {}, memory_budget=100_000)
    assert error.code == "memory-budget"
    assert error.message.endswith("but 97.66 KiB is --memory-budget")


def test_estimate_beyond_available_memory_is_refused():
    with pytest.raises(BundleError) as caught:
        check_memory({"weights_bytes": 2**60, "kv_cache_bytes": 0, "total_bytes": 2**60}, None)
    assert caught.value.code == "memory-budget"


def test_pickle_weights_are_refused_before_loading(weightless_pair):
    torch.save({"x": torch.zeros(1)}, weightless_pair["draft"] / "pytorch_model.bin")
    error = refused_before_loading(weightless_pair["root"], {})
    assert error.code == "pickle-weights"
    assert error.message.startswith("draft holds pytorch_model.bin")


def _cgroup_tree(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    for name, text in files.items():
        (tmp_path / "sys" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "sys" / name).write_text(text)
    (tmp_path / "cgroup").write_text(proc)
    return tmp_path / "cgroup", tmp_path / "sys"


def test_cgroup_room_is_the_least_limit_less_usage_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    from runner.checks.memory import cgroup_room

    # cgroup v2: a pod's limit (1 GiB, 600 MiB used) under a node slice with a looser one, the root unlimited
    proc, root = _cgroup_tree(tmp_path / "v2", "0::/kubepods/pod1\n", {
        "memory.max": "max\n", "memory.current": "1\n",
        "kubepods/memory.max": str(8 << 30), "kubepods/memory.current": str(1 << 30),
        "kubepods/pod1/memory.max": str(1 << 30), "kubepods/pod1/memory.current": str(600 << 20)})
    assert cgroup_room(proc, root) == (1 << 30) - (600 << 20)
    # cgroup v1 (a hybrid system: the unified line has no memory files), the limit at the process's own cgroup
    proc, root = _cgroup_tree(tmp_path / "v1", "4:memory:/job\n0::/job\n", {
        "memory/memory.limit_in_bytes": "9223372036854771712", "memory/memory.usage_in_bytes": "5",
        "memory/job/memory.limit_in_bytes": str(2 << 30), "memory/job/memory.usage_in_bytes": str(3 << 30)})
    assert cgroup_room(proc, root) == 0  # over its limit already: no room, not a negative one
    # no limit anywhere, or nothing readable: None (MemAvailable alone decides)
    proc, root = _cgroup_tree(tmp_path / "none", "0::/\n", {"memory.max": "max", "memory.current": "7"})
    assert cgroup_room(proc, root) is None
    assert cgroup_room(tmp_path / "missing", root) is None


def test_the_default_prompt_cache_fits_a_containers_limit_and_the_machine() -> None:
    from runner.checks.memory import PROMPT_CACHE_MAX, default_prompt_cache

    assert default_prompt_cache(64 << 30, None) == PROMPT_CACHE_MAX  # a big machine, no limit: at most 8 GiB
    assert default_prompt_cache(2 << 30, None) == 1 << 30  # half what is left
    assert default_prompt_cache(64 << 30, 300 << 20) == 150 << 20  # a pod's limit: half its room
    assert default_prompt_cache(64 << 30, -(100 << 20)) == 0  # the KV caches alone fill the limit: none
