"""`bundle pack` and `bundle sign` refuse, before anything is written or signed, every bundle `verify` or
`run` would refuse for its content (roles, the tokenizer gate, config agreement, pairing), each with the code
verify or run gives; and a name and version already signed in the store with other content (`rollback`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

from conftest import run_bundle, tree_digest
from tests.tinygguf import write_gguf
from tests.tinymodels import make_pair, train_tokenizer, write_kitfile, write_tokenizer
from tests.unchecked_pack import pack_unchecked

REF = "tiny-spec:1.0.0"


@pytest.fixture(scope="module")
def good_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny pair verify and run accept; each test changes a copy."""
    return make_pair(tmp_path_factory.mktemp("pack-checks") / "ctx")["root"]


def _empty_tokenizer_dir(ctx: Path) -> None:
    shutil.rmtree(ctx / "tokenizer")
    (ctx / "tokenizer").mkdir()


def _draft_without_config(ctx: Path) -> None:
    (ctx / "draft" / "config.json").unlink()


def _draft_tokenizer_with_other_ids(ctx: Path) -> None:
    write_tokenizer(ctx / "draft", train_tokenizer(300))  # another vocabulary: other ids for the same text


def _draft_config_with_other_eos(ctx: Path) -> None:
    config = json.loads((ctx / "draft" / "config.json").read_text())
    config["eos_token_id"] = 0  # the tokenizer's eos <|im_end|> is id 2
    (ctx / "draft" / "config.json").write_text(json.dumps(config))


def _target_config_needing_remote_code(ctx: Path) -> None:
    config = json.loads((ctx / "target" / "config.json").read_text())
    config["model_type"] = "llama-with-remote-code"  # transformers builds no such model without remote code
    (ctx / "target" / "config.json").write_text(json.dumps(config))


def _target_and_draft_swapped(ctx: Path) -> None:
    (ctx / "target").rename(ctx / "was-target")
    (ctx / "draft").rename(ctx / "target")
    (ctx / "was-target").rename(ctx / "draft")


def _gguf_draft_with_other_eos(ctx: Path) -> None:
    _gguf_pair(ctx, draft_tokenizer={"eos_token_id": 0})


def _gguf_pair(ctx: Path, draft_tokenizer: dict | None = None) -> None:
    for role in ("target", "draft"):
        shutil.rmtree(ctx / role)
        (ctx / role).mkdir()
    write_gguf(ctx / "target" / "model.gguf", seed=0, hidden=128, layers=2)
    write_gguf(ctx / "draft" / "model.gguf", seed=1, tokenizer=draft_tokenizer, hidden=32, layers=1, heads=2, kv_heads=1)


# case -> (how the good pair is spoiled, the code verify or run refuses it with, its exit code)
REFUSED: dict[str, tuple[Callable[[Path], None], str, int]] = {
    "an empty tokenizer directory": (_empty_tokenizer_dir, "invalid-bundle", 6),
    "a draft without config.json": (_draft_without_config, "invalid-bundle", 6),
    "a draft tokenizer.json with other ids": (_draft_tokenizer_with_other_ids, "tokenizer-mismatch", 4),
    "a draft config.json eos id not the tokenizer's": (_draft_config_with_other_eos, "tokenizer-mismatch", 4),
    "a target config.json with an unknown model_type": (_target_config_needing_remote_code, "invalid-bundle", 6),
    "target and draft swapped": (_target_and_draft_swapped, "size-ratio", 4),
    "a GGUF draft with another eos id": (_gguf_draft_with_other_eos, "tokenizer-mismatch", 4),
}


def _spoiled(good_pair: Path, tmp_path: Path, case: str) -> Path:
    ctx = tmp_path / "ctx"
    shutil.copytree(good_pair, ctx)
    REFUSED[case][0](ctx)
    return ctx


def _refused(result, code: str, exit_code: int) -> None:
    assert result.code == exit_code, result.err
    assert result.err.startswith(f"error: [{code}] ") and len(result.err.strip().splitlines()) == 1, result.err


@pytest.mark.parametrize("case", list(REFUSED))
def test_pack_refuses_before_writing_what_verify_or_run_would_refuse(good_pair: Path, tmp_path: Path, keypair, case: str) -> None:
    _, code, exit_code = REFUSED[case]
    ctx, store = _spoiled(good_pair, tmp_path, case), tmp_path / "store"
    _refused(run_bundle("pack", str(ctx), "-t", REF, "--key", str(keypair[0]), "--store", str(store)), code, exit_code)
    _refused(run_bundle("pack", str(ctx), "-t", REF, "--store", str(store)), code, exit_code)  # signing or not
    assert tree_digest(store) == "absent"


@pytest.mark.parametrize("case", list(REFUSED))
def test_sign_refuses_the_same_bundles_with_the_same_code(good_pair: Path, tmp_path: Path, keypair, case: str) -> None:
    _, code, exit_code = REFUSED[case]
    store = tmp_path / "store"
    pack_unchecked(_spoiled(good_pair, tmp_path, case), REF, store)  # as if it came from elsewhere: pack refuses it
    before = tree_digest(store)
    _refused(run_bundle("sign", REF, "--key", str(keypair[0]), "--store", str(store)), code, exit_code)
    assert tree_digest(store) == before


def test_pack_and_sign_accept_a_good_pair_and_it_verifies(good_pair: Path, tmp_path: Path, keypair) -> None:
    store = str(tmp_path / "store")
    packed = run_bundle("pack", str(good_pair), "-t", REF, "--store", store, check=True)
    assert "checked: tokenizer sha256:" in packed.out and "llama pair (safetensors)" in packed.out
    run_bundle("sign", REF, "--key", str(keypair[0]), "--store", store, check=True)
    run_bundle("verify", REF, "--key", str(keypair[1]), "--store", store, check=True)


def test_pack_accepts_a_good_gguf_pair_and_it_verifies(good_pair: Path, tmp_path: Path, keypair) -> None:
    ctx = tmp_path / "ctx"
    shutil.copytree(good_pair, ctx)
    _gguf_pair(ctx)
    write_kitfile(ctx, speculative={"draft_tokens": 3, "min_acceptance": 0.0})
    store = str(tmp_path / "store")
    packed = run_bundle("pack", str(ctx), "-t", REF, "--key", str(keypair[0]), "--store", store, check=True)
    assert "pair (gguf)" in packed.out
    run_bundle("verify", REF, "--key", str(keypair[1]), "--store", store, check=True)


def _other_content(ctx: Path, tmp_path: Path) -> Path:
    """The same name and version as ctx, one byte of its README changed."""
    other = tmp_path / "other"
    shutil.copytree(ctx, other)
    (other / "README.md").write_text((other / "README.md").read_text() + ".")
    return other


def test_pack_refuses_a_signed_release_with_other_content_and_says_to_raise_the_version(good_pair: Path, tmp_path: Path, keypair) -> None:
    store = tmp_path / "store"
    run_bundle("pack", str(good_pair), "-t", REF, "--key", str(keypair[0]), "--store", str(store), check=True)
    before = tree_digest(store)
    for tag in (REF, "tiny-spec:again"):
        result = run_bundle("pack", str(_other_content(good_pair, tmp_path / tag)), "-t", tag, "--key", str(keypair[0]), "--store", str(store))
        _refused(result, "rollback", 3)
        assert "tiny-spec 1.0.0 is already signed" in result.err and "raise package.version in the Kitfile" in result.err
    assert tree_digest(store) == before


def test_pack_of_the_same_release_again_stores_nothing_new(good_pair: Path, tmp_path: Path, keypair) -> None:
    store = tmp_path / "store"
    first = run_bundle("pack", str(good_pair), "-t", REF, "--key", str(keypair[0]), "--store", str(store), check=True)
    before = tree_digest(store)
    again = run_bundle("pack", str(good_pair), "-t", REF, "--store", str(store), check=True)
    assert again.out.splitlines()[-1] == first.out.splitlines()[-1]
    assert tree_digest(store) == before


def test_a_raised_version_packs(good_pair: Path, tmp_path: Path, keypair) -> None:
    store = str(tmp_path / "store")
    run_bundle("pack", str(good_pair), "-t", REF, "--key", str(keypair[0]), "--store", store, check=True)
    other = _other_content(good_pair, tmp_path)
    (other / "Kitfile").write_text((other / "Kitfile").read_text().replace("version: 1.0.0", "version: 1.0.1"))
    run_bundle("pack", str(other), "-t", "tiny-spec:1.0.1", "--key", str(keypair[0]), "--store", store, check=True)
    run_bundle("verify", "tiny-spec:1.0.1", "--key", str(keypair[1]), "--store", store, check=True)


def test_pack_refuses_other_content_for_a_version_verify_remembers_even_with_its_signature_gone(good_pair: Path, tmp_path: Path, keypair) -> None:
    store = str(tmp_path / "store")
    run_bundle("pack", str(good_pair), "-t", REF, "--key", str(keypair[0]), "--store", store, check=True)
    run_bundle("verify", REF, "--key", str(keypair[1]), "--store", store, check=True)  # remembered in versions.json
    run_bundle("rm", REF, "--store", store, check=True)
    run_bundle("gc", "--store", store, check=True)  # the bundle and its signature are gone
    before = tree_digest(Path(store))
    _refused(run_bundle("pack", str(_other_content(good_pair, tmp_path)), "-t", REF, "--store", store), "rollback", 3)
    assert tree_digest(Path(store)) == before


def test_sign_refuses_other_content_under_a_signed_release(good_pair: Path, tmp_path: Path, keypair) -> None:
    store = tmp_path / "store"
    run_bundle("pack", str(good_pair), "-t", REF, "--key", str(keypair[0]), "--store", str(store), check=True)
    pack_unchecked(_other_content(good_pair, tmp_path), "tiny-spec:other", store)  # pack refuses it; built as if pulled unsigned
    before = tree_digest(store)
    result = run_bundle("sign", "tiny-spec:other", "--key", str(keypair[0]), "--store", str(store))
    _refused(result, "rollback", 3)
    assert "raise package.version in the Kitfile" in result.err
    assert tree_digest(store) == before
