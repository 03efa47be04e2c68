"""Signatures in the OpenSSF model-signing format, as pure functions over bytes.

The layers, outside in:
  Sigstore bundle v0.3 JSON  {mediaType, verificationMaterial: {publicKey: {hint}, tlogEntries: []}, dsseEnvelope}
  DSSE envelope              {payload: b64(statement), payloadType: in-toto, signatures: [{sig: b64(ECDSA-DER), keyid: ""}]}
  in-toto Statement v1       {_type, subject: [{name, digest: {sha256: root}}], predicateType, predicate}
  predicate (v1.0)           {serialization: {method: files, hash_type: sha256, ...}, resources: [{name, algorithm, digest}], bundle: {...}}

laid out exactly as `model_signing` 1.1.1 lays them out for an elliptic-key signature, so each tool verifies
the other's signatures. The signature is ECDSA P-256 / SHA-256 over the DSSE PAE of the payload (the
envelope and statement code is bundler.trust.dsse, shared with run records). The
subject digest is sha256 over the concatenated raw file digests in resource order; the subject name is
informational (model_signing names it after the model directory and never compares it).
Written with `cryptography` directly: model_signing pulls in protobuf models and sigstore clients that
the runtime does not need, and it is only used as a test cross-check.
"""

from __future__ import annotations

__all__ = [
    "PREDICATE_TYPE", "SignedClaims", "format_time", "named_key", "parse_time", "read_unverified", "sign",
    "signed_expiry", "statement_claims", "verify",
]

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bundler.format.mediatypes import SIGSTORE_BUNDLE
from bundler.format.schemacheck import schema_problem
from bundler.trust import certificates as certs, dsse
from core.errors import BundleError
from bundler.trust.keys import PrivateKey, PublicKey, key_id

PREDICATE_TYPE = "https://model_signing/signature/v1.0"

# Top-level paths model_signing leaves out of a directory's hash by default (hashing.Config, ignore_git_paths).
MODEL_SIGNING_IGNORED = (".git", ".gitattributes", ".github", ".gitignore")

SCHEMA_NAME = "signature-predicate.schema.json"  # in the `schemas` package


@dataclass(frozen=True)
class SignedClaims:
    """What a signature says, once parsed (and, from `verify`, once checked)."""

    key_id: str  # hex sha256 of the signer's public key PEM ("" when an unverified signature names none)
    files: dict[str, str]  # path -> sha256 hex: exactly the signed resources
    bundle: dict[str, Any]  # our predicate fields (name, version, manifest_digest, ...); {} for model_signing's own
    statement: dict[str, Any]  # the whole in-toto statement
    model_name: str = ""  # the subject name: informational only
    ignore_paths: tuple[str, ...] = field(default=())  # paths the signer's hashing left out, relative to the root
    signer_name: str = ""  # a certificate signer's identity (SAN or CN); "" for a key signer


# ---------------------------------------------------------------- signing


def sign(files: Mapping[str, str], bundle_fields: Mapping[str, Any], private_key: PrivateKey, model_name: str, certificates: Sequence[Any] = ()) -> bytes:
    """Sign `files` (path -> sha256 hex) and `bundle_fields`; return the Sigstore bundle JSON (canonical bytes).

    The predicate lists `files` with file-level sha256 serialization, as model_signing would over a
    directory holding exactly these files, so `model_signing verify key DIR` accepts it. Paths must be
    POSIX relative paths; top-level .git, .github, .gitattributes, .gitignore are refused because
    model_signing never hashes them. Errors: invalid-bundle for bad files or fields, key-error for a
    key that is not P-256.
    """
    dsse.require_signing_key(private_key)
    for name, digest in files.items():
        problem = _unsafe_name(name) or _model_signing_ignores(name)
        if problem:
            raise BundleError("invalid-bundle", f"cannot sign file {name!r}: {problem}")
        if not _is_sha256_hex(digest):
            raise BundleError("invalid-bundle", f"cannot sign file {name!r}: digest {digest!r} is not a sha256 hex digest")
    if not model_name:
        raise BundleError("invalid-bundle", "cannot sign: empty model name")

    # model_signing orders resources by PurePosixPath, i.e. by path components, not by the raw string.
    names = sorted(files, key=lambda name: name.split("/"))
    predicate: dict[str, Any] = {
        "serialization": {
            "method": "files",
            "hash_type": "sha256",
            "allow_symlinks": False,
            "ignore_paths": sorted(MODEL_SIGNING_IGNORED),
        },
        "resources": [{"name": name, "algorithm": "sha256", "digest": files[name]} for name in names],
        "bundle": dict(bundle_fields),
    }
    problem = schema_problem(SCHEMA_NAME, predicate)
    if problem:
        raise BundleError("invalid-bundle", f"cannot sign: {problem}")
    statement = dsse.statement(model_name, _root_digest([files[n] for n in names]), PREDICATE_TYPE, predicate)
    # With a certificate (leaf first, then its chain) the material is model-signing's certificate format.
    material = certs.chain_material(certificates[0], certificates[1:]) if certificates else {"publicKey": {"hint": key_id(private_key)}, "tlogEntries": []}
    bundle = {
        "mediaType": SIGSTORE_BUNDLE,
        "verificationMaterial": material,
        # model_signing leaves the DSSE keyid empty and names the key in the hint instead.
        "dsseEnvelope": dsse.sign_envelope(_canonical_json(statement), private_key, keyid=""),
    }
    return _canonical_json(bundle)


# ---------------------------------------------------------------- verifying


def verify(bundle_json: bytes, trusted: Mapping[str, PublicKey]) -> SignedClaims:
    """Check a signature against the trusted keys and return what it signs.

    Checks: the Sigstore bundle's JSON shape and mediaType, the DSSE payloadType, the ECDSA signature
    by a trusted key (the hinted key first, then every trusted key), that the hint names the key that
    signed, the statement type, predicateType, predicate schema, and that the subject digest matches
    the resources. Expiry, rollback and the file list itself are the caller's to check.
    Errors: signature-invalid (malformed, bad signature, hint not naming the signer), untrusted-signer
    (no trusted key made it), key-error (a trusted key that is not P-256).
    """
    envelope = _parse_envelope(bundle_json)
    if envelope.certificates:
        return _verify_certificate(envelope, trusted)
    signer = dsse.verify_signer(envelope.inner, trusted, envelope.hint)
    return _claims(envelope.payload_type, envelope.payload, signer)


def _verify_certificate(envelope: "_Envelope", trusted: Mapping[str, PublicKey]) -> SignedClaims:
    """A certificate signature: the chain to a trusted CA at the signing time (the signed `created`, else
    the leaf's start of validity as model-signing takes it), the identity, then the DSSE signature by the
    leaf's key. The signer is named by the certificate's identity."""
    claims = _claims(envelope.payload_type, envelope.payload, "")  # read first only for its signing time
    created = claims.bundle.get("created")
    try:
        signed_at = parse_time(created) if created is not None else envelope.certificates[0].not_valid_before_utc
    except ValueError:
        raise _invalid(f"signed created {created!r} is not an RFC 3339 UTC timestamp"[:300]) from None
    trust = getattr(trusted, "certificates", None) or certs.CertificateTrust()
    leaf = certs.validate_signer(envelope.certificates, trust, signed_at)
    public_key = leaf.public_key()
    if not isinstance(public_key, PublicKey):
        raise _invalid(f"certificate {certs.signer_name(leaf)!r} holds no ECDSA key")
    if not dsse.signed_by(public_key, envelope.inner.signature, dsse.pae(envelope.payload_type, envelope.payload)):  # type: ignore[arg-type]
        raise _invalid(f"signature does not verify with the key of certificate {certs.signer_name(leaf)!r}: the signature or its payload was changed")
    return dataclasses.replace(claims, key_id=key_id(public_key), signer_name=certs.signer_name(leaf))  # type: ignore[arg-type]


def statement_claims(payload_type: str, payload: bytes, signer_name: str) -> SignedClaims:
    """What a payload verified elsewhere (a Sigstore keyless bundle, bundler.trust.sigstore_bundle) signs:
    the same statement and predicate checks as `verify`, the signer named by its identity."""
    return dataclasses.replace(_claims(payload_type, payload, ""), signer_name=signer_name)


def read_unverified(bundle_json: bytes) -> SignedClaims | None:
    """Parse a signature without checking it, for display: who claims to have signed, over what.

    Never use the result to trust anything. Returns None when it cannot be parsed.
    """
    try:
        envelope = _parse_envelope(bundle_json)
        return _claims(envelope.payload_type, envelope.payload, envelope.hint or "")
    except BundleError:
        return None


def named_key(bundle_json: bytes) -> str | None:
    """The key id a signature's hint names, unchecked (the hint is outside the signed bytes), or None."""
    try:
        hint = json.loads(bundle_json)["verificationMaterial"]["publicKey"]["hint"]
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    return hint if isinstance(hint, str) else None


# ---------------------------------------------------------------- timestamps


def format_time(moment: datetime) -> str:
    """RFC 3339 UTC with whole seconds, as the `created` and `expires` fields hold it."""
    if moment.tzinfo is None:
        raise ValueError("timestamp must be timezone-aware")
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# RFC 3339 in UTC with the `Z` suffix, whole seconds or a fraction: the one form `created` and `expires` take.
_UTC_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?Z")


def parse_time(text: Any) -> datetime:
    """Parse a `created` / `expires` field (RFC 3339 UTC, `Z` suffix) to an aware datetime.

    Any other form (no zone, an offset, a date that does not exist, not a string) raises ValueError."""
    if not isinstance(text, str) or not _UTC_TIMESTAMP.fullmatch(text):
        raise ValueError(f"not an RFC 3339 UTC timestamp (YYYY-MM-DDTHH:MM:SSZ): {text!r}"[:200])
    return datetime.fromisoformat(text[:-1] + "+00:00").astimezone(timezone.utc)


def signed_expiry(value: Any, where: str) -> datetime | None:
    """The moment a signature's `expires` value names (None when it has none); any other form than
    RFC 3339 UTC with `Z` is signature-invalid, never a crash and never "no expiry"."""
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError:
        raise dsse.invalid(f"{where} {value!r} is not an RFC 3339 UTC timestamp (YYYY-MM-DDTHH:MM:SSZ)"[:300]) from None


# ---------------------------------------------------------------- parts


@dataclass(frozen=True)
class _Envelope:
    hint: str | None
    inner: dsse.Envelope  # the DSSE envelope inside the Sigstore bundle
    certificates: list[Any] = field(default_factory=list)  # leaf first, for a certificate signature

    @property
    def payload_type(self) -> str:
        return self.inner.payload_type

    @property
    def payload(self) -> bytes:
        return self.inner.payload


_invalid = dsse.invalid
_require_object = dsse.require_object


def _parse_envelope(bundle_json: bytes) -> _Envelope:
    """The Sigstore bundle's fields, strictly: every key known, every base64 canonical.

    Strict so that any changed byte of the JSON is noticed, even in places the signature does not cover.
    """
    try:
        bundle = json.loads(bundle_json)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:  # RecursionError: a nesting bomb
        raise _invalid(f"signature is not JSON: {err}") from err
    _require_object(bundle, "signature", required={"mediaType", "verificationMaterial", "dsseEnvelope"})
    if bundle["mediaType"] != SIGSTORE_BUNDLE:
        raise _invalid(f"signature mediaType is {bundle['mediaType']!r}, expected {SIGSTORE_BUNDLE}")

    material = bundle["verificationMaterial"]
    if isinstance(material, dict) and ("x509CertificateChain" in material or "certificate" in material):
        _require_object(material, "verificationMaterial", required=set(), optional={"x509CertificateChain", "certificate", "tlogEntries"})
        if material.get("tlogEntries", []) != []:
            raise _invalid("signature has transparency log entries: a Sigstore (keyless) signature, checked against --trusted-root")
        return _Envelope(hint=None, inner=dsse.parse_envelope(bundle["dsseEnvelope"], "dsseEnvelope"), certificates=certs.material_certificates(material) or [])
    _require_object(material, "verificationMaterial", required={"publicKey"}, optional={"tlogEntries"})
    if material.get("tlogEntries", []) != []:
        raise _invalid("signature has transparency log entries; only key-signed bundles are supported")
    public_key = material["publicKey"]
    _require_object(public_key, "verificationMaterial.publicKey", required=set(), optional={"hint"})
    hint = public_key.get("hint")
    if hint is not None and not isinstance(hint, str):
        raise _invalid("verificationMaterial.publicKey.hint is not a string")

    return _Envelope(hint=hint or None, inner=dsse.parse_envelope(bundle["dsseEnvelope"], "dsseEnvelope"))


def _claims(payload_type: str, payload: bytes, signer: str) -> SignedClaims:
    """Check the in-toto statement inside the payload and turn it into SignedClaims."""
    statement = dsse.parse_statement(payload_type, payload, PREDICATE_TYPE)
    subject = statement["subject"][0]
    digest = subject["digest"]
    predicate = statement.get("predicate")
    problem = schema_problem(SCHEMA_NAME, predicate)
    if problem:
        raise _invalid(f"signed predicate: {problem}")

    files: dict[str, str] = {}
    for resource in predicate["resources"]:
        name = resource["name"]
        problem = _unsafe_name(name)
        if problem:
            raise _invalid(f"signed file name {name!r}: {problem}")
        if name in files:
            raise _invalid(f"signed file {name!r} is listed twice")
        files[name] = resource["digest"]
    root = _root_digest([resource["digest"] for resource in predicate["resources"]])
    if root != digest["sha256"]:
        raise _invalid(f"subject digest {digest['sha256'][:12]}... does not match the signed resources ({root[:12]}...)")
    return SignedClaims(
        key_id=signer,
        files=files,
        bundle=dict(predicate.get("bundle", {})),
        statement=statement,
        model_name=subject["name"],
        ignore_paths=tuple(predicate["serialization"].get("ignore_paths", ())),
    )


def _root_digest(hex_digests: list[str]) -> str:
    """model_signing's subject digest: sha256 over the raw resource digests, in resource order."""
    hasher = hashlib.sha256()
    for value in hex_digests:
        hasher.update(bytes.fromhex(value))
    return hasher.hexdigest()


_canonical_json = dsse.canonical_json
_is_sha256_hex = dsse.is_sha256_hex


def _unsafe_name(name: Any) -> str | None:
    """Why `name` is not a plain relative POSIX path inside the bundle root, or None if it is."""
    if not isinstance(name, str) or not name:
        return "empty or not a string"
    if "\x00" in name or "\\" in name:
        return "contains NUL or backslash"
    parts = name.split("/")
    if "" in parts:
        return "absolute, or has an empty component"
    if "." in parts or ".." in parts:
        return "has a '.' or '..' component"
    return None


def _model_signing_ignores(name: str) -> str | None:
    top = name.split("/", 1)[0]
    if top in MODEL_SIGNING_IGNORED:
        return f"model_signing never hashes top-level {top!r}, so it could not verify this signature"
    return None
