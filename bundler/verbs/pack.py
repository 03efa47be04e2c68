"""`bundle pack`: Kitfile -> layers -> config -> manifest -> the store, in one transaction.

Two formats (`--format`): a KitOps ModelKit (the default: one tar layer per Kitfile entry, as `kit pack`
writes it) or a CNCF ModelPack (one raw file per layer, placed by its path, as a container runtime mounts an
image volume; bundler.format.modelpack). Both are reproducible: the same context gives the same digest.
"""

from __future__ import annotations

__all__ = ["FORMATS", "attest_packed", "pack", "pack_checked"]

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bundler.trust import attest, upstream
from bundler.trust.contentcheck import ContentReport, check_content
from core.errors import BundleError
from bundler.format.kitfile import Kitfile, LayerSpec, load_kitfile
from bundler.format.manifest import Descriptor, build_config, build_manifest
from bundler.format.mediatypes import MODELKIT_CONFIG, MODELPACK_CONFIG, OCI_MANIFEST, layer_media_type
from bundler.format.modelpack import FileLayer, build_modelpack_config, build_modelpack_manifest, raw_layer, write_raw
from bundler.store.refs import Ref
from bundler.trust.releases import check_new_release, signed_releases
from bundler.store.layout import Staging, Store
from bundler.format.tarwrite import LayerResult, layer_files, write_layer

FORMATS = ("modelkit", "modelpack")


@dataclass(frozen=True)
class PackedFile:
    path: str
    sha256: str
    size: int
    role: str


@dataclass(frozen=True)
class PackResult:
    ref: Ref
    digest: str  # the manifest digest: the bundle's identity
    manifest: Descriptor
    config: Descriptor
    layers: list[Descriptor]
    files: list[PackedFile]
    kitfile: Kitfile


def _excluded(spec: LayerSpec, kitfile: Kitfile) -> list[str]:
    """Paths of other entries nested inside this one: they go in their own layers (as kit does)."""
    return [o.path for o in kitfile.layers if o is not spec and o.path.startswith(spec.path + "/")]


class _Discard:
    """A layer written nowhere: write_layer hashes what it would write (the digests without the bytes)."""

    def write(self, data: bytes | memoryview) -> int:
        return len(data)


def _layers(context: Path, kitfile: Kitfile, staging: Staging | None, progress: Callable[[str, int], None] | None) -> tuple[list[Descriptor], list[PackedFile], dict[LayerSpec, str]]:
    """Each entry as a kit-style tar layer: into `staging`, or only hashed when it is None."""
    layers: list[Descriptor] = []
    files: list[PackedFile] = []
    digests: dict[LayerSpec, str] = {}
    for spec in kitfile.layers:
        tick = (lambda n, p=spec.path: progress(p, n)) if progress else None
        if staging is None:
            result: LayerResult = write_layer(context, spec.path, _Discard(), exclude=_excluded(spec, kitfile), progress=tick)  # type: ignore[arg-type]
        else:
            writer = staging.writer(hashing=False)
            try:
                result = write_layer(context, spec.path, writer, exclude=_excluded(spec, kitfile), progress=tick)
            finally:
                writer.close()
            staging.add(writer, result.digest)
        digests[spec] = result.digest
        layers.append(Descriptor(layer_media_type(spec.kind), result.digest, result.size))
        files += [PackedFile(f.path, f.sha256, f.size, spec.role) for f in result.files]
    return layers, files, digests


def _modelpack_layers(context: Path, kitfile: Kitfile, staging: Staging | None, progress: Callable[[str, int], None] | None) -> tuple[list[FileLayer], list[PackedFile]]:
    """Each file of each entry as one raw ModelPack layer (its bytes are the blob): into `staging`, or only hashed."""
    layers: list[FileLayer] = []
    files: list[PackedFile] = []
    for spec in kitfile.layers:
        for name, path in layer_files(context, spec.path, _excluded(spec, kitfile)):
            tick = (lambda n, p=name: progress(p, n)) if progress else None
            if staging is None:
                hexdigest, size, mode = write_raw(path, name, _Discard(), tick)
            else:
                writer = staging.writer(hashing=False)
                try:
                    hexdigest, size, mode = write_raw(path, name, writer, tick)
                finally:
                    writer.close()
                staging.add(writer, "sha256:" + hexdigest)
            layers.append(raw_layer(spec, name, hexdigest, size, mode))
            files.append(PackedFile(name, hexdigest, size, spec.role))
    return layers, files


def _param_size(count: int) -> str:
    """ModelPack's paramSize: a count with at most one decimal and a scale letter (`134.5M`)."""
    for letter, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6)):
        if count >= scale:
            return f"{count / scale:.1f}{letter}"
    return f"{count / 10**3:.1f}K"


def _model_facts(context: Path, kitfile: Kitfile) -> dict[str, Any]:
    """The ModelPack config's model facts, read from the target's headers (no weights): family, format,
    parameter size, precision, quantization."""
    from runner.checks import gguf_header, gguf_model, modelinfo  # torch-free; read only for a ModelPack

    target = context / kitfile.role_paths()["target"]
    ggufs = gguf_model.gguf_files(target)
    if ggufs:
        header = gguf_header.read_header(ggufs[0])
        family = header["metadata"].get("general.architecture")
        return {"family": family, "architecture": "transformer", "format": "gguf", "paramSize": _param_size(gguf_model.parameters(header))}
    config = modelinfo.read_raw_config(target)
    quant = config.get("quantization_config")
    return {
        "family": config.get("model_type"), "architecture": "transformer", "format": "safetensors",
        "paramSize": _param_size(modelinfo.count_parameters(target)),
        "precision": config.get("torch_dtype") or config.get("dtype"),
        "quantization": quant.get("quant_method") if isinstance(quant, dict) else None,
    }


def _contents(context: Path, kitfile: Kitfile, staging: Staging | None, progress: Callable[[str, int], None] | None, fmt: str) -> tuple[list[Descriptor], list[PackedFile], bytes, str, Callable[[Descriptor], bytes]]:
    """(layers, files, config blob, config media type, manifest from the config's descriptor) in `fmt`."""
    if fmt == "modelpack":
        packs, files = _modelpack_layers(context, kitfile, staging, progress)
        config = build_modelpack_config(kitfile, packs, _model_facts(context, kitfile))
        return list(packs), files, config, MODELPACK_CONFIG, lambda desc: build_modelpack_manifest(desc, packs, kitfile)
    if fmt != "modelkit":
        raise BundleError("usage", f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    layers, files, digests = _layers(context, kitfile, staging, progress)
    return layers, files, build_config(kitfile, digests), MODELKIT_CONFIG, lambda desc: build_manifest(desc, layers)


def _blob(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def planned(context: Path, ref: Ref, kitfile: Kitfile, progress: Callable[[str, int], None] | None = None, fmt: str = "modelkit") -> PackResult:
    """What `pack` would store for this context (the manifest digest included), with nothing written: every
    file is read and hashed once."""
    layers, files, config_bytes, config_type, manifest_of = _contents(context, kitfile, None, progress, fmt)
    config = Descriptor(config_type, _blob(config_bytes), len(config_bytes))
    manifest_bytes = manifest_of(config)
    manifest = Descriptor(OCI_MANIFEST, _blob(manifest_bytes), len(manifest_bytes))
    return PackResult(ref, manifest.digest, manifest, config, layers, files, kitfile)


def pack(
    context: Path,
    ref: Ref,
    store: Store,
    kitfile_path: Path | None = None,
    progress: Callable[[str, int], None] | None = None,
    fmt: str = "modelkit",
) -> PackResult:
    """Pack a context into the store under `ref` in `fmt` (FORMATS); nothing is visible in the store until all
    of it is written.

    Only the Kitfile and the tree's shape are checked here; `pack_checked` (what `bundle pack` runs) also
    refuses content verify or run would refuse. Tests call this to build such bundles on purpose.
    """
    kitfile = load_kitfile(context, kitfile_path)
    with store.transaction() as staging:
        layers, files, config_bytes, config_type, manifest_of = _contents(context, kitfile, staging, progress, fmt)
        config = Descriptor(config_type, staging.add_bytes(config_bytes).digest, len(config_bytes))
        manifest_bytes = manifest_of(config)
        manifest = Descriptor(OCI_MANIFEST, staging.add_bytes(manifest_bytes).digest, len(manifest_bytes))
        staging.commit()  # blobs first, so the index never names a missing blob
        store.tag(ref, manifest)
    return PackResult(ref, manifest.digest, manifest, config, layers, files, kitfile)


def _stored(store: Store, ref: Ref, plan: PackResult) -> bool:
    """Whether `ref` already names exactly this content, every blob present."""
    try:
        if store.resolve(ref).digest != plan.digest:
            return False
    except BundleError:
        return False
    return all(store.has_blob(d.digest) for d in (plan.manifest, plan.config, *plan.layers))


def pack_checked(
    context: Path,
    ref: Ref,
    store: Store,
    kitfile_path: Path | None = None,
    progress: Callable[[str, int], None] | None = None,
    fmt: str = "modelkit",
) -> tuple[PackResult, ContentReport]:
    """`bundle pack`: before anything is written, every check verify and run make on the content
    (bundler.trust.contentcheck) and no other content signed in this store as the same name and version
    (`rollback`, as verify would say); then `pack`. The same content again writes nothing new. `fmt`: modelkit
    (the default) or modelpack.
    """
    if fmt not in FORMATS:
        raise BundleError("usage", f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    kitfile = load_kitfile(context, kitfile_path)
    checked = check_content(context, kitfile)
    upstream.check_context(context, kitfile.layers)  # a publisher's signature that does not match: refused, never carried
    if signed_releases(store, kitfile.name, kitfile.version):  # only then is the digest needed before writing
        plan = planned(context, ref, kitfile, fmt=fmt)
        check_new_release(store, kitfile.name, kitfile.version, plan.digest)
        if _stored(store, ref, plan):
            return plan, checked
    return pack(context, ref, store, kitfile_path, progress, fmt), checked


def attest_packed(store: Store, result: PackResult, context: Path, private_key: Any, started: dt.datetime) -> list[attest.Written]:
    """After signing a pack: its SBOM and SLSA provenance (bundler.trust.attest), signed with the same key, read
    from the context just packed."""
    return attest.attest_context(store, result.ref, context, {f.path: f.sha256 for f in result.files}, private_key, started)
