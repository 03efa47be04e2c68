"""Cosign-style signatures of a bundle's manifest digest: what Kubernetes admission controllers check.

Laid out as cosign 3.x (v3.1.2, `cosign sign --key KEY IMAGE@DIGEST`, the default new bundle format) writes
a key-based signature of an OCI artifact (cmd/cosign/cli/sign/sign.go `signDigestBundle`,
pkg/oci/remote/write.go `WriteAttestationNewBundleFormat`, specs/BUNDLE_SPEC.md):

  OCI referrer manifest  artifactType = the Sigstore bundle v0.3 media type, subject = the bundle manifest,
                         config = the empty descriptor, one layer: the Sigstore bundle JSON, annotations
                         dev.sigstore.bundle.content=dsse-envelope, dev.sigstore.bundle.predicateType,
                         org.opencontainers.image.created
  Sigstore bundle v0.3   {mediaType, verificationMaterial: {publicKey: {hint}, tlogEntries: []}, dsseEnvelope}
  DSSE envelope          in-toto payload type, one ECDSA P-256 / SHA-256 signature over the PAE
  in-toto Statement v1   subject [{digest: {sha256: <manifest hex>}, annotations}], predicateType
                         https://sigstore.dev/cosign/sign/v1, predicate {}

The hint is cosign's: base64 of sha256 over the public key's DER SubjectPublicKeyInfo. Our own signatures
carry `specbundle.dev/expires` among the subject annotations (cosign's `-a key=value` place for claims), so
the cosign-style signature ends when the model-signing one beside it does; a signature made by cosign
itself has no such annotation and no expiry.
"""

from __future__ import annotations

__all__ = [
    "CosignClaims", "EXPIRES_ANNOTATION", "KIND", "MODEL_SIGNING_KIND", "PREDICATE_TYPE",
    "SIGNATURE_ANNOTATION", "artifact_annotations", "cosign_hint", "kind_of", "legacy_config", "legacy_payload",
    "legacy_sign", "legacy_tag", "sign_digest", "verify_digest",
]

import base64
import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bundler.format.mediatypes import SIGSTORE_BUNDLE, SIGSTORE_BUNDLE_TYPES
from bundler.trust import dsse
from core.errors import BundleError
from bundler.trust.keys import PrivateKey, PublicKey
from bundler.trust.signature import signed_expiry

PREDICATE_TYPE = "https://sigstore.dev/cosign/sign/v1"
CONTENT_ANNOTATION = "dev.sigstore.bundle.content"
PREDICATE_ANNOTATION = "dev.sigstore.bundle.predicateType"
CREATED_ANNOTATION = "org.opencontainers.image.created"
EXPIRES_ANNOTATION = "specbundle.dev/expires"

KIND = "cosign"
MODEL_SIGNING_KIND = "model-signing"

# The legacy form (cosign before the new bundle format; what policy-controller's key authorities read): an
# image tagged sha256-<hex>.sig whose layers are simple-signing payloads, each signature in an annotation.
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SIMPLE_SIGNING_TYPE = "cosign container image signature"


@dataclass(frozen=True)
class CosignClaims:
    """A verified cosign-style signature: who signed which manifest digest, and the subject's annotations."""

    key_id: str  # our key id (hex sha256 of the public key PEM) of the trusted key that signed
    manifest_digest: str  # sha256:<hex>
    annotations: dict[str, Any]
    statement: dict[str, Any]

    @property
    def expires(self) -> str | None:
        value = self.annotations.get(EXPIRES_ANNOTATION)
        return value if isinstance(value, str) else None


# ---------------------------------------------------------------- signing


def cosign_hint(key: PublicKey | PrivateKey) -> str:
    """cosign's `verificationMaterial.publicKey.hint`: base64 sha256 of the public key's DER SPKI."""
    public_key = key.public_key() if hasattr(key, "private_bytes") else key
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode("ascii")


def sign_digest(manifest_digest: str, private_key: PrivateKey, annotations: Mapping[str, str] | None = None) -> bytes:
    """The Sigstore bundle JSON signing `manifest_digest` as cosign's key-based `sign` does.

    `annotations` go into the statement's subject (cosign's `-a` flag). Errors: key-error for a key that is
    not P-256, invalid-bundle for a digest that is not sha256.
    """
    hex_digest = _hex(manifest_digest)
    if hex_digest is None:
        raise BundleError("invalid-bundle", f"cannot sign {manifest_digest!r}: not a sha256 digest")
    subject: dict[str, Any] = {"digest": {"sha256": hex_digest}}
    if annotations:
        subject["annotations"] = dict(annotations)
    # Field order as protojson writes an intotov1.Statement; the bytes are signed as they are.
    statement = {"_type": dsse.STATEMENT_TYPE, "subject": [subject], "predicateType": PREDICATE_TYPE, "predicate": {}}
    envelope = dsse.sign_envelope(json.dumps(statement, separators=(",", ":")).encode("utf-8"), private_key)
    del envelope["signatures"][0]["keyid"]  # sigstore-go writes none
    bundle = {
        "mediaType": SIGSTORE_BUNDLE,
        "verificationMaterial": {"publicKey": {"hint": cosign_hint(private_key)}, "tlogEntries": []},
        "dsseEnvelope": envelope,
    }
    return json.dumps(bundle, separators=(",", ":")).encode("utf-8")


def artifact_annotations(created: dt.datetime) -> dict[str, str]:
    """The referrer manifest's annotations, as cosign writes them."""
    return {
        CREATED_ANNOTATION: created.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        CONTENT_ANNOTATION: "dsse-envelope",
        PREDICATE_ANNOTATION: PREDICATE_TYPE,
    }


def legacy_tag(manifest_digest: str) -> str:
    """cosign's signature tag for a manifest digest: `sha256-<hex>.sig`."""
    return manifest_digest.replace(":", "-", 1) + ".sig"


def legacy_payload(manifest_digest: str, docker_reference: str, annotations: Mapping[str, str] | None = None) -> bytes:
    """The simple-signing payload cosign's legacy `sign` writes (sigstore/sigstore payload.Cosign), in Go's
    field order; the optional part holds the `-a` annotations (null without)."""
    critical = {
        "identity": {"docker-reference": docker_reference},
        "image": {"docker-manifest-digest": manifest_digest},
        "type": SIMPLE_SIGNING_TYPE,
    }
    return json.dumps({"critical": critical, "optional": dict(annotations) if annotations else None}, separators=(",", ":")).encode("utf-8")


def legacy_sign(payload: bytes, private_key: PrivateKey) -> str:
    """The base64 ECDSA P-256 / SHA-256 signature over the payload bytes, as the layer annotation holds it."""
    dsse.require_signing_key(private_key)
    return base64.b64encode(private_key.sign(payload, ec.ECDSA(hashes.SHA256()))).decode("ascii")


def legacy_config(layer_digest: str) -> bytes:
    """The image config of a signature image: empty apart from the one layer's diff id."""
    return json.dumps({"architecture": "", "created": "0001-01-01T00:00:00Z", "history": [{"created": "0001-01-01T00:00:00Z"}],
                       "os": "", "rootfs": {"type": "layers", "diff_ids": [layer_digest]}, "config": {}}, separators=(",", ":")).encode()


# ---------------------------------------------------------------- reading


def kind_of(bundle_json: bytes) -> str | None:
    """Which kind of signature a Sigstore bundle holds, read without checking it: "cosign" for a statement
    of cosign's sign predicate, "model-signing" for anything else (judged by bundler.trust.signature), None when
    it is not JSON at all."""
    try:
        bundle = json.loads(bundle_json)
        payload = base64.b64decode(bundle["dsseEnvelope"]["payload"], validate=True)
        statement = json.loads(payload)
    except (ValueError, TypeError, KeyError, RecursionError):
        return MODEL_SIGNING_KIND  # let the model-signing parser say what is wrong with it
    return KIND if isinstance(statement, dict) and statement.get("predicateType") == PREDICATE_TYPE else MODEL_SIGNING_KIND


def verify_digest(bundle_json: bytes, trusted: Mapping[str, PublicKey], manifest_digest: str, now: dt.datetime | None = None) -> CosignClaims:
    """Check a cosign-style signature: a trusted key signed a statement of cosign's sign predicate whose one
    subject is `manifest_digest`, and it has not expired (when it says when it does).

    Transparency log entries and timestamps, where a bundle has them, are not checked (offline; the key is
    what is trusted) and not required. A certificate instead of a public key is refused: only key-signed
    bundles are supported. Errors: signature-invalid, untrusted-signer, signature-mismatch (another
    digest), expired, key-error.
    """
    try:
        bundle = json.loads(bundle_json)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise dsse.invalid(f"cosign signature is not JSON: {err}") from err
    dsse.require_object(bundle, "cosign signature", required={"mediaType", "verificationMaterial", "dsseEnvelope"})
    if bundle["mediaType"] not in SIGSTORE_BUNDLE_TYPES:
        raise dsse.invalid(f"cosign signature mediaType is {bundle['mediaType']!r}, expected {SIGSTORE_BUNDLE}")
    material = bundle["verificationMaterial"]
    dsse.require_object(material, "verificationMaterial", required={"publicKey"}, optional={"tlogEntries", "timestampVerificationData"})
    public_key = material["publicKey"]
    dsse.require_object(public_key, "verificationMaterial.publicKey", required=set(), optional={"hint"})
    envelope = dsse.parse_envelope(bundle["dsseEnvelope"], "dsseEnvelope")

    hint = public_key.get("hint")
    if hint is not None and not isinstance(hint, str):
        raise dsse.invalid("cosign signature's verificationMaterial.publicKey.hint is not a string")

    by_id = dsse.trusted_by_id(trusted)
    # The hint lies outside the signed bytes: used only to try the named key first (cosign's or ours).
    hints = {cosign_hint(key): kid for kid, key in by_id.items()} | {kid: kid for kid in by_id}
    signer = dsse.verify_signer(envelope, trusted, hints.get(hint) if hint else None)

    statement = _statement(envelope.payload)
    subject = statement["subject"][0]
    signed = "sha256:" + subject["digest"]["sha256"]
    if signed != manifest_digest:
        raise BundleError("signature-mismatch", f"cosign signature is over manifest {signed[:19]}…, this bundle is {manifest_digest[:19]}…")
    claims = CosignClaims(signer, signed, dict(subject.get("annotations") or {}), statement)
    # Read from the annotations themselves: a value of another type is refused, never taken as "no expiry".
    expires = signed_expiry(claims.annotations.get(EXPIRES_ANNOTATION), f"cosign signature's {EXPIRES_ANNOTATION}")
    if expires is not None and expires <= (now or dt.datetime.now(dt.timezone.utc)):
        raise BundleError("expired", f"cosign signature expired at {claims.expires}")
    return claims


def _statement(payload: bytes) -> dict[str, Any]:
    """The in-toto Statement v1 of cosign's sign predicate, with exactly one subject holding a sha256
    digest (cosign leaves the subject's name out). Errors: signature-invalid."""
    try:
        value = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise dsse.invalid(f"cosign signature's payload is not JSON: {err}") from err
    if not isinstance(value, dict) or value.get("_type") != dsse.STATEMENT_TYPE:
        raise dsse.invalid(f"cosign signature's payload is not an in-toto Statement v1 ({dsse.STATEMENT_TYPE})")
    if value.get("predicateType") != PREDICATE_TYPE:
        raise dsse.invalid(f"predicateType is {value.get('predicateType')!r}, expected {PREDICATE_TYPE}")
    subjects = value.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise dsse.invalid("cosign statement must have exactly one subject")
    digest = subjects[0].get("digest")
    if not isinstance(digest, dict) or not dsse.is_sha256_hex(digest.get("sha256")):
        raise dsse.invalid("cosign statement subject needs a sha256 digest")
    annotations = subjects[0].get("annotations", {})
    if not isinstance(annotations, dict):
        raise dsse.invalid("cosign statement subject annotations are not an object")
    return value


def _hex(digest: str) -> str | None:
    algorithm, _, hex_digest = digest.partition(":")
    return hex_digest if algorithm == "sha256" and dsse.is_sha256_hex(hex_digest) else None

