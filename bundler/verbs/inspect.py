"""`bundle inspect` and `bundle list`: what a bundle holds, who signed it, what it needs to run."""

from __future__ import annotations

__all__ = ["inspect_bundle"]

import contextlib
import posixpath
import struct
import tempfile
from pathlib import Path
from typing import Any, Mapping

from bundler.format import metadatacheck

from bundler.trust import signature
from core.errors import BundleError
from bundler.format.layerread import TOKENIZER_FILES
from bundler.store.modelkit import ModelKit, load_modelkit
from bundler.store.refs import Ref
from bundler.store.referrers import find_signatures
from bundler.store.layout import Store
from bundler.format.modelpack import layer_members
from bundler.trust.verify import verify_bundle

MAX_METADATA_FILE = 64 << 20
MAX_SAFETENSORS_HEADER = metadatacheck.MAX_SAFETENSORS_HEADER
MAX_GGUF_HEADER = 64 << 20  # the first bytes of a GGUF file kept for its header (metadata, tensor infos); a longer header reads as cut
METADATA_FILES = TOKENIZER_FILES | {"config.json", "generation_config.json"}


def metadata_view(store: Store, mk: ModelKit, dest: Path) -> None:
    """Write the small files of a bundle and the headers of its safetensors files (enough to count parameters)."""
    for spec, desc in mk.layers:
        with open(store.blob_path(desc.digest), "rb") as f:
            for member, content in layer_members(f, desc, spec.path):
                if member.kind != "file" or content is None:
                    continue
                base = posixpath.basename(member.name)
                out = dest / member.name
                if base in METADATA_FILES and member.size <= MAX_METADATA_FILE:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(content.read())
                elif base.endswith(".gguf"):  # the header (metadata, tensor shapes) is at the start: no weights
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(content.read(min(member.size, MAX_GGUF_HEADER)))
                elif base.endswith(".safetensors") and member.size >= 8:
                    head = content.read(8)
                    (n,) = struct.unpack("<Q", head)
                    # A header too large, or larger than its file, is kept without its body: metadatacheck says so.
                    body = content.read(n) if n <= min(MAX_SAFETENSORS_HEADER, member.size - 8) else b""
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(head + body)


def inspect_bundle(store: Store, ref: Ref, trusted: Mapping[str, Any], max_tokens: int = 2048) -> dict[str, Any]:
    """A JSON-ready description: manifest, layers with roles, signer and verification state, tokenizer, sizes."""
    from runner.checks import gguf_model, modelinfo, tokenizer_gate  # the runner reads model and tokenizer files; imported late (torch-free)

    mk = load_modelkit(store, ref)
    roles = mk.kitfile.role_paths()
    claimed = [c for _, payload in find_signatures(store, mk.digest) if (c := signature.read_unverified(payload))]
    report = verify_bundle(store, ref, trusted, record=False)
    out: dict[str, Any] = {
        "ref": str(ref),
        "digest": mk.digest,
        "package": mk.kitfile.data["package"],
        "format": mk.format,
        "manifest": mk.manifest,
        "layers": [
            {"role": spec.role, "path": spec.path, "mediaType": desc.media_type, "digest": desc.digest, "size": desc.size} for spec, desc in mk.layers
        ],
        "roles": roles,
        "parameters": mk.kitfile.parameters,
        "signatures": [{"key_id": c.key_id, "created": c.bundle.get("created"), "expires": c.bundle.get("expires")} for c in claimed],
        "verification": {"ok": report.ok, "signer": report.signer, "error": report.error.line() if report.error else None},
        "size_bytes": sum(desc.size for _, desc in mk.layers),
    }
    passed = {c.name for c in report.checks if c.ok}
    if not {"manifest", "blobs", "roles"} <= passed:
        # Files of a bundle whose integrity checks failed are hostile input: metadata only, never parsed.
        # (An unsigned but intact bundle is read through the bounded metadata view below.)
        why = "not read: the bundle did not verify"
        out["tokenizer"] = {"fingerprint": None, "error": why}
        out["models"] = {"error": why}
        return out
    with tempfile.TemporaryDirectory(prefix="specbundle-inspect-") as tmp:
        view = Path(tmp)
        metadata_view(store, mk, view)
        models = {role: view / roles[role] for role in ("target", "draft") if role in roles}  # no draft: draft-free speculation
        if all(d.is_dir() and gguf_model.gguf_files(d) for d in models.values()):
            out.update(_gguf_view(models, max_tokens))
            return out
        try:
            metadatacheck.check_roles(view, roles)  # hostile shapes refused before the runner's readers see them
        except BundleError as err:
            out["tokenizer"] = {"fingerprint": None, "error": err.line()}
            out["models"] = {"error": err.line()}
            out["error"] = {"code": err.code, "message": err.message}
            return out
        try:
            out["tokenizer"] = {"fingerprint": tokenizer_gate.fingerprint(view / roles["tokenizer"])}
        except BundleError as err:
            out["tokenizer"] = {"fingerprint": None, "error": err.line()}
        dtype = str(mk.kitfile.parameters.get("dtype", "float32"))
        try:
            out["models"] = {role: {"parameters": modelinfo.count_parameters(directory)} for role, directory in models.items()}
            out["memory"] = {"dtype": dtype, "max_tokens": max_tokens,
                             **modelinfo.estimate_memory(models["target"], models.get("draft"), dtype, max_tokens)}
        except BundleError as err:
            out["models"] = {"error": err.line()}
    return out


def _gguf_view(dirs: Mapping[str, Path], max_tokens: int) -> dict[str, Any]:
    """tokenizer, models and memory of a GGUF bundle from its files' headers. The fingerprint is the one
    `bundle run` reports and gates on: the target GGUF file's own tokenizer metadata (runner.checks.gguf_model),
    which is what llama.cpp tokenizes with; a `tokenizer` role beside it is not used by a GGUF run."""
    from runner.checks import gguf_header, gguf_model, gguf_tokenizer_gate

    try:
        headers = {role: gguf_header.read_header(gguf_model.gguf_files(d)[0]) for role, d in dirs.items()}
    except BundleError as err:
        return {"tokenizer": {"fingerprint": None, "error": err.line()}, "models": {"error": err.line()}}
    out: dict[str, Any] = {
        "tokenizer": {"fingerprint": gguf_tokenizer_gate.fingerprint(gguf_tokenizer_gate.tokenizer_metadata(headers["target"])),
                      "source": "target GGUF metadata"},
        "models": {role: {"parameters": gguf_model.parameters(h)} for role, h in headers.items()},
    }
    with contextlib.suppress(BundleError):  # sizes of the wrong type: no estimate, as for safetensors
        out["memory"] = {"dtype": "gguf", "engine": "llama.cpp", "max_tokens": max_tokens,
                         **gguf_model.estimate_memory(headers, max_tokens)}
    return out
