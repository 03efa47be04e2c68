"""Read a bundle from the store: manifest -> config -> Kitfile and the layer(s) of each entry.

Two formats: a KitOps ModelKit (one tar layer per Kitfile entry, the Kitfile in the config) and a CNCF
ModelPack (one file or tree per layer, placed by its path: bundler.format.modelpack), told apart by the
manifest's artifactType. Both give the same ModelKit value, so every check reads them alike.
"""

from __future__ import annotations

__all__ = ["ModelKit", "file_hashes", "load_modelkit", "strip_layer_info"]

import hashlib
from dataclasses import dataclass
from typing import Any

from core.errors import BundleError
from bundler.format.kitfile import Kitfile, LayerSpec, kitfile_from_data
from bundler.format.manifest import Descriptor, parse_descriptor
from bundler.format.mediatypes import MODELKIT_CONFIG, MODELPACK_CONFIG, OCI_MANIFEST, layer_kind
from bundler.format.modelpack import is_modelpack, layer_members, read_modelpack
from bundler.store.refs import Ref
from bundler.store.layout import Store

_LAYER_INFO = ("digest", "diffId")


@dataclass(frozen=True)
class ModelKit:
    """A bundle as the store holds it, its config parsed back into a validated Kitfile."""

    ref: Ref
    manifest_desc: Descriptor
    manifest: dict[str, Any]
    config_desc: Descriptor
    config: dict[str, Any]
    kitfile: Kitfile
    layers: list[tuple[LayerSpec, Descriptor]]  # a ModelPack entry may have several (FileLayer descriptors)

    @property
    def digest(self) -> str:
        return self.manifest_desc.digest

    @property
    def format(self) -> str:
        """`modelkit` or `modelpack`."""
        return "modelpack" if is_modelpack(self.manifest) else "modelkit"


def strip_layer_info(config: Any) -> Any:
    """The config without the digest and diffId kit adds to each entry: the Kitfile as written.

    Only the entries kit annotates, not recursively: a hostile config may be nested thousands deep.
    """
    if not isinstance(config, dict):
        return config

    def strip(entry: Any) -> Any:
        return {k: v for k, v in entry.items() if k not in _LAYER_INFO} if isinstance(entry, dict) else entry

    out = dict(config)
    if isinstance(out.get("model"), dict):
        out["model"] = strip(out["model"])
        if isinstance(out["model"].get("parts"), list):
            out["model"]["parts"] = [strip(p) for p in out["model"]["parts"]]
    for section in ("code", "datasets", "docs"):
        if isinstance(out.get(section), list):
            out[section] = [strip(e) for e in out[section]]
    return out


def _entry(config: dict[str, Any], spec: LayerSpec) -> dict[str, Any]:
    if spec.section == "model":
        return config["model"]
    if spec.section == "parts":
        return config["model"]["parts"][spec.index]
    return config[spec.section][spec.index]


def _entry_digest(config: dict[str, Any], spec: LayerSpec) -> str | None:
    return _entry(config, spec).get("digest")


def load_modelkit(store: Store, ref: Ref) -> ModelKit:
    """Resolve `ref` and read its manifest and config (each checked against its digest)."""
    desc = store.resolve(ref)
    _, manifest = store.read_json_blob(desc)
    if not isinstance(manifest, dict) or manifest.get("mediaType", OCI_MANIFEST) != OCI_MANIFEST or manifest.get("schemaVersion") != 2:
        raise BundleError("invalid-bundle", f"{ref}: not an OCI image manifest")
    config_desc = parse_descriptor(manifest.get("config"), f"{ref} manifest config")
    if is_modelpack(manifest):
        return _load_modelpack(store, ref, desc, manifest, config_desc)
    if config_desc.media_type != MODELKIT_CONFIG:
        raise BundleError("invalid-bundle", f"{ref}: config media type {config_desc.media_type!r} is not a ModelKit config")
    _, config = store.read_json_blob(config_desc)
    kitfile = kitfile_from_data(strip_layer_info(config), f"{ref} config")
    if not isinstance(manifest.get("layers", []), list):
        raise BundleError("invalid-bundle", f"{ref}: manifest layers is not a list")
    by_digest: dict[str, Descriptor] = {}
    for i, raw in enumerate(manifest.get("layers", [])):
        layer = parse_descriptor(raw, f"{ref} manifest layers[{i}]")
        if layer_kind(layer.media_type) is None:
            raise BundleError("invalid-bundle", f"{ref}: layer {layer.digest} has media type {layer.media_type!r}, not an uncompressed ModelKit layer")
        if layer.digest in by_digest:
            raise BundleError("invalid-bundle", f"{ref}: layer {layer.digest} is listed twice")
        by_digest[layer.digest] = layer
    layers: list[tuple[LayerSpec, Descriptor]] = []
    for spec in kitfile.layers:
        digest = _entry_digest(config, spec)
        layer = by_digest.pop(digest, None) if isinstance(digest, str) else None
        if layer is None:
            raise BundleError("invalid-bundle", f"{ref}: no layer for {spec.role} entry {spec.path!r} (config digest {digest})")
        diff_id = _entry(config, spec).get("diffId")
        # Layers are uncompressed tars, so the digest of the uncompressed content IS the layer digest.
        if diff_id is not None and diff_id != digest:
            raise BundleError("invalid-bundle", f"{ref}: {spec.role} entry {spec.path!r} has diffId {str(diff_id)[:19]}… but its layer is {digest[:19]}… (uncompressed layers: they must be equal)")
        if layer_kind(layer.media_type) != spec.kind:
            raise BundleError("invalid-bundle", f"{ref}: layer for {spec.path!r} is a {layer_kind(layer.media_type)} layer, expected {spec.kind}")
        layers.append((spec, layer))
    if by_digest:
        raise BundleError("invalid-bundle", f"{ref}: layer {next(iter(by_digest))} is not named by any Kitfile entry")
    return ModelKit(ref, desc, manifest, config_desc, config, kitfile, layers)


def _load_modelpack(store: Store, ref: Ref, desc: Descriptor, manifest: dict[str, Any], config_desc: Descriptor) -> ModelKit:
    if config_desc.media_type != MODELPACK_CONFIG:
        raise BundleError("invalid-bundle", f"{ref}: config media type {config_desc.media_type!r} is not a ModelPack config")
    _, config = store.read_json_blob(config_desc)
    kitfile, layers = read_modelpack(manifest, config, str(ref))
    return ModelKit(ref, desc, manifest, config_desc, config, kitfile, list(layers))


def file_hashes(store: Store, mk: ModelKit) -> tuple[dict[str, str], dict[str, str]]:
    """(path -> sha256, path -> role) of every file in the bundle, read from its layers."""
    hashes: dict[str, str] = {}
    roles: dict[str, str] = {}
    for spec, desc in mk.layers:
        with open(store.blob_path(desc.digest), "rb") as f:
            for member, content in layer_members(f, desc, spec.path):
                if member.kind != "file" or content is None:
                    continue
                h = hashlib.sha256()
                while chunk := content.read(1 << 20):
                    h.update(chunk)
                hashes[member.name] = h.hexdigest()
                roles[member.name] = spec.role
    return hashes, roles
