"""DSSE envelopes over in-toto Statements v1, signed and verified with ECDSA P-256 / SHA-256.

The one signing code under both kinds of signed claim the project writes:
  bundle signatures (bundler.trust.signature): the envelope inside a Sigstore bundle v0.3, keyid "", the key named
    in the Sigstore bundle's hint, as model_signing writes it;
  run records (bundler.trust.runrecord): a bare envelope whose keyid names the key.

  DSSE envelope          {payload: b64(statement), payloadType: application/vnd.in-toto+json, signatures: [{sig, keyid}]}
  in-toto Statement v1   {_type, subject: [{name, digest: {sha256}}], predicateType, predicate}

What is signed is the DSSE v1 pre-authentication encoding (PAE) of the payload, never the JSON around it.
Written with `cryptography` directly, so a third party can check an envelope with those primitives alone.
"""

from __future__ import annotations

__all__ = [
    "Envelope", "STATEMENT_TYPE", "canonical_json", "invalid", "is_sha256_hex", "pae", "parse_envelope",
    "parse_statement", "require_object", "require_signing_key", "sign_envelope", "signed_by", "statement",
    "trusted_by_id", "verify_signer",
]

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from bundler.format.mediatypes import IN_TOTO
from core.errors import BundleError
from bundler.trust.keys import PrivateKey, PublicKey, key_id

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"


@dataclass(frozen=True)
class Envelope:
    """A DSSE envelope's fields, decoded (one signature: the only kind this project writes or accepts)."""

    payload_type: str
    payload: bytes
    signature: bytes
    keyid: str


# ---------------------------------------------------------------- signing


def require_signing_key(private_key: Any) -> None:
    """Refuse anything but an ECDSA P-256 private key (key-error)."""
    if not isinstance(private_key, ec.EllipticCurvePrivateKey) or not isinstance(private_key.curve, ec.SECP256R1):
        raise BundleError("key-error", "signing key is not an ECDSA P-256 private key")


def statement(subject_name: str, subject_sha256: str, predicate_type: str, predicate: Mapping[str, Any]) -> dict[str, Any]:
    """An in-toto Statement v1 with one subject."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": subject_sha256}}],
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }


def sign_envelope(payload: bytes, private_key: PrivateKey, keyid: str = "", payload_type: str = IN_TOTO) -> dict[str, Any]:
    """The DSSE envelope (a JSON object) signing `payload` with `private_key`: ECDSA P-256 / SHA-256 over the PAE."""
    require_signing_key(private_key)
    signature = private_key.sign(pae(payload_type, payload), ec.ECDSA(hashes.SHA256()))
    return {
        "payload": base64.b64encode(payload).decode("ascii"),
        "payloadType": payload_type,
        "signatures": [{"sig": base64.b64encode(signature).decode("ascii"), "keyid": keyid}],
    }


# ---------------------------------------------------------------- verifying


def parse_envelope(envelope: Any, where: str = "dsseEnvelope", payload_type: str = IN_TOTO) -> Envelope:
    """An envelope's fields, strictly: every key known, exactly one signature, every base64 canonical.

    Strict so that any changed byte of the JSON is noticed, even in places the signature does not cover.
    Errors: signature-invalid.
    """
    require_object(envelope, where, required={"payload", "payloadType", "signatures"})
    if envelope["payloadType"] != payload_type:
        raise invalid(f"DSSE payloadType is {envelope['payloadType']!r}, expected {payload_type}")
    signatures = envelope["signatures"]
    if not isinstance(signatures, list) or len(signatures) != 1:
        raise invalid("DSSE envelope must hold exactly one signature")
    require_object(signatures[0], f"{where}.signatures[0]", required={"sig"}, optional={"keyid"})
    keyid = signatures[0].get("keyid", "")
    if not isinstance(keyid, str):
        raise invalid(f"{where}.signatures[0].keyid is not a string")
    return Envelope(
        payload_type=envelope["payloadType"],
        payload=b64decode(envelope["payload"], f"{where}.payload"),
        signature=b64decode(signatures[0]["sig"], f"{where}.signatures[0].sig"),
        keyid=keyid,
    )


def trusted_by_id(trusted: Mapping[str, PublicKey]) -> dict[str, PublicKey]:
    """key id -> key for the trusted keys; key-error when one is not a P-256 public key."""
    by_id: dict[str, PublicKey] = {}
    for key in trusted.values():
        if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
            raise BundleError("key-error", "a trusted key is not an ECDSA P-256 public key")
        by_id[key_id(key)] = key
    return by_id


def verify_signer(envelope: Envelope, trusted: Mapping[str, PublicKey], hint: str | None) -> str:
    """The key id of the trusted key whose signature the envelope carries (the hinted key first, then every one).

    `hint` names the key claimed to have signed (outside the signed bytes). Errors: signature-invalid (bad
    signature by the hinted trusted key, or a hint naming another key than the one that signed),
    untrusted-signer (no trusted key made it), key-error (a trusted key that is not P-256).
    """
    by_id = trusted_by_id(trusted)
    message = pae(envelope.payload_type, envelope.payload)
    if hint and hint in by_id:
        if not signed_by(by_id[hint], envelope.signature, message):
            raise invalid(f"signature does not verify with trusted key {hint[:12]}...: the signature or its payload was changed")
        return hint
    signer = next((kid for kid, key in by_id.items() if signed_by(key, envelope.signature, message)), "")
    if signer and hint:
        # The hint is outside the signed payload: a wrong one means the envelope was altered.
        raise invalid(f"signature names key {hint[:12]}... but was made by trusted key {signer[:12]}...")
    if not signer:
        who = f"key {hint[:12]}..." if hint else "a key it does not name"
        if not by_id:
            raise BundleError("untrusted-signer", f"signed by {who}, and no key is trusted: pass the signer's public key with --key PUB or put it in $BUNDLE_TRUSTED_KEYS")
        trusted_ids = ", ".join(f"{kid[:12]}..." for kid in sorted(by_id))
        raise BundleError("untrusted-signer", f"signed by {who}, which is none of the trusted keys ({trusted_ids}): get the signer's public key and pass it with --key or put it in $BUNDLE_TRUSTED_KEYS")
    return signer


def parse_statement(payload_type: str, payload: bytes, predicate_type: str) -> dict[str, Any]:
    """The in-toto Statement v1 in a payload, with exactly one subject (a name and a sha256 digest) and the
    expected predicateType. The predicate itself is the caller's to check. Errors: signature-invalid."""
    if payload_type != IN_TOTO:
        raise invalid(f"DSSE payloadType is {payload_type!r}")
    try:
        value = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:  # RecursionError: a nesting bomb
        raise invalid(f"signed payload is not JSON: {err}") from err
    if not isinstance(value, dict) or value.get("_type") != STATEMENT_TYPE:
        raise invalid(f"signed payload is not an in-toto Statement v1 ({STATEMENT_TYPE})")
    if value.get("predicateType") != predicate_type:
        raise invalid(f"predicateType is {value.get('predicateType')!r}, expected {predicate_type}")
    subjects = value.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise invalid("statement must have exactly one subject")
    subject = subjects[0]
    digest = subject.get("digest")
    if not isinstance(subject.get("name"), str) or not isinstance(digest, dict) or not is_sha256_hex(digest.get("sha256")):
        raise invalid("statement subject needs a name and a sha256 digest")
    return value


# ---------------------------------------------------------------- parts


def invalid(message: str) -> BundleError:
    return BundleError("signature-invalid", message)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what is actually signed."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def signed_by(key: PublicKey, signature: bytes, message: bytes) -> bool:
    try:
        key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no spaces, ASCII: the same value always gives the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def b64decode(value: Any, where: str) -> bytes:
    """Standard base64, refused unless canonical: otherwise unused padding bits could change unseen."""
    if not isinstance(value, str):
        raise invalid(f"{where} is not a string")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise invalid(f"{where} is not valid base64") from err
    if base64.b64encode(raw).decode("ascii") != value:
        raise invalid(f"{where} is not canonical base64")
    return raw


def require_object(value: Any, where: str, required: set[str], optional: frozenset[str] | set[str] = frozenset()) -> None:
    """A JSON object with every `required` key and nothing outside `required` | `optional` (signature-invalid)."""
    if not isinstance(value, dict):
        raise invalid(f"{where} is not a JSON object")
    missing = required - value.keys()
    if missing:
        raise invalid(f"{where} lacks {', '.join(sorted(missing))}")
    unknown = value.keys() - required - optional
    if unknown:
        raise invalid(f"{where} has unknown field(s) {', '.join(sorted(unknown))}")


def is_sha256_hex(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
