"""Artifacts in the store whose subject is a bundle (signatures, run records): the one writer of such an
artifact, and the one reader of each kind for verify, sign, push, pull, list, inspect and the run records (a
damaged signature counts as none; `damaged_signatures` names it)."""

from __future__ import annotations

__all__ = [
    "damaged_signatures", "find_legacy_signatures", "find_records", "find_signatures", "signature_artifacts",
    "stage_artifact",
]

from typing import Any, Iterator, Mapping

from core.errors import BundleError
from bundler.format.manifest import Descriptor, go_json, parse_descriptor
from bundler.format.mediatypes import OCI_EMPTY, OCI_MANIFEST, RUN_RECORD, SIGSTORE_BUNDLE, SIMPLE_SIGNING
from bundler.store.layout import Staging, Store

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


def signature_artifacts(store: Store) -> Iterator[tuple[Descriptor, str, bytes]]:
    """Every readable signature artifact in the store: (its descriptor, its subject's digest, its Sigstore bundle bytes)."""
    for desc, data, manifest in _artifacts(store, SIGSTORE_BUNDLE):
        subject = _subject_of(manifest)
        if data is None or subject is None:
            continue  # a damaged signature artifact counts as no signature; verify then says so
        layers = manifest.get("layers")
        if not isinstance(layers, list) or len(layers) != 1:
            continue
        try:
            layer = parse_descriptor(layers[0], f"signature {desc.digest} layer")
            if layer.media_type != SIGSTORE_BUNDLE:
                continue
            bundle, _ = store.read_json_blob(layer)
            # Its config too (the empty JSON object): verify and push walk this artifact, so every blob of it is checked.
            store.read_json_blob(parse_descriptor(manifest.get("config"), f"signature {desc.digest} config"))
        except BundleError:
            continue
        yield desc, subject, bundle


def damaged_signatures(store: Store, subject_digest: str, found: list[tuple[Descriptor, bytes]] | None = None) -> list[str]:
    """Digests of signature artifacts whose manifest names `subject_digest` but which `find_signatures` leaves
    out: one of their blobs is missing or does not match its digest and size (or the artifact is malformed);
    and of those whose manifest itself cannot be read, whose subject cannot be told (it may be this one).
    found: what `find_signatures` already returned for this subject (not read again)."""
    usable = {desc.digest for desc, _ in (find_signatures(store, subject_digest) if found is None else found)}
    return [desc.digest for desc, data, manifest in _artifacts(store, SIGSTORE_BUNDLE)
            if data is None or (_subject_of(manifest) == subject_digest and desc.digest not in usable)]


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
