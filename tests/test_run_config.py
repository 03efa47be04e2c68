"""`bundle run` judges a signed config.json before any model is built: types and ranges (exit 6), a model_type
transformers cannot build without remote code (exit 6), and memory sized by the config, not only by the files
(exit 4); and `run --json` reports its timings and which forward each model ran through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import runner.models.loading
from core.errors import BundleError
from bundler.trust.keys import key_id, load_public_key
from bundler.store.refs import parse_ref
from bundler.verbs.run import run_bundle as run_in_process
from bundler.store.layout import Store
from conftest import run_bundle
from tests.tinymodels import make_pair
from tests.unchecked_pack import pack_unchecked

REF = "tiny-spec:1.0.0"


def _signed_with_target_config(tmp_path: Path, keypair: tuple[Path, Path], **changes) -> Path:
    paths = make_pair(tmp_path / "ctx")
    config = json.loads((paths["target"] / "config.json").read_text())
    (paths["target"] / "config.json").write_text(json.dumps({**config, **changes}))
    store = tmp_path / "store"
    # Built with the library: `bundle pack` refuses most of these configs itself (tests/test_pack_checks.py);
    # these tests are of run's own refusals.
    pack_unchecked(paths["root"], REF, store, keypair[0])
    return store


def _refusal(store: Path, keypair: tuple[Path, Path], **options) -> BundleError:
    key = load_public_key(keypair[1])
    before = runner.models.loading.LOADS
    with pytest.raises(BundleError) as err:
        run_in_process(Store(store), parse_ref(REF), {key_id(key): key}, "hello", max_new_tokens=4, **options)
    assert runner.models.loading.LOADS == before, "a model was loaded before the refusal"
    return err.value


def test_a_config_whose_vocabulary_needs_more_memory_than_the_budget_is_refused_before_loading(
    tmp_path: Path, keypair: tuple[Path, Path]
) -> None:
    # tiny weights, but a config that would allocate 60M x 64 embeddings: sized by the config, refused
    store = _signed_with_target_config(tmp_path, keypair, vocab_size=60_000_000)
    assert _refusal(store, keypair, memory_budget=200_000_000).code == "memory-budget"
    result = run_bundle("run", REF, "--prompt", "x", "--memory-budget", "200000000", "--key", str(keypair[1]), "--store", str(store))
    assert result.code == 4 and result.err.startswith("error: [memory-budget] "), result.err


def test_an_unknown_model_type_is_invalid_content(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    store = _signed_with_target_config(tmp_path, keypair, model_type="llama-with-remote-code")
    assert _refusal(store, keypair).code == "invalid-bundle"
    result = run_bundle("run", REF, "--prompt", "x", "--key", str(keypair[1]), "--store", str(store))
    assert result.code == 6 and result.err.startswith("error: [invalid-bundle] "), result.err


@pytest.mark.parametrize(
    "changes",
    [{"vocab_size": "320"}, {"num_hidden_layers": -1}, {"hidden_size": 64.5}, {"num_key_value_heads": 3}, {"rms_norm_eps": 0}],
    ids=["string", "negative", "float", "heads-do-not-split", "zero-eps"],
)
def test_config_types_and_ranges_are_checked_before_loading(tmp_path: Path, keypair: tuple[Path, Path], changes: dict) -> None:
    store = _signed_with_target_config(tmp_path, keypair, **changes)
    assert _refusal(store, keypair).code == "invalid-bundle"


def test_run_json_reports_timings_and_the_forward_each_model_ran(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    store = _signed_with_target_config(tmp_path, keypair)
    result = run_bundle("run", REF, "--prompt", "hello", "--max-new-tokens", "6", "--key", str(keypair[1]),
                        "--store", str(store), "--json", check=True)
    out = json.loads(result.out)
    timings = out["timings"]
    assert set(timings) >= {"verify_s", "extract_s", "load_s", "prefill_s", "decode_s", "first_token_s"}
    assert all(isinstance(v, float) and v >= 0 for v in timings.values())
    assert timings["first_token_s"] >= timings["verify_s"] + timings["extract_s"] + timings["load_s"] + timings["prefill_s"]
    assert out["forward"] == {"target": "compact", "draft": "compact"}  # tiny Llamas run through runner.models.compact_llama
