"""Push and pull bundles through OCI registries (distribution API v2), signatures included.

Push: HEAD each blob, upload only the missing ones (chunked, resumable), then the manifest bytes exactly
as the store holds them, then each signature artifact and, where the registry has no referrers API, the
referrers tag schema fallback (an image index tagged `sha256-<hex>`).

Pull: manifest -> signatures (referrers API, else the fallback tag) -> blobs, each checked against its
digest while it streams into `.specbundle/downloads` (a partial blob is resumed with Range on the next
run). The bundle is assembled in a temporary OCI layout and verified there; only a bundle that verifies
is moved into the store and tagged, under the store lock. Any failure leaves the store as it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import oras.auth
import oras.auth.utils
import requests
import urllib3

from bundler.format import boundedjson

from bundler.trust import cosign, recordlimits, releases, runrecord

from bundler.registry import credentials
from core.errors import BundleError
from bundler.format import mediatypes
from bundler.format.manifest import Descriptor, go_json, sha256_digest
from bundler.format.mediatypes import OCI_INDEX, OCI_MANIFEST
from bundler.store.modelkit import load_modelkit
from bundler.store.refs import Ref
from bundler.store.referrers import damaged_signatures, find_legacy_signatures, find_signatures
from bundler.store.layout import MAX_JSON_BLOB, Store
from bundler.trust.releases import ROLLBACK_STATE
from bundler.trust.verify import MAX_SIGNATURES, signed_before_download, verify_bundle

Progress = Callable[[str, int], None]

CHUNK = 64 << 20  # upload chunk (one PATCH): the unit an interrupted upload loses at most
READ = 1 << 20  # streaming read size
WORKERS = 4  # blobs in flight at once (hashlib and socket I/O release the GIL)
CONNECT_TIMEOUT = 10
SESSION_MAX_BYTES = 64 << 10  # an upload session file holds one URL; a larger one is ignored


def _env_number(name: str, default: float) -> float:
    """A positive number from the environment (a bad value is a usage error, not a silent default)."""
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise BundleError("usage", f"${name} must be a number >= 0, not {text!r}")
    return value


@dataclass(frozen=True)
class Bounds:
    """Bounds on a registry that stalls or trickles: a read waits at most `read_timeout` s; after the first
    `min_rate_grace` s a download must average at least `min_rate` bytes/s; GET and HEAD are retried
    `retries` times on a 5xx or a dropped connection, with exponential backoff, then exit 5."""

    read_timeout: float = 60
    min_rate: float = 10 << 10
    min_rate_grace: float = 30
    retries: int = 3

    @classmethod
    def from_env(cls) -> "Bounds":
        """The bounds as the environment sets them now (read when a client is made, not at import)."""
        return cls(_env_number("BUNDLE_READ_TIMEOUT", cls.read_timeout), _env_number("BUNDLE_MIN_RATE", cls.min_rate),
                   _env_number("BUNDLE_MIN_RATE_GRACE", cls.min_rate_grace), int(_env_number("BUNDLE_RETRIES", cls.retries)))
BACKOFF = 0.25
SIG_TYPE = mediatypes.SIGSTORE_BUNDLE
MANIFEST_ACCEPT = f"{OCI_MANIFEST}, {OCI_INDEX}"


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


# transport ---------------------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    """The useful end of a requests exception ("[Errno 111] Connection refused"), never a header."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    if found:
        return found.group(0).strip()
    return type(exc).__name__


def _registry_message(resp: requests.Response) -> str:
    """The first message of an OCI error body, if the registry sent one."""
    with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError, IndexError, RecursionError):
        err = resp.json()["errors"][0]
        return f": {err.get('code', '')} {err.get('message', '')}".rstrip()
    return ""


def _loopback(host: str) -> bool:
    """Whether HOST[:PORT] names this machine (localhost, 127.0.0.0/8, ::1)."""
    import ipaddress

    name = urllib.parse.urlsplit(f"//{host}").hostname or ""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Client:
    """One repository on one registry: requests with auth challenges answered (Basic or Bearer) and errors as codes.

    The plain HTTP API is spoken with requests: oras 0.2.43 re-serialises manifests (their digest changes),
    reads whole blobs into memory, retries for a minute on a refused connection, and cannot answer a Basic
    challenge with its token backend. From oras we take the bearer-token exchange.
    """

    def __init__(self, ref: Ref, plain_http: bool = False, creds: credentials.Credentials | None = None, bounds: Bounds | None = None) -> None:
        if not ref.registry:
            raise BundleError("usage", f"{ref} names no registry: use HOST[:PORT]/NAME:TAG (for example 127.0.0.1:5000/org/model:v1)")
        self.ref = ref
        self.host = ref.registry
        if plain_http and not _loopback(self.host):
            # Over plain HTTP anyone on the path reads the credentials and swaps the bytes: loopback only.
            raise BundleError("usage", f"--plain-http is only for a registry on loopback (localhost, 127.0.0.0/8, ::1), not {self.host}")
        self.plain_http = plain_http
        self.scheme = "http" if plain_http else "https"
        self.base = f"{self.scheme}://{self.host}/v2/{ref.repository}"
        self.creds = creds
        self.bounds = bounds or Bounds.from_env()
        self._auth: str | None = None  # the Authorization value that last worked
        self._lock = threading.Lock()
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.trust_env = False  # no proxies or .netrc: the registry named is the one we talk to
            self._local.session = session
        return session

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base + path

    def is_registry(self, url: str) -> bool:
        """Whether `url` is on the registry host the user named (same scheme, host and port).

        Credentials go only there: an upload Location or a redirect may name any host, and that host
        must never see them (nor choose a token service to send them to).
        """
        parts = urllib.parse.urlsplit(url)
        return parts.scheme == self.scheme and parts.netloc.lower() == self.host.lower()

    def request(
        self,
        method: str,
        path: str,
        what: str,
        ok: tuple[int, ...] = (200,),
        headers: Mapping[str, str] | None = None,
        body: Callable[[], Any] | None = None,
        params: Mapping[str, str] | None = None,
        stream: bool = False,
        not_found_ok: bool = False,
    ) -> requests.Response:
        """Send; answer up to two auth challenges; map failures to error codes. `body` makes the data anew per try."""
        url = self.url(path)
        for attempt in range(3):
            hdrs = dict(headers or {})
            if self._auth and self.is_registry(url):
                hdrs["Authorization"] = self._auth
            resp = self._send(method, url, hdrs, body, params, stream, what)
            # A challenge is answered only when the registry itself sent it, never a redirect target
            # (requests drops Authorization on a cross-host redirect; its 401 must not win it back).
            if resp.status_code == 401 and attempt < 2 and self.is_registry(resp.url) and self._answer(resp, hdrs.get("Authorization"), what):
                resp.close()
                continue
            break
        if resp.status_code in ok or (not_found_ok and resp.status_code == 404):
            return resp
        self._fail(resp, what)
        raise AssertionError("unreachable")

    def _send(self, method: str, url: str, hdrs: dict[str, str], body: Callable[[], Any] | None, params: Mapping[str, str] | None, stream: bool, what: str) -> requests.Response:
        """One request; GET and HEAD retried on a 5xx or a dropped connection (bounded, with backoff)."""
        retries = self.bounds.retries if method in ("GET", "HEAD") else 0
        for n in range(retries + 1):
            try:
                resp = self._session().request(
                    method, url, headers=hdrs, data=body() if body else None, params=params, stream=stream,
                    timeout=(CONNECT_TIMEOUT, self.bounds.read_timeout), allow_redirects=True,
                )
            except requests.exceptions.SSLError as exc:
                raise BundleError("registry-unreachable", f"TLS to {self.host} failed ({_reason(exc)}); for a plain-HTTP registry on loopback pass --plain-http") from None
            except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
                if n < retries:
                    time.sleep(BACKOFF * 2**n)
                    continue
                tries = f" after {retries + 1} tries" if retries else ""
                raise BundleError("registry-unreachable", f"cannot reach registry {self.host} ({_reason(exc)}) during {what}{tries}") from None
            except requests.exceptions.RequestException as exc:  # a redirect loop, a Location that is no URL
                raise BundleError("registry", f"{self.host}: {what} failed ({type(exc).__name__})") from None
            if resp.status_code >= 500 and n < retries:
                resp.close()
                time.sleep(BACKOFF * 2**n)
                continue
            return resp
        raise AssertionError("unreachable")

    def _fail(self, resp: requests.Response, what: str) -> None:
        status, detail = resp.status_code, _registry_message(resp)
        resp.close()
        if status in (401, 403):
            hint = (
                f"credentials from {self.creds.source} were refused"
                if self.creds
                else f"no credentials: run `docker login {self.host}` or set {credentials.USER_ENV} and {credentials.PASSWORD_ENV}"
            )
            raise BundleError("registry-auth", f"{self.host} denied {what} ({status}{detail}); {hint}")
        if status == 404:
            raise BundleError("registry-not-found", f"{what}: not found on {self.host} ({status}{detail})")
        raise BundleError("registry", f"{self.host} answered {status} to {what}{detail}")

    def _answer(self, resp: requests.Response, sent: str | None, what: str) -> bool:
        """Set the Authorization header a 401 challenge asks for; False when it is what `sent` already was."""
        challenge = resp.headers.get("WWW-Authenticate", "")
        scheme = challenge.split(" ", 1)[0].lower()
        with self._lock:
            if scheme == "basic":
                if self.creds is None or sent == self.creds.basic():
                    return False
                self._auth = self.creds.basic()
                return True
            if scheme == "bearer":
                token = self._token(oras.auth.utils.parse_auth_header(challenge), what)
                if token is None or sent == f"Bearer {token}":
                    return False
                self._auth = f"Bearer {token}"
                return True
        return False

    def _token(self, header: Any, what: str) -> str | None:
        """A bearer token for the challenge's scope, from its realm (with our credentials if we have any)."""
        backend = oras.auth.get_auth_backend("token", requests.Session(), insecure=self.plain_http)
        if self.creds is not None:
            backend.set_basic_auth(self.creds.username, self.creds.password)
        try:
            if self.creds is None:
                return backend.request_anonymous_token(header)
            return backend.request_token(header)
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            raise BundleError("registry-unreachable", f"cannot reach the token service of {self.host} ({_reason(exc)}) during {what}") from None


def _client(ref: Ref, plain_http: bool) -> Client:
    return Client(ref, plain_http, credentials.lookup(ref.registry))


# push ----------------------------------------------------------------------------------------------


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
        raise BundleError("registry", f"{client.host} stored {what} as {echoed}, not {sha256_digest(data)}: it rewrote the manifest")
    return resp


def fallback_tag(digest: str) -> str:
    """The referrers tag schema: `sha256-<hex>` for subject `sha256:<hex>`."""
    return digest.replace(":", "-", 1)


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
    client = _client(ref, plain_http)
    manifest_bytes, _ = store.read_json_blob(mk.manifest_desc)
    blobs: list[tuple[Descriptor, str]] = [(mk.config_desc, "config")]
    blobs += [(desc, f"{spec.path} {desc.digest[7:19]}") for spec, desc in mk.layers]
    sigs: list[tuple[Descriptor, bytes, dict[str, Any]]] = []
    found = find_signatures(store, mk.digest)
    for sig_desc, _ in found:
        data, sig_manifest = store.read_json_blob(sig_desc)
        sigs.append((sig_desc, data, sig_manifest))
        for item in [sig_manifest["config"], *sig_manifest["layers"]]:
            blobs.append((Descriptor(item["mediaType"], item["digest"], item["size"]), f"signature {item['digest'][7:19]}"))
    damaged = damaged_signatures(store, mk.digest, found)
    if damaged:  # pushing the bundle without it would publish it unsigned, or with a blob the registry refuses
        raise BundleError("digest-mismatch", f"{ref}: signature artifact {damaged[0][:19]}… is damaged (a blob is missing or does "
                          "not match its digest): nothing pushed; pull or sign the bundle again")
    legacy = find_legacy_signatures(store, mk.digest)  # cosign's older `sha256-<hex>.sig` tag form (bundler.trust.cosign)
    blobs += [(Descriptor(i["mediaType"], i["digest"], i["size"]), "cosign .sig") for _, _, m in legacy for i in [m["config"], *m["layers"]]]
    records = local_records(store, mk.digest, trusted or {})
    blobs += [(d, f"run record {d.digest[7:19]}") for _, _, record_blobs in records for d in record_blobs]
    unique = list({d.digest: (d, label) for d, label in blobs}.values())
    uploader = _Uploader(client, store, progress)
    _run_all([lambda d=d, label=label: uploader.upload(d, label) for d, label in sorted(unique, key=lambda x: -x[0].size)], uploader.stop)
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
    return PushResult(str(ref), mk.digest, uploader.uploaded, uploader.skipped, uploader.bytes, [s[0].digest for s in sigs], mode,
                      [desc.digest for desc, _, _ in records])


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


def remote_records(client: Client, subject: str) -> list[tuple[Descriptor, bytes, list[Descriptor]]]:
    """(manifest descriptor, manifest bytes, its blobs) of each run record of `subject` the registry lists;
    a manifest that is not a record about `subject` is skipped."""
    out = []
    for ref_desc in referrers(client, subject, mediatypes.RUN_RECORD)[: recordlimits.MAX_CANDIDATES]:
        what = f"run record {ref_desc.digest[:19]}…"
        if ref_desc.size > recordlimits.MAX_RECORD_BYTES:
            continue  # larger than any record pull keeps: not even read
        data, digest, _ = _get_manifest(client, ref_desc.digest, what, expect=ref_desc.digest)
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


def _run_all(jobs: list[Callable[[], None]], stop: threading.Event) -> None:
    """Run jobs on a few threads; the first failure sets `stop` and is raised once the others have stopped."""
    if not jobs:
        return
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(jobs))) as pool:
        futures = [pool.submit(job) for job in jobs]
        try:
            for fut in futures:
                fut.result()
        except BaseException:
            stop.set()
            for fut in futures:
                fut.cancel()
            raise


# pull ----------------------------------------------------------------------------------------------


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
            raise BundleError("digest-mismatch", f"{what}: {name} {value}, the bytes served are {digest}")
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
    if not isinstance(item, dict) or not isinstance(item.get("digest"), str) or not isinstance(item.get("size"), int) or item["size"] < 0:
        raise BundleError("invalid-bundle", f"{what}: a descriptor without digest or size")
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", item["digest"]):
        raise BundleError("invalid-bundle", f"{what}: unsupported digest {item['digest']!r}")
    if limit is not None and item["size"] > limit:
        raise BundleError("invalid-bundle", f"{what}: blob {item['digest'][:19]}… claims {item['size']} bytes, more than {limit}")
    return Descriptor(str(item.get("mediaType", "")), item["digest"], item["size"])


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
    return [_descriptor(m, what, MAX_JSON_BLOB) for m in manifests if isinstance(m, dict) and m.get("artifactType") == artifact_type]


class _Downloader:
    """Blobs into `.specbundle/downloads/<hex>`: digest-checked while streaming, resumed with Range from `<hex>.part`."""

    def __init__(self, client: Client, store: Store, progress: Progress | None) -> None:
        self.client, self.store, self.progress = client, store, progress
        self.dir = store.private_dir("downloads")
        self.lock = threading.Lock()
        self.downloaded = self.reused = self.bytes = 0
        self.fetched: list[Path] = []  # cache entries this pull completed or reused: dropped once committed
        self.stop = threading.Event()  # set when one transfer failed: the others stop at their next read

    def path(self, digest: str) -> Path:
        return self.dir / digest.split(":", 1)[1]

    def discard(self) -> None:
        """Drop what this pull put in the cache, finished or partial (after bad bytes or a bad signature)."""
        for path in self.fetched:
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".part").unlink(missing_ok=True)

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
                    raise BundleError("registry-unreachable", f"connection to {self.client.host} broke during {what} ({_reason(exc)}); run the pull again to resume") from None
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
) -> PullResult:
    """Download `ref` with its signatures, verify it apart from the store, then add it and tag it `ref`."""
    client = _client(ref, plain_http)
    manifest_bytes, digest, media_type = _get_manifest(client, ref.reference, f"manifest {ref}", expect=ref.digest)
    if media_type == OCI_INDEX:
        raise BundleError("invalid-bundle", f"{ref} is an image index, not a bundle manifest")
    manifest = boundedjson.loads(manifest_bytes, f"{ref}: the manifest")
    if not isinstance(manifest, dict) or manifest.get("mediaType", OCI_MANIFEST) != OCI_MANIFEST:
        raise BundleError("invalid-bundle", f"{ref}: not an OCI image manifest")
    what = f"manifest {ref}"
    blobs = [(_descriptor(manifest.get("config"), what, MAX_JSON_BLOB), "config")]
    blobs += [(d, f"layer {d.digest[7:19]}") for d in (_descriptor(x, what) for x in manifest.get("layers") or [])]

    sig_manifests: list[tuple[Descriptor, bytes]] = []
    sig_layers: dict[str, str] = {}  # signature manifest digest -> its Sigstore bundle blob digest
    meta = blobs[:1]
    # At most MAX_SIGNATURES candidates of each kind (model-signing, cosign-style): anyone able to attach
    # referrers can attach thousands.
    for sig in referrers(client, digest)[:2 * MAX_SIGNATURES]:
        data, sig_digest, _ = _get_manifest(client, sig.digest, f"signature {sig.digest[:19]}…", expect=sig.digest)
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
        meta += [(d, f"signature {sig_digest[7:19]}") for d in parts]
    bundle_blobs = {digest} | {d.digest for d, _ in blobs + meta}
    records = remote_records(client, digest)
    blobs += [(d, f"run record {d.digest[7:19]}") for _, _, record_blobs in records for d in record_blobs]

    downloader = _Downloader(client, store, progress)
    files: dict[str, Path] = {}

    def fetch_all(items: list[tuple[Descriptor, str]]) -> None:
        unique = [x for x in {d.digest: (d, label) for d, label in items}.values() if x[0].digest not in files]

        def fetch(desc: Descriptor, label: str) -> None:
            files[desc.digest] = downloader.fetch(desc, label)

        try:
            _run_all([lambda d=d, label=label: fetch(d, label) for d, label in sorted(unique, key=lambda x: -x[0].size)], downloader.stop)
        except BundleError as err:
            if err.exit_code == 3:  # bad bytes: keep nothing; a network failure keeps finished blobs for the rerun
                downloader.discard()
            raise

    # Config and signatures first: with trusted keys, a signature must hold for this manifest digest
    # before a single layer (gigabytes) comes down.
    fetch_all(meta)
    if not allow_unsigned:
        payloads = [boundedjson.read_regular(files[sig_layers[d.digest]], MAX_JSON_BLOB, "signature") for d, _ in sig_manifests]
        try:
            signed_before_download(digest, payloads, trusted)
        except BundleError:
            downloader.discard()  # refused: nothing of it is worth keeping for a retry
            raise
    fetch_all(blobs)

    tmp = Store(Path(tempfile.mkdtemp(prefix="pull-", dir=store.private_dir("tmp"))))
    try:
        tmp.ensure()
        for blob_digest, path in files.items():
            _place(path, tmp.blob_path(blob_digest))
        for data in [manifest_bytes] + [d for _, d in sig_manifests] + [d for _, d, _ in records]:
            tmp.blob_path(sha256_digest(data)).write_bytes(data)
        manifest_desc = Descriptor(OCI_MANIFEST, digest, len(manifest_bytes))
        tmp.tag(ref, manifest_desc)
        for sig_desc, _ in sig_manifests:
            tmp.add_untagged(sig_desc, SIG_TYPE)
        tmp.write_state(ROLLBACK_STATE, store.state(ROLLBACK_STATE))  # rollback is judged against this store's memory
        report = verify_bundle(tmp, ref, trusted, allow_unsigned=allow_unsigned, record=True, allow_rollback=allow_rollback, allow_ref_mismatch=allow_ref_mismatch)
        if report.error is not None:
            downloader.discard()  # bad content or a bad signature: nothing of it is worth keeping for a retry
            raise report.error
        records, dropped_records = _bounded_records(store, tmp, digest, records, trusted, bundle_blobs | {d.digest for d, _ in sig_manifests})
        # Only the signatures that verified are kept, of each kind (none with --allow-unsigned: not checked).
        dropped = {d.digest for d, _ in sig_manifests if d.digest not in report.verified_signatures}
        sig_manifests = [(d, data) for d, data in sig_manifests if d.digest in report.verified_signatures]
        kept = {sig_layers[d.digest] for d, _ in sig_manifests} | {d.digest for d, _ in sig_manifests}
        for blob in (dropped | {sig_layers[d] for d in dropped}) - kept - {digest}:
            tmp.blob_path(blob).unlink(missing_ok=True)
        with store.lock():
            blob_dir = store.root / "blobs" / "sha256"
            for path in sorted((tmp.root / "blobs" / "sha256").iterdir()):
                if not (blob_dir / path.name).exists():
                    os.chmod(path, 0o444)
                    _place(path, blob_dir / path.name)
            for sig_desc, _ in sig_manifests:
                store.add_untagged(sig_desc, SIG_TYPE)
            for record_desc, _, _ in records:
                store.add_untagged(record_desc, mediatypes.RUN_RECORD)
            store.tag(ref, manifest_desc)
            store.write_state(ROLLBACK_STATE, releases.merge(store.state(ROLLBACK_STATE), tmp.state(ROLLBACK_STATE)))
        for path in downloader.fetched:
            path.unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp.root, ignore_errors=True)
    return PullResult(str(ref), digest, downloader.downloaded, downloader.reused, downloader.bytes, report.signer, [d.digest for d, _ in sig_manifests],
                      [d.digest for d, _, _ in records], sorted({s["kind"] for s in report.signatures if s["verified"]}),
                      dropped_records)



def _bounded_records(store: Store, tmp: Store, subject: str, records: list[tuple[Descriptor, bytes, list[Descriptor]]],
                     trusted: Mapping[str, Any], needed: set[str]) -> tuple[list[tuple[Descriptor, bytes, list[Descriptor]]], int]:
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
