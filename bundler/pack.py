"""`bundle pack`: Kitfile -> one tar layer per entry -> config -> manifest -> the store, in one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bundler.kitfile import Kitfile, LayerSpec, load_kitfile
from bundler.manifest import MODELKIT_CONFIG, OCI_MANIFEST, Descriptor, build_config, build_manifest, layer_media_type
from bundler.refs import Ref
from bundler.store import Store
from bundler.tarlayer import LayerResult, write_layer


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


def pack(
    context: Path,
    ref: Ref,
    store: Store,
    kitfile_path: Path | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> PackResult:
    """Pack a context into the store under `ref`; nothing is visible in the store until all of it is written."""
    kitfile = load_kitfile(context, kitfile_path)
    layers: list[Descriptor] = []
    files: list[PackedFile] = []
    digests: dict[LayerSpec, str] = {}
    with store.transaction() as staging:
        for spec in kitfile.layers:
            writer = staging.writer(hashing=False)
            tick = (lambda n, p=spec.path: progress(p, n)) if progress else None
            try:
                result: LayerResult = write_layer(context, spec.path, writer, exclude=_excluded(spec, kitfile), progress=tick)
            finally:
                writer.close()
            staging.add(writer, result.digest)
            digests[spec] = result.digest
            layers.append(Descriptor(layer_media_type(spec.kind), result.digest, result.size))
            files += [PackedFile(f.path, f.sha256, f.size, spec.role) for f in result.files]
        config_bytes = build_config(kitfile, digests)
        config = Descriptor(MODELKIT_CONFIG, staging.add_bytes(config_bytes).digest, len(config_bytes))
        manifest_bytes = build_manifest(config, layers)
        manifest = Descriptor(OCI_MANIFEST, staging.add_bytes(manifest_bytes).digest, len(manifest_bytes))
        staging.commit()  # blobs first, so the index never names a missing blob
        store.tag(ref, manifest)
    return PackResult(ref, manifest.digest, manifest, config, layers, files, kitfile)
