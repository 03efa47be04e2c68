"""`bundle push`: a bundle from the store to a registry, its signatures and run records with it.

HEAD each blob, upload only the missing ones (chunked, resumable), then the manifest bytes exactly as the
store holds them, then each signature artifact and, where the registry has no referrers API, the referrers
tag schema fallback (an image index tagged `sha256-<hex>`).
"""

from __future__ import annotations

__all__ = ["push", "push_records"]

import contextlib
import hashlib
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import requests

from bundler.format import boundedjson
from bundler.format.manifest import Descriptor, go_json, parse_descriptor, sha256_digest
from bundler.format import mediatypes
from bundler.format.mediatypes import OCI_INDEX, OCI_MANIFEST
from bundler.registry.client import READ, SIG_TYPE, Client, Progress, client_for, fallback_tag, redact, run_all
from bundler.store.layout import Store
from bundler.store.modelkit import load_modelkit
from bundler.store.referrers import damaged_signatures, find_attestations, find_legacy_signatures, find_signatures
from bundler.store.refs import Ref
from bundler.trust import cosign, recordlimits, runrecord
from core.errors import BundleError

CHUNK = 64 << 20  # upload chunk (one PATCH): the unit an interrupted upload loses at most
SESSION_MAX_BYTES = 64 << 10  # an upload session file holds one URL; a larger one is ignored


@dataclass(frozen=True)
class PushResult:
    ref: str
    digest: str
    blobs_uploaded: int
    blobs_skipped: int
    bytes_uploaded: int
    signatures: list[str]  # signature manifest digests pushed
    referrers: str  # "api" when the registry indexes subjects itself, "tag" when we wrote the fallback index, "" if unsigned
    records: list[str] = field(default_factory=list)  # run record manifest digests pushed (bundler.trust.runrecord)
    attestations: list[str] = field(default_factory=list)  # SBOM and provenance manifest digests pushed (bundler.trust.attestation)


class _Chunk:
    """A byte range of a file as a request body: a length (so requests sends Content-Length) and big reads."""

    def __init__(self, path: Path, start: int, length: int, tick: Callable[[int], None]) -> None:
        self.path, self.start, self.length, self.tick = path, start, length, tick

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            f.seek(self.start)
            left = self.length
            while left > 0:
                data = f.read(min(READ, left))
                if not data:
                    raise BundleError("missing-file", f"{self.path} is shorter than its descriptor")
                left -= len(data)
                self.tick(len(data))
                yield data


class _Uploader:
    """Blob uploads for one push: HEAD first, then POST a session and PATCH in chunks, resumable across runs."""

    def __init__(self, client: Client, store: Store, progress: Progress | None) -> None:
        self.client, self.store, self.progress = client, store, progress
        self.sessions = store.private_dir("uploads")
        self.lock = threading.Lock()
        self.uploaded = self.skipped = self.bytes = 0
        self.stop = threading.Event()  # set when one transfer failed: the others stop before their next chunk

    def _session_file(self, digest: str) -> Path:
        where = hashlib.sha256(f"{self.client.host}/{self.client.ref.repository}".encode()).hexdigest()[:16]
        return self.sessions / f"{where}-{digest.split(':', 1)[1]}.json"

    def _offset(self, location: str, what: str) -> tuple[int, str] | None:
        """(bytes the registry holds, the session URL to go on with), or None if the session is gone."""
        resp = self.client.request("GET", location, what, ok=(204,), not_found_ok=True)
        if resp.status_code == 404:
            return None
        found = re.match(r"^(?:bytes=)?0-(\d+)$", resp.headers.get("Range", ""))
        # distribution says "0-0" for an empty session too: read it as 0 (a refused PATCH then starts afresh).
        held = int(found.group(1)) + 1 if found and found.group(1) != "0" else 0
        # The Location it answers carries the session state for that offset (distribution signs it).
        return held, urllib.parse.urljoin(resp.url, resp.headers.get("Location", location))

    def upload(self, desc: Descriptor, label: str) -> None:
        what = f"upload of {label}"
        head = self.client.request("HEAD", f"/blobs/{desc.digest}", what, not_found_ok=True)
        if head.status_code == 200:
            with self.lock:
                self.skipped += 1
            return
        state = self._session_file(desc.digest)
        resumed = None
        if state.exists():
            with contextlib.suppress(BundleError):  # a damaged, oversized or foreign session file: start afresh
                session = boundedjson.read_json(state, "upload session", max_bytes=SESSION_MAX_BYTES)
                location = session.get("location") if isinstance(session, dict) else None
                if isinstance(location, str):
                    resumed = self._offset(location, what)
        if resumed is not None and resumed[0] <= desc.size:
            try:
                self._send(desc, label, resumed[1], resumed[0], state)
                return
            except BundleError as err:
                if err.code != "registry" or self.stop.is_set():  # else the old session was refused: start afresh
                    raise
        resp = self.client.request("POST", "/blobs/uploads/", what, ok=(202,), headers={"Content-Length": "0"})
        if not resp.headers.get("Location"):
            raise BundleError("registry", f"{self.client.host} answered 202 to {what} without a Location to upload to")
        self._send(desc, label, urllib.parse.urljoin(resp.url, resp.headers["Location"]), 0, state)

    def _send(self, desc: Descriptor, label: str, location: str, offset: int, state: Path) -> None:
        """PATCH the blob from `offset` in chunks, then PUT ?digest= to close the session."""
        what = f"upload of {label}"
        path = self.store.blob_path(desc.digest)
        state.write_text(json.dumps({"location": location, "digest": desc.digest}))
        sent = 0

        def tick(n: int) -> None:
            nonlocal sent
            sent += n
            if self.progress:
                self.progress(label, n)

        # Chunked PATCHes with Content-Range: oras's chunked_upload cannot resume and its put_upload reads the whole blob.
        while offset < desc.size:
            if self.stop.is_set():
                raise BundleError("registry", f"{what}: stopped because another transfer failed")
            length = min(CHUNK, desc.size - offset)
            start = offset
            try:
                resp = self.client.request(
                    "PATCH", location, what, ok=(202,),
                    headers={"Content-Type": "application/octet-stream", "Content-Range": f"{start}-{start + length - 1}"},
                    body=lambda: _Chunk(path, start, length, tick),
                )
            except BundleError as err:
                if err.code != "registry-unreachable":
                    raise
                # A broken chunk: ask the registry how far it got and go on from there, if it got further.
                got = self._offset(location, what)
                if got is None or got[0] <= start:
                    raise
                offset, location = got
                continue
            location = urllib.parse.urljoin(resp.url, resp.headers.get("Location", location))
            state.write_text(json.dumps({"location": location, "digest": desc.digest}))
            offset = start + length
        try:
            self.client.request("PUT", location, what, ok=(201,), params={"digest": desc.digest}, headers={"Content-Length": "0"})
        finally:
            state.unlink(missing_ok=True)  # closed or refused: this session is done either way
        with self.lock:
            self.uploaded += 1
            self.bytes += sent


def _put_manifest(client: Client, reference: str, data: bytes, media_type: str, what: str) -> requests.Response:
    """PUT manifest bytes as they are (same digest in the registry as in the store)."""
    resp = client.request("PUT", f"/manifests/{reference}", what, ok=(201,), headers={"Content-Type": media_type}, body=lambda: data)
    echoed = resp.headers.get("Docker-Content-Digest")
    if echoed and echoed != sha256_digest(data):
        raise BundleError("registry", f"{client.host} stored {what} as {redact(echoed[:80])}, not {sha256_digest(data)}: it rewrote the manifest")
    return resp


def _update_fallback_index(client: Client, subject: str, entries: list[dict[str, Any]]) -> None:
    """Merge our signature descriptors into the `sha256-<hex>` image index (others' entries kept)."""
    tag = fallback_tag(subject)
    resp = client.request("GET", f"/manifests/{tag}", "read of the referrers index", headers={"Accept": OCI_INDEX}, not_found_ok=True)
    index: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    if resp.status_code == 200:
        with contextlib.suppress(ValueError, RecursionError):  # a nesting bomb is no index: start a new one
            found = resp.json()
            if isinstance(found, dict) and isinstance(found.get("manifests"), list):
                index = found
    known = {m.get("digest") for m in index["manifests"] if isinstance(m, dict)}
    added = [e for e in entries if e["digest"] not in known]
    if not added:
        return
    index["manifests"] = index["manifests"] + added
    _put_manifest(client, tag, go_json(index), OCI_INDEX, "write of the referrers index")


def push(store: Store, ref: Ref, *, plain_http: bool = False, progress: Progress | None = None, dest: Ref | None = None,
         trusted: Mapping[str, Any] | None = None) -> PushResult:
    """Push the bundle the store tags `ref` with its blobs and signature artifacts, to `dest` (HOST/NAME:TAG) or `ref`;
    its run records only as far as a pull would keep them (bundler.trust.recordlimits, `trusted` verifying them)."""
    mk = load_modelkit(store, ref)
    ref = dest or ref
    if not ref.registry:
        raise BundleError("usage", f"{ref} names no registry: give the destination as HOST[:PORT]/NAME:TAG (`bundle push SRC DST`)")
    client = client_for(ref, plain_http)
    manifest_bytes, _ = store.read_json_blob(mk.manifest_desc)
    blobs: list[tuple[Descriptor, str]] = [(mk.config_desc, "config")]
    blobs += [(desc, f"{spec.path} {desc.digest[7:19]}") for spec, desc in mk.layers]
    sigs: list[tuple[Descriptor, bytes, dict[str, Any]]] = []
    found = find_signatures(store, mk.digest)
    # Attestations travel as cosign 3 pushes them, beside the signatures; a damaged one stays behind.
    attested = [(desc, data) for desc, _, data in find_attestations(store, mk.digest) if data is not None]
    for sig_desc, _ in found + attested:
        data, sig_manifest = store.read_json_blob(sig_desc)
        sigs.append((sig_desc, data, sig_manifest))
        for item in [sig_manifest["config"], *sig_manifest["layers"]]:  # both read intact by find_signatures
            blob = parse_descriptor(item, f"signature {sig_desc.digest[:19]}…")
            blobs.append((blob, f"signature {blob.digest[7:19]}"))
    damaged = damaged_signatures(store, mk.digest)
    if damaged:  # pushing the bundle without it would publish it unsigned, or with a blob the registry refuses
        raise BundleError("digest-mismatch", f"{ref}: signature artifact {damaged[0][:19]}… is damaged (a blob is missing or does "
                          "not match its digest): nothing pushed; pull or sign the bundle again")
    legacy = find_legacy_signatures(store, mk.digest)  # cosign's older `sha256-<hex>.sig` tag form (bundler.trust.cosign)
    blobs += [(Descriptor(i["mediaType"], i["digest"], i["size"]), "cosign .sig") for _, _, m in legacy for i in [m["config"], *m["layers"]]]
    records = local_records(store, mk.digest, trusted or {})
    blobs += [(d, f"run record {d.digest[7:19]}") for _, _, record_blobs in records for d in record_blobs]
    unique = list({d.digest: (d, label) for d, label in blobs}.values())
    uploader = _Uploader(client, store, progress)
    run_all([lambda d=d, label=label: uploader.upload(d, label) for d, label in sorted(unique, key=lambda x: -x[0].size)], uploader.stop)
    reference = ref.digest or ref.tag or "latest"
    _put_manifest(client, reference, manifest_bytes, OCI_MANIFEST, f"push of manifest {ref}")
    mode = ""
    if sigs:
        fallback = []
        for sig_desc, data, sig_manifest in sigs:
            resp = _put_manifest(client, sig_desc.digest, data, OCI_MANIFEST, f"push of signature {sig_desc.digest[:19]}…")
            if resp.headers.get("OCI-Subject") != mk.digest:  # the registry does not index subjects: write the fallback
                fallback.append({**sig_desc.as_dict(), "artifactType": SIG_TYPE, **({"annotations": sig_manifest["annotations"]} if sig_manifest.get("annotations") else {})})
        if fallback:
            _update_fallback_index(client, mk.digest, fallback)
        mode = "tag" if fallback else "api"
    for _, data, _ in legacy[-1:]:  # the tag holds one image
        _put_manifest(client, cosign.legacy_tag(mk.digest), data, OCI_MANIFEST, "push of the cosign .sig tag")
    push_records(client, mk.digest, records)
    attested_digests = {desc.digest for desc, _ in attested}
    return PushResult(str(ref), mk.digest, uploader.uploaded, uploader.skipped, uploader.bytes,
                      [s[0].digest for s in sigs if s[0].digest not in attested_digests], mode,
                      [desc.digest for desc, _, _ in records], sorted(attested_digests))


# run records (bundler.trust.runrecord): carried like signatures, by the referrers API or the fallback tag.
# Push and pull only move them (digests checked); `bundle attestations` verifies them.


def local_records(store: Store, subject: str, trusted: Mapping[str, Any]) -> list[tuple[Descriptor, bytes, list[Descriptor]]]:
    """(manifest descriptor, manifest bytes, its blobs) of each run record of `subject` in the store that a pull
    would keep (bundler.trust.recordlimits): a record whose blobs are damaged or missing stays behind."""
    return [(c.desc, store.read_json_blob(c.desc)[0], c.blobs) for c in recordlimits.local(store, subject, trusted)]


def push_records(client: Client, subject: str, records: list[tuple[Descriptor, bytes, list[Descriptor]]]) -> None:
    """PUT each record manifest (its blobs already uploaded); list them in the fallback index where the
    registry does not index subjects itself."""
    fallback = []
    for desc, data, _ in records:
        resp = _put_manifest(client, desc.digest, data, OCI_MANIFEST, f"push of run record {desc.digest[:19]}…")
        if resp.headers.get("OCI-Subject") != subject:
            fallback.append({**desc.as_dict(), "artifactType": mediatypes.RUN_RECORD,
                             "annotations": {runrecord.PREDICATE_ANNOTATION: runrecord.PREDICATE_TYPE}})
    if fallback:
        _update_fallback_index(client, subject, fallback)
