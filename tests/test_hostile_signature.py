"""Hostile bundles, the signatures: untrusted, removed, moved, flipped, expired, extended, malformed, foreign beside a
good one, too many, or a damaged second one: each refused (or skipped) with its code, and `verify --json` says which."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from attacker import StoreEditor
from bundler.trust.keys import key_id, load_public_key
from bundletree import make_tree
from conftest import assert_matches_schema, run_bundle
from hostile_store import _no_creds, Attack, INTEGRITY, NEWER, OTHER, REF, attack, base  # noqa: F401  (fixtures)
from registry_server import registry  # noqa: F401  (fixture)


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


def test_a_damaged_signature_config_blob_fails_verify_and_is_never_pushed(registry, tmp_path: Path, keypair) -> None:
    from attacker import StoreEditor

    env = _no_creds(tmp_path)
    ref = f"{registry.host}/damaged/tiny-spec:v1"
    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", ref, "--key", str(keypair[0]), "--store", str(store), check=True)
    edit = StoreEditor(store)
    (sig,) = edit.signatures(edit.manifest_digest(ref), kind="model-signing")  # its config blob, the empty JSON object, is the cosign one's too
    config = json.loads(edit.read(sig["digest"]))["config"]
    assert config["size"] == 2  # the empty JSON object
    edit.overwrite(config["digest"], b"[]")  # same size, other bytes
    result = run_bundle("verify", ref, "--key", str(keypair[1]), "--store", str(store))
    assert result.code == 3 and result.err.startswith("error: [signature-missing] "), result.err
    assert f"signature artifact {sig['digest'][:19]}… is damaged" in result.err
    pushed = run_bundle("push", ref, "--plain-http", "--store", str(store), env=env)
    assert pushed.code == 3 and pushed.err.startswith("error: [digest-mismatch] ") and "nothing pushed" in pushed.err, pushed.err
    pulled = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "other"), env=env)
    assert pulled.code == 5 and "[registry-not-found]" in pulled.err, pulled.err  # not even the bundle reached the registry


def test_a_damaged_second_signature_fails_verify_although_the_other_holds(tmp_path: Path, keypair) -> None:
    """Item 9 with two signatures: the cosign-style one's Sigstore bundle damaged, the model-signing one intact.
    verify does not verify around the damage: the store is refused, naming the artifact."""
    from attacker import StoreEditor

    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--store", str(store), check=True)
    edit = StoreEditor(store)
    (sig,) = edit.signatures(edit.manifest_digest("tiny-spec:1.0.0"), kind="cosign")
    layer = json.loads(edit.read(sig["digest"]))["layers"][0]["digest"]
    data = edit.read(layer)
    edit.overwrite(layer, data[:-2] + b" }")  # same size, other bytes
    result = run_bundle("verify", "tiny-spec:1.0.0", "--key", str(keypair[1]), "--store", str(store))
    assert result.code == 3 and result.err.startswith("error: [digest-mismatch] "), result.err
    assert f"signature artifact {sig['digest'][:19]}… in the store is damaged" in result.err
