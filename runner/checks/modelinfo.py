"""What a model directory holds, read from config.json and safetensors headers without loading weights.

A safetensors file starts with an 8-byte little-endian header length and a JSON header naming each
tensor's dtype and shape, so parameter counts and memory needs are known before any weight is read.

A weight file need not be on disk as a file of its own: `bundle run` leaves each *.safetensors file inside
its verified layer blob (an uncompressed tar, so the file is one contiguous byte range of it) and hands over
a `FileRange` per file, keyed by the path the file would have if extracted. Every function here that reads
weight files takes those `ranges`; a file on disk is the range of its whole size.
"""

from __future__ import annotations

__all__ = [
    "COMPACT_ARCHITECTURES", "FileRange", "INT_FIELDS", "POSITIVE_FLOAT_FIELDS", "Ranges", "check_dtype",
    "config_from_dict", "count_parameters", "estimate_memory", "read_config", "read_raw_config",
    "read_safetensors_header", "rss_bytes", "safetensors_files", "validate_config",
]

import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.errors import BundleError

# Bytes per element for safetensors dtype names and for the dtypes a model may be loaded in.
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # a header larger than this is not a real checkpoint


def read_config(model_dir: Path) -> dict:
    """config.json of a Hugging Face model directory (the text part for multimodal configs)."""
    config = read_raw_config(model_dir)
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def read_raw_config(model_dir: Path) -> dict:
    """config.json of a Hugging Face model directory, as written."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError("invalid-bundle", f"{path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError("invalid-bundle", f"{path} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise BundleError("invalid-bundle", f"{path} is not a JSON object")
    return config


@dataclass(frozen=True)
class FileRange:
    """Where one file's bytes are: `length` bytes from `offset` of the file at `path`: a weight file inside
    a layer blob, or a plain file (offset 0, its whole size)."""

    path: Path
    offset: int
    length: int

    @classmethod
    def whole(cls, path: Path) -> FileRange:
        """A plain file, as it is now."""
        return cls(Path(path), 0, Path(path).stat().st_size)

    def read(self, start: int, n: int) -> bytes:
        """Up to n bytes from `start` within the range (fewer at its end, or where the file is shorter)."""
        n = max(0, min(n, self.length - start))
        with open(self.path, "rb", buffering=0) as f:
            return os.pread(f.fileno(), n, self.offset + start)


# A weight file's path as if extracted (model_dir / name) -> where its bytes are.
Ranges = Mapping[Path, FileRange]


def safetensors_files(model_dir: Path, ranges: Ranges | None = None) -> dict[Path, FileRange]:
    """The *.safetensors files of a model directory, sorted by name, each with where its bytes are: the
    range `ranges` gives for it, else the file on disk. Refuses a directory without any."""
    model_dir = Path(model_dir)
    found = {p: FileRange.whole(p) for p in model_dir.glob("*.safetensors")}
    found.update({p: r for p, r in (ranges or {}).items() if p.parent == model_dir and p.name.endswith(".safetensors")})
    if not found:
        raise BundleError("invalid-bundle", f"{model_dir} holds no *.safetensors weights")
    return dict(sorted(found.items()))


def read_safetensors_header(path: Path, where: FileRange | None = None) -> dict[str, dict]:
    """Tensor name -> {"dtype", "shape", "data_offsets"} from one safetensors file's header (read from
    `where` when given, else from the file at `path`)."""
    where = where or FileRange.whole(path)
    raw = where.read(0, 8)
    if len(raw) != 8:
        raise BundleError("invalid-bundle", f"{path} is too short to be a safetensors file")
    (size,) = struct.unpack("<Q", raw)
    if size > MAX_HEADER_BYTES:
        raise BundleError("invalid-bundle", f"{path} declares a {size}-byte header: not a safetensors file")
    header = where.read(8, size)
    try:
        tensors = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BundleError("invalid-bundle", f"{path} has an unreadable safetensors header") from None
    tensors.pop("__metadata__", None)
    return tensors


def count_parameters(model_dir: Path, ranges: Ranges | None = None) -> int:
    """Parameters in a model directory's safetensors files; a tied lm_head is counted once."""
    tied = read_config(model_dir).get("tie_word_embeddings", True)
    tensors: dict[str, dict] = {}
    for path, where in safetensors_files(model_dir, ranges).items():
        tensors.update(read_safetensors_header(path, where))
    has_embedding = any(name.endswith("embed_tokens.weight") for name in tensors)
    total = 0
    for name, info in tensors.items():
        if tied and has_embedding and name == "lm_head.weight":
            continue
        total += math.prod(info.get("shape", []))
    return total


# config.json fields the loader and the preflight size things with: (lowest, highest) accepted integer.
INT_FIELDS = {
    "vocab_size": (1, 2**31 - 1),
    "hidden_size": (1, 2**20),
    "intermediate_size": (1, 2**22),
    "num_hidden_layers": (1, 4096),
    "num_attention_heads": (1, 4096),
    "num_key_value_heads": (1, 4096),
    "head_dim": (1, 2**16),
    "max_position_embeddings": (1, 2**30),
    "sliding_window": (1, 2**30),
}
REQUIRED_INT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
POSITIVE_FLOAT_FIELDS = ("rms_norm_eps", "layer_norm_eps", "rope_theta")


# The model types runner.models.compact_llama runs (transformers' causal LMs all three): checking them needs no
# transformers import (seconds: docs/benchmarks.md).
COMPACT_ARCHITECTURES = ("llama", "qwen2", "mistral")


def _transformers_causal_lm(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in CONFIG_MAPPING and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def validate_config(config: dict, role: str) -> None:
    """Types and ranges of the config.json fields that size a model, and a model_type transformers builds
    as a causal LM without remote code; raises BundleError "invalid-bundle" (exit 6) before anything is built.
    """
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise BundleError("invalid-bundle", f"{role} config.json has no model_type")
    if model_type not in COMPACT_ARCHITECTURES and not _transformers_causal_lm(model_type):
        raise BundleError("invalid-bundle", f"{role} config.json model_type {model_type!r} is not a causal LM transformers knows (remote code is never run)")
    text = config.get("text_config")
    fields = {**config, **text} if isinstance(text, dict) else config
    for name in REQUIRED_INT_FIELDS:
        if fields.get(name) is None:
            raise BundleError("invalid-bundle", f"{role} config.json lacks {name}")
    for name, (low, high) in INT_FIELDS.items():
        value = fields.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise BundleError("invalid-bundle", f"{role} config.json {name} is {value!r}: an integer is required")
        if not low <= value <= high:
            raise BundleError("invalid-bundle", f"{role} config.json {name} {value} is out of range [{low}, {high}]")
    for name in POSITIVE_FLOAT_FIELDS:
        value = fields.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf):
            raise BundleError("invalid-bundle", f"{role} config.json {name} is {value!r}: a positive number is required")
    heads, kv_heads = fields["num_attention_heads"], fields.get("num_key_value_heads") or fields["num_attention_heads"]
    if heads % kv_heads:
        raise BundleError("invalid-bundle", f"{role} config.json: {heads} attention heads do not split into {kv_heads} key/value heads")
    if not fields.get("head_dim") and fields["hidden_size"] % heads:
        raise BundleError("invalid-bundle", f"{role} config.json: hidden_size {fields['hidden_size']} does not split into {heads} heads")
    tie = config.get("tie_word_embeddings")
    if tie is not None and not isinstance(tie, bool):
        raise BundleError("invalid-bundle", f"{role} config.json tie_word_embeddings is {tie!r}: true or false")


def config_from_dict(config: dict, role: str):
    """transformers' config object for a validated config.json dict (never remote code)."""
    from transformers import AutoConfig

    rest = dict(config)
    model_type = rest.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **rest)
    except (ValueError, TypeError, KeyError) as e:
        raise BundleError("invalid-bundle", f"{role} config.json is not a usable {model_type} config: {e}") from None


def config_parameters(config: dict) -> int:
    """Parameters a model of this config.json holds, computed from its sizes alone (no weights read):
    embeddings, a separate head when untied, attention (with q/k/v biases when the config says so), MLP, norms."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    inter = config.get("intermediate_size") or 4 * hidden
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    if config.get("attention_bias") or config.get("model_type") == "qwen2":
        attention += head_dim * (heads + 2 * kv_heads)
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    return embeddings + config["num_hidden_layers"] * per_layer + hidden


def _kv_bytes_per_token(config: dict, element_bytes: int) -> int:
    """Keys and values of every layer for one token."""
    layers = config.get("num_hidden_layers") or config.get("n_layer") or config.get("num_layers")
    heads = config.get("num_attention_heads") or config.get("n_head")
    hidden = config.get("hidden_size") or config.get("n_embd")
    if not (layers and heads and hidden):
        raise BundleError("invalid-bundle", "config.json lacks num_hidden_layers, num_attention_heads or hidden_size")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    return 2 * layers * kv_heads * head_dim * element_bytes


def _activation_bytes(config: dict, element_bytes: int, prompt_tokens: int, step_tokens: int) -> int:
    """The largest transient tensors of a forward pass: one layer's hidden states and MLP for the prompt
    (all at once in the prefill), and float32 logits over the vocabulary for the tokens a pass scores."""
    hidden = config.get("hidden_size") or 0
    inter = config.get("intermediate_size") or 4 * hidden
    layer = prompt_tokens * (4 * hidden + 3 * inter) * element_bytes
    logits = 3 * step_tokens * (config.get("vocab_size") or 0) * 4  # logits, their float32 copy, softmax
    return layer + logits


def _loader_bytes(model_dir: Path, element_bytes: int, ranges: Ranges | None = None) -> int:
    """Memory runner.models.loading holds beyond the weights: the buffers of shards stored in another dtype than
    the run's (all shards of target and draft are read, in parallel, before they are converted); else
    nothing (the tensors are views of the buffers)."""
    extra = 0
    for path, where in safetensors_files(model_dir, ranges).items():
        tensors = read_safetensors_header(path, where)
        if any(SAFETENSORS_DTYPE_BYTES.get(t.get("dtype"), 0) != element_bytes for t in tensors.values()):
            extra += where.length
    return extra


def check_dtype(dtype: str) -> str:
    """`dtype` if it is a run dtype (DTYPE_BYTES), else a usage error (exit 2)."""
    if dtype not in DTYPE_BYTES:
        raise BundleError("usage", f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
    return dtype


def rss_bytes() -> int:
    """This process's resident memory now (the baseline before loading: Python, and torch when imported)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def estimate_memory(
    target_dir: Path, draft_dir: Path | None, dtype: str, max_tokens: int, *, prompt_tokens: int | None = None, draft_tokens: int = 5,
    ranges: Ranges | None = None,
) -> dict:
    """Memory to run the pair in `dtype` for `max_tokens` positions, from config.json and safetensors headers
    only: both models' weights (the larger of what the headers hold and what the config implies: a config
    that would allocate more than its files hold is sized by the config), KV caches, activations, and the
    loader's own overhead. `total_bytes` is what the run adds; `predicted_peak_bytes` adds this process's
    resident memory now (what `bundle run` peaks at; runner.run.load_pair adds torch's import when it comes
    later, during the read, as measured there). `ranges`: weight files left in layer blobs.
    """
    element = DTYPE_BYTES[check_dtype(dtype)]
    prompt_tokens = max_tokens if prompt_tokens is None else prompt_tokens
    models = {"target": target_dir, **({"draft": draft_dir} if draft_dir is not None else {})}  # no draft: draft-free speculation
    configs = {role: read_config(directory) for role, directory in models.items()}
    params, activations, loader = {"draft": 0}, 0, 0
    for role, directory in models.items():
        config = configs[role]
        from_config = config_parameters(config) if all(config.get(k) for k in REQUIRED_INT_FIELDS) else 0
        params[role] = max(count_parameters(directory, ranges), from_config)
        activations = max(activations, _activation_bytes(config, element, prompt_tokens, draft_tokens + 1))
        loader += _loader_bytes(directory, element, ranges)  # both models' files are read before either is converted
    weights = (params["target"] + params["draft"]) * element
    kv = max_tokens * sum(_kv_bytes_per_token(config, element) for config in configs.values())
    total = weights + kv + activations + loader
    return {
        "weights_bytes": weights,
        "kv_cache_bytes": kv,
        "activation_bytes": activations,
        "loader_bytes": loader,
        "total_bytes": total,
        "baseline_bytes": (baseline := rss_bytes()),
        "predicted_peak_bytes": total + baseline,
        "target_parameters": params["target"],
        "draft_parameters": params["draft"],
        "dtype": dtype,
        "max_tokens": max_tokens,
    }
