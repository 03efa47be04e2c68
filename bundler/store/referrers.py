"""Artifacts in the store whose subject is a bundle (signatures, standard attestations, run records): the one
writer of such an artifact, and the one reader of each kind for verify, sign, push, pull, list, inspect and the
run records (a damaged signature counts as none; `damaged_signatures` names it). Signatures and attestations
share the Sigstore bundle artifactType, as cosign 3 writes both; an attestation's manifest names its predicate
type (mediatypes.ATTESTATION_PREDICATES) in an annotation, and is never taken for a signature."""

from __future__ import annotations

__all__ = [
    "damaged_signatures", "find_attestations", "find_legacy_signatures", "is_attestation", "find_records", "find_signatures", "signature_artifacts",
    "stage_artifact",
]

import hashlib
from typing import Any, Iterator, Mapping

from bundler.format import boundedjson
from core.errors import BundleError
from bundler.format.manifest import Descriptor, go_json, parse_descriptor
from bundler.format.mediatypes import (
    ATTESTATION_PREDICATES, OCI_EMPTY, OCI_MANIFEST, PREDICATE_TYPE_ANNOTATION, RUN_RECORD, SIGSTORE_BUNDLE, SIMPLE_SIGNING,
)
from bundler.store.layout import MAX_JSON_BLOB, Staging, Store

EMPTY_CONFIG = b"{}"  # the blob of an OCI_EMPTY config: an artifact manifest must still name a config


def stage_artifact(staging: Staging, artifact_type: str, layer_type: str, payload: bytes, subject: Descriptor,
                   annotations: Mapping[str, str]) -> Descriptor:
    """Stage an OCI artifact whose subject is the manifest `subject`: an empty config and one layer holding
    `payload`, in the field order of Go's ocispec.Manifest (as cosign and oras write referrers)."""
    layer = Descriptor(layer_type, staging.add_bytes(payload).digest, len(payload))
    config = Descriptor(OCI_EMPTY, staging.add_bytes(EMPTY_CONFIG).digest, len(EMPTY_CONFIG))
    manifest = go_json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": artifact_type,
            "config": config.as_dict(),
            "layers": [layer.as_dict()],
            "subject": subject.as_dict() | {"mediaType": OCI_MANIFEST},
            "annotations": dict(annotations),
        }
    )
    return Descriptor(OCI_MANIFEST, staging.add_bytes(manifest).digest, len(manifest))


def _subject_of(manifest: Any) -> str | None:
    """The digest a manifest names as its subject, or None."""
    subject = manifest.get("subject") if isinstance(manifest, dict) else None
    return subject.get("digest") if isinstance(subject, dict) and isinstance(subject.get("digest"), str) else None


def is_attestation(manifest: Any) -> str | None:
    """The attestation predicate type a Sigstore bundle artifact's manifest annotates, or None (a signature)."""
    annotations = manifest.get("annotations") if isinstance(manifest, dict) else None
    value = annotations.get(PREDICATE_TYPE_ANNOTATION) if isinstance(annotations, dict) else None
    return value if value in ATTESTATION_PREDICATES else None


def _artifacts(store: Store, artifact_type: str) -> Iterator[tuple[Descriptor, bytes | None, Any]]:
    """Each untagged artifact of `artifact_type`: (descriptor, manifest bytes, manifest JSON), or
    (descriptor, None, None) when its manifest cannot be read (missing, damaged, not JSON)."""
    for desc in store.untagged(artifact_type):
        try:
            data, manifest = store.read_json_blob(desc)
        except BundleError:
            yield desc, None, None
            continue
        yield desc, data, manifest


class _Damaged(Exception):
    """A blob of a signature artifact is missing or does not match its descriptor: the store is damaged."""


def _intact(store: Store, item: Any, what: str) -> bytes:
    """The bytes of the blob a descriptor names, checked against its digest and size; _Damaged when missing or
    different, BundleError when the descriptor itself is malformed (an attacker's artifact, not a damaged store)."""
    desc = parse_descriptor(item, what)
    if not isinstance(desc.size, int) or desc.size > MAX_JSON_BLOB:
        raise BundleError("invalid-bundle", f"{what}: a blob of {desc.size} bytes, more than a signature holds")
    path = store.blob_path(desc.digest)  # a malformed digest: BundleError, the artifact's own fault
    try:
        data = boundedjson.read_regular(path, desc.size, what, "digest-mismatch")
    except BundleError:
        raise _Damaged() from None
    if len(data) != desc.size or "sha256:" + hashlib.sha256(data).hexdigest() != desc.digest:
        raise _Damaged()
    return data


def _signature_parts(store: Store, desc: Descriptor, manifest: Any) -> bytes | None:
    """The Sigstore bundle bytes of an intact signature artifact (JSON or not: verify judges them), or None for
    an artifact that is intact but not shaped like one (skipped: anyone can attach such a referrer).
    Raises _Damaged when one of its blobs is missing or changed."""
    layers = manifest.get("layers")
    if not isinstance(layers, list) or len(layers) != 1:
        return None
    try:
        if parse_descriptor(layers[0], f"signature {desc.digest} layer").media_type != SIGSTORE_BUNDLE:
            return None
        bundle = _intact(store, layers[0], f"signature {desc.digest} layer")
        # Its config too (the empty JSON object): verify and push walk this artifact, so every blob of it is checked.
        _intact(store, manifest.get("config"), f"signature {desc.digest} config")
    except BundleError:
        return None
    return bundle


def signature_artifacts(store: Store) -> Iterator[tuple[Descriptor, str, bytes]]:
    """Every readable signature artifact in the store: (its descriptor, its subject's digest, its Sigstore bundle bytes)."""
    for desc, data, manifest in _artifacts(store, SIGSTORE_BUNDLE):
        subject = _subject_of(manifest)
        if data is None or subject is None or is_attestation(manifest):
            continue  # a damaged signature artifact counts as no signature; verify then says so
        try:
            bundle = _signature_parts(store, desc, manifest)
        except _Damaged:
            continue
        if bundle is not None:
            yield desc, subject, bundle


def damaged_signatures(store: Store, subject_digest: str) -> list[str]:
    """Digests of signature artifacts whose manifest names `subject_digest` and one of whose blobs is missing or
    does not match its digest and size; and of those whose manifest itself cannot be read, whose subject cannot
    be told (it may be this one). An intact artifact that is not shaped like a signature is not damaged: it is
    no signature (anyone who can push a referrer can attach one)."""
    out = []
    for desc, data, manifest in _artifacts(store, SIGSTORE_BUNDLE):
        if data is None:
            out.append(desc.digest)
            continue
        if _subject_of(manifest) != subject_digest or is_attestation(manifest):
            continue
        try:
            _signature_parts(store, desc, manifest)
        except _Damaged:
            out.append(desc.digest)
    return out


def find_signatures(store: Store, subject_digest: str) -> list[tuple[Descriptor, bytes]]:
    """Signature artifacts in the store whose subject is `subject_digest`, with their Sigstore bundle bytes."""
    return [(desc, data) for desc, subject, data in signature_artifacts(store) if subject == subject_digest]


def find_legacy_signatures(store: Store, subject_digest: str) -> list[tuple[Descriptor, bytes, dict[str, Any]]]:
    """The bundle's cosign legacy signature images in the store: (descriptor, manifest bytes, manifest)."""
    return [(desc, data, manifest) for desc, data, manifest in _artifacts(store, SIMPLE_SIGNING)
            if data is not None and _subject_of(manifest) == subject_digest]


def find_records(store: Store, subject_digest: str) -> list[Descriptor]:
    """Run record artifacts in the store whose manifest names `subject_digest` as its subject (not yet
    verified: bundler.trust.runrecord checks them).

    A manifest that cannot be read is still listed, so that its damage is reported rather than hidden."""
    return [desc for desc, data, manifest in _artifacts(store, RUN_RECORD) if data is None or _subject_of(manifest) == subject_digest]


def find_attestations(store: Store, subject_digest: str) -> list[tuple[Descriptor, str, bytes | None]]:
    """The standard attestations of `subject_digest` in the store (not yet verified: bundler.trust.attest checks
    them): (descriptor, the predicate type its manifest annotates, its Sigstore bundle bytes, or None when a blob
    of it is missing or changed, or it is not shaped like one)."""
    out: list[tuple[Descriptor, str, bytes | None]] = []
    for desc, data, manifest in _artifacts(store, SIGSTORE_BUNDLE):
        kind = is_attestation(manifest) if data is not None else None
        if kind is None or _subject_of(manifest) != subject_digest:
            continue
        try:
            bundle = _signature_parts(store, desc, manifest)
        except _Damaged:
            bundle = None
        out.append((desc, kind, bundle))
    return out
