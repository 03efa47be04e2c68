"""GGUF bundles before any weights load: which files, their tokenizer metadata (the gate), pairing and memory.

Everything here reads GGUF headers (metadata and tensor shapes; no tensor data; `_Header` says why not with
the `gguf` package's reader),
except the probe check, which loads each file's vocabulary only (llama.cpp's `vocab_only`) to encode the
probe set through both models' own tokenizers.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import struct
from collections.abc import Mapping
from pathlib import Path

from bundler.errors import BundleError

# The tokenizer metadata that decides which ids a text becomes, compared field by field.
TOKENIZER_FIELDS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.eot_token_id",
)
PROBES = ("Hello, world!", "def add(a, b):\n    return a + b\n", "caf\u00e9 na\u00efve \u6771\u4eac \U0001f44d",
          "  leading spaces and\ttabs", "numbers 3.14159, 42 and 1,000,000", "<|im_start|>user\nhi<|im_end|>")


def gguf_files(directory: Path) -> list[Path]:
    """The *.gguf files directly in a role's directory."""
    return sorted(p for p in Path(directory).iterdir() if p.is_file() and p.name.endswith(".gguf"))


def has_safetensors(directory: Path) -> bool:
    return any(p.name.endswith(".safetensors") for p in Path(directory).iterdir())


def bundle_format(dirs: Mapping[str, Path]) -> str:
    """"gguf" when target and draft each hold one GGUF file, "safetensors" when neither holds any;
    a pair that mixes the two, or a role with several GGUF files, is refused (exit 6)."""
    kinds = {}
    for role in ("target", "draft"):
        files = gguf_files(dirs[role])
        if len(files) > 1:
            raise BundleError("invalid-bundle", f"the {role} holds {len(files)} GGUF files; a role holds one")
        if files and has_safetensors(dirs[role]):
            raise BundleError("invalid-bundle", f"the {role} holds both a GGUF and safetensors weights")
        kinds[role] = "gguf" if files else "safetensors"
    if kinds["target"] != kinds["draft"]:
        raise BundleError("invalid-bundle", f"the target is {kinds['target']} and the draft {kinds['draft']}: "
                          "a bundle pairs two GGUF files or two safetensors models, not one of each")
    return kinds["target"]


# GGUF metadata value types (the GGUF spec; gguf.GGUFValueType): struct formats of the fixed-size ones
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 8


class _Header:
    """A GGUF header read from its bytes, bounds-checked at every step.

    Why not gguf.GGUFReader: it builds numpy views for every element of every array, and a 49152-token
    vocabulary with its merges took 5 s per file on this CPU (10 of the 11.5 s before the GGUF demo's first
    token); this reads the same values in about 0.1 s. tests/test_gguf_bundle.py checks both agree."""

    def __init__(self, data: memoryview) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError(f"truncated at byte {self.at} (wants {n} more of {len(self.data)})")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return bytes(self.take(self.scalar("<Q"))).decode("utf-8", "replace")

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if count > len(self.data) - self.at:  # every element takes a byte at least
                raise ValueError(f"an array of {count} elements is longer than the file")
            if item in _SCALARS:  # one unpack for the whole array
                fmt = _SCALARS[item]
                return list(struct.unpack(f"<{count}{fmt[1]}", self.take(count * struct.calcsize(fmt))))
            return [self.value(item) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {kind}")


def _parse_header(path: Path) -> dict:
    from gguf.constants import GGML_QUANT_SIZES

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        h = _Header(memoryview(mapped))
        try:
            if bytes(h.take(4)) != b"GGUF":
                raise ValueError("no GGUF magic")
            version = h.scalar("<I")
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version} is not 2 or 3")
            n_tensors, n_kv = h.scalar("<Q"), h.scalar("<Q")
            metadata = {}
            for _ in range(n_kv):
                key = h.string()
                metadata[key] = h.value(h.scalar("<I"))
            tensors = {}
            for _ in range(n_tensors):
                name, n_dims = h.string(), h.scalar("<I")
                if n_dims > _MAX_DIMS:
                    raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
                shape = tuple(h.scalar("<Q") for _ in range(n_dims))
                kind, _offset = h.scalar("<I"), h.scalar("<Q")
                block, size = GGML_QUANT_SIZES[kind]
                count = math.prod(shape)
                tensors[name] = (shape, count // block * size)
        finally:
            h.data.release()
    return {"metadata": metadata, "tensors": tensors}


def read_header(path: Path) -> dict:
    """{"metadata": {key: value} (tokenizer fields and general.*/<arch>.* scalars), "tensors": {name: (shape,
    bytes)}} from a GGUF header; no tensor data is read."""
    try:
        header = _parse_header(Path(path))
    except (ValueError, KeyError, OSError, struct.error) as e:  # any parse failure is bad content, said once
        raise BundleError("invalid-bundle", f"{Path(path).name} is not a readable GGUF file: {e}") from None
    header["metadata"] = {k: v for k, v in header["metadata"].items() if k != "tokenizer.chat_template"}
    return header


def tokenizer_metadata(header: Mapping) -> dict:
    return {k: header["metadata"].get(k) for k in TOKENIZER_FIELDS}


def fingerprint(tokenizer: Mapping) -> str:
    """sha256 of the tokenizer metadata, canonical JSON: equal for files that tokenize alike."""
    return "sha256:" + hashlib.sha256(json.dumps(tokenizer, sort_keys=True).encode()).hexdigest()


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def difference(target: Mapping, draft: Mapping) -> str | None:
    """The first differing field, said precisely (which token, which merge), or None."""
    for key in TOKENIZER_FIELDS:
        a, b = target.get(key), draft.get(key)
        if a == b:
            continue
        name = key.removeprefix("tokenizer.ggml.")
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                return f"{name}: target has {len(a)}, draft {len(b)}"
            i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            what = {"tokens": "token", "token_type": "token type of", "merges": "merge"}.get(name, name)
            return f"{what} {i} differs: target {_short(a[i])} draft {_short(b[i])}"
        return f"{name} differs: target {_short(a)} draft {_short(b)}"
    return None


def _probe_ids(path: Path) -> list[list[int]]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return [llm.tokenize(p.encode(), add_bos=True, special=True) for p in PROBES]


def check_tokenizers(files: Mapping[str, Path], headers: Mapping[str, Mapping]) -> str:
    """The tokenizer gate for GGUF: the metadata field by field, then the probe set through both models'
    own llama.cpp tokenizers (vocabulary only, no weights). Returns the fingerprint; raises
    BundleError("tokenizer-mismatch") with the first difference."""
    target, draft = tokenizer_metadata(headers["target"]), tokenizer_metadata(headers["draft"])
    if target["tokenizer.ggml.tokens"] is None:
        raise BundleError("invalid-bundle", f"{files['target'].name} carries no tokenizer")
    found = difference(target, draft)
    if found:
        raise BundleError("tokenizer-mismatch", found)
    for probe, a, b in zip(PROBES, _probe_ids(files["target"]), _probe_ids(files["draft"])):
        if a != b:
            raise BundleError("tokenizer-mismatch", f"probe {probe!r} encodes to {a} on the target, {b} on the draft")
    return fingerprint(target)


def parameters(header: Mapping) -> int:
    count = 0
    for shape, _ in header["tensors"].values():
        n = 1
        for d in shape:
            n *= d
        count += n
    return count


def check_pairing(headers: Mapping[str, Mapping], params: Mapping) -> dict:
    """Same `general.architecture` (unless allow_cross_family), the same vocabulary size (the output
    tensor's rows), and the target at least min_size_ratio times the draft's parameters."""
    arch = {role: headers[role]["metadata"].get("general.architecture", "unknown") for role in ("target", "draft")}
    if arch["target"] != arch["draft"] and not params.get("allow_cross_family", False):
        raise BundleError("model-family", f"target is {arch['target']}, draft is {arch['draft']}: different model "
                          "families (set speculative.allow_cross_family in the Kitfile to allow)")
    vocab = {role: headers[role]["tensors"].get("token_embd.weight", ((0, 0), 0))[0][-1] for role in arch}
    if vocab["target"] != vocab["draft"]:
        raise BundleError("model-family", f"target embeds {vocab['target']} tokens, draft {vocab['draft']}")
    counts = {role: parameters(headers[role]) for role in arch}
    ratio = counts["target"] / max(counts["draft"], 1)
    min_ratio = float(params.get("min_size_ratio", 4))
    if ratio < min_ratio:
        raise BundleError("size-ratio", f"target has {counts['target']:,} parameters, draft {counts['draft']:,}: "
                          f"ratio {ratio:.2f} < {min_ratio:g} (speculative.min_size_ratio)")
    return {"target_family": arch["target"], "draft_family": arch["draft"], "target_parameters": counts["target"],
            "draft_parameters": counts["draft"], "size_ratio": ratio}


def estimate_memory(headers: Mapping[str, Mapping], n_ctx: int) -> dict:
    """Weights (tensor bytes as stored) plus each model's f16 KV cache for n_ctx positions."""
    weights = sum(b for h in headers.values() for _, b in h["tensors"].values())
    kv = 0
    for h in headers.values():
        m = h["metadata"]
        arch = m.get("general.architecture", "llama")
        layers, embd = int(m.get(f"{arch}.block_count", 0)), int(m.get(f"{arch}.embedding_length", 0))
        heads, kv_heads = int(m.get(f"{arch}.attention.head_count", 1)), int(m.get(f"{arch}.attention.head_count_kv", 0))
        kv_width = embd // max(heads, 1) * (kv_heads or heads)
        kv += 2 * layers * n_ctx * kv_width * 2  # K and V, f16
    overhead = 64 * 2**20  # llama.cpp's compute buffers and the binding's (measured order of magnitude)
    total = weights + kv + overhead
    return {"weights_bytes": weights, "kv_cache_bytes": kv, "activation_bytes": overhead, "loader_bytes": 0,
            "total_bytes": total, "predicted_peak_bytes": total}
