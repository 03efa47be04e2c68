"""CNCF ModelPack (modelpack/model-spec v1) read as a bundle: its layers placed by their file path, each given
the role of the Kitfile entry it lies in.

A ModelPack manifest carries artifactType `application/vnd.cncf.model.manifest.v1+json` and layers of
`application/vnd.cncf.model.<kind>.v1.<raw|tar>`, one file (raw) or one tree (tar) each, placed by the
`org.cncf.model.filepath` annotation (else `org.opencontainers.image.title`). The roles come from the Kitfile
kit writes into the manifest annotation `ml.kitops.modelkit.kitfile`; without it, from our role annotation
on each layer, else the first directory of its path (`target/`, `draft/`, `tokenizer/`), the package name and
version from the config's descriptor and the speculative settings from our manifest annotation.
"""

from __future__ import annotations

__all__ = [
    "FILEPATH", "FILE_METADATA", "KITFILE_ANNOTATION", "ROLE_ANNOTATION", "SPECULATIVE_ANNOTATION", "TITLE",
    "FileLayer", "build_modelpack_config", "build_modelpack_manifest", "is_modelpack", "layer_members", "layer_path",
    "parse_layer", "raw_layer", "read_modelpack", "write_raw",
]

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Mapping

from core.errors import BundleError
from bundler.format import boundedjson
from bundler.format.kitfile import Kitfile, LayerSpec, kitfile_from_data, parse_kitfile
from bundler.format.manifest import Descriptor, go_json, parse_descriptor
from bundler.format.mediatypes import MODELPACK_ARTIFACT, MODELPACK_CONFIG, OCI_MANIFEST, modelpack_layer, modelpack_media_type
from bundler.format.tarread import TarMember, iter_layer

FILEPATH = "org.cncf.model.filepath"
FILE_METADATA = "org.cncf.model.file.metadata+json"
TITLE = "org.opencontainers.image.title"
KITFILE_ANNOTATION = "ml.kitops.modelkit.kitfile"
# Ours, where ModelPack leaves the choice free (the prefix of cosign.EXPIRES_ANNOTATION): a layer's role,
# and the Kitfile's speculative settings as JSON on the manifest.
ROLE_ANNOTATION = "specbundle.dev/role"
SPECULATIVE_ANNOTATION = "specbundle.dev/speculative"
MAX_KITFILE_BYTES = 1 << 20  # as a Kitfile file may be (bundler.format.kitfile)
MAX_ANNOTATIONS = 64  # per layer: a hostile manifest may carry thousands
# Which ModelPack layer kinds a Kitfile entry of each kind may hold.
_KINDS = {"model": ("weight", "weight.config"), "modelpart": ("weight", "weight.config"), "docs": ("doc",), "code": ("code",), "dataset": ("dataset",)}
_ROLE_DIRS = ("target", "draft", "tokenizer")


@dataclass(frozen=True)
class FileLayer(Descriptor):
    """A ModelPack layer: its descriptor, the path its file (raw) or tree (tar) takes, its annotations."""

    filepath: str = ""
    kind: str = "weight"  # weight | weight.config | doc | code | dataset
    form: str = "raw"  # raw | tar
    annotations: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out

    def annotation(self, key: str) -> str | None:
        return dict(self.annotations).get(key)


def is_modelpack(manifest: Mapping[str, Any]) -> bool:
    """Whether a manifest is ModelPack's: its artifactType, or (as older writers leave it out) its config type."""
    config = manifest.get("config")
    return manifest.get("artifactType") == MODELPACK_ARTIFACT or (isinstance(config, dict) and config.get("mediaType") == MODELPACK_CONFIG)


def _safe_filepath(raw: str, where: str) -> str:
    """A layer's place: relative, no '..', '.', empty component, backslash or NUL (else unsafe-archive)."""
    parts = raw.split("/")
    if not raw or raw.startswith("/") or "\\" in raw or "\x00" in raw or any(p in ("", ".", "..") for p in parts):
        if raw in (".", "./"):
            return "."
        raise BundleError("unsafe-archive", f"{where}: file path {raw!r} is not a plain relative path")
    return raw


def _annotations(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > MAX_ANNOTATIONS or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BundleError("invalid-bundle", f"{where}: annotations must be at most {MAX_ANNOTATIONS} string pairs")
    return tuple(sorted(value.items()))


def parse_layer(raw: Any, where: str) -> FileLayer:
    """A ModelPack layer descriptor: a raw or uncompressed tar media type and a file path (invalid-bundle otherwise)."""
    desc = parse_descriptor(raw, where)
    found = modelpack_layer(desc.media_type)
    if found is None:
        raise BundleError("invalid-bundle", f"{where}: media type {desc.media_type!r} is not an uncompressed ModelPack layer (raw or tar)")
    annotations = _annotations(raw.get("annotations"), where)
    notes = dict(annotations)
    place = notes.get(FILEPATH) or notes.get(TITLE)
    if place is None:
        raise BundleError("invalid-bundle", f"{where}: layer {desc.digest[:19]}… has neither {FILEPATH} nor {TITLE}: its place is unknown")
    path = _safe_filepath(place, where)
    if found[1] == "raw" and path == ".":
        raise BundleError("unsafe-archive", f"{where}: a raw layer's file path cannot be the whole bundle")
    return FileLayer(desc.media_type, desc.digest, desc.size, path, found[0], found[1], annotations)


def layer_path(desc: Descriptor, spec_path: str) -> str:
    """Where a layer's entries lie: a ModelPack layer's own path, a ModelKit layer's Kitfile entry."""
    return desc.filepath if isinstance(desc, FileLayer) else spec_path


class _Exact:
    """Exactly `size` bytes of a raw layer's stream: fewer is a truncated blob (integrity)."""

    def __init__(self, raw: BinaryIO, size: int, where: str) -> None:
        self.raw, self.left, self.where = raw, size, where

    def read(self, n: int = -1) -> bytes:
        want = self.left if n is None or n < 0 else min(n, self.left)
        data = self.raw.read(want) if want else b""
        if want and not data:
            raise BundleError("integrity", f"{self.where}: blob ends {self.left} bytes early")
        self.left -= len(data)
        return data

    def readinto(self, buf: bytearray | memoryview) -> int:
        data = self.read(len(buf))
        memoryview(buf)[: len(data)] = data
        return len(data)


def layer_members(stream: BinaryIO, desc: Descriptor, spec_path: str) -> Iterator[tuple[TarMember, BinaryIO | None]]:
    """The entries of any layer, as iter_layer yields a tar's: a raw ModelPack layer is its one file at its
    path (its bytes from offset 0 of the blob), a tar layer is read by iter_layer below its path."""
    if isinstance(desc, FileLayer) and desc.form == "raw":
        yield TarMember(desc.filepath, "file", desc.size, 0o644, 0), _Exact(stream, desc.size, desc.filepath)  # type: ignore[misc]
        return
    yield from iter_layer(stream, layer_path(desc, spec_path))


# --------------------------------------------------------------------------------------------------
# A ModelPack manifest as a bundle


def _within(path: str, root: str) -> bool:
    return root == "." or path == root or path.startswith(root + "/")


def _owner(kitfile: Kitfile, layer: FileLayer, where: str) -> LayerSpec:
    """The Kitfile entry a layer lies in: the deepest one containing its path."""
    owners = [s for s in kitfile.layers if _within(layer.filepath, s.path)]
    if not owners:
        raise BundleError("invalid-bundle", f"{where}: layer {layer.filepath!r} is not named by any Kitfile entry")
    spec = max(owners, key=lambda s: len(s.path))
    if layer.kind not in _KINDS[spec.kind]:
        raise BundleError("invalid-bundle", f"{where}: layer {layer.filepath!r} is a {layer.kind} layer, but {spec.role} ({spec.path}) holds {' or '.join(_KINDS[spec.kind])} layers")
    role = layer.annotation(ROLE_ANNOTATION)
    if role is not None and role != spec.role:
        raise BundleError("invalid-bundle", f"{where}: layer {layer.filepath!r} says role {role!r}, but it lies in {spec.role} ({spec.path})")
    return spec


def _config_checks(config: Any, layers: list[FileLayer], where: str) -> dict[str, Any]:
    """The config's descriptor, after checking its diffIds name the layers (uncompressed: diffId = digest)."""
    if not isinstance(config, dict) or not isinstance(config.get("modelfs"), dict) or not isinstance(config.get("descriptor", {}), dict):
        raise BundleError("invalid-bundle", f"{where}: config is not a ModelPack config (descriptor, config, modelfs)")
    modelfs = config["modelfs"]
    if modelfs.get("type") != "layers" or modelfs.get("diffIds") != [layer.digest for layer in layers]:
        raise BundleError("invalid-bundle", f"{where}: config modelfs.diffIds do not list the manifest's layers in order (uncompressed layers: each diffId is its digest)")
    return dict(config.get("descriptor") or {})


def _role_of(layer: FileLayer) -> str | None:
    role = layer.annotation(ROLE_ANNOTATION)
    if role is None and layer.kind != "doc":
        first = layer.filepath.split("/", 1)[0]
        role = first if first in _ROLE_DIRS and "/" in layer.filepath else None
    return role or ("docs" if layer.kind == "doc" else None)


def _synthesized(manifest: Mapping[str, Any], descriptor: Mapping[str, Any], layers: list[FileLayer], where: str) -> Kitfile:
    """The Kitfile a bundle without kit's annotation implies: roles from our annotation or the first directory."""
    dirs: dict[str, str] = {}
    docs: list[dict[str, str]] = []
    for layer in layers:
        role = _role_of(layer)
        if role == "docs":
            docs.append({"path": layer.filepath})
            continue
        if role not in _ROLE_DIRS:
            raise BundleError("invalid-bundle", f"{where}: layer {layer.filepath!r} has no role: no Kitfile annotation, no {ROLE_ANNOTATION}, not under target/, draft/ or tokenizer/")
        place = layer.filepath.split("/", 1)[0]
        if dirs.setdefault(role, place) != place:
            raise BundleError("invalid-bundle", f"{where}: the {role} role's files lie in both {dirs[role]}/ and {place}/")
    if "target" not in dirs:
        raise BundleError("invalid-kitfile", f"{where}: no target role among the layers")
    notes = manifest.get("annotations") if isinstance(manifest.get("annotations"), dict) else {}
    model: dict[str, Any] = {"name": descriptor.get("name"), "path": dirs["target"]}
    model["parts"] = [{"name": role, "path": dirs[role], "type": role} for role in ("draft", "tokenizer") if role in dirs]
    if isinstance(notes.get(SPECULATIVE_ANNOTATION), str):
        model["parameters"] = {"speculative": _bounded_json(notes[SPECULATIVE_ANNOTATION], where)}
    package = {"name": descriptor.get("name"), "version": descriptor.get("version")}
    data = {"manifestVersion": "1.0.0", "package": package, "model": model, **({"docs": docs} if docs else {})}
    return kitfile_from_data(data, f"{where} (roles from the layers)")


def _bounded_json(text: str, where: str) -> Any:
    return boundedjson.loads(text, f"{where} {SPECULATIVE_ANNOTATION}")


def read_modelpack(manifest: Mapping[str, Any], config: Any, where: str) -> tuple[Kitfile, list[tuple[LayerSpec, FileLayer]]]:
    """The Kitfile of a ModelPack manifest and each layer with the entry it belongs to, in manifest order.

    Refused as invalid-bundle: a layer not raw or uncompressed tar, without a place, outside every entry, of
    a kind its entry cannot hold, contradicting its role annotation; an entry with no layer; a config whose
    diffIds are not the layers. A Kitfile annotation is read as the Kitfile is (invalid-kitfile).
    """
    raw_layers = manifest.get("layers", [])
    if not isinstance(raw_layers, list):
        raise BundleError("invalid-bundle", f"{where}: manifest layers is not a list")
    layers = [parse_layer(raw, f"{where} manifest layers[{i}]") for i, raw in enumerate(raw_layers)]
    descriptor = _config_checks(config, layers, where)
    notes = manifest.get("annotations")
    text = notes.get(KITFILE_ANNOTATION) if isinstance(notes, dict) else None
    if text is not None:
        if not isinstance(text, str) or len(text) > MAX_KITFILE_BYTES:
            raise BundleError("invalid-kitfile", f"{where}: the {KITFILE_ANNOTATION} annotation is not a Kitfile of at most {MAX_KITFILE_BYTES} bytes")
        kitfile = parse_kitfile(text, f"{where} {KITFILE_ANNOTATION}")
    else:
        kitfile = _synthesized(manifest, descriptor, layers, where)
    placed = [(_owner(kitfile, layer, where), layer) for layer in layers]
    for spec in kitfile.layers:
        if not any(s is spec for s, _ in placed):
            raise BundleError("invalid-bundle", f"{where}: no layer for {spec.role} entry {spec.path!r}")
    return kitfile, placed


# --------------------------------------------------------------------------------------------------
# Writing: one raw file per layer


def _writer_kind(spec: LayerSpec, name: str) -> str:
    """Weights as `weight`, every other file of a model role (config, tokenizer) as `weight.config`."""
    if spec.kind in ("model", "modelpart"):
        weights = spec.role != "tokenizer" and name.endswith((".safetensors", ".gguf"))
        return "weight" if weights else "weight.config"
    return {"docs": "doc", "code": "code", "dataset": "dataset"}[spec.kind]


def write_raw(path: Path, name: str, out: Any, progress: Callable[[int], None] | None = None) -> tuple[str, int, int]:
    """Copy one file into a raw layer blob (`out.write`), hashing it in the same pass: (sha256 hex, size, mode).
    Opened without following a link; a file that changes while read is refused (invalid-bundle)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise BundleError("invalid-bundle", f"{name}: cannot read ({err.strerror})") from None
    digest = hashlib.sha256()
    with open(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BundleError("invalid-bundle", f"{name}: not a regular file")
        left = st.st_size
        while left:
            chunk = f.read(min(1 << 20, left))
            if not chunk:
                raise BundleError("invalid-bundle", f"{name}: file shrank while packing")
            digest.update(chunk)
            out.write(chunk)
            left -= len(chunk)
            if progress:
                progress(len(chunk))
        if f.read(1):
            raise BundleError("invalid-bundle", f"{name}: file grew while packing")
    return digest.hexdigest(), st.st_size, 0o755 if st.st_mode & 0o111 else 0o644


def raw_layer(spec: LayerSpec, name: str, sha256_hex: str, size: int, mode: int) -> FileLayer:
    """The raw layer of one file: the same bytes give the same descriptor on any machine (metadata as our
    tars write it: uid 1000, gid 0, mtime 0, mode 0644 or 0755)."""
    kind = _writer_kind(spec, name)
    metadata = {"name": name, "mode": mode, "uid": 1000, "gid": 0, "size": size, "mtime": "1970-01-01T00:00:00Z", "typeflag": ord("0")}
    notes = {FILEPATH: name, FILE_METADATA: go_json(metadata).decode(), TITLE: name, ROLE_ANNOTATION: spec.role}
    return FileLayer(modelpack_media_type(kind, "raw"), "sha256:" + sha256_hex, size, name, kind, "raw", tuple(sorted(notes.items())))


def _omit_empty(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if v not in (None, "", [], {})}


def build_modelpack_config(kitfile: Kitfile, layers: list[FileLayer], facts: Mapping[str, str]) -> bytes:
    """The config blob, in the field order of model-spec's Go types: the descriptor from the Kitfile's package
    (name, version, authors, licence, description), the model config from `facts` (family, architecture,
    format, paramSize, precision, quantization: read from the weights by the caller), every layer's diffId."""
    package = kitfile.data["package"]
    licence = package.get("license")
    descriptor = _omit_empty({
        "authors": package.get("authors"), "family": facts.get("family"), "name": kitfile.name, "version": kitfile.version,
        "licenses": [licence] if licence else None, "description": package.get("description"),
    })
    config = _omit_empty({k: facts.get(k) for k in ("architecture", "format", "paramSize", "precision", "quantization")})
    model = {"descriptor": descriptor, "modelfs": {"type": "layers", "diffIds": [layer.digest for layer in layers]}, "config": config}
    return go_json(model)


def build_modelpack_manifest(config: Descriptor, layers: list[FileLayer], kitfile: Kitfile) -> bytes:
    """The OCI image manifest: ModelPack's artifactType, the Kitfile as kit writes it (JSON, in
    `ml.kitops.modelkit.kitfile`) and the speculative settings under our prefix."""
    notes = {KITFILE_ANNOTATION: go_json(kitfile.data).decode()}
    speculative = kitfile.parameters.get("speculative")
    if speculative:
        notes[SPECULATIVE_ANNOTATION] = go_json(speculative).decode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": MODELPACK_ARTIFACT,
        "config": config.as_dict(),
        "layers": [layer.as_dict() for layer in layers],
        "annotations": dict(sorted(notes.items())),
    }
    return go_json(manifest)
