"""Hostile bundles, the layers: a signed bundle in a real store whose blobs an attacker changed in place, re-digested
up the chain, swapped from another bundle, or filled with pickle weights (tests/hostile_store.py's Attack: each test
on its own copy of the store). `bundle verify` (and `unpack` where files would be written) refuses with the right
exit code and one line `error: [code] ...`, and nothing is written anywhere."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from attacker import StoreEditor, build_tar, file_entry, flip, read_members, with_content
from conftest import run_bundle
from hostile_store import _draft_with, Attack, INTEGRITY, INVALID, NEWER, OTHER, POLICY, REF, attack, base, packed, store  # noqa: F401  (fixtures)


@pytest.mark.parametrize(
    ("role", "member"),
    [("draft", "draft/model.safetensors"), ("target", "target/model.safetensors"), ("tokenizer", "tokenizer/tokenizer.json")],
)
def test_flipped_byte_in_a_layer_is_a_digest_mismatch(attack: Attack, role: str, member: str) -> None:
    digest = attack.edit.layer_digest(REF, role)
    with tarfile.open(attack.edit.path(digest)) as tar:
        info = tar.getmember(member)
    data = attack.edit.read(digest)
    attack.edit.overwrite(digest, flip(data, info.offset_data + info.size // 2))
    attack.refused("digest-mismatch", INTEGRITY, unpack=role == "draft")


def test_flipped_byte_in_the_config_blob_is_a_digest_mismatch(attack: Attack) -> None:
    digest = attack.edit.config_digest(REF)
    data = attack.edit.read(digest)
    attack.edit.overwrite(digest, data.replace(b'"draft_tokens":4', b'"draft_tokens":5'))
    attack.refused("digest-mismatch", INTEGRITY)


def test_flipped_byte_in_the_manifest_is_a_digest_mismatch(attack: Attack) -> None:
    digest = attack.edit.manifest_digest(REF)
    attack.edit.overwrite(digest, attack.edit.read(digest).replace(b'"schemaVersion":2', b'"schemaVersion":3'))
    attack.refused("digest-mismatch", INTEGRITY)


def test_truncated_layer_blob_is_a_digest_mismatch(attack: Attack) -> None:
    digest = attack.edit.layer_digest(REF, "target")
    data = attack.edit.read(digest)
    attack.edit.overwrite(digest, data[: len(data) // 2])
    attack.refused("digest-mismatch", INTEGRITY, unpack=True)


def test_layer_blob_longer_than_its_descriptor_is_a_digest_mismatch(attack: Attack) -> None:
    digest = attack.edit.layer_digest(REF, "draft")
    attack.edit.overwrite(digest, attack.edit.read(digest) + b"\0" * 1024)
    attack.refused("digest-mismatch", INTEGRITY)


@pytest.mark.parametrize("which", ["layer", "config"])
def test_blob_removed_from_the_store_is_a_missing_file(attack: Attack, which: str) -> None:
    attack.edit.remove(attack.edit.layer_digest(REF, "draft") if which == "layer" else attack.edit.config_digest(REF))
    attack.refused("missing-file", INTEGRITY)


@pytest.mark.parametrize(("role", "member"), [("draft", "draft/model.safetensors"), ("target", "target/model.safetensors")])
def test_redigested_weights_no_longer_match_the_signed_manifest(attack: Attack, role: str, member: str) -> None:
    members = with_content(read_members(attack.edit.layer(REF, role)), member, flip)
    attack.edit.rewrite(REF, layers={role: build_tar(members)})
    attack.refused("signature-mismatch", INTEGRITY, unpack=role == "draft")


def test_redigested_config_change_no_longer_matches_the_signed_manifest(attack: Attack) -> None:
    attack.edit.rewrite(REF, config=lambda c: c["model"]["parameters"]["speculative"].update(draft_tokens=64))
    attack.refused("signature-mismatch", INTEGRITY)


def test_redigested_manifest_change_no_longer_matches_the_signed_manifest(attack: Attack) -> None:
    attack.edit.rewrite(REF, manifest=lambda m: m.setdefault("annotations", {}).update(evil="1"))
    attack.refused("signature-mismatch", INTEGRITY)


def test_redigested_manifest_leaves_its_signature_behind(attack: Attack) -> None:
    attack.edit.rewrite(REF, manifest=lambda m: m.setdefault("annotations", {}).update(evil="1"), repoint_signatures=False)
    attack.refused("signature-missing", INTEGRITY)


def test_draft_swapped_from_another_bundle_is_a_signature_mismatch(attack: Attack) -> None:
    # 1.1.0's draft: other weights, same tokenizer, so only the signature can tell.
    attack.edit.rewrite(REF, layers={"draft": attack.edit.layer(NEWER, "draft")})
    attack.refused("signature-mismatch", INTEGRITY)


def test_draft_swapped_from_a_bundle_with_another_tokenizer_is_a_tokenizer_mismatch(attack: Attack) -> None:
    attack.edit.rewrite(REF, layers={"draft": attack.edit.layer(OTHER, "draft")})
    attack.refused("tokenizer-mismatch", POLICY)


@pytest.mark.parametrize("resigned", [False, True], ids=["signature-left", "resigned-with-trusted-key"])
def test_swapped_tokenizer_is_a_tokenizer_mismatch(attack: Attack, resigned: bool) -> None:
    attack.edit.rewrite(REF, layers={"tokenizer": attack.edit.layer(OTHER, "tokenizer")})
    if resigned:  # the policy holds even over content the trusted key signed
        attack.edit.drop_signatures()
        attack.edit.sign_with_key(REF, attack.base.key)
    attack.refused("tokenizer-mismatch", POLICY, unpack=resigned)


def test_added_file_is_an_extra_file(attack: Attack) -> None:
    attack.edit.rewrite(REF, layers={"draft": _draft_with(attack, file_entry("draft/notes.txt", b"not signed"))})
    attack.refused("extra-file", INTEGRITY, unpack=True)


def test_removed_file_is_a_missing_file(attack: Attack) -> None:
    members = [m for m in read_members(attack.edit.layer(REF, "draft")) if m[0].name != "draft/tokenizer_config.json"]
    attack.edit.rewrite(REF, layers={"draft": build_tar(members)})
    attack.refused("missing-file", INTEGRITY)


def test_renamed_file_is_tampered(attack: Attack) -> None:
    members = read_members(attack.edit.layer(REF, "draft"))
    for info, _ in members:
        if info.name == "draft/model.safetensors":
            info.name = "draft/model-00001-of-00001.safetensors"
    attack.edit.rewrite(REF, layers={"draft": build_tar(members)})
    attack.refused("tampered", INTEGRITY)


def test_truncated_archive_with_recomputed_digest_and_trusted_signature_is_refused(attack: Attack) -> None:
    layer = attack.edit.layer(REF, "target")
    attack.edit.rewrite(REF, layers={"target": layer[: len(layer) // 2]})
    attack.edit.drop_signatures()
    attack.edit.sign_with_key(REF, attack.base.key)
    attack.refused("integrity", INTEGRITY, unpack=True)


def test_layer_smuggled_into_the_manifest_is_an_invalid_bundle(attack: Attack) -> None:
    smuggled = build_tar([file_entry("payload/run.sh", b"#!/bin/sh\nrm -rf ~\n")])
    desc = {"mediaType": "application/vnd.kitops.modelkit.code.v1.tar", "digest": attack.edit.put(smuggled), "size": len(smuggled)}
    attack.edit.rewrite(REF, manifest=lambda m: m["layers"].append(desc))
    attack.refused("invalid-bundle", INVALID)


@pytest.mark.parametrize("name", ["draft/pytorch_model.bin", "draft/weights.pt"])
def test_pickle_weights_signed_by_the_trusted_key_are_refused(attack: Attack, name: str) -> None:
    pickle = b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x8c\x06system\x93\x8c\x04true\x85R."
    attack.edit.rewrite(REF, layers={"draft": _draft_with(attack, file_entry(name, pickle))})
    attack.edit.drop_signatures()
    attack.edit.sign_with_key(REF, attack.base.key)
    attack.refused("pickle-weights", POLICY, unpack=name.endswith(".bin"))


def test_pickle_weights_unsigned_are_refused_with_allow_unsigned(attack: Attack) -> None:
    attack.edit.rewrite(REF, layers={"draft": _draft_with(attack, file_entry("draft/pytorch_model.bin", b"\x80\x04."))})
    attack.edit.drop_signatures()
    attack.refused("pickle-weights", POLICY, "--allow-unsigned", unpack=True)


def test_bundle_sign_refuses_pickle_weights(attack: Attack) -> None:
    attack.edit.rewrite(REF, layers={"target": build_tar(read_members(attack.edit.layer(REF, "target")) + [file_entry("target/pytorch_model.bin", b"\x80\x04.")])})
    attack.edit.drop_signatures()
    result = attack.bundle("sign", REF, "--key", str(attack.base.key))
    assert result.code == POLICY and result.err.startswith("error: [pickle-weights] "), result.err
    assert attack.edit.signatures() == []


def test_inspect_of_a_bundle_that_fails_integrity_shows_metadata_only(store: Path, keypair) -> None:
    edit = StoreEditor(store)
    digest = edit.layer_digest(REF, "tokenizer")
    data = bytearray(edit.read(digest))
    data[len(data) // 2] ^= 1
    edit.overwrite(digest, bytes(data))
    result = run_bundle("inspect", REF, "--json", "--key", str(keypair[1]), "--store", str(store))
    assert result.code == 0, result.err
    shown = json.loads(result.out)
    assert shown["verification"]["ok"] is False
    assert shown["tokenizer"]["fingerprint"] is None and "did not verify" in shown["tokenizer"]["error"]
    assert "did not verify" in shown["models"]["error"]
