"""Standard attestations of a bundle: an SBOM (CycloneDX) and SLSA v1 provenance, each an in-toto Statement v1
in a DSSE envelope signed with the bundle's key, stored as cosign 3 stores an attestation (specs/BUNDLE_SPEC.md
of sigstore/cosign):

  OCI referrer manifest  artifactType = the Sigstore bundle v0.3 media type, subject = the bundle manifest,
                         annotations dev.sigstore.bundle.content=dsse-envelope,
                         dev.sigstore.bundle.predicateType=<the predicate type>, org.opencontainers.image.created
  Sigstore bundle v0.3   {mediaType, verificationMaterial: {publicKey: {hint}, tlogEntries: []}, dsseEnvelope}
  in-toto Statement v1   subject [{name: the bundle's name, digest: {sha256: <manifest hex>}}], predicateType,
                         predicate (the CycloneDX document, or the SLSA provenance predicate)

So `cosign verify-attestation --key --type cyclonedx`, Kyverno's attestations by predicate type and
@sigstore/verify read them as they read cosign's own. What they are built from: bundler.trust.sbom and
bundler.trust.provenance; written by bundler.trust.attest.
"""

from __future__ import annotations

__all__ = [
    "KINDS", "MAX_ATTESTATIONS", "AttestationCheck", "attestation_checks", "check_attestation", "parse_kinds", "require_kinds",
    "sign_statement", "store_attestation",
]

import contextlib
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bundler.format import boundedjson
from bundler.format.manifest import Descriptor
from bundler.format.mediatypes import (
    CYCLONEDX_BOM, PREDICATE_TYPE_ANNOTATION, SIGSTORE_BUNDLE, SIGSTORE_BUNDLE_TYPES, SLSA_PROVENANCE_V1,
)
from bundler.store.layout import Store
from bundler.store.referrers import find_attestations, stage_artifact
from bundler.trust import cosign, dsse, keys
from core.errors import BundleError

# The names users give (`verify --require sbom,provenance`) and the predicate types they stand for.
KINDS = {"sbom": CYCLONEDX_BOM, "provenance": SLSA_PROVENANCE_V1}
NAMES = {v: k for k, v in KINDS.items()}
MAX_ATTESTATIONS = 16  # looked at per bundle: anyone able to attach referrers can attach thousands


def parse_kinds(value: str | Sequence[str], allow_unsigned: bool = False) -> tuple[str, ...]:
    """`--require sbom,provenance` (or several values) as kind names; usage error for an unknown one, and with
    `allow_unsigned` (the attestations are checked against trusted keys, which that flag does without)."""
    items = [value] if isinstance(value, str) else list(value)
    names = [n.strip() for item in items for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        raise BundleError("usage", f"unknown attestation {unknown[0]!r}: expected one of {', '.join(KINDS)}")
    if names and allow_unsigned:
        raise BundleError("usage", "--require checks attestations against trusted keys: it cannot go with --allow-unsigned")
    return tuple(dict.fromkeys(names))


# ---------------------------------------------------------------- writing


def sign_statement(statement: Mapping[str, Any], private_key: keys.PrivateKey) -> bytes:
    """The Sigstore bundle JSON of a key-signed DSSE envelope over `statement` (as cosign's `attest --key`)."""
    envelope = dsse.sign_envelope(dsse.canonical_json(statement), private_key)
    del envelope["signatures"][0]["keyid"]  # sigstore-go writes none; the bundle's hint names the key
    bundle = {
        "mediaType": SIGSTORE_BUNDLE,
        "verificationMaterial": {"publicKey": {"hint": cosign.cosign_hint(private_key)}, "tlogEntries": []},
        "dsseEnvelope": envelope,
    }
    return dsse.canonical_json(bundle)


def store_attestation(store: Store, subject: Descriptor, predicate_type: str, bundle: bytes, created: dt.datetime,
                      replace_hint: str | None = None) -> Descriptor:
    """Add a signed attestation to the store as a referrer of `subject`; the earlier ones of the same type
    whose bundle names `replace_hint` (the same key) are removed."""
    annotations = {
        "org.opencontainers.image.created": created.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "dev.sigstore.bundle.content": "dsse-envelope",
        PREDICATE_TYPE_ANNOTATION: predicate_type,
    }
    with store.transaction() as staging:
        desc = stage_artifact(staging, SIGSTORE_BUNDLE, SIGSTORE_BUNDLE, bundle, subject, annotations)
        staging.commit()
        store.add_untagged(desc, SIGSTORE_BUNDLE)
        for old, kind, data in find_attestations(store, subject.digest):
            if old.digest != desc.digest and kind == predicate_type and replace_hint and _hint(data) == replace_hint:
                store.remove_manifest(old.digest)
    return desc


def _hint(bundle: bytes | None) -> str | None:
    with contextlib.suppress(BundleError, AttributeError, TypeError):
        return boundedjson.loads(bundle or b"", "attestation")["verificationMaterial"]["publicKey"]["hint"]
    return None


# ---------------------------------------------------------------- checking


@dataclass
class AttestationCheck:
    """One attestation found for a bundle, and whether it verified; `statement` is shown even when it did not."""

    digest: str  # the attestation artifact's manifest digest
    predicate_type: str  # as its manifest annotates it
    verified: bool = False
    signer: str | None = None  # key id of the trusted key that signed it
    statement: dict[str, Any] | None = None
    error: BundleError | None = None

    @property
    def kind(self) -> str:
        return NAMES.get(self.predicate_type, self.predicate_type)

    def as_json(self) -> dict[str, Any]:
        return {
            "type": self.kind, "predicate_type": self.predicate_type, "digest": self.digest,
            "signer": {"key_id": self.signer} if self.signer else None, "verified": self.verified,
            "reason": {"code": self.error.code, "message": self.error.message} if self.error else None,
            "statement": self.statement,
        }


def check_attestation(desc: Descriptor, predicate_type: str, bundle: bytes | None, subject_digest: str,
                      trusted: Mapping[str, keys.PublicKey]) -> AttestationCheck:
    """Verify one attestation: intact, a Sigstore bundle whose DSSE envelope a trusted key signed, a statement of
    the annotated predicate type about this bundle, its predicate of that type's shape. Never raises."""
    result = AttestationCheck(desc.digest, predicate_type)
    try:
        if bundle is None:
            raise BundleError("digest-mismatch", f"attestation {desc.digest[:19]}… is damaged: a blob is missing or does not match its digest")
        envelope, hint = _open(bundle)
        with contextlib.suppress(BundleError):
            result.statement = boundedjson.loads(envelope.payload, "attestation statement")  # shown, verified or not
        hints = {cosign.cosign_hint(key): kid for kid, key in dsse.trusted_by_id(trusted).items()}
        result.signer = dsse.verify_signer(envelope, trusted, hints.get(hint) if hint else None)
        statement = dsse.parse_statement(envelope.payload_type, envelope.payload, predicate_type)
        signed = "sha256:" + statement["subject"][0]["digest"]["sha256"]
        if signed != subject_digest:
            raise BundleError("signature-mismatch", f"attestation is about another bundle: it signs {signed[:19]}…, this bundle is {subject_digest[:19]}…")
        _check_predicate(predicate_type, statement.get("predicate"))
        result.verified = True
    except BundleError as err:
        result.error = err
    return result


def _open(bundle_json: bytes) -> tuple[dsse.Envelope, str | None]:
    """The DSSE envelope of a key-signed Sigstore bundle, and the key hint beside it (signature-invalid)."""
    try:
        bundle = boundedjson.loads(bundle_json, "attestation")
    except BundleError as err:
        raise dsse.invalid(f"attestation is not JSON: {err.message}") from None
    dsse.require_object(bundle, "attestation", required={"mediaType", "verificationMaterial", "dsseEnvelope"})
    if bundle["mediaType"] not in SIGSTORE_BUNDLE_TYPES:
        raise dsse.invalid(f"attestation mediaType is {bundle['mediaType']!r}, expected {SIGSTORE_BUNDLE}")
    material = bundle["verificationMaterial"]
    dsse.require_object(material, "verificationMaterial", required={"publicKey"}, optional={"tlogEntries", "timestampVerificationData"})
    dsse.require_object(material["publicKey"], "verificationMaterial.publicKey", required=set(), optional={"hint"})
    hint = material["publicKey"].get("hint")
    if hint is not None and not isinstance(hint, str):
        raise dsse.invalid("attestation's verificationMaterial.publicKey.hint is not a string")
    return dsse.parse_envelope(bundle["dsseEnvelope"], "dsseEnvelope"), hint


def _check_predicate(predicate_type: str, predicate: Any) -> None:
    """The fields a reader of the predicate type relies on (the full schemas are checked where they are written)."""
    if predicate_type == CYCLONEDX_BOM:
        ok = isinstance(predicate, dict) and predicate.get("bomFormat") == "CycloneDX" and isinstance(predicate.get("specVersion"), str)
        what = "a CycloneDX BOM (bomFormat, specVersion)"
    else:
        definition = predicate.get("buildDefinition") if isinstance(predicate, dict) else None
        details = predicate.get("runDetails") if isinstance(predicate, dict) else None
        ok = (isinstance(definition, dict) and isinstance(definition.get("buildType"), str) and isinstance(definition.get("externalParameters"), dict)
              and isinstance(details, dict) and isinstance(details.get("builder"), dict) and isinstance(details["builder"].get("id"), str))
        what = "SLSA v1 provenance (buildDefinition.buildType, externalParameters, runDetails.builder.id)"
    if not ok:
        raise BundleError("invalid-bundle", f"the signed {NAMES[predicate_type]} predicate is not {what}")


def attestation_checks(store: Store, subject_digest: str, trusted: Mapping[str, keys.PublicKey]) -> list[AttestationCheck]:
    """Every standard attestation of the bundle (at most MAX_ATTESTATIONS of each type), each verified."""
    found = find_attestations(store, subject_digest)
    chosen = [a for kind in KINDS.values() for a in [a for a in found if a[1] == kind][:MAX_ATTESTATIONS]]
    return [check_attestation(desc, kind, data, subject_digest, trusted) for desc, kind, data in chosen]


def require_kinds(checks: Sequence[AttestationCheck], required: Sequence[str], what: str) -> str:
    """Each required kind has an attestation that verified, else the reason (exit 3 for a missing one or a bad
    signature): the failure of one found, else signature-missing."""
    for name in required:
        of_kind = [c for c in checks if c.predicate_type == KINDS[name]]
        if any(c.verified for c in of_kind):
            continue
        if of_kind and of_kind[0].error is not None:
            err = of_kind[0].error
            raise BundleError(err.code, f"{what}: the {name} attestation {of_kind[0].digest[:19]}… did not verify: {err.message}")
        raise BundleError("signature-missing", f"{what} has no {name} attestation ({KINDS[name]}): write one with `bundle attest REF --key KEY`")
    held = ", ".join(f"{name} by {next(c.signer for c in checks if c.verified and c.predicate_type == KINDS[name])[:16]}…" for name in required)
    return held
