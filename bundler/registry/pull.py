"""`bundle pull`: a bundle from a registry into the store, verified before the store sees it.

Manifest -> signatures (referrers API, else the fallback tag) -> blobs, each checked against its digest
while it streams into `.specbundle/downloads` (a partial blob is resumed with Range on the next run). With
trusted keys a signature must hold for the manifest digest before any layer comes down. The bundle is
assembled in a temporary OCI layout and verified there; only a bundle that verifies is moved into the store
and tagged, under the store lock. Any failure leaves the store as it was.
"""

from __future__ import annotations

__all__ = ["pull"]

import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import requests
import urllib3

from bundler.format import boundedjson
from bundler.format.manifest import Descriptor, sha256_digest
from bundler.format import mediatypes
from bundler.format.mediatypes import OCI_INDEX, OCI_MANIFEST
from bundler.registry.client import (
    MANIFEST_ACCEPT, READ, SIG_TYPE, Client, Progress, client_for, failure_reason, fallback_tag, redact, run_all,
)
from bundler.store.layout import MAX_JSON_BLOB, Store
from bundler.store.refs import Ref
from bundler.store.referrers import is_attestation
from bundler.trust import attestation, recordlimits, releases
from bundler.trust.releases import ROLLBACK_STATE
from bundler.trust.verify import MAX_SIGNATURES, signed_before_download, verify_bundle
from core.errors import BundleError


Records = list[tuple[Descriptor, bytes, list[Descriptor]]]  # (manifest descriptor, manifest bytes, its blobs)


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


class _Downloader:
    """Blobs into `.specbundle/downloads/<hex>`: digest-checked while streaming, resumed with Range from `<hex>.part`."""

    def __init__(self, client: Client, store: Store, progress: Progress | None) -> None:
        self.client, self.store, self.progress = client, store, progress
        self.dir = store.private_dir("downloads")
        self.lock = threading.Lock()
        self.downloaded = self.reused = self.bytes = 0
        self.fetched: list[Path] = []  # cache entries this pull completed or reused: dropped once committed
        self.files: dict[str, Path] = {}  # digest -> a local file with the blob's bytes
        self.stop = threading.Event()  # set when one transfer failed: the others stop at their next read

    def path(self, digest: str) -> Path:
        return self.dir / digest.split(":", 1)[1]

    def discard(self) -> None:
        """Drop what this pull put in the cache, finished or partial (after bad bytes or a bad signature)."""
        for path in self.fetched:
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".part").unlink(missing_ok=True)

    def fetch_all(self, items: list[tuple[Descriptor, str]]) -> None:
        """Every blob of `items` not in `files` yet, a few at a time, largest first; after bad bytes nothing
        of this pull is kept, after a network failure the finished blobs are (for the rerun)."""
        unique = [x for x in {d.digest: (d, label) for d, label in items}.values() if x[0].digest not in self.files]

        def fetch(desc: Descriptor, label: str) -> None:
            self.files[desc.digest] = self.fetch(desc, label)

        try:
            run_all([lambda d=d, label=label: fetch(d, label) for d, label in sorted(unique, key=lambda x: -x[0].size)], self.stop)
        except BundleError as err:
            if err.exit_code == 3:  # bad bytes
                self.discard()
            raise

    def fetch(self, desc: Descriptor, label: str) -> Path:
        """A local file with the blob's bytes: the store's own copy, a finished download, or a new one."""
        if self.store.has_blob(desc.digest):
            with self.lock:
                self.reused += 1
            return self.store.blob_path(desc.digest)
        final = self.path(desc.digest)
        with self.lock:
            self.fetched.append(final)
        if final.exists():
            with self.lock:
                self.reused += 1
            return final
        part = final.with_name(final.name + ".part")
        with open(part, "ab+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # another pull of the same blob waits, then finds it done
            if final.exists():
                return final
            got = self._stream(desc, label, f)
            os.fsync(f.fileno())
            os.replace(part, final)
        with self.lock:
            self.downloaded += 1
            self.bytes += got
        return final

    def _stream(self, desc: Descriptor, label: str, f: Any) -> int:
        """Append the rest of the blob to `f`, hashing everything; raise digest-mismatch if it is not the blob."""
        what = f"download of {label}"
        f.seek(0)
        h = hashlib.sha256()
        have = 0
        while data := f.read(READ):
            h.update(data)
            have += len(data)
        if have > desc.size:
            f.truncate(0)
            h, have = hashlib.sha256(), 0
        got = 0
        if have < desc.size:
            # Streaming GET with Range and hashing on the fly: oras's download_blob neither resumes nor checks the digest.
            headers = {"Range": f"bytes={have}-"} if have else {}
            resp = self.client.request("GET", f"/blobs/{desc.digest}", what, ok=(200, 206), headers=headers, stream=True)
            with resp:
                if resp.status_code == 200 and have:  # the registry ignored Range: start over
                    f.truncate(0)
                    h, have = hashlib.sha256(), 0
                f.seek(have)
                try:
                    started = time.monotonic()
                    # read1: returns what one socket read brings, so a trickle cannot hold us inside one read.
                    while data := resp.raw.read1(READ):
                        bounds = self.client.bounds
                        if time.monotonic() - started > bounds.min_rate_grace and got / (time.monotonic() - started) < bounds.min_rate:
                            f.flush()
                            raise BundleError("registry-unreachable", f"{what} from {self.client.host}: {got} bytes in {time.monotonic() - started:.0f} s, under the minimum rate of {bounds.min_rate:.0f} bytes/s (BUNDLE_MIN_RATE, BUNDLE_MIN_RATE_GRACE); run the pull again to resume")
                        if self.stop.is_set():
                            raise BundleError("registry", f"{what}: stopped because another transfer failed")
                        if have + len(data) > desc.size:
                            raise self._mismatch(f, desc, what, "more bytes than its size")
                        f.write(data)
                        h.update(data)
                        have += len(data)
                        got += len(data)
                        if self.progress:
                            self.progress(label, len(data))
                except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError, urllib3.exceptions.HTTPError, OSError) as exc:
                    f.flush()
                    raise BundleError("registry-unreachable", f"connection to {self.client.host} broke during {what} ({failure_reason(exc)}); run the pull again to resume") from None
        f.flush()
        if have != desc.size or "sha256:" + h.hexdigest() != desc.digest:
            raise self._mismatch(f, desc, what, f"{have} bytes with digest sha256:{h.hexdigest()[:12]}…")
        return got

    def _mismatch(self, f: Any, desc: Descriptor, what: str, detail: str) -> BundleError:
        f.truncate(0)  # never resume from bytes that are known to be wrong
        return BundleError("digest-mismatch", f"{what} from {self.client.host}: expected {desc.digest[:19]}… ({desc.size} bytes), got {detail}")


def _place(src: Path, dst: Path) -> None:
    """Put a blob at dst by hard link (same filesystem), else by copy."""
    if dst.exists():
        return
    try:
        os.link(src, dst)
    except OSError:
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)


@dataclass
class _Remote:
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
    remote = _listing(client, ref)
    downloader = _Downloader(client, store, progress)
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
    return PullResult(str(ref), remote.digest, downloader.downloaded, downloader.reused, downloader.bytes, report.signer,
                      [d.digest for d, _ in signatures], [d.digest for d, _, _ in records],
                      sorted({s["kind"] for s in report.signatures if s["verified"]}), dropped_records, [d.digest for d, _ in attested])


def _listing(client: Client, ref: Ref) -> _Remote:
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
    return _Remote(digest, manifest_bytes, blobs, meta, signatures, sig_layers, records, bundle_blobs, attested)


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


def _assemble(tmp: Store, store: Store, ref: Ref, remote: _Remote, files: Mapping[str, Path]) -> None:
    """The pulled bundle as an OCI layout in `tmp`, tagged `ref`, with `store`'s release memory (rollback is
    judged against it)."""
    tmp.ensure()
    for blob_digest, path in files.items():
        _place(path, tmp.blob_path(blob_digest))
    for data in [remote.manifest] + [d for _, d in remote.signatures + remote.attestations] + [d for _, d, _ in remote.records]:
        tmp.blob_path(sha256_digest(data)).write_bytes(data)
    tmp.tag(ref, remote.manifest_desc)
    for sig_desc, _ in remote.signatures + remote.attestations:
        tmp.add_untagged(sig_desc, SIG_TYPE)
    tmp.write_state(ROLLBACK_STATE, store.state(ROLLBACK_STATE))


def _verified_signatures(tmp: Store, remote: _Remote, verified: list[str]) -> list[tuple[Descriptor, bytes]]:
    """Only the signatures that verified are kept, of each kind (none with --allow-unsigned: not checked);
    the blobs of the others leave `tmp`."""
    dropped = {d.digest for d, _ in remote.signatures if d.digest not in verified}
    signatures = [(d, data) for d, data in remote.signatures if d.digest in verified]
    kept = {remote.sig_layers[d.digest] for d, _ in signatures} | {d.digest for d, _ in signatures}
    for blob in (dropped | {remote.sig_layers[d] for d in dropped}) - kept - {remote.digest}:
        tmp.blob_path(blob).unlink(missing_ok=True)
    return signatures


def _verified_attestations(tmp: Store, remote: _Remote, trusted: Mapping[str, Any]) -> list[tuple[Descriptor, bytes]]:
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
                _place(path, blob_dir / path.name)
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
