"""The hostile-bundle suite: real signed bundles in real stores, changed the way an attacker would.

Each case packs and signs with the CLI (once per module; each test works on its own copy of the store),
then edits the store's files directly (tests/attacker.py): the careful attacker recomputes digests up the
chain and re-points the signature, so each case reaches the check it names. Then `bundle verify` (and
`bundle unpack` where files would be written) must refuse with the right exit code and one line
`error: [code] ...` on stderr, and nothing may be written anywhere but the test's temp dirs: the store
is left as it was, the unpack target never appears, no partial directory is left beside it.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from attacker import StoreEditor, build_tar, file_entry, flip, read_members, special_entry, with_content
from bundler.trust.keys import key_id, load_public_key
from bundletree import make_tree, tokenizer_json
from conftest import Result, assert_matches_schema, run_bundle, tree_digest
from tests.unchecked_pack import pack_unchecked

REF = "tiny-spec:1.0.0"
NEWER = "tiny-spec:1.1.0"
OTHER = "other-spec:1.0.0"
OTHER_VOCAB = ["<unk>", "<s>", "</s>", "bonjour", "monde", "le", "la", "et", "un", "une"]

INTEGRITY, POLICY, INVALID = 3, 4, 6


def _context(root: Path, name: str, version: str, seed: int, vocab: list[str] | None = None) -> Path:
    """A bundle tree whose target and draft carry copies of the tokenizer files, as Hugging Face dirs do."""
    make_tree(root, name, version, seed)
    (root / "tokenizer" / "tokenizer.json").write_text(tokenizer_json(vocab))
    for role in ("target", "draft"):
        for f in (root / "tokenizer").iterdir():
            shutil.copy(f, root / role / f.name)
    return root


@dataclass
class Base:
    store: Path
    contexts: dict[str, Path]
    key: Path
    pub: Path
    other_key: Path
    other_pub: Path


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path], other_keypair: tuple[Path, Path]) -> Base:
    """tiny-spec 1.0.0 and 1.1.0 and other-spec 1.0.0 (another tokenizer), packed and signed by the trusted key."""
    root = tmp_path_factory.mktemp("hostile-base")
    store = root / "store"
    contexts = {
        REF: _context(root / "ctx-100", "tiny-spec", "1.0.0", 0),
        NEWER: _context(root / "ctx-110", "tiny-spec", "1.1.0", 1),
        OTHER: _context(root / "ctx-other", "other-spec", "1.0.0", 2, OTHER_VOCAB),
    }
    for ref, ctx in contexts.items():
        run_bundle("pack", str(ctx), "-t", ref, "--key", str(keypair[0]), "--store", str(store), check=True)
    return Base(store, contexts, keypair[0], keypair[1], other_keypair[0], other_keypair[1])


@dataclass
class Attack:
    """One test's own copy of the base store, the attacker's hands on it, and the checks on the outcome."""

    base: Base
    tmp: Path
    store: Path
    edit: StoreEditor

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": str(self.tmp / "home"), "TMPDIR": str(self.tmp / "tmpdir")}

    def bundle(self, *args: str) -> Result:
        return run_bundle(*args, "--store", str(self.store), env=self.env, cwd=self.tmp / "cwd")

    def verify(self, *extra: str, ref: str = REF, key: Path | None = None) -> Result:
        keys = [] if "--allow-unsigned" in extra else ["--key", str(key or self.base.pub)]
        return self.bundle("verify", ref, *keys, *extra)

    def refused(self, code: str, exit_code: int, *extra: str, ref: str = REF, key: Path | None = None, unpack: bool = False) -> None:
        """verify (and unpack) fail with exit_code and exactly one stderr line `error: [code] ...`; nothing written."""
        before = tree_digest(self.store)
        calls = [("verify", self.verify(*extra, ref=ref, key=key))]
        if unpack:
            keys = [] if "--allow-unsigned" in extra else ["--key", str(key or self.base.pub)]
            calls.append(("unpack", self.bundle("unpack", ref, "-d", str(self.tmp / "out" / "bundle"), *keys, *extra)))
        for what, result in calls:
            lines = result.err.strip().splitlines()
            assert result.code == exit_code and len(lines) == 1, f"{what} exited {result.code}: {result.err}"
            assert lines[0].startswith(f"error: [{code}] "), f"{what}: {lines[0]}"
        assert tree_digest(self.store) == before, "a refused bundle changed the store"
        self.assert_nothing_written()

    def assert_nothing_written(self) -> None:
        for name in ("cwd", "tmpdir", "out"):
            assert list((self.tmp / name).iterdir()) == [], f"something was written in {name}/"
        assert not (self.tmp / "home").exists()


@pytest.fixture
def attack(base: Base, tmp_path: Path) -> Attack:
    store = tmp_path / "store"
    shutil.copytree(base.store, store)
    for name in ("cwd", "tmpdir", "out"):
        (tmp_path / name).mkdir()
    return Attack(base, tmp_path, store, StoreEditor(store))


def _draft_with(attack: Attack, *extra: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    return build_tar(read_members(attack.edit.layer(REF, "draft")) + list(extra))


# ---------------------------------------------------------------- blobs changed in place


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


# ---------------------------------------------------------------- content changed, digests recomputed


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


# ---------------------------------------------------------------- malicious archives, signed by the trusted key


def _hostile_entries(tmp: Path) -> dict[str, list[tuple[tarfile.TarInfo, bytes | None]]]:
    pax = file_entry("draft/ok.txt", b"pwned")
    pax[0].pax_headers = {"path": "draft/../../../pwned"}
    return {
        "path-traversal": [file_entry("draft/../../../pwned", b"pwned")],
        "absolute-path": [file_entry(str(tmp / "pwned"), b"pwned")],
        "symlink": [special_entry("draft/escape", tarfile.SYMTYPE, str(tmp / "victim"))],
        "symlink-then-write-through": [
            special_entry("draft/sub", tarfile.SYMTYPE, str(tmp)),
            file_entry("draft/sub/pwned", b"pwned"),
        ],
        "hardlink": [special_entry("draft/hard", tarfile.LNKTYPE, str(tmp / "victim"))],
        "char-device": [special_entry("draft/null", tarfile.CHRTYPE, devmajor=1, devminor=3)],
        "block-device": [special_entry("draft/disk", tarfile.BLKTYPE, devmajor=8, devminor=0)],
        "fifo": [special_entry("draft/pipe", tarfile.FIFOTYPE)],
        "duplicate-entry": [file_entry("draft/model.safetensors", b"a second copy that would win on extraction")],
        "pax-path-traversal": [pax],
        "outside-its-layer": [file_entry("target/model.safetensors", b"overrides the target's weights")],
        "below-a-file": [file_entry("draft/config.json/x", b"pwned")],
    }


HOSTILE = list(_hostile_entries(Path("/x")))


def _plant(attack: Attack, case: str) -> None:
    (attack.tmp / "victim").write_bytes(b"victim")
    attack.edit.rewrite(REF, layers={"draft": _draft_with(attack, *_hostile_entries(attack.tmp)[case])})


def _assert_no_escape(attack: Attack) -> None:
    assert (attack.tmp / "victim").read_bytes() == b"victim"
    assert not (attack.tmp / "pwned").exists() and not (attack.tmp / "out" / "pwned").exists()


@pytest.mark.parametrize("case", HOSTILE)
def test_malicious_archive_signed_by_the_trusted_key_is_unsafe(attack: Attack, case: str) -> None:
    _plant(attack, case)
    attack.edit.drop_signatures()
    attack.edit.sign_with_key(REF, attack.base.key)
    attack.refused("unsafe-archive", INTEGRITY, unpack=True)
    _assert_no_escape(attack)


@pytest.mark.parametrize("case", ["path-traversal", "symlink", "hardlink", "char-device", "duplicate-entry"])
def test_malicious_archive_unsigned_is_unsafe_even_with_allow_unsigned(attack: Attack, case: str) -> None:
    _plant(attack, case)
    attack.edit.drop_signatures()
    attack.refused("unsafe-archive", INTEGRITY, "--allow-unsigned", unpack=True)
    _assert_no_escape(attack)


def test_bundle_sign_refuses_a_malicious_archive(attack: Attack) -> None:
    _plant(attack, "symlink")
    attack.edit.drop_signatures()
    before = tree_digest(attack.store)
    result = attack.bundle("sign", REF, "--key", str(attack.base.key))
    assert result.code == INTEGRITY and len(result.err.strip().splitlines()) == 1, result.err
    assert result.err.startswith("error: [unsafe-archive] ")
    assert tree_digest(attack.store) == before and attack.edit.signatures() == []


# ---------------------------------------------------------------- signatures


def test_signature_by_an_untrusted_key_is_refused(attack: Attack) -> None:
    attack.edit.drop_signatures()
    attack.edit.sign_with_key(REF, attack.base.other_key)  # the attacker's own key, not trusted
    attack.refused("untrusted-signer", INTEGRITY, unpack=True)


def test_signature_by_the_trusted_key_is_refused_when_another_key_is_asked_for(attack: Attack) -> None:
    attack.refused("untrusted-signer", INTEGRITY, key=attack.base.other_pub)


@pytest.mark.parametrize("delete_blobs", [True, False], ids=["artifact-deleted", "dropped-from-index"])
def test_removed_signature_is_missing(attack: Attack, delete_blobs: bool) -> None:
    attack.edit.drop_signatures(attack.edit.manifest_digest(REF), delete_blobs=delete_blobs)
    attack.refused("signature-missing", INTEGRITY, unpack=delete_blobs)


def test_signature_moved_from_another_bundle_is_a_mismatch(attack: Attack) -> None:
    mine = attack.edit.manifest_digest(REF)
    [theirs] = attack.edit.signatures(attack.edit.manifest_digest(OTHER), kind="model-signing")
    attack.edit.drop_signatures(mine)
    attack.edit.point_signature(theirs, mine)
    attack.refused("signature-mismatch", INTEGRITY, unpack=True)


def test_signature_over_another_version_is_a_mismatch(attack: Attack) -> None:
    mine = attack.edit.manifest_digest(REF)
    [newer] = attack.edit.signatures(attack.edit.manifest_digest(NEWER), kind="model-signing")
    attack.edit.drop_signatures(mine)
    attack.edit.point_signature(newer, mine)
    attack.refused("signature-mismatch", INTEGRITY)


def _model_signing_only(attack: Attack) -> None:
    """Take the cosign-style signatures out: where a model-signing signature does not verify, a valid
    cosign-style one beside it decides (issue #40), so an attack on the model-signing one is judged alone."""
    gone = {e["digest"] for e in attack.edit.signatures(kind="cosign")}
    index = attack.edit.index()
    index["manifests"] = [m for m in index["manifests"] if m["digest"] not in gone]
    attack.edit.write_index(index)


def test_signature_with_a_flipped_byte_is_invalid(attack: Attack) -> None:
    _model_signing_only(attack)
    [entry] = attack.edit.signatures(attack.edit.manifest_digest(REF), kind="model-signing")
    sigstore = json.loads(attack.edit.signature_payload(entry))
    sig = sigstore["dsseEnvelope"]["signatures"][0]
    sig["sig"] = ("B" if sig["sig"][10] == "A" else "A").join([sig["sig"][:10], sig["sig"][11:]])
    attack.edit.point_signature(entry, attack.edit.manifest_digest(REF), json.dumps(sigstore).encode())
    attack.refused("signature-invalid", INTEGRITY)


def test_signature_payload_nesting_bomb_is_invalid_and_inspect_survives_it(attack: Attack) -> None:
    import base64

    _model_signing_only(attack)
    [entry] = attack.edit.signatures(attack.edit.manifest_digest(REF), kind="model-signing")
    sigstore = json.loads(attack.edit.signature_payload(entry))
    sigstore["dsseEnvelope"]["payload"] = base64.b64encode(b"[" * 100_000 + b"]" * 100_000).decode()
    attack.edit.point_signature(entry, attack.edit.manifest_digest(REF), json.dumps(sigstore).encode())
    attack.refused("signature-invalid", INTEGRITY)
    shown = attack.bundle("inspect", REF, "--json", "--key", str(attack.base.pub))  # reads the claims unverified, for display
    assert shown.code == 0, shown.err
    assert json.loads(shown.out)["verification"]["ok"] is False


def test_expired_signature_is_refused(attack: Attack) -> None:
    ctx = attack.base.contexts[REF]
    fresh = attack.tmp / "fresh-store"
    # The CLI refuses --valid-days <= 0 now, so the expired signature is made with the library, as an attacker could.
    from bundler.trust.keys import load_private_key
    from bundler.store.modelkit import load_modelkit
    from bundler.store.refs import parse_ref
    from bundler.trust.sign import sign_modelkit
    from bundler.store.layout import Store

    run_bundle("pack", str(ctx), "-t", REF, "--store", str(fresh), check=True)
    sign_modelkit(Store(fresh), load_modelkit(Store(fresh), parse_ref(REF)), load_private_key(attack.base.key), valid_days=-1)
    attack.store = fresh
    attack.refused("expired", INTEGRITY, unpack=True)


def test_resigned_with_a_past_expiry_is_expired(attack: Attack) -> None:
    attack.edit.drop_signatures()
    result = attack.bundle("sign", REF, "--key", str(attack.base.key), "--valid-days", "0.00001")  # about a second
    assert result.code == 0, result.err
    time.sleep(1.5)
    attack.refused("expired", INTEGRITY)


def test_expiry_extended_by_editing_the_signed_payload_is_invalid(attack: Attack) -> None:
    import base64

    attack.edit.drop_signatures()
    attack.edit.sign_with_key(REF, attack.base.key, valid_days=-1)
    _model_signing_only(attack)
    [entry] = attack.edit.signatures(kind="model-signing")
    sigstore = json.loads(attack.edit.signature_payload(entry))
    statement = json.loads(base64.b64decode(sigstore["dsseEnvelope"]["payload"]))
    statement["predicate"]["bundle"]["expires"] = "2099-01-01T00:00:00Z"
    sigstore["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()).decode()
    attack.edit.point_signature(entry, attack.edit.manifest_digest(REF), json.dumps(sigstore).encode())
    attack.refused("signature-invalid", INTEGRITY)


def test_rollback_to_an_older_version_is_refused(attack: Attack) -> None:
    assert attack.verify(ref=NEWER).code == 0
    attack.refused("rollback", INTEGRITY, unpack=True)


def test_same_version_with_other_content_is_a_rollback(attack: Attack, tmp_path: Path) -> None:
    assert attack.verify().code == 0
    rebuilt = _context(tmp_path / "ctx-rebuilt", "tiny-spec", "1.0.0", 7)
    # `bundle pack` refuses this itself (tests/test_pack_checks.py): the replaced release is made with the library
    pack_unchecked(rebuilt, REF, attack.store, attack.base.key)
    attack.refused("rollback", INTEGRITY)


# ---------------------------------------------------------------- pickle weights


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


# ---------------------------------------------------------------- invalid Kitfile or bundle content


def test_config_that_fails_the_kitfile_schema_is_invalid(attack: Attack) -> None:
    attack.edit.rewrite(REF, config=lambda c: c["package"].update(version=["1", "0"]))
    attack.refused("invalid-kitfile", INVALID, unpack=True)


BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize(
    "kitfile",
    [
        pytest.param(BILLION_LAUGHS, id="yaml-bomb"),
        pytest.param("manifestVersion: 1.0.0\n" + "x: " + "[" * 5000 + "]" * 5000 + "\n", id="yaml-nesting"),
        pytest.param("manifestVersion: 1.0.0\npackage: {name: tiny-spec, version: 1.0.0}\nmodel: {path: 42}\n", id="schema"),
    ],
)
def test_packing_a_hostile_kitfile_is_refused_and_stores_nothing(attack: Attack, kitfile: str) -> None:
    ctx = _context(attack.tmp / "ctx", "tiny-spec", "1.0.0", 0)
    (ctx / "Kitfile").write_text(kitfile)
    fresh = attack.tmp / "fresh-store"
    started = time.monotonic()
    result = run_bundle("pack", str(ctx), "-t", REF, "--key", str(attack.base.key), "--store", str(fresh), env=attack.env, cwd=attack.tmp / "cwd")
    assert time.monotonic() - started < 20
    assert result.code == INVALID and result.err.startswith("error: [invalid-kitfile] "), result.err
    assert len(result.err.strip().splitlines()) == 1
    assert not (fresh / "index.json").exists() or StoreEditor(fresh).index()["manifests"] == []
    attack.assert_nothing_written()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda m: m["layers"][0].pop("size"), id="layer-without-size"),
        pytest.param(lambda m: m["layers"][0].update(size=str(m["layers"][0]["size"])), id="size-as-string"),
        pytest.param(lambda m: m["layers"][0].update(size=-1), id="negative-size"),
        pytest.param(lambda m: m["config"].pop("digest"), id="config-without-digest"),
        pytest.param(lambda m: m.update(layers={"0": m["layers"][0]}), id="layers-not-a-list"),
        pytest.param(lambda m: m["layers"].__setitem__(0, "sha256:" + "0" * 64), id="layer-not-an-object"),
        pytest.param(lambda m: m["layers"][0].update(digest="sha256:../../../../etc/passwd"), id="digest-path-traversal"),
    ],
)
def test_malformed_manifest_is_an_invalid_bundle(attack: Attack, change: Any) -> None:
    attack.edit.rewrite(REF, manifest=change)
    attack.refused("invalid-bundle", INVALID)


@pytest.mark.parametrize(("depth", "code"), [(100_000, "invalid-bundle"), (500, "invalid-kitfile")])
def test_config_json_nesting_bomb_is_invalid(attack: Attack, depth: int, code: str) -> None:
    config = attack.edit.read(attack.edit.config_digest(REF))
    bomb = config.replace(b'"speculative":', b'"deep":' + b"[" * depth + b"]" * depth + b',"speculative":')

    def point(m: dict[str, Any]) -> None:
        m["config"].update(digest=attack.edit.put(bomb), size=len(bomb))

    attack.edit.rewrite(REF, manifest=point)
    attack.refused(code, INVALID)


@pytest.mark.parametrize(
    "index",
    [
        pytest.param('{"schemaVersion":2,"manifests":{"a":1}}', id="manifests-not-a-list"),
        pytest.param("[1,2,3]", id="not-an-object"),
        pytest.param('{"schemaVersion":2,"manifests":["x"]}', id="entry-not-an-object"),
        pytest.param("[" * 100_000 + "]" * 100_000, id="nesting-bomb"),
    ],
)
def test_malformed_index_is_an_invalid_bundle(attack: Attack, index: str) -> None:
    (attack.store / "index.json").write_text(index)
    attack.refused("invalid-bundle", INVALID)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda a: a.update(subject="sha256:" + "0" * 64), id="subject-not-an-object"),
        pytest.param(lambda a: a["layers"][0].pop("size"), id="layer-without-size"),
        pytest.param(lambda a: a.update(layers="x"), id="layers-not-a-list"),
    ],
)
def test_malformed_signature_artifact_counts_as_no_signature(attack: Attack, change: Any) -> None:
    entries = attack.edit.signatures(attack.edit.manifest_digest(REF))
    assert len(entries) == 2  # model-signing and cosign-style: each malformed the same way
    for entry in entries:
        artifact = json.loads(attack.edit.read(entry["digest"]))
        change(artifact)
        data = json.dumps(artifact).encode()
        index = attack.edit.index()
        for m in index["manifests"]:
            if m["digest"] == entry["digest"]:
                m.update(digest=attack.edit.put(data), size=len(data))
        attack.edit.write_index(index)
    attack.refused("signature-missing", INTEGRITY)


# ---------------------------------------------------------------- verify --json, the contract's shape


def test_verify_json_on_a_good_signed_bundle(attack: Attack) -> None:
    result = attack.verify("--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert_matches_schema(report, "verify-report")
    assert report["ok"] is True and report["error"] is None
    assert report["ref"] == REF and report["digest"] == attack.edit.manifest_digest(REF)
    assert report["signer"]["key_id"] == key_id(load_public_key(attack.base.pub))
    assert report["checks"] and all(set(c) >= {"name", "ok", "detail"} and c["ok"] is True for c in report["checks"])
    assert {"signature", "expiry", "rollback"} <= {c["name"] for c in report["checks"]}


def test_verify_json_on_a_failure_names_the_error(attack: Attack) -> None:
    attack.edit.drop_signatures()
    result = attack.verify("--json")
    assert result.code == INTEGRITY
    report = json.loads(result.out)
    assert_matches_schema(report, "verify-report")
    assert report["ok"] is False and report["signer"] is None
    assert report["error"]["code"] == "signature-missing" and report["error"]["message"]
    assert report["checks"][-1] == {"name": "signature", "ok": False, "detail": report["error"]["message"]}
    assert result.err.strip().splitlines() == [f"error: [signature-missing] {report['error']['message']}"]


# ---------------------------------------------------------------- which signature counts


def _both_keys(attack: Attack) -> list[str]:
    return ["--key", str(attack.base.pub), "--key", str(attack.base.other_pub)]


def test_foreign_signature_placed_first_does_not_block_a_good_one(attack: Attack) -> None:
    before = {m["digest"] for m in attack.edit.signatures()}
    attack.edit.sign_with_key(REF, attack.base.other_key)  # an untrusted key, attached by anyone with registry access
    foreign = {m["digest"] for m in attack.edit.signatures()} - before
    attack.edit.move_to_front(foreign)
    result = attack.verify("--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["ok"] and report["signer"]["key_id"] == key_id(load_public_key(attack.base.pub))
    [skipped] = report["skipped_signatures"]
    assert skipped["digest"] in foreign and skipped["error"]["code"] == "untrusted-signer"


def test_expired_signature_renewed_by_signing_again_verifies(attack: Attack) -> None:
    fresh = attack.tmp / "fresh-store"
    run_bundle("pack", str(attack.base.contexts[REF]), "-t", REF, "--store", str(fresh), check=True)
    attack.store, attack.edit = fresh, StoreEditor(fresh)
    attack.edit.sign_with_key(REF, attack.base.key, valid_days=-1)  # the CLI refuses --valid-days <= 0
    assert attack.verify().code == INTEGRITY
    renewed = attack.bundle("sign", REF, "--key", str(attack.base.key))
    assert renewed.code == 0, renewed.err
    assert attack.verify().code == 0
    kinds = [len(attack.edit.signatures(kind=kind)) for kind in ("model-signing", "cosign")]
    assert kinds == [1, 1], "sign keeps its own key's expired signatures"


def test_expired_signature_beside_a_valid_one_is_skipped_and_listed(attack: Attack) -> None:
    attack.edit.sign_with_key(REF, attack.base.key, valid_days=-1)
    attack.edit.move_to_front({m["digest"] for m in attack.edit.signatures(attack.edit.manifest_digest(REF), kind="model-signing")[-1:]})
    report = json.loads(attack.verify("--json").out)
    assert report["ok"] and [s["error"]["code"] for s in report["skipped_signatures"]] == ["expired"]


def test_at_most_16_signatures_are_considered(attack: Attack) -> None:
    mine = attack.edit.manifest_digest(REF)
    good = {m["digest"] for m in attack.edit.signatures(mine)}
    for _ in range(16):
        attack.edit.sign_with_key(REF, attack.base.other_key)
    attack.edit.move_to_front({m["digest"] for m in attack.edit.signatures(mine)} - good)
    attack.refused("untrusted-signer", INTEGRITY)
    report = json.loads(attack.verify("--json").out)
    assert len(report["skipped_signatures"]) == 17 and "not considered" in report["skipped_signatures"][-1]["error"]["message"]


# ---------------------------------------------------------------- rollback memory


def test_rollback_memory_holds_across_a_key_rotation(attack: Attack) -> None:
    attack.edit.drop_signatures(attack.edit.manifest_digest(NEWER))
    attack.edit.sign_with_key(NEWER, attack.base.other_key)  # the new key signs 1.1.0; the old key signed 1.0.0
    assert attack.bundle("verify", NEWER, *_both_keys(attack)).code == 0
    before = tree_digest(attack.store)
    result = attack.bundle("verify", REF, *_both_keys(attack))
    assert result.code == INTEGRITY and result.err.startswith("error: [rollback] "), result.err
    assert tree_digest(attack.store) == before


def test_allow_rollback_accepts_an_older_release_for_that_command_only(attack: Attack) -> None:
    assert attack.verify(ref=NEWER).code == 0
    refused = attack.verify()
    assert refused.code == INTEGRITY and "--allow-rollback" in refused.err
    assert attack.verify("--allow-rollback").code == 0
    assert attack.verify().code == INTEGRITY, "the newest version seen is still 1.1.0"


@pytest.mark.parametrize(
    "older, newer",
    [("1.0.0-rc.9", "1.0.0-rc.10"), ("1.0.0-alpha", "1.0.0-alpha.1"), ("1.0.0-alpha.1", "1.0.0-alpha.beta"), ("1.0.0-alpha.beta", "1.0.0-beta"),
     ("1.0.0-beta.2", "1.0.0-beta.11"), ("1.0.0-rc.1", "1.0.0"), ("1.9.0", "1.10.0"), ("1.0.0", "2.0.0+build.1")],
)
def test_versions_follow_semver_precedence(older: str, newer: str) -> None:
    from bundler.trust.releases import version_key

    assert version_key(older) < version_key(newer)


def test_prerelease_rc10_after_rc9_is_an_upgrade_and_back_is_a_rollback(attack: Attack, tmp_path: Path) -> None:
    for version in ("1.0.0-rc.9", "1.0.0-rc.10"):
        ctx = _context(tmp_path / version, "tiny-spec", version, 3)
        run_bundle("pack", str(ctx), "-t", f"tiny-spec:{version}", "--key", str(attack.base.key), "--store", str(attack.store), check=True)
    assert attack.verify(ref="tiny-spec:1.0.0-rc.9").code == 0
    assert attack.verify(ref="tiny-spec:1.0.0-rc.10").code == 0
    attack.refused("rollback", INTEGRITY, ref="tiny-spec:1.0.0-rc.9")


@pytest.mark.parametrize("damage", ["garbage", "not-an-object", "directory", "fifo"])
def test_damaged_rollback_memory_is_a_clear_error_saying_how_to_reset(attack: Attack, damage: str) -> None:
    import os

    assert attack.verify().code == 0
    path = attack.store / ".specbundle" / "versions.json"
    path.unlink()
    if damage == "garbage":
        path.write_bytes(b"{\x00not json")
    elif damage == "not-an-object":
        path.write_text("[1, 2]")
    elif damage == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    result = attack.verify()
    assert result.code == INTEGRITY and result.err.startswith("error: [integrity] ") and "remove" in result.err and "versions.json" in result.err, result.err
    if damage != "directory":
        path.unlink()
    else:
        path.rmdir()
    assert attack.verify().code == 0, "removing the file resets the memory"


# ---------------------------------------------------------------- the reference is bound to the signature


def test_version_tag_repointed_at_an_older_signed_release_is_refused(attack: Attack) -> None:
    attack.edit.retag(REF, "tiny-spec:1.1.0")  # the tag says 1.1.0, the signed content is 1.0.0
    attack.refused("signature-mismatch", INTEGRITY, ref="tiny-spec:1.1.0", unpack=True)
    result = attack.verify(ref="tiny-spec:1.1.0")
    assert "--allow-ref-mismatch" in result.err


def test_tag_of_another_name_on_a_signed_bundle_is_refused(attack: Attack) -> None:
    attack.edit.retag(REF, "prod-model:9.9.9")
    attack.refused("signature-mismatch", INTEGRITY, ref="prod-model:9.9.9")


def test_ref_mismatch_is_accepted_with_the_explicit_flag(attack: Attack) -> None:
    attack.edit.retag(REF, "prod-model:9.9.9")
    assert attack.verify("--allow-ref-mismatch", ref="prod-model:9.9.9").code == 0


def test_digest_reference_and_non_version_tag_are_fine(attack: Attack) -> None:
    attack.edit.retag(REF, "tiny-spec:latest")
    assert attack.verify(ref="tiny-spec:latest").code == 0
    assert attack.verify(ref=f"tiny-spec@{attack.edit.manifest_digest(REF)}").code == 0
