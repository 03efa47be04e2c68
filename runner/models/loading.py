"""Loading only what was verified: safetensors weights, no remote code, no hub, the weights in memory once.

How a model loads (`load_model`):
1. each file (config.json, every *.safetensors shard) is read once into one buffer of its own size, with
   `os.preadv` into a preallocated bytearray; a weight file comes from its `FileRange`: the byte range it
   occupies inside its verified layer blob (`bundle run` extracts no weights), or the whole file on disk;
2. with `expected_sha256` (the signed file list) each buffer is hashed, in parallel threads (hashlib releases
   the GIL), and compared with the signed sha256: the bytes that load ARE the bytes hashed, so a blob or
   file changed after verification is refused ("digest-mismatch") instead of loaded;
3. tensors are views into those buffers (the safetensors header parsed, `torch.frombuffer`: no copy);
   a shard whose dtype differs from the run dtype is converted and its buffer dropped;
4. with `compact` (bundle run, serve) a model runner.models.compact_llama computes exactly (Llama, Qwen2, Mistral
   without sliding windows or RoPE scaling) whose tensors are exactly its checkpoint's is that forward over
   the tensors as they are: transformers is not even imported (about 4 s of imports on this CPU). Every other
   model is built by transformers from the verified config, on the meta device (no random initialisation),
   and takes the tensors as its parameters (`from_pretrained(None, state_dict=...)`: tied embeddings,
   non-persistent buffers and the dtype are transformers' own logic; no file is reopened).

`load_models` loads a target and its draft: the files of both are read and hashed in one pool of threads,
then the models are built one after the other. Peak memory is the weights in the run dtype once (plus the
files' bytes when they are stored in another dtype: they are all read before they are converted).

`LOADS` counts the models `load_model`/`load_models` were asked for, so a test can prove that a refusal came
before any weight was read.
"""

from __future__ import annotations

__all__ = ["LOADS", "ModelFiles", "check_weight_files", "load_model", "load_models", "torch_import_bytes"]

import hashlib
import json
import mmap
import os
import struct
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from core.errors import BundleError
from runner.checks.modelinfo import (FileRange, Ranges, check_dtype, config_from_dict, read_raw_config, rss_bytes, safetensors_files,
                                     validate_config)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
INDEX_FILE = "model.safetensors.index.json"
LOADS = 0  # calls to load_model in this process
# Bytes per read call: while torch is imported beside the reads, what the reading threads have put in their
# buffers is known to within this per thread (see `_import_torch`).
READ_CHUNK = 4 << 20
_torch_import_bytes: int | None = None  # what importing torch added to this process, once load_models measured it
# safetensors dtype names -> torch dtype names (the formats transformers checkpoints use)
TORCH_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}


def check_weight_files(model_dir: Path, role: str = "model", ranges: Ranges | None = None) -> None:
    """Refuses pickle-based weights anywhere in a model directory (they can run code when loaded), and
    safetensors shards that do not match the index (see `shard_files`)."""
    for path in sorted(Path(model_dir).rglob("*")):
        if path.suffix.lower() in PICKLE_SUFFIXES and path.is_file():
            raise BundleError(
                "pickle-weights",
                f"{role} holds {path.relative_to(model_dir)}: pickle-based weights are refused, use safetensors",
            )
    shard_files(model_dir, ranges)


def shard_files(model_dir: Path, ranges: Ranges | None = None) -> dict[Path, FileRange]:
    """The safetensors files of a model directory and where their bytes are (runner.checks.modelinfo); with an
    index, exactly the shards its weight_map names."""
    model_dir = Path(model_dir)
    files = safetensors_files(model_dir, ranges)
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (ValueError, UnicodeDecodeError, AttributeError):
            weight_map = None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise BundleError("invalid-bundle", f"{index} has no weight_map of tensor -> file")
        named, present = set(weight_map.values()), {f.name for f in files}
        if named != present:
            raise BundleError(
                "invalid-bundle",
                f"{index} names shards {sorted(named - present)[:3]} missing, or files {sorted(present - named)[:3]} it does not list",
            )
    return files


def torch_dtype(dtype: str):
    import torch

    return getattr(torch, check_dtype(dtype))


class ReadBytes:
    """Bytes the reading threads have put in their buffers so far."""

    def __init__(self) -> None:
        self.total, self._lock = 0, threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.total += n


def torch_import_bytes() -> int | None:
    """What importing torch added to this process's resident memory, as `load_models` measured it when it
    imported torch; None when torch came in elsewhere (or not yet)."""
    return _torch_import_bytes


def _import_torch(dtype: str, read: ReadBytes):
    """torch_dtype(dtype). When that imports torch, what the import added to the resident memory is measured:
    what the memory grew by, less what the reading threads put in their buffers meanwhile."""
    global _torch_import_bytes
    if "torch" in sys.modules:
        return torch_dtype(dtype)
    before, read_before = rss_bytes(), read.total
    dt = torch_dtype(dtype)
    _torch_import_bytes = max(0, rss_bytes() - before - (read.total - read_before))
    return dt


def _buffer(size: int) -> mmap.mmap | bytearray:
    """A writable buffer of `size` bytes: private anonymous memory, its pages mapped as the read fills them.
    Not MAP_POPULATE: populating up front was slower and far less steady than faulting the pages in during the
    parallel read and hash; a bytearray first zeroes every byte in Python (docs/benchmarks.md)."""
    if size and hasattr(mmap, "MAP_PRIVATE"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return bytearray(size)


def _read_once(path: Path, where: FileRange, want: str | None, read: ReadBytes | None = None) -> mmap.mmap | bytearray:
    """The file's bytes in one buffer, read once from `where`; hashed against `want` (sha256 hex) when given.
    `read` counts the bytes as they come."""
    buf = _buffer(where.length)
    view, done = memoryview(buf), 0
    with open(where.path, "rb", buffering=0) as f:
        while done < where.length:  # preadv may return less than asked
            n = os.preadv(f.fileno(), [view[done : done + READ_CHUNK]], where.offset + done)
            if not n:
                raise BundleError("digest-mismatch", f"{_shown(path, where)} changed after verification: shorter than it was")
            done += n
            if read is not None:
                read.add(n)
    view.release()  # an mmap with a view still exported could not be closed when its tensors go
    if want is not None:
        got = hashlib.sha256(buf).hexdigest()
        if got != want.removeprefix("sha256:"):
            raise BundleError("digest-mismatch", f"{_shown(path, where)} changed after verification: sha256 {got}")
    return buf


def _shown(path: Path, where: FileRange) -> str:
    """A file for a message: its path, and the blob bytes it was read from when it lies inside a blob."""
    if where.path == path:
        return str(path)
    return f"{path} (bytes {where.offset}-{where.offset + where.length} of {where.path})"


def _expected(expected: Mapping[str, str] | None, path: Path) -> str | None:
    if expected is None:
        return None
    want = expected.get(path.name)
    if want is None:
        raise BundleError("extra-file", f"{path} is not among the verified files")
    return want


def tensors_from_buffer(buf: mmap.mmap | bytearray, name: str) -> dict:
    """The tensors of one safetensors file held in `buf`, as views into it (no copy)."""
    import torch

    if len(buf) < 8:
        raise BundleError("invalid-bundle", f"{name} is too short to be a safetensors file")
    (size,) = struct.unpack("<Q", buf[:8])
    if 8 + size > len(buf):
        raise BundleError("invalid-bundle", f"{name} declares a header longer than the file")
    try:
        header = json.loads(bytes(buf[8 : 8 + size]))
    except (ValueError, UnicodeDecodeError):
        raise BundleError("invalid-bundle", f"{name} has an unreadable safetensors header") from None
    if not isinstance(header, dict):
        raise BundleError("invalid-bundle", f"{name} has an unreadable safetensors header")
    header.pop("__metadata__", None)
    base, out = 8 + size, {}
    for key, info in header.items():
        try:
            dtype = getattr(torch, TORCH_DTYPES[info["dtype"]])
            shape = [int(d) for d in info["shape"]]
            start, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise BundleError("invalid-bundle", f"{name}: tensor {key!r} has an unusable header entry") from None
        count = 1
        for d in shape:
            count *= d
        if start < 0 or end != start + count * dtype.itemsize or base + end > len(buf) or min(shape, default=1) < 0:
            raise BundleError("invalid-bundle", f"{name}: tensor {key!r} lies outside the file or has the wrong size")
        if count == 0:
            out[key] = torch.empty(shape, dtype=dtype)
        else:
            out[key] = torch.frombuffer(buf, dtype=dtype, count=count, offset=base + start).view(shape)
    return out


@dataclass(frozen=True)
class ModelFiles:
    """One model to load: its directory, its role (for messages), the signed sha256 of its files (file name
    -> hex; None: not checked) and its weight files that lie inside layer blobs (see runner.checks.modelinfo)."""

    model_dir: Path
    role: str = "model"
    expected_sha256: Mapping[str, str] | None = None
    ranges: Ranges | None = None


def load_model(
    model_dir: Path, dtype: str, device: str, *, expected_sha256: Mapping[str, str] | None = None, role: str = "model",
    ranges: Ranges | None = None,
):
    """A causal LM from a verified directory: safetensors only, trust_remote_code=False, nothing from a hub.

    `expected_sha256`: file name in the directory -> sha256 hex, as the signature lists them; when given,
    config.json and every weight file are hashed from the very buffers the model is built from (see the
    module docstring). `ranges`: weight files that are not on disk but inside layer blobs (path as if
    extracted -> FileRange). Raises BundleError: "digest-mismatch" for a changed file or blob,
    "invalid-bundle" for a config or checkpoint that does not fit.
    """
    return load_models([ModelFiles(Path(model_dir), role, expected_sha256, ranges)], dtype, device)[0]


def load_models(models: Sequence[ModelFiles], dtype: str, device: str, compact: bool = False) -> list:
    """Several models (a target and its draft) as `load_model` loads each, the files of all of them read and
    hashed in one pool of threads (so a small draft's files do not wait, one core idle, for the target),
    then built one after another. Every model's files are checked before any is read. `compact`: a model
    runner.models.compact_llama computes exactly comes back as a CompactLlama built without transformers (step 4)."""
    global LOADS
    LOADS += len(models)
    check_dtype(dtype)  # before anything is read; torch is imported (torch_dtype) while the files are
    plans: list[tuple[ModelFiles, dict[Path, FileRange]]] = []
    reads: list[tuple[Path, FileRange, str | None]] = []
    for model in models:
        check_weight_files(model.model_dir, model.role, model.ranges)
        shards = shard_files(model.model_dir, model.ranges)
        config_path = model.model_dir / "config.json"
        if not config_path.is_file():
            raise BundleError("invalid-bundle", f"{model.role} has no config.json")
        # config.json is hashed with the weights, from the buffer it is parsed from.
        files = {config_path: FileRange.whole(config_path), **shards}
        # an unverified file is refused before anything is read
        reads += [(path, where, _expected(model.expected_sha256, path)) for path, where in files.items()]
        plans.append((model, shards))
    # largest first: the threads then finish together
    order = sorted(range(len(reads)), key=lambda i: -reads[i][1].length)
    workers = max(1, min(len(reads), os.cpu_count() or 1))
    read = ReadBytes()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending = {i: pool.submit(_read_once, *reads[i], read) for i in order}
        dt = _import_torch(dtype, read)  # the first torch import of a `bundle run` on a CPU build: while the files are read
        for model in models:  # while the files are read and hashed (no GIL held there)
            _import_classes(model.model_dir, compact)
        done = {i: future.result() for i, future in pending.items()}
    buffers = [done.pop(i) for i in range(len(reads))]
    built = []
    for model, shards in plans:
        mine, buffers = buffers[: 1 + len(shards)], buffers[1 + len(shards) :]
        built.append(_build(model.role, mine, shards, dt, device, compact).eval())
    return built


def _import_classes(model_dir: Path, compact: bool) -> None:
    """Imports transformers' config and model classes for the model's type, unless the compact forward will
    run it. The imports take ~3 s of one core (transformers pulls in torch.distributed and dynamo with them)
    and need no weights: done while the weights are read and hashed, they hide part of that read. The config
    comes from config.json as written; it only chooses what to import, and anything wrong with it is reported
    by _build, from the verified bytes."""
    try:
        from runner.models.compact_llama import compact_config

        raw = read_raw_config(model_dir)
        if compact and compact_config(raw) is not None:
            return
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        MODEL_FOR_CAUSAL_LM_MAPPING[CONFIG_MAPPING[raw["model_type"]]]
    except Exception:  # noqa: BLE001 - only a head start; _build reports what is wrong
        pass


def _build(role: str, buffers: list, shards: Mapping[Path, FileRange], dt, device: str, compact: bool):
    """The model from its verified buffers: config.json's first, then each shard's, in `shards`' order."""
    try:
        config_dict = json.loads(bytes(buffers.pop(0)))
    except (ValueError, UnicodeDecodeError):
        raise BundleError("invalid-bundle", f"{role} config.json is not valid JSON") from None
    validate_config(config_dict, role)
    state_dict: dict = {}
    for path in shards:
        tensors = tensors_from_buffer(buffers.pop(0), f"{role} {path.name}")
        for key, tensor in tensors.items():
            if key in state_dict:
                raise BundleError("invalid-bundle", f"{role}: tensor {key!r} is in more than one shard")
            # A shard in another dtype is converted now, so its buffer is freed before the next one's turn.
            state_dict[key] = tensor.to(dt) if tensor.is_floating_point() and tensor.dtype != dt else tensor
        del tensors
    if compact:
        from runner.models import compact_llama, packed

        config = compact_llama.compact_config(config_dict)
        weights = config and compact_llama.weights_from_state_dict(config, {k: v.to(device) for k, v in state_dict.items()})
        if weights is not None:  # laid out for the CPU's matrix kernel where that is measured to pay (runner.models.packed)
            return compact_llama.CompactLlama(packed.pack(weights))
    return _from_state_dict(config_from_dict(config_dict, role), state_dict, dt, role).to(device)


def _from_state_dict(config, state_dict: dict, dt, role: str):
    """The model transformers builds for `config` on the meta device, taking `state_dict`'s tensors as its
    parameters (no random initialisation, no copy when the dtypes agree)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr is for the one error line
    hf_logging.set_verbosity_error()
    try:
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        raise BundleError("invalid-bundle", f"{role}: transformers has no causal LM for model_type {config.model_type!r}") from None
    try:
        model, info = cls.from_pretrained(
            None, config=config, state_dict=state_dict, dtype=dt, output_loading_info=True, trust_remote_code=False
        )
    except RuntimeError as e:  # transformers raises it for tensors whose shapes do not fit the config
        raise BundleError("invalid-bundle", f"{role}: weights do not fit config.json: {str(e).splitlines()[0]}") from None
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = set(info.get("missing_keys", ())) - tied
    unexpected, mismatched = info.get("unexpected_keys", ()), info.get("mismatched_keys", ())
    if missing or unexpected or mismatched:
        raise BundleError(
            "invalid-bundle",
            f"{role}: weights do not fit config.json (missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}, "
            f"wrong shape {sorted(str(m[0]) if isinstance(m, tuple) else str(m) for m in mismatched)[:3]})",
        )
    return model
