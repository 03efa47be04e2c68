"""Signature artifacts in the store whose subject is a bundle: one reader for verify, sign, push, list and
inspect (a damaged artifact counts as none; `damaged_signatures` names it)."""

from __future__ import annotations

from typing import Any, Iterator

from bundler.trust import cosign, signature
from core.errors import BundleError
from bundler.format.manifest import Descriptor, parse_descriptor
from bundler.store.layout import Store


def signature_artifacts(store: Store) -> Iterator[tuple[Descriptor, str, bytes]]:
    """Every readable signature artifact in the store: (its descriptor, its subject's digest, its Sigstore bundle bytes)."""
    for desc in store.untagged(signature.SIGSTORE_BUNDLE_MEDIA_TYPE):
        try:
            _, manifest = store.read_json_blob(desc)
        except BundleError:
            continue  # a damaged signature artifact counts as no signature; verify then says so
        subject = manifest.get("subject") if isinstance(manifest, dict) else None
        if not isinstance(subject, dict) or not isinstance(subject.get("digest"), str):
            continue
        layers = manifest.get("layers")
        if not isinstance(layers, list) or len(layers) != 1:
            continue
        try:
            layer = parse_descriptor(layers[0], f"signature {desc.digest} layer")
            if layer.media_type != signature.SIGSTORE_BUNDLE_MEDIA_TYPE:
                continue
            data, _ = store.read_json_blob(layer)
            # Its config too (the empty JSON object): verify and push walk this artifact, so every blob of it is checked.
            store.read_json_blob(parse_descriptor(manifest.get("config"), f"signature {desc.digest} config"))
        except BundleError:
            continue
        yield desc, subject["digest"], data


def damaged_signatures(store: Store, subject_digest: str, found: list[tuple[Descriptor, bytes]] | None = None) -> list[str]:
    """Digests of signature artifacts whose manifest names `subject_digest` but which `find_signatures` leaves
    out: one of their blobs is missing or does not match its digest and size (or the artifact is malformed);
    and of those whose manifest itself cannot be read, whose subject cannot be told (it may be this one).
    found: what `find_signatures` already returned for this subject (not read again)."""
    usable = {desc.digest for desc, _ in (find_signatures(store, subject_digest) if found is None else found)}
    out = []
    for desc in store.untagged(signature.SIGSTORE_BUNDLE_MEDIA_TYPE):
        try:
            _, manifest = store.read_json_blob(desc)
        except BundleError:
            out.append(desc.digest)
            continue
        subject = manifest.get("subject") if isinstance(manifest, dict) else None
        if isinstance(subject, dict) and subject.get("digest") == subject_digest and desc.digest not in usable:
            out.append(desc.digest)
    return out


def find_signatures(store: Store, subject_digest: str) -> list[tuple[Descriptor, bytes]]:
    """Signature artifacts in the store whose subject is `subject_digest`, with their Sigstore bundle bytes."""
    return [(desc, data) for desc, subject, data in signature_artifacts(store) if subject == subject_digest]


def find_legacy_signatures(store: Store, subject_digest: str) -> list[tuple[Descriptor, bytes, dict[str, Any]]]:
    """The bundle's cosign legacy signature images in the store: (descriptor, manifest bytes, manifest)."""
    out = []
    for desc in store.untagged(cosign.SIMPLE_SIGNING_MEDIA_TYPE):
        try:
            data, manifest = store.read_json_blob(desc)
        except BundleError:
            continue
        subject = manifest.get("subject") if isinstance(manifest, dict) else None
        if isinstance(subject, dict) and subject.get("digest") == subject_digest:
            out.append((desc, data, manifest))
    return out
