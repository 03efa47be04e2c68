"""The ModelKit config (the Kitfile as JSON with layer digests) and the OCI image manifest, as kit writes them."""

from __future__ import annotations

__all__ = ["Descriptor", "build_config", "build_manifest", "go_json", "parse_descriptor", "sha256_digest"]

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from core.errors import BundleError
from bundler.format.kitfile import Kitfile, LayerSpec
from bundler.format.mediatypes import MODELKIT_ARTIFACT, OCI_MANIFEST


def go_json(value: Any) -> bytes:
    """JSON encoded as Go's encoding/json does: compact, map keys as given, <, >, & escaped, UTF-8 kept."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode()


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int

    def as_dict(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def parse_descriptor(value: Any, where: str) -> Descriptor:
    """A descriptor as read from a manifest or index.json, its fields' types checked (hostile JSON is invalid-bundle, not a crash)."""
    if not isinstance(value, dict):
        raise BundleError("invalid-bundle", f"{where}: descriptor is not a JSON object")
    media_type, digest, size = value.get("mediaType", ""), value.get("digest"), value.get("size")
    if not isinstance(media_type, str) or not isinstance(digest, str):
        raise BundleError("invalid-bundle", f"{where}: descriptor needs a string mediaType and digest")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BundleError("invalid-bundle", f"{where}: descriptor size {size!r} is not a non-negative integer")
    return Descriptor(media_type, digest, size)


def _keep(entry: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """Fields in kit's struct order, empty ones left out (Go's omitempty)."""
    return {k: entry[k] for k in order if entry.get(k) not in (None, "", [], {})}


def _with_layer(entry: dict[str, Any], order: tuple[str, ...], digest: str) -> dict[str, Any]:
    out = _keep(entry, order)
    out["digest"] = digest
    out["diffId"] = digest  # layers are uncompressed, so the digest is the diffID
    return out


def build_config(kitfile: Kitfile, digests: dict[LayerSpec, str]) -> bytes:
    """The config blob: kit's KitFile struct marshalled by Go, each entry with its layer's digest and diffId."""
    data = kitfile.data
    by_place = {(s.section, s.index): digests[s] for s in kitfile.layers}
    model = data["model"]
    parts = [
        _with_layer(p, ("name", "path", "license", "type"), by_place[("parts", i)]) for i, p in enumerate(model.get("parts", []))
    ]
    model_out = _keep({**model, "parts": parts}, ("name", "path", "license", "framework", "format", "version", "description", "parts", "parameters"))
    model_out.update(digest=by_place[("model", 0)], diffId=by_place[("model", 0)])
    if "parameters" in model_out:
        model_out["parameters"] = _sorted_maps(model_out["parameters"])  # Go sorts map keys
    config: dict[str, Any] = {
        "manifestVersion": str(data["manifestVersion"]),
        "package": _keep(data["package"], ("name", "version", "description", "license", "authors")),
        "model": model_out,
    }
    orders = {"code": ("path", "description", "license"), "datasets": ("name", "path", "description", "license"), "docs": ("path", "description")}
    for section, order in orders.items():
        if data.get(section):
            config[section] = [_with_layer(e, order, by_place[(section, i)]) for i, e in enumerate(data[section])]
    return go_json(config)


def _sorted_maps(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted_maps(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_maps(v) for v in value]
    return value


def build_manifest(config: Descriptor, layers: list[Descriptor], annotations: dict[str, str] | None = None) -> bytes:
    """An OCI image manifest for a ModelKit, in the field order of Go's ocispec.Manifest."""
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": MODELKIT_ARTIFACT,
        "config": config.as_dict(),
        "layers": [layer.as_dict() for layer in layers],
    }
    if annotations:
        manifest["annotations"] = dict(sorted(annotations.items()))
    return go_json(manifest)
