"""What a model directory holds, read from config.json and safetensors headers without loading weights.

A safetensors file starts with an 8-byte little-endian header length and a JSON header naming each
tensor's dtype and shape, so parameter counts and memory needs are known before any weight is read.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from bundler.errors import BundleError

# Bytes per element for safetensors dtype names and for the dtypes a model may be loaded in.
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # a header larger than this is not a real checkpoint


def read_config(model_dir: Path) -> dict:
    """config.json of a Hugging Face model directory (the text part for multimodal configs)."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError("invalid-bundle", f"{path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError("invalid-bundle", f"{path} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise BundleError("invalid-bundle", f"{path} is not a JSON object")
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def safetensors_files(model_dir: Path) -> list[Path]:
    """The *.safetensors files of a model directory, sorted; refuses a directory without any."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise BundleError("invalid-bundle", f"{model_dir} holds no *.safetensors weights")
    return files


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """Tensor name -> {"dtype", "shape", "data_offsets"} from one safetensors file's header."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise BundleError("invalid-bundle", f"{path} is too short to be a safetensors file")
        (size,) = struct.unpack("<Q", raw)
        if size > MAX_HEADER_BYTES:
            raise BundleError("invalid-bundle", f"{path} declares a {size}-byte header: not a safetensors file")
        header = f.read(size)
    try:
        tensors = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BundleError("invalid-bundle", f"{path} has an unreadable safetensors header") from None
    tensors.pop("__metadata__", None)
    return tensors


def count_parameters(model_dir: Path) -> int:
    """Parameters in a model directory's safetensors files; a tied lm_head is counted once."""
    tied = read_config(model_dir).get("tie_word_embeddings", True)
    tensors: dict[str, dict] = {}
    for path in safetensors_files(model_dir):
        tensors.update(read_safetensors_header(path))
    has_embedding = any(name.endswith("embed_tokens.weight") for name in tensors)
    total = 0
    for name, info in tensors.items():
        if tied and has_embedding and name == "lm_head.weight":
            continue
        total += math.prod(info.get("shape", []))
    return total


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


def estimate_memory(target_dir: Path, draft_dir: Path, dtype: str, max_tokens: int) -> dict:
    """Memory to run the pair in `dtype` for `max_tokens` positions: both models' weights and KV caches.

    Returns {"weights_bytes", "kv_cache_bytes", "total_bytes", "target_parameters", "draft_parameters"}.
    """
    if dtype not in DTYPE_BYTES:
        raise BundleError("usage", f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
    element = DTYPE_BYTES[dtype]
    target_params, draft_params = count_parameters(target_dir), count_parameters(draft_dir)
    weights = (target_params + draft_params) * element
    kv = max_tokens * (
        _kv_bytes_per_token(read_config(target_dir), element) + _kv_bytes_per_token(read_config(draft_dir), element)
    )
    return {
        "weights_bytes": weights,
        "kv_cache_bytes": kv,
        "total_bytes": weights + kv,
        "target_parameters": target_params,
        "draft_parameters": draft_params,
        "dtype": dtype,
        "max_tokens": max_tokens,
    }
