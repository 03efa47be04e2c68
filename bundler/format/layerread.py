"""Stream a layer blob once: its digest and size, its members (checked for safety), small files' hashes."""

from __future__ import annotations

__all__ = ["BlobSource", "HashingReader", "LayerScan", "TOKENIZER_FILES", "merge_scans", "scan_layer"]

import hashlib
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from core.errors import BundleError
from bundler.format.manifest import Descriptor
from bundler.format.modelpack import layer_members

CHUNK = 1 << 20
# Files whose content decides token ids; hashed even when no signature lists them.
TOKENIZER_FILES = frozenset(
    {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json"}
)


class HashingReader:
    """A read-only stream that hashes and counts every byte read through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.hash = hashlib.sha256()
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.hash.update(data)
        self.count += len(data)
        return data

    def readinto(self, buf: bytearray | memoryview) -> int:
        n = self.raw.readinto(buf)
        self.hash.update(memoryview(buf)[:n])
        self.count += n
        return n

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


@dataclass
class LayerScan:
    """What one pass over a layer blob found."""

    files: dict[str, int] = field(default_factory=dict)  # path -> size
    dirs: list[str] = field(default_factory=list)
    small_hashes: dict[str, str] = field(default_factory=dict)  # tokenizer files: path -> sha256 hex


class BlobSource(Protocol):
    """Where a layer's blob lies (bundler.store.layout.Store is one): the format reads blobs, the store keeps them."""

    def blob_path(self, digest: str) -> Path: ...


def scan_layer(store: BlobSource, desc: Descriptor, layer_path: str) -> LayerScan:
    """Read a layer blob once, checking its digest and size against `desc` and every entry for safety."""
    path = store.blob_path(desc.digest)
    if not path.is_file():
        raise BundleError("missing-file", f"layer {desc.digest} ({layer_path}) is missing from the store")
    scan = LayerScan()
    with open(path, "rb") as raw:
        reader = HashingReader(raw)
        try:
            for member, content in layer_members(reader, desc, layer_path):
                if member.kind == "dir":
                    scan.dirs.append(member.name)
                    continue
                scan.files[member.name] = member.size
                hasher = hashlib.sha256() if posixpath.basename(member.name) in TOKENIZER_FILES else None
                while content is not None and (chunk := content.read(CHUNK)):
                    if hasher:
                        hasher.update(chunk)
                if hasher:
                    scan.small_hashes[member.name] = hasher.hexdigest()
        except BundleError as err:
            # A blob whose bytes differ from its descriptor says more than the archive error it caused.
            reader.drain()
            if reader.count != desc.size or "sha256:" + reader.hash.hexdigest() != desc.digest:
                raise _mismatch(desc, layer_path, reader) from err
            raise
        reader.drain()
    if reader.count != desc.size or "sha256:" + reader.hash.hexdigest() != desc.digest:
        raise _mismatch(desc, layer_path, reader)
    return scan


def _mismatch(desc: Descriptor, layer_path: str, reader: HashingReader) -> BundleError:
    if reader.count != desc.size:
        return BundleError("digest-mismatch", f"layer {layer_path} ({desc.digest[:19]}…): {reader.count} bytes, descriptor says {desc.size}")
    return BundleError("digest-mismatch", f"layer {layer_path}: sha256 is sha256:{reader.hash.hexdigest()[:12]}…, descriptor says {desc.digest[:19]}…")


def merge_scans(scans: list[tuple[str, str, LayerScan]]) -> dict[str, LayerScan]:
    """(entry path, what to call the layer, its scan) of every layer -> one scan per Kitfile entry (a ModelPack
    entry has a layer per file); a file in two layers is refused (unsafe-archive), as one tar may not hold it twice."""
    seen: dict[str, str] = {}
    merged: dict[str, LayerScan] = {}
    for entry, shown, scan in scans:
        for name in [*scan.files, *scan.dirs]:
            if name in scan.files and name in seen:
                raise BundleError("unsafe-archive", f"file {name!r} is in two layers ({seen[name]} and {shown})")
            seen.setdefault(name, shown)
        into = merged.setdefault(entry, LayerScan())
        into.files.update(scan.files)
        into.dirs.extend(scan.dirs)
        into.small_hashes.update(scan.small_hashes)
    return merged
