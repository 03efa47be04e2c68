"""`bundle pull`: a bundle from a registry into the store, verified before the store sees it.

Manifest -> signatures (referrers API, else the fallback tag) -> blobs, each checked against its digest
while it streams into `.specbundle/downloads` (a partial blob is resumed with Range on the next run). With
trusted keys a signature must hold for the manifest digest before any layer comes down. The bundle is
assembled in a temporary OCI layout and verified there; only a bundle that verifies is moved into the store
and tagged, under the store lock. Any failure leaves the store as it was. What the registry lists is read in
`remote.py`, the blobs come down in `download.py`; here they are assembled, verified, pruned and committed.
"""

from __future__ import annotations

__all__ = ["pull"]

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from bundler.format import boundedjson
from bundler.format.manifest import Descriptor, sha256_digest
from bundler.format import mediatypes
from bundler.registry.client import SIG_TYPE, Progress, client_for
from bundler.registry.download import Downloader, place
from bundler.registry.remote import Records, RemoteBundle, remote_bundle
from bundler.store.layout import MAX_JSON_BLOB, Store
from bundler.store.refs import Ref
from bundler.trust import attestation, recordlimits, releases
from bundler.trust.releases import ROLLBACK_STATE
from bundler.trust.signature_checks import signed_before_download
from bundler.trust.verify import verify_bundle
from core.errors import BundleError


@dataclass(frozen=True)
class PullResult:
    ref: str
    digest: str
    blobs_downloaded: int
    blobs_reused: int  # already in the store, or completed by an earlier interrupted pull
    bytes_downloaded: int
    signer: str | None
    signatures: list[str] = field(default_factory=list)
    records: list[str] = field(default_factory=list)  # run record manifest digests carried (verified by `bundle attestations`)
    signature_kinds: list[str] = field(default_factory=list)  # the kinds that verified: model-signing, cosign
    records_dropped: int = 0  # records the registry listed beyond what the store keeps (bundler.trust.recordlimits)
    attestations: list[str] = field(default_factory=list)  # standard attestations kept: those a trusted key signed


def pull(
    store: Store,
    ref: Ref,
    *,
    trusted: Mapping[str, Any],
    allow_unsigned: bool = False,
    plain_http: bool = False,
    progress: Progress | None = None,
    allow_rollback: bool = False,
    allow_ref_mismatch: bool = False,
    require_attestations: tuple[str, ...] = (),
) -> PullResult:
    """Download `ref` with its signatures and attestations, verify it apart from the store (with the
    `require_attestations` kinds attached and signed by a trusted key), then add it and tag it `ref`."""
    client = client_for(ref, plain_http)
    remote = remote_bundle(client, ref)
    downloader = Downloader(client, store, progress)
    # Config and signatures first: with trusted keys, a signature must hold for this manifest digest
    # before a single layer (gigabytes) comes down.
    downloader.fetch_all(remote.meta)
    if not allow_unsigned:
        payloads = [boundedjson.read_regular(downloader.files[remote.sig_layers[d.digest]], MAX_JSON_BLOB, "signature")
                    for d, _ in remote.signatures]
        try:
            signed_before_download(remote.digest, payloads, trusted)
        except BundleError:
            downloader.discard()  # refused: nothing of it is worth keeping for a retry
            raise
    downloader.fetch_all(remote.blobs)

    tmp = Store(Path(tempfile.mkdtemp(prefix="pull-", dir=store.private_dir("tmp"))))
    try:
        _assemble(tmp, store, ref, remote, downloader.files)
        report = verify_bundle(tmp, ref, trusted, allow_unsigned=allow_unsigned, record=True, allow_rollback=allow_rollback,
                               allow_ref_mismatch=allow_ref_mismatch, require_attestations=require_attestations)
        if report.error is not None:
            downloader.discard()  # bad content or a bad signature: nothing of it is worth keeping for a retry
            raise report.error
        records, dropped_records = _bounded_records(store, tmp, remote.digest, remote.records, trusted,
                                                    remote.bundle_blobs | {d.digest for d, _ in remote.signatures})
        signatures = _verified_signatures(tmp, remote, report.verified_signatures)
        attested = _verified_attestations(tmp, remote, trusted)
        _commit(store, tmp, ref, remote.manifest_desc, signatures, records, attested)
        for path in downloader.fetched:
            path.unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp.root, ignore_errors=True)
    return PullResult(str(ref), remote.digest, downloader.downloaded, downloader.reused, downloader.bytes, report.signed_by,
                      [d.digest for d, _ in signatures], [d.digest for d, _, _ in records],
                      sorted({s["kind"] for s in report.signatures if s["verified"]}), dropped_records, [d.digest for d, _ in attested])


def _assemble(tmp: Store, store: Store, ref: Ref, remote: RemoteBundle, files: Mapping[str, Path]) -> None:
    """The pulled bundle as an OCI layout in `tmp`, tagged `ref`, with `store`'s release memory (rollback is
    judged against it)."""
    tmp.ensure()
    for blob_digest, path in files.items():
        place(path, tmp.blob_path(blob_digest))
    for data in [remote.manifest] + [d for _, d in remote.signatures + remote.attestations] + [d for _, d, _ in remote.records]:
        tmp.blob_path(sha256_digest(data)).write_bytes(data)
    tmp.tag(ref, remote.manifest_desc)
    for sig_desc, _ in remote.signatures + remote.attestations:
        tmp.add_untagged(sig_desc, SIG_TYPE)
    tmp.write_state(ROLLBACK_STATE, store.state(ROLLBACK_STATE))


def _verified_signatures(tmp: Store, remote: RemoteBundle, verified: list[str]) -> list[tuple[Descriptor, bytes]]:
    """Only the signatures that verified are kept, of each kind (none with --allow-unsigned: not checked);
    the blobs of the others leave `tmp`."""
    dropped = {d.digest for d, _ in remote.signatures if d.digest not in verified}
    signatures = [(d, data) for d, data in remote.signatures if d.digest in verified]
    kept = {remote.sig_layers[d.digest] for d, _ in signatures} | {d.digest for d, _ in signatures}
    for blob in (dropped | {remote.sig_layers[d] for d in dropped}) - kept - {remote.digest}:
        tmp.blob_path(blob).unlink(missing_ok=True)
    return signatures


def _verified_attestations(tmp: Store, remote: RemoteBundle, trusted: Mapping[str, Any]) -> list[tuple[Descriptor, bytes]]:
    """Only the attestations a trusted key signed are kept; the blobs of the others leave `tmp`."""
    held = {c.digest for c in attestation.attestation_checks(tmp, remote.digest, trusted) if c.verified}
    kept = [(d, data) for d, data in remote.attestations if d.digest in held]
    needed = {d.digest for d, _ in remote.signatures + kept} | {remote.sig_layers[d.digest] for d, _ in remote.signatures + kept}
    for desc, _ in remote.attestations:
        for blob in {desc.digest, remote.sig_layers[desc.digest]} - needed - {remote.digest}:
            tmp.blob_path(blob).unlink(missing_ok=True)
    return kept


def _commit(store: Store, tmp: Store, ref: Ref, manifest_desc: Descriptor, signatures: list[tuple[Descriptor, bytes]],
            records: Records, attested: Sequence[tuple[Descriptor, bytes]] = ()) -> None:
    """Under the store lock: `tmp`'s blobs moved in (read-only), the signatures and records listed, `ref`
    tagged, and the release memory merged with what the verification recorded."""
    with store.lock():
        blob_dir = store.root / "blobs" / "sha256"
        for path in sorted((tmp.root / "blobs" / "sha256").iterdir()):
            if not (blob_dir / path.name).exists():
                os.chmod(path, 0o444)
                place(path, blob_dir / path.name)
        for sig_desc, _ in [*signatures, *attested]:
            store.add_untagged(sig_desc, SIG_TYPE)
        for record_desc, _, _ in records:
            store.add_untagged(record_desc, mediatypes.RUN_RECORD)
        store.tag(ref, manifest_desc)
        store.write_state(ROLLBACK_STATE, releases.merge(store.state(ROLLBACK_STATE), tmp.state(ROLLBACK_STATE)))


def _bounded_records(store: Store, tmp: Store, subject: str, records: Records, trusted: Mapping[str, Any],
                     needed: set[str]) -> tuple[Records, int]:
    """The pulled records (their blobs in `tmp`) that the store keeps beside those it holds (bundler.trust.recordlimits),
    and how many were dropped; a dropped record's blobs are removed from `tmp` unless `needed` or kept."""
    held = recordlimits.local(store, subject, trusted)
    held_digests = {c.desc.digest for c in held}
    new = [recordlimits.Candidate(desc, blobs) for desc, _, blobs in records if desc.digest not in held_digests]
    chosen = {c.desc.digest for c in recordlimits.choose(tmp, subject, new, trusted, len(held), sum(c.size for c in held))}
    kept = [r for r in records if r[0].digest in chosen or r[0].digest in held_digests]
    needed = needed | {d.digest for desc, _, blobs in kept for d in [desc, *blobs]}
    for desc, _, blobs in records:
        for blob in [desc, *blobs]:
            if blob.digest not in needed:
                tmp.blob_path(blob.digest).unlink(missing_ok=True)
    return kept, len(records) - len(kept)
