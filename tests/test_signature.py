"""Signatures: what `sign` writes, and what `verify` accepts and refuses, with which error code."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime, timezone

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from core.errors import BundleError
from bundler.format.mediatypes import SIGSTORE_BUNDLE
from bundler.trust.keys import key_id
from bundler.trust.signature import (
    PREDICATE_TYPE,
    format_time,
    parse_time,
    read_unverified,
    sign,
    verify,
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


FILES = {
    "target/model.safetensors": _sha(b"target weights"),
    "target/config.json": _sha(b"{}"),
    "draft/model.safetensors": _sha(b"draft weights"),
    "tokenizer/tokenizer.json": _sha(b"tokens"),
    "README.md": _sha(b""),
}
FIELDS = {
    "name": "smollm2-spec",
    "version": "1.0.0",
    "manifest_digest": "sha256:" + _sha(b"manifest"),
    "config_digest": "sha256:" + _sha(b"config"),
    "roles": {"target/model.safetensors": "target", "draft/model.safetensors": "draft"},
    "created": "2026-11-30T12:00:00Z",
    "expires": "2027-11-30T12:00:00Z",
}


@pytest.fixture(scope="module")
def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="module")
def other_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="module")
def signed(key) -> bytes:
    return sign(FILES, FIELDS, key, "smollm2-spec")


def _trust(*keys) -> dict:
    return {key_id(k): k.public_key() for k in keys}


def _code(bundle_json: bytes, trusted: dict) -> str:
    with pytest.raises(BundleError) as caught:
        verify(bundle_json, trusted)
    return caught.value.code


def _statement(bundle_json: bytes) -> dict:
    return json.loads(base64.b64decode(json.loads(bundle_json)["dsseEnvelope"]["payload"]))


def _resign(bundle_json: bytes, statement: dict | bytes, private_key) -> bytes:
    """An attacker holding a trusted key re-signs a changed statement (DSSE written out independently here)."""
    payload = statement if isinstance(statement, bytes) else json.dumps(statement).encode()
    pae = b"DSSEv1 28 application/vnd.in-toto+json %d %s" % (len(payload), payload)
    bundle = json.loads(bundle_json)
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(payload).decode()
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(
        private_key.sign(pae, ec.ECDSA(hashes.SHA256()))
    ).decode()
    return json.dumps(bundle).encode()


def _rewrite(bundle_json: bytes, change) -> bytes:
    bundle = json.loads(bundle_json)
    change(bundle)
    return json.dumps(bundle).encode()


# ---------------------------------------------------------------- round trip and layout


def test_verify_returns_the_signed_files_fields_and_signer(signed, key) -> None:
    claims = verify(signed, _trust(key))

    assert claims.files == FILES
    assert claims.bundle == FIELDS
    assert claims.key_id == key_id(key)
    assert claims.model_name == "smollm2-spec"
    assert claims.statement["predicateType"] == PREDICATE_TYPE


def test_signature_is_a_sigstore_bundle_laid_out_as_model_signing_lays_it_out(signed, key) -> None:
    bundle = json.loads(signed)

    assert bundle["mediaType"] == SIGSTORE_BUNDLE
    assert bundle["verificationMaterial"] == {"publicKey": {"hint": key_id(key)}, "tlogEntries": []}
    assert bundle["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"
    assert [s["keyid"] for s in bundle["dsseEnvelope"]["signatures"]] == [""]
    statement = _statement(signed)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicate"]["serialization"] == {
        "method": "files",
        "hash_type": "sha256",
        "allow_symlinks": False,
        "ignore_paths": [".git", ".gitattributes", ".github", ".gitignore"],
    }
    resources = statement["predicate"]["resources"]
    assert {r["name"]: r["digest"] for r in resources} == FILES
    assert {r["algorithm"] for r in resources} == {"sha256"}
    root = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in resources)).hexdigest()
    assert statement["subject"] == [{"name": "smollm2-spec", "digest": {"sha256": root}}]


def test_signature_json_is_canonical(signed) -> None:
    assert signed == json.dumps(json.loads(signed), sort_keys=True, separators=(",", ":")).encode()
    payload = base64.b64decode(json.loads(signed)["dsseEnvelope"]["payload"])
    assert payload == json.dumps(json.loads(payload), sort_keys=True, separators=(",", ":")).encode()


def test_resources_are_ordered_by_path_components_like_model_signing(key) -> None:
    files = {"a-c": _sha(b"1"), "a/b": _sha(b"2"), "a.txt": _sha(b"3"), "B": _sha(b"4")}
    names = [r["name"] for r in _statement(sign(files, FIELDS, key, "m"))["predicate"]["resources"]]
    assert names == ["B", "a/b", "a-c", "a.txt"]


def test_verify_tries_every_trusted_key(signed, key, other_key) -> None:
    assert verify(signed, _trust(other_key, key)).key_id == key_id(key)


def test_a_signature_without_a_hint_verifies_with_the_trusted_key_that_made_it(signed, key) -> None:
    no_hint = _rewrite(signed, lambda b: b["verificationMaterial"]["publicKey"].pop("hint"))
    assert verify(no_hint, _trust(key)).key_id == key_id(key)


def test_read_unverified_shows_the_claimed_signer_without_trusting_anything(signed, key) -> None:
    claims = read_unverified(signed)
    assert claims is not None
    assert (claims.key_id, claims.files, claims.bundle) == (key_id(key), FILES, FIELDS)
    assert read_unverified(b"not json") is None


def test_timestamps_are_rfc3339_utc() -> None:
    moment = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)
    assert format_time(moment) == "2026-11-30T12:00:00Z"
    assert parse_time("2026-11-30T12:00:00Z") == moment


# ---------------------------------------------------------------- tampering


def test_every_flipped_byte_of_the_signature_json_is_refused(signed, key) -> None:
    trusted = _trust(key)
    accepted = []
    for i in range(len(signed)):
        changed = signed[:i] + bytes([signed[i] ^ 0x01]) + signed[i + 1 :]
        try:
            verify(changed, trusted)
            accepted.append(i)
        except BundleError as err:
            assert err.code in ("signature-invalid", "untrusted-signer"), (i, err.line())
    assert accepted == []


def test_a_changed_payload_is_signature_invalid(signed, key) -> None:
    statement = _statement(signed)
    statement["predicate"]["resources"][0]["digest"] = _sha(b"evil")
    payload = base64.b64encode(json.dumps(statement).encode()).decode()
    changed = _rewrite(signed, lambda b: b["dsseEnvelope"].update(payload=payload))
    assert _code(changed, _trust(key)) == "signature-invalid"


def test_a_changed_signature_is_signature_invalid(signed, key) -> None:
    def flip(bundle: dict) -> None:
        sig = bytearray(base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"]))
        sig[-1] ^= 0x01
        bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()

    assert _code(_rewrite(signed, flip), _trust(key)) == "signature-invalid"


def test_a_signature_by_an_untrusted_key_is_untrusted_signer_and_names_the_key(signed, key, other_key) -> None:
    with pytest.raises(BundleError) as caught:
        verify(signed, _trust(other_key))
    assert caught.value.code == "untrusted-signer"
    assert key_id(key)[:12] in caught.value.message
    assert "--key" in caught.value.message and "BUNDLE_TRUSTED_KEYS" in caught.value.message


def test_no_trusted_keys_at_all_is_untrusted_signer(signed) -> None:
    assert _code(signed, {}) == "untrusted-signer"


def test_a_hint_naming_another_trusted_key_is_signature_invalid(signed, key, other_key) -> None:
    lying = _rewrite(signed, lambda b: b["verificationMaterial"]["publicKey"].update(hint=key_id(other_key)))
    assert _code(lying, _trust(key, other_key)) == "signature-invalid"


def test_a_hint_naming_an_unknown_key_over_a_trusted_signature_is_signature_invalid(signed, key) -> None:
    lying = _rewrite(signed, lambda b: b["verificationMaterial"]["publicKey"].update(hint="0" * 64))
    assert _code(lying, _trust(key)) == "signature-invalid"


def test_a_signature_with_neither_hint_nor_trusted_signer_is_untrusted_signer(signed, other_key) -> None:
    no_hint = _rewrite(signed, lambda b: b["verificationMaterial"]["publicKey"].pop("hint"))
    assert _code(no_hint, _trust(other_key)) == "untrusted-signer"


@pytest.mark.parametrize("text", [b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"mediaType": 1}'])
def test_malformed_json_is_signature_invalid(text: bytes, key) -> None:
    assert _code(text, _trust(key)) == "signature-invalid"


def test_a_wrong_media_type_is_signature_invalid(signed, key) -> None:
    changed = _rewrite(signed, lambda b: b.update(mediaType="application/vnd.dev.sigstore.bundle.v0.2+json"))
    assert _code(changed, _trust(key)) == "signature-invalid"


def test_unknown_fields_in_the_sigstore_bundle_are_signature_invalid(signed, key) -> None:
    changed = _rewrite(signed, lambda b: b["dsseEnvelope"].update(extra="x"))
    assert _code(changed, _trust(key)) == "signature-invalid"


def test_two_dsse_signatures_are_signature_invalid(signed, key) -> None:
    changed = _rewrite(signed, lambda b: b["dsseEnvelope"]["signatures"].append(b["dsseEnvelope"]["signatures"][0]))
    assert _code(changed, _trust(key)) == "signature-invalid"


def test_base64_that_is_not_canonical_is_signature_invalid(signed, key) -> None:
    # Two '=' of padding leave 4 unused bits in the last character: changing them must not go unseen.
    payload = json.dumps(_statement(signed)).encode()
    payload += b" " * ((1 - len(payload)) % 3)
    resigned = _resign(signed, payload, key)
    assert verify(resigned, _trust(key)).files == FILES
    b64 = json.loads(resigned)["dsseEnvelope"]["payload"]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    same_bytes = b64[:-3] + alphabet[alphabet.index(b64[-3]) ^ 1] + "=="
    assert base64.b64decode(same_bytes) == base64.b64decode(b64)

    changed = _rewrite(resigned, lambda b: b["dsseEnvelope"].update(payload=same_bytes))
    assert _code(changed, _trust(key)) == "signature-invalid"


# ---------------------------------------------------------------- validly signed, but wrong inside


def _with_root_digest(statement: dict) -> dict:
    """Make the subject digest agree with the resources again, so only the change under test is wrong."""
    resources = statement["predicate"]["resources"]
    root = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in resources)).hexdigest()
    for subject in statement["subject"]:
        subject["digest"]["sha256"] = root
    return statement


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s.update(predicateType="https://model_signing/Digests/v0.1"), id="predicate-type"),
        pytest.param(lambda s: s.update(_type="https://in-toto.io/Statement/v0.1"), id="statement-type"),
        pytest.param(lambda s: s["subject"].append(s["subject"][0]), id="two-subjects"),
        pytest.param(lambda s: s["predicate"]["serialization"].update(method="shards", shard_size=10), id="shards"),
        pytest.param(lambda s: s["predicate"]["resources"][0].update(algorithm="blake3"), id="blake3"),
        pytest.param(lambda s: s["predicate"]["resources"][0].update(name="../escape"), id="dotdot-name"),
        pytest.param(lambda s: s["predicate"]["resources"][0].update(name="/etc/passwd"), id="absolute-name"),
        pytest.param(lambda s: s["predicate"]["resources"].append(dict(s["predicate"]["resources"][0])), id="duplicate"),
        pytest.param(lambda s: s["predicate"]["bundle"].pop("manifest_digest"), id="no-manifest-digest"),
        pytest.param(lambda s: s["predicate"]["bundle"].update(expires="tomorrow"), id="bad-expiry"),
    ],
)
def test_a_validly_signed_but_malformed_statement_is_signature_invalid(signed, key, change) -> None:
    statement = _statement(signed)
    change(statement)
    assert _code(_resign(signed, _with_root_digest(statement), key), _trust(key)) == "signature-invalid"


def test_a_validly_signed_subject_digest_that_disagrees_with_the_resources_is_signature_invalid(signed, key) -> None:
    statement = _statement(signed)
    statement["predicate"]["resources"][0]["digest"] = _sha(b"other")
    assert _code(_resign(signed, statement, key), _trust(key)) == "signature-invalid"


def test_a_resigned_statement_passes_so_the_tamper_tests_test_what_they_say(signed, key) -> None:
    assert verify(_resign(signed, _statement(signed), key), _trust(key)).files == FILES


# ---------------------------------------------------------------- what sign refuses


@pytest.mark.parametrize("name", ["../x", "/abs", "a//b", "a/./b", "dir/", "a\\b", ".git/config", ".gitignore", ".github/x"])
def test_sign_refuses_file_names_model_signing_could_not_match(key, name: str) -> None:
    with pytest.raises(BundleError) as caught:
        sign({name: _sha(b"x")}, FIELDS, key, "m")
    assert caught.value.code == "invalid-bundle"


def test_sign_accepts_git_files_below_the_top_level(key) -> None:
    files = {"target/.gitattributes": _sha(b"x")}
    assert verify(sign(files, FIELDS, key, "m"), _trust(key)).files == files


def test_sign_refuses_a_digest_that_is_not_sha256_hex(key) -> None:
    with pytest.raises(BundleError) as caught:
        sign({"a": "sha256:" + _sha(b"x")}, FIELDS, key, "m")
    assert caught.value.code == "invalid-bundle"


def test_sign_refuses_bundle_fields_outside_the_schema(key) -> None:
    with pytest.raises(BundleError) as caught:
        sign(FILES, {**FIELDS, "manifest_digest": "md5:abc"}, key, "m")
    assert caught.value.code == "invalid-bundle"
    assert "manifest_digest" in caught.value.message


def test_sign_refuses_a_key_that_is_not_p256() -> None:
    with pytest.raises(BundleError) as caught:
        sign(FILES, FIELDS, ec.generate_private_key(ec.SECP384R1()), "m")
    assert caught.value.code == "key-error"


def test_verify_refuses_a_trusted_key_that_is_not_p256(signed) -> None:
    p384 = ec.generate_private_key(ec.SECP384R1())
    assert _code(signed, {key_id(p384): p384.public_key()}) == "key-error"
