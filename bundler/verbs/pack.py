"""`bundle pack`: Kitfile -> one tar layer per entry -> config -> manifest -> the store, in one transaction."""

from __future__ import annotations

__all__ = ["attest_packed", "pack", "pack_checked"]

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bundler.trust import attest
from bundler.trust.contentcheck import ContentReport, check_content
from core.errors import BundleError
from bundler.format.kitfile import Kitfile, LayerSpec, load_kitfile
from bundler.format.manifest import Descriptor, build_config, build_manifest
from bundler.format.mediatypes import MODELKIT_CONFIG, OCI_MANIFEST, layer_media_type
from bundler.store.refs import Ref
from bundler.trust.releases import check_new_release, signed_releases
from bundler.store.layout import Staging, Store
from bundler.format.tarwrite import LayerResult, write_layer


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


def _blob(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def planned(context: Path, ref: Ref, kitfile: Kitfile, progress: Callable[[str, int], None] | None = None) -> PackResult:
    """What `pack` would store for this context (the manifest digest included), with nothing written: every
    file is read and hashed once."""
    layers, files, digests = _layers(context, kitfile, None, progress)
    config_bytes = build_config(kitfile, digests)
    config = Descriptor(MODELKIT_CONFIG, _blob(config_bytes), len(config_bytes))
    manifest_bytes = build_manifest(config, layers)
    manifest = Descriptor(OCI_MANIFEST, _blob(manifest_bytes), len(manifest_bytes))
    return PackResult(ref, manifest.digest, manifest, config, layers, files, kitfile)


def pack(
    context: Path,
    ref: Ref,
    store: Store,
    kitfile_path: Path | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> PackResult:
    """Pack a context into the store under `ref`; nothing is visible in the store until all of it is written.

    Only the Kitfile and the tree's shape are checked here; `pack_checked` (what `bundle pack` runs) also
    refuses content verify or run would refuse. Tests call this to build such bundles on purpose.
    """
    kitfile = load_kitfile(context, kitfile_path)
    with store.transaction() as staging:
        layers, files, digests = _layers(context, kitfile, staging, progress)
        config_bytes = build_config(kitfile, digests)
        config = Descriptor(MODELKIT_CONFIG, staging.add_bytes(config_bytes).digest, len(config_bytes))
        manifest_bytes = build_manifest(config, layers)
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
) -> tuple[PackResult, ContentReport]:
    """`bundle pack`: before anything is written, every check verify and run make on the content
    (bundler.trust.contentcheck) and no other content signed in this store as the same name and version
    (`rollback`, as verify would say); then `pack`. The same content again writes nothing new.
    """
    kitfile = load_kitfile(context, kitfile_path)
    checked = check_content(context, kitfile)
    if signed_releases(store, kitfile.name, kitfile.version):  # only then is the digest needed before writing
        plan = planned(context, ref, kitfile)
        check_new_release(store, kitfile.name, kitfile.version, plan.digest)
        if _stored(store, ref, plan):
            return plan, checked
    return pack(context, ref, store, kitfile_path, progress), checked


def attest_packed(store: Store, result: PackResult, context: Path, private_key: Any, started: dt.datetime) -> list[attest.Written]:
    """After signing a pack: its SBOM and SLSA provenance (bundler.trust.attest), signed with the same key, read
    from the context just packed."""
    return attest.attest_context(store, result.ref, context, {f.path: f.sha256 for f in result.files}, private_key, started)
