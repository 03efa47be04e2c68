"""Blobs downloaded for a pull, before the store sees them: each into `.specbundle/downloads/<hex>`, checked
against its digest while it streams, a few at a time, resumed with Range from `<hex>.part` on the next run, held
to the registry's minimum rate; bad bytes are never kept to resume from. `place` puts a finished blob where it
goes (a hard link, else a copy).
"""

from __future__ import annotations

__all__ = ["Downloader", "place"]

import fcntl
import hashlib
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import requests
import urllib3

from bundler.format.manifest import Descriptor
from bundler.registry.client import READ, Client, Progress, failure_reason, run_all
from bundler.store.layout import Store
from core.errors import BundleError


class Downloader:
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


def place(src: Path, dst: Path) -> None:
    """Put a blob at dst by hard link (same filesystem), else by copy."""
    if dst.exists():
        return
    try:
        os.link(src, dst)
    except OSError:
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)

