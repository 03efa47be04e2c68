"""What a registry holds for one bundle, read before any layer comes down: the manifest a reference names (its
digest checked), the signatures and standard attestations whose subject it is (the OCI 1.1 referrers API, else
the `sha256-<hex>` fallback tag) and its run records, each descriptor checked. Anyone able to push a referrer can
list anything, so what is not shaped like ours is skipped, and the candidates are bounded in count and size.
"""

from __future__ import annotations

__all__ = ["Records", "RemoteBundle", "referrers", "remote_bundle", "remote_records"]

import re
from dataclasses import dataclass, field
from typing import Any

import requests

from bundler.format import boundedjson
from bundler.format.manifest import Descriptor, sha256_digest
from bundler.format import mediatypes
from bundler.format.mediatypes import OCI_INDEX, OCI_MANIFEST
from bundler.registry.client import MANIFEST_ACCEPT, SIG_TYPE, Client, fallback_tag, redact
from bundler.store.layout import MAX_JSON_BLOB
from bundler.store.refs import Ref
from bundler.store.referrers import is_attestation
from bundler.trust import recordlimits
from bundler.trust.signature_checks import MAX_SIGNATURES
from core.errors import BundleError

Records = list[tuple[Descriptor, bytes, list[Descriptor]]]  # (manifest descriptor, manifest bytes, its blobs)


def _get_manifest(client: Client, reference: str, what: str, expect: str | None = None) -> tuple[bytes, str, str]:
    """(bytes, digest, media type) of a manifest, its digest checked against `expect` (when pulling by digest)."""
    resp = client.request("GET", f"/manifests/{reference}", what, headers={"Accept": MANIFEST_ACCEPT}, stream=True)
    data = _read_body(resp, what)
    if len(data) > MAX_JSON_BLOB:
        raise BundleError("registry", f"{what}: the manifest is larger than {MAX_JSON_BLOB} bytes")
    digest = sha256_digest(data)
    claimed = resp.headers.get("Docker-Content-Digest")
    for name, value in (("asked for", expect), ("the registry said", claimed)):
        if value and value != digest:
            raise BundleError("digest-mismatch", f"{what}: {name} {redact(value[:80])}, the bytes served are {digest}")
    media_type = (resp.headers.get("Content-Type") or "").split(";")[0].strip()
    return data, digest, media_type


def _read_body(resp: requests.Response, what: str, limit: int = MAX_JSON_BLOB) -> bytes:
    """At most limit + 1 bytes of a response body (a JSON document); a connection cut short is exit 5."""
    with resp:
        try:
            return resp.raw.read(limit + 1, decode_content=True)
        except Exception as exc:  # urllib3 raises several kinds (IncompleteRead, ProtocolError, DecodeError)
            raise BundleError("registry-unreachable", f"{what}: the connection broke while reading ({type(exc).__name__})") from None


def _descriptor(item: Any, what: str, limit: int | None = None) -> Descriptor:
    size = item.get("size") if isinstance(item, dict) else None
    if not isinstance(item, dict) or not isinstance(item.get("digest"), str) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BundleError("invalid-bundle", f"{what}: a descriptor without digest or size")
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", item["digest"]):
        raise BundleError("invalid-bundle", f"{what}: unsupported digest {item['digest'][:80]!r}")
    if limit is not None and item["size"] > limit:
        raise BundleError("invalid-bundle", f"{what}: blob {item['digest'][:19]}… claims {item['size']} bytes, more than {limit}")
    media_type = item.get("mediaType", "")
    if not isinstance(media_type, str):
        raise BundleError("invalid-bundle", f"{what}: a descriptor whose mediaType is not a string")
    return Descriptor(media_type, item["digest"], item["size"])


def _listed(manifests: list[Any], what: str, artifact_type: str) -> list[Descriptor]:
    """The well-formed entries of a referrers index of `artifact_type`: anyone who can push a referrer can
    list anything, so a malformed entry is skipped, never the end of the pull."""
    out = []
    for item in manifests:
        if isinstance(item, dict) and item.get("artifactType") == artifact_type:
            try:
                out.append(_descriptor(item, what, MAX_JSON_BLOB))
            except BundleError:
                continue
    return out


def _referrer_manifest(client: Client, desc: Descriptor, what: str) -> tuple[bytes, str] | None:
    """(bytes, digest) of a manifest a referrers index lists, or None when the registry has no such manifest
    (an index entry anyone could write)."""
    try:
        data, digest, _ = _get_manifest(client, desc.digest, what, expect=desc.digest)
    except BundleError as err:
        if err.code == "registry-not-found":
            return None
        raise
    return data, digest


def referrers(client: Client, digest: str, artifact_type: str = SIG_TYPE) -> list[Descriptor]:
    """Manifests whose subject is `digest`: the OCI 1.1 referrers API, else the `sha256-<hex>` fallback tag."""
    what = f"referrers of {digest[:19]}…"
    resp = client.request("GET", f"/referrers/{digest}", what, headers={"Accept": OCI_INDEX}, params={"artifactType": artifact_type}, not_found_ok=True, stream=True)
    index: Any = None
    if resp.status_code == 200 and resp.headers.get("Content-Type", "").startswith(OCI_INDEX):
        index = boundedjson.loads(_read_body(resp, what), f"{what}: the referrers response", "registry")
    else:  # 404: no referrers API (docker-registry 2.8): the referrers tag schema
        resp.close()
        got = client.request("GET", f"/manifests/{fallback_tag(digest)}", what, headers={"Accept": OCI_INDEX}, not_found_ok=True, stream=True)
        if got.status_code == 404:
            got.close()
            return []
        index = boundedjson.loads(_read_body(got, what), f"{what}: the fallback tag {fallback_tag(digest)}", "registry")
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list):
        raise BundleError("registry", f"{what}: the referrers index lists no manifests")
    return _listed(manifests, what, artifact_type)


# run records (bundler.trust.runrecord): carried like signatures; pull only moves them (digests checked),
# `bundle attestations` verifies them.


def remote_records(client: Client, subject: str) -> Records:
    """(manifest descriptor, manifest bytes, its blobs) of each run record of `subject` the registry lists;
    a manifest that is not a record about `subject` is skipped."""
    out = []
    for ref_desc in referrers(client, subject, mediatypes.RUN_RECORD)[: recordlimits.MAX_CANDIDATES]:
        what = f"run record {ref_desc.digest[:19]}…"
        if ref_desc.size > recordlimits.MAX_RECORD_BYTES:
            continue  # larger than any record pull keeps: not even read
        found = _referrer_manifest(client, ref_desc, what)
        if found is None:
            continue
        data, digest = found
        try:
            body = boundedjson.loads(data, what)
        except BundleError:  # not JSON, or a nesting bomb: not a record
            continue
        if not isinstance(body, dict) or not isinstance(body.get("subject"), dict) or body["subject"].get("digest") != subject:
            continue
        if body.get("artifactType") != mediatypes.RUN_RECORD:
            continue
        layers = body.get("layers")
        if not isinstance(layers, list):
            continue
        try:
            record_blobs = [_descriptor(item, what, MAX_JSON_BLOB) for item in [body.get("config"), *layers]]
        except BundleError:
            continue  # not a well-formed record: not ours to carry
        if len(data) + sum(d.size for d in record_blobs) > recordlimits.MAX_RECORD_BYTES:
            continue
        out.append((Descriptor(OCI_MANIFEST, digest, len(data)), data, record_blobs))
    return out


@dataclass
class RemoteBundle:
    """What the registry lists for one bundle: its manifest, the candidate signatures, the run records, and
    the blobs of each (labelled for progress)."""

    digest: str
    manifest: bytes
    blobs: list[tuple[Descriptor, str]]  # config, layers, the records' blobs
    meta: list[tuple[Descriptor, str]]  # config and signature blobs: fetched first
    signatures: list[tuple[Descriptor, bytes]]  # signature manifests
    sig_layers: dict[str, str]  # signature manifest digest -> its Sigstore bundle blob digest
    records: Records
    bundle_blobs: set[str]  # the manifest, config, layers and signature blobs
    attestations: list[tuple[Descriptor, bytes]] = field(default_factory=list)  # SBOM, provenance manifests (bundler.trust.attestation)

    @property
    def manifest_desc(self) -> Descriptor:
        return Descriptor(OCI_MANIFEST, self.digest, len(self.manifest))


def remote_bundle(client: Client, ref: Ref) -> RemoteBundle:
    """The manifest `ref` names (an OCI image manifest, its digest checked), its signatures and run records."""
    manifest_bytes, digest, media_type = _get_manifest(client, ref.reference, f"manifest {ref}", expect=ref.digest)
    if media_type == OCI_INDEX:
        raise BundleError("invalid-bundle", f"{ref} is an image index, not a bundle manifest")
    manifest = boundedjson.loads(manifest_bytes, f"{ref}: the manifest")
    if not isinstance(manifest, dict) or manifest.get("mediaType", OCI_MANIFEST) != OCI_MANIFEST:
        raise BundleError("invalid-bundle", f"{ref}: not an OCI image manifest")
    what = f"manifest {ref}"
    blobs = [(_descriptor(manifest.get("config"), what, MAX_JSON_BLOB), "config")]
    blobs += [(d, f"layer {d.digest[7:19]}") for d in (_descriptor(x, what) for x in manifest.get("layers") or [])]
    signatures, sig_layers, sig_blobs = _signature_candidates(client, digest)
    meta = blobs[:1] + sig_blobs
    bundle_blobs = {digest} | {d.digest for d, _ in blobs + meta}
    records = remote_records(client, digest)
    blobs += [(d, f"run record {d.digest[7:19]}") for _, _, record_blobs in records for d in record_blobs]
    # Attestations share the signatures' artifactType (cosign 3): told apart by their predicate type annotation.
    attested = [(d, data) for d, data in signatures if is_attestation(boundedjson.loads(data, "signature"))]
    signatures = [s for s in signatures if s not in attested]
    return RemoteBundle(digest, manifest_bytes, blobs, meta, signatures, sig_layers, records, bundle_blobs, attested)


def _signature_candidates(
    client: Client, digest: str
) -> tuple[list[tuple[Descriptor, bytes]], dict[str, str], list[tuple[Descriptor, str]]]:
    """The signature manifests the registry lists for `digest` that are shaped like one (a subject of `digest`,
    one layer): their descriptors and bytes, their Sigstore bundle blob by manifest digest, and their blobs."""
    sig_manifests: list[tuple[Descriptor, bytes]] = []
    sig_layers: dict[str, str] = {}
    sig_blobs: list[tuple[Descriptor, str]] = []
    # At most MAX_SIGNATURES candidates of each kind (model-signing, cosign-style): anyone able to attach
    # referrers can attach thousands.
    for sig in referrers(client, digest)[:2 * MAX_SIGNATURES]:  # attestations (cosign 3: the same artifactType) included
        found = _referrer_manifest(client, sig, f"signature {sig.digest[:19]}…")
        if found is None:
            continue
        data, sig_digest = found
        try:
            body = boundedjson.loads(data, f"signature {sig_digest[:19]}…")
        except BundleError:
            continue  # not ours to judge: verify reports a missing signature if none is usable
        subject = body.get("subject") if isinstance(body, dict) else None
        layers = body.get("layers") if isinstance(body, dict) else None
        if not isinstance(subject, dict) or subject.get("digest") != digest or not isinstance(layers, list) or len(layers) != 1:
            continue
        swhat = f"signature {sig_digest[:19]}…"
        try:
            parts = [_descriptor(x, swhat, MAX_JSON_BLOB) for x in [body.get("config"), layers[0]]]
        except BundleError:
            continue
        sig_manifests.append((Descriptor(OCI_MANIFEST, sig_digest, len(data)), data))
        sig_layers[sig_digest] = parts[1].digest
        sig_blobs += [(d, f"signature {sig_digest[7:19]}") for d in parts]
    return sig_manifests, sig_layers, sig_blobs
