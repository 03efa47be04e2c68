"""ModelPack bundles made without our writer, and the directory a container runtime mounts from one.

`spec_shaped` lays a bundle context out as the specification's own example manifest and config do
(tests/data/modelpack/, from modelpack/model-spec at the commit SOURCE.md names): an OCI image manifest with
ModelPack's artifactType, tar layers of the example's media types (weights, weight configs, docs), one file
each, placed by `org.cncf.model.filepath`, and the Kitfile in kit's `ml.kitops.modelkit.kitfile` annotation.
`runtime_mount` writes what CRI-O shows a pod for an image volume of such an artefact: each raw layer's blob
as the file its path names, each tar layer unpacked, all read-only.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path

from bundler.format.manifest import Descriptor
from bundler.format.tarwrite import layer_files, write_layer
from bundler.store.layout import Store
from bundler.store.modelkit import load_modelkit
from bundler.store.refs import parse_ref

DATA = Path(__file__).parent / "data" / "modelpack"
EXAMPLE_MANIFEST = json.loads((DATA / "example-manifest.json").read_text())
EXAMPLE_CONFIG = json.loads((DATA / "example-config.json").read_text())
CONFIG_SCHEMA = json.loads((DATA / "config-schema.json").read_text())
# The example's layer media types, by what they hold.
_TYPES = {layer["mediaType"].split(".")[-3]: layer["mediaType"] for layer in EXAMPLE_MANIFEST["layers"]}
_TYPES.update({"config": "application/vnd.cncf.model.weight.config.v1.tar"})


def _media_type(path: str) -> str:
    if path.endswith((".safetensors", ".gguf")):
        return next(t for t in _TYPES.values() if t.endswith(".weight.v1.tar"))
    if "/" not in path:
        return next(t for t in _TYPES.values() if t.endswith(".doc.v1.tar"))
    return next(t for t in _TYPES.values() if t.endswith(".weight.config.v1.tar"))


def _blob(staging, data: bytes) -> str:
    return staging.add_bytes(data).digest


def spec_shaped(context: Path, store_dir: Path, ref: str, *, skip: tuple[str, ...] = (), kitfile: bool = True) -> str:
    """A ModelPack of `context` (its Kitfile's entries), one tar layer per file, as the spec's example is
    shaped; files under a path in `skip` left out. Returns the manifest digest."""
    store = Store(store_dir)
    kitfile_text = (context / "Kitfile").read_text()
    entries = [p for p in ("target", "draft", "tokenizer", "README.md") if (context / p).exists()]
    with store.transaction() as staging:
        layers = []
        for entry in entries:
            for name, _ in layer_files(context, entry):
                if any(name == s or name.startswith(s + "/") for s in skip):
                    continue
                writer = staging.writer(hashing=False)
                try:
                    result = write_layer(context, name, writer)
                finally:
                    writer.close()
                staging.add(writer, result.digest)
                layers.append({"mediaType": _media_type(name), "digest": result.digest, "size": result.size,
                               "annotations": {"org.cncf.model.filepath": name}})
        config = copy.deepcopy(EXAMPLE_CONFIG)
        config["descriptor"].update(name="tiny-spec", version="1.0.0")
        config["modelfs"]["diffIds"] = [layer["digest"] for layer in layers]
        config_bytes = json.dumps(config).encode()
        manifest = copy.deepcopy(EXAMPLE_MANIFEST)
        manifest["config"] = {**manifest["config"], "digest": _blob(staging, config_bytes), "size": len(config_bytes)}
        manifest["layers"] = layers
        if kitfile:
            manifest["annotations"] = {"ml.kitops.modelkit.kitfile": kitfile_text}
        manifest_bytes = json.dumps(manifest).encode()
        desc = Descriptor(manifest["mediaType"], _blob(staging, manifest_bytes), len(manifest_bytes))
        staging.commit()
        store.tag(parse_ref(ref), desc)
    return desc.digest


def runtime_mount(store_dir: Path, ref: str, dest: Path) -> Path:
    """The directory an image volume of `ref` shows a pod: each layer's file at its path, read-only."""
    store = Store(store_dir)
    mk = load_modelkit(store, parse_ref(ref))
    dest.mkdir(parents=True)
    for _, desc in mk.layers:
        blob = store.blob_path(desc.digest)
        if desc.media_type.endswith(".raw"):
            out = dest / desc.filepath
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(blob, out)
        else:
            with tarfile.open(blob) as tar:
                tar.extractall(dest, filter="data")
    for dirpath, dirnames, filenames in os.walk(dest, topdown=False):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
        os.chmod(dirpath, 0o555)
    return dest


def make_writable(root: Path) -> None:
    """Undo runtime_mount's read-only modes (a hostile variant changes the mount; the test removes it)."""
    for dirpath, _, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rewrite_manifest(store_dir: Path, ref: str, change) -> str:
    """Tag `ref` to a copy of its manifest that `change(manifest_dict)` altered in place (a hostile or broken
    variant); the blobs stay. Returns the new manifest digest."""
    store = Store(store_dir)
    parsed = parse_ref(ref)
    _, manifest = store.read_json_blob(store.resolve(parsed))
    change(manifest)
    data = json.dumps(manifest).encode()
    with store.transaction() as staging:
        desc = Descriptor(manifest["mediaType"], _blob(staging, data), len(data))
        staging.commit()
        store.tag(parsed, desc)
    return desc.digest
