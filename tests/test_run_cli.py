"""`bundle run` on a real signed bundle of a tiny pair: the contract's JSON, and every refusal before any
weights are loaded (unsigned, tampered, untrusted signer, pairing, memory, tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import runner.models.loading
from core.errors import BundleError
from bundler.trust.keys import load_public_key, key_id
from bundler.store.modelkit import load_modelkit
from bundler.store.refs import parse_ref
from bundler.verbs.run import run_bundle as run_in_process
from bundler.store.layout import Store
from conftest import assert_matches_schema, copy_store, run_bundle
from tests.tinymodels import make_pair, write_tokenizer, train_tokenizer
from tests.unchecked_pack import pack_unchecked

REF = "tiny-spec:1.0.0"


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict[str, Path]:
    """A packed, signed tiny pair; tests copy its store before changing anything."""
    base = tmp_path_factory.mktemp("run")
    make_pair(base / "ctx")
    store = base / "store"
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(store), check=True)
    return {"base": base, "ctx": base / "ctx", "store": store}


def _refused_before_loading(store: Path, trusted: dict, code: str, **options) -> None:
    before = runner.models.loading.LOADS
    with pytest.raises(BundleError) as err:
        run_in_process(Store(store), parse_ref(REF), trusted, "hello", max_new_tokens=4, **options)
    assert err.value.code == code, err.value.line()
    assert runner.models.loading.LOADS == before  # no weights were loaded


def _trusted(pub: Path) -> dict:
    key = load_public_key(pub)
    return {key_id(key): key}


def test_run_json_reports_the_bundle_that_ran(signed: dict[str, Path], keypair: tuple[Path, Path]) -> None:
    result = run_bundle("run", REF, "--prompt", "hello world", "--max-new-tokens", "12", "--key", str(keypair[1]),
                        "--store", str(signed["store"]), "--json", check=True)
    out = json.loads(result.out)
    assert_matches_schema(out, "run-report")
    mk = load_modelkit(Store(signed["store"]), parse_ref(REF))
    assert out["ok"] is True and out["error"] is None
    assert out["bundle"] == {"ref": REF, "digest": mk.digest, "signer": key_id(load_public_key(keypair[1]))}
    assert out["tokenizer"]["fingerprint"].startswith("sha256:")
    assert len(out["tokens"]) == out["stats"]["new_tokens"] <= 12
    for field in ("new_tokens", "drafted", "accepted", "acceptance_rate", "mean_accepted_length", "target_passes", "tokens_per_second", "fallback"):
        assert field in out["stats"]


def test_run_streams_text_then_statistics(signed: dict[str, Path], keypair: tuple[Path, Path]) -> None:
    result = run_bundle("run", REF, "--prompt", "hello", "--max-new-tokens", "8", "--key", str(keypair[1]), "--store", str(signed["store"]), check=True)
    assert "tokens/s" in result.err and "acceptance" in result.err


def test_run_refuses_an_unsigned_bundle(signed: dict[str, Path], tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    store = tmp_path / "unsigned"
    run_bundle("pack", str(signed["ctx"]), "-t", REF, "--store", str(store), check=True)
    _refused_before_loading(store, _trusted(keypair[1]), "signature-missing")
    result = run_bundle("run", REF, "--prompt", "x", "--key", str(keypair[1]), "--store", str(store), "--allow-unsigned")
    assert result.code == 2  # run has no --allow-unsigned


def test_run_refuses_a_tampered_bundle(signed: dict[str, Path], tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    store = copy_store(signed["store"], tmp_path)
    mk = load_modelkit(Store(store), parse_ref(REF))
    blob = Store(store).blob_path(next(d for s, d in mk.layers if s.role == "draft").digest)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    _refused_before_loading(store, _trusted(keypair[1]), "digest-mismatch")
    result = run_bundle("run", REF, "--prompt", "x", "--key", str(keypair[1]), "--store", str(store), "--json")
    assert result.code == 3
    assert json.loads(result.out)["error"]["code"] == "digest-mismatch"
    assert_matches_schema(json.loads(result.out), "run-report")
    assert result.err.startswith("error: [digest-mismatch] ")


def test_run_refuses_an_untrusted_signer(signed: dict[str, Path], other_keypair: tuple[Path, Path]) -> None:
    _refused_before_loading(signed["store"], _trusted(other_keypair[1]), "untrusted-signer")
    _refused_before_loading(signed["store"], {}, "untrusted-signer")


@pytest.mark.parametrize(
    "speculative, code",
    [({"draft_tokens": 4, "min_size_ratio": 1000}, "size-ratio")],
)
def test_run_refuses_a_pairing_violation(tmp_path: Path, keypair: tuple[Path, Path], speculative: dict, code: str) -> None:
    make_pair(tmp_path / "ctx", speculative=speculative)
    store = tmp_path / "store"
    pack_unchecked(tmp_path / "ctx", REF, store, keypair[0])  # `bundle pack` refuses it (tests/test_pack_checks.py); run's refusal is tested
    _refused_before_loading(store, _trusted(keypair[1]), code)


def test_run_refuses_another_model_family(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    paths = make_pair(tmp_path / "ctx")
    config = json.loads((paths["draft"] / "config.json").read_text())
    config["model_type"] = "gpt2"
    (paths["draft"] / "config.json").write_text(json.dumps(config))
    store = tmp_path / "store"
    pack_unchecked(paths["root"], REF, store, keypair[0])  # `bundle pack` refuses it (tests/test_pack_checks.py); run's refusal is tested
    _refused_before_loading(store, _trusted(keypair[1]), "model-family")


def test_run_refuses_a_memory_budget_too_small(signed: dict[str, Path], keypair: tuple[Path, Path]) -> None:
    _refused_before_loading(signed["store"], _trusted(keypair[1]), "memory-budget", memory_budget=1000)
    result = run_bundle("run", REF, "--prompt", "x", "--memory-budget", "1000", "--key", str(keypair[1]), "--store", str(signed["store"]))
    assert result.code == 4 and result.err.startswith("error: [memory-budget] ")


def test_run_refuses_a_draft_with_another_tokenizer(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    paths = make_pair(tmp_path / "ctx")
    write_tokenizer(paths["draft"], train_tokenizer(300))  # the draft carries its own, different tokenizer
    store = tmp_path / "store"
    pack_unchecked(paths["root"], REF, store, keypair[0])  # `bundle pack` refuses it (tests/test_pack_checks.py); run's refusal is tested
    before = runner.models.loading.LOADS
    result = run_bundle("run", REF, "--prompt", "x", "--key", str(keypair[1]), "--store", str(store))
    assert result.code == 4, result.err
    assert result.err.startswith("error: [tokenizer-mismatch] ")
    _refused_before_loading(store, _trusted(keypair[1]), "tokenizer-mismatch")
    assert runner.models.loading.LOADS == before
