"""An attacker with write access to a bundle store, editing its files directly.

The careful attacker of the hostile-bundle suite: after changing a blob it recomputes the digest up the
chain (layer -> config -> manifest -> index.json tag) and re-points the signature artifacts at the new
manifest, so that a test reaches the check it names instead of tripping over a stale digest. Where the
attacker also holds the trusted private key, it signs with the library directly: `bundle sign` refuses
to sign a bundle that fails its own integrity checks, and an attacker does not use that front door.
Layers are rebuilt with Python's `tarfile`, as an attacker would, not with our kit-compatible writer.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any, Callable

from bundler.trust.keys import load_private_key
from bundler.format.manifest import go_json
from bundler.store.modelkit import load_modelkit
from bundler.store.refs import parse_ref
from bundler.trust.sign import sign_modelkit
from bundler.store.layout import Store

REF_NAME = "org.opencontainers.image.ref.name"
SIGNATURE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"

Member = tuple[tarfile.TarInfo, bytes | None]


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- tar layers, attacker style


def read_members(layer: bytes, partial: bool = False) -> list[Member]:
    """Every entry of a layer tar with its content (None for non-files); with `partial`, as many as a damaged tar gives."""
    out: list[Member] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(layer), mode="r:") as tar:
            for info in tar:
                data = tar.extractfile(info).read() if info.isreg() else None  # type: ignore[union-attr]
                out.append((info, data))
    except tarfile.TarError:
        if not partial:
            raise
    return out


def build_tar(members: list[Member], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar written by `tarfile`, entries exactly as given (hostile names and types included)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def file_entry(name: str, data: bytes) -> Member:
    info = tarfile.TarInfo(name)
    info.mode, info.uid = 0o644, 1000
    return info, data


def special_entry(name: str, kind: bytes, linkname: str = "", **fields: Any) -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    return info, None


def with_content(members: list[Member], name: str, change: Callable[[bytes], bytes]) -> list[Member]:
    return [(info, change(data) if info.name == name and data is not None else data) for info, data in members]


def flip(data: bytes, at: int | None = None) -> bytes:
    """One byte changed (in the middle unless told)."""
    i = len(data) // 2 if at is None else at
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]


# ---------------------------------------------------------------- the store, edited by hand


class StoreEditor:
    """Direct edits to an OCI layout store, with the digests recomputed up the chain on request."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # raw blobs and the index
    def path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest.split(":", 1)[1]

    def read(self, digest: str) -> bytes:
        return self.path(digest).read_bytes()

    def put(self, data: bytes) -> str:
        digest = digest_of(data)
        if not self.path(digest).exists():
            self.path(digest).write_bytes(data)
        return digest

    def overwrite(self, digest: str, data: bytes) -> None:
        """Replace a blob's bytes in place, leaving its name (the old digest) as it was."""
        path = self.path(digest)
        os.chmod(path, 0o644)  # the store writes blobs read-only; the attacker owns the files anyway
        path.write_bytes(data)

    def remove(self, digest: str) -> None:
        self.path(digest).unlink()

    def index(self) -> dict[str, Any]:
        return json.loads((self.root / "index.json").read_bytes())

    def write_index(self, index: dict[str, Any]) -> None:
        (self.root / "index.json").write_bytes(json.dumps(index, separators=(",", ":")).encode())

    # a bundle's parts
    def entry(self, ref: str) -> dict[str, Any]:
        return next(m for m in self.index()["manifests"] if m.get("annotations", {}).get(REF_NAME) == ref)

    def manifest_digest(self, ref: str) -> str:
        return self.entry(ref)["digest"]

    def manifest(self, ref: str) -> dict[str, Any]:
        return json.loads(self.read(self.manifest_digest(ref)))

    def config_digest(self, ref: str) -> str:
        return self.manifest(ref)["config"]["digest"]

    def config(self, ref: str) -> dict[str, Any]:
        return json.loads(self.read(self.config_digest(ref)))

    @staticmethod
    def _config_entry(config: dict[str, Any], role: str) -> dict[str, Any]:
        if role == "target":
            return config["model"]
        if role == "docs":
            return config["docs"][0]
        return next(p for p in config["model"]["parts"] if p.get("type") == role)

    def layer_digest(self, ref: str, role: str) -> str:
        return self._config_entry(self.config(ref), role)["digest"]

    def layer(self, ref: str, role: str) -> bytes:
        return self.read(self.layer_digest(ref, role))

    # signatures
    def signatures(self, subject: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """Index entries of signature artifacts (whose subject is `subject`, when given; of one kind,
        "model-signing" or "cosign", when given). The SBOM and provenance attestations share their artifactType
        (cosign 3) and are no signatures: left out, as bundler.store.referrers leaves them out."""
        from bundler.store.referrers import is_attestation
        from bundler.trust.cosign import kind_of

        out = []
        for m in self.index()["manifests"]:
            if m.get("artifactType") != SIGNATURE_TYPE or is_attestation(json.loads(self.read(m["digest"]))):
                continue
            if kind is not None and kind_of(self.signature_payload(m)) != kind:
                continue
            if subject is None or json.loads(self.read(m["digest"])).get("subject", {}).get("digest") == subject:
                out.append(m)
        return out

    def signature_payload(self, entry: dict[str, Any]) -> bytes:
        return self.read(json.loads(self.read(entry["digest"]))["layers"][0]["digest"])

    def drop_signatures(self, subject: str | None = None, delete_blobs: bool = True) -> None:
        """Take signature artifacts out of index.json (and their blobs out of the store)."""
        gone = {m["digest"] for m in self.signatures(subject)}
        if delete_blobs:
            for digest in gone:
                self.remove(digest)
        index = self.index()
        index["manifests"] = [m for m in index["manifests"] if m["digest"] not in gone]
        self.write_index(index)

    def point_signature(self, entry: dict[str, Any], new_subject: str, payload: bytes | None = None) -> None:
        """Re-point a signature artifact at another manifest (and maybe swap its Sigstore bundle), re-digested."""
        artifact = json.loads(self.read(entry["digest"]))
        if payload is not None:
            artifact["layers"][0].update(digest=self.put(payload), size=len(payload))
        artifact["subject"].update(digest=new_subject, size=len(self.read(new_subject)))
        data = go_json(artifact)
        index = self.index()
        for m in index["manifests"]:
            if m["digest"] == entry["digest"]:
                m.update(digest=self.put(data), size=len(data))
        self.write_index(index)

    def retag(self, src: str, dst: str) -> None:
        """Point the tag `dst` at the manifest `src` names (a re-pointed tag, as a registry or store owner can)."""
        index = self.index()
        entry = {**self.entry(src), "annotations": {REF_NAME: dst}}
        index["manifests"] = [m for m in index["manifests"] if m.get("annotations", {}).get(REF_NAME) != dst] + [entry]
        self.write_index(index)

    def move_to_front(self, digests: set[str]) -> None:
        """Reorder index.json so these manifests come first (signatures are looked at in index order)."""
        index = self.index()
        index["manifests"].sort(key=lambda m: m["digest"] not in digests)
        self.write_index(index)

    def copy_signature(self, entry: dict[str, Any], new_subject: str) -> None:
        """Add a copy of a signature artifact, pointed at another manifest."""
        artifact = json.loads(self.read(entry["digest"]))
        artifact["subject"].update(digest=new_subject, size=len(self.read(new_subject)))
        data = go_json(artifact)
        index = self.index()
        index["manifests"].append({**entry, "digest": self.put(data), "size": len(data)})
        self.write_index(index)

    # the careful attacker's rewrite
    def rewrite(
        self,
        ref: str,
        layers: dict[str, bytes] | None = None,
        config: Callable[[dict[str, Any]], None] | None = None,
        manifest: Callable[[dict[str, Any]], None] | None = None,
        repoint_signatures: bool = True,
    ) -> str:
        """Swap layers by role, edit config and manifest, then recompute every digest up to index.json.

        Signature artifacts that named the old manifest are re-pointed at the new one unless told not to.
        Returns the new manifest digest.
        """
        old = self.manifest_digest(ref)
        man = self.manifest(ref)
        cfg = self.config(ref)
        for role, data in (layers or {}).items():
            entry = self._config_entry(cfg, role)
            new = self.put(data)
            for layer in man["layers"]:
                if layer["digest"] == entry["digest"]:
                    layer.update(digest=new, size=len(data))
            entry.update(digest=new, diffId=new)
        if config:
            config(cfg)
        cfg_bytes = go_json(cfg)
        man["config"].update(digest=self.put(cfg_bytes), size=len(cfg_bytes))
        if manifest:
            manifest(man)
        man_bytes = go_json(man)
        new_digest = self.put(man_bytes)
        index = self.index()
        for m in index["manifests"]:
            if m.get("annotations", {}).get(REF_NAME) == ref:
                m.update(digest=new_digest, size=len(man_bytes))
        self.write_index(index)
        if repoint_signatures:
            for entry in self.signatures(old):
                self.point_signature(entry, new_digest)
        return new_digest

    # the attacker who holds the trusted key
    def sign_with_key(self, ref: str, key_path: Path, valid_days: float = 365) -> None:
        """Sign what the bundle now holds with the library, past `bundle sign`'s refusal of damaged bundles.

        The file list is every regular file of every layer whose name the signer can express.
        """
        store = Store(self.root)
        mk = load_modelkit(store, parse_ref(ref))
        files: dict[str, str] = {}
        roles: dict[str, str] = {}
        for spec, desc in mk.layers:
            for info, data in read_members(self.read(desc.digest), partial=True):
                parts = info.name.split("/")
                if data is None or info.name.startswith("/") or ".." in parts or "." in parts:
                    continue
                files[info.name] = hashlib.sha256(data).hexdigest()
                roles[info.name] = spec.role
        sign_modelkit(store, mk, load_private_key(key_path), files, roles, valid_days)
