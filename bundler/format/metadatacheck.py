"""Bundle metadata checked within bounds before anything trusts it.

`inspect` of an unsigned or untrusted bundle, verify's tokenizer-copy check (before the signature), and pack,
init and sign (on a model directory as downloaded) read tokenizer.json, tokenizer_config.json,
special_tokens_map.json, config.json and safetensors headers. Those readers (runner.checks.tokenizer_gate,
runner.checks.modelinfo) assume the shapes real files have; a hostile file (a token id of 2**40, a nesting bomb, a
header that is a list, a shape that is a string) would make them allocate without bound or fail with
MemoryError, RecursionError or TypeError. Every such file is checked here first, read through
bundler.format.boundedjson, and refused as `invalid-bundle` (exit 6) naming the file and the field.
"""

from __future__ import annotations

__all__ = ["MAX_SAFETENSORS_HEADER", "check_roles", "check_tree"]

import struct
from pathlib import Path
from typing import Any

from bundler.format import boundedjson
from core.errors import BundleError

MAX_JSON_FILE = 64 << 20  # the largest real tokenizer.json files are ~35 MB
# Real metadata nests under 10 deep; the tokenizer library refuses deeper than 128, Python recurses ~1000.
MAX_DEPTH = 64
# Containers ('[' and '{') in one file, counted before parsing: JSON made of tiny containers costs ~20x its
# size in memory; a real tokenizer.json has one per merge (500k at most seen) and few else.
MAX_CONTAINERS = 4_000_000
MAX_TOKEN_ID = 1 << 22  # ids index a list (the vocabulary); the largest real vocabularies are ~10x smaller
MAX_SAFETENSORS_HEADER = 16 << 20  # a header names each tensor in ~150 bytes: 100k tensors per file
MAX_DIMS = 16
MAX_DIM = 1 << 40

TOKENIZER_JSON = "tokenizer.json"
OBJECT_FILES = ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json", "config.json")
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _refuse(path: Path, what: str) -> BundleError:
    return BundleError("invalid-bundle", f"{path}: {what}")


def _read(path: Path) -> Any:
    data = boundedjson.read_regular(path, MAX_JSON_FILE, "metadata file")
    if data.count(b"[") + data.count(b"{") > MAX_CONTAINERS:
        raise _refuse(path, f"more than {MAX_CONTAINERS} JSON arrays and objects")
    return boundedjson.loads(data, str(path), max_bytes=MAX_JSON_FILE, max_depth=MAX_DEPTH)


def _int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _object(path: Path, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _refuse(path, f"is a JSON {type(value).__name__}, not an object")
    return value


def check_tokenizer_json(path: Path) -> None:
    """The parts of tokenizer.json runner.checks.tokenizer_gate reads: model type, vocabulary ids, merges, added tokens."""
    data = _object(path, _read(path))
    model = data.get("model")
    if model is None:
        model = {}
    if not isinstance(model, dict):
        raise _refuse(path, "model is not an object")
    if not isinstance(model.get("type", ""), (str, type(None))):
        raise _refuse(path, "model.type is not a string")
    vocab = model.get("vocab", {})
    if isinstance(vocab, dict):
        bad = next((t for t, i in vocab.items() if not _int(i, 0, MAX_TOKEN_ID)), None)
        if bad is not None:
            raise _refuse(path, f"vocabulary id of {bad[:40]!r} is {str(vocab[bad])[:40]}: ids are integers in [0, {MAX_TOKEN_ID})")
    elif isinstance(vocab, list):
        if len(vocab) > MAX_TOKEN_ID:
            raise _refuse(path, f"more than {MAX_TOKEN_ID} vocabulary entries")
        if not all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and _number(e[1]) for e in vocab):
            raise _refuse(path, "a vocabulary entry is not a [token, score] pair")
    else:
        raise _refuse(path, "model.vocab is neither an object nor a list")
    merges = model.get("merges", [])
    if not isinstance(merges, list) or not all(
            isinstance(m, str) or (isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m)) for m in merges):
        raise _refuse(path, "model.merges is not a list of merges (strings or pairs of strings)")
    added = data.get("added_tokens")
    if added is not None:
        if not isinstance(added, list):
            raise _refuse(path, "added_tokens is not a list")
        for token in added:
            if not isinstance(token, dict) or not _int(token.get("id"), 0, MAX_TOKEN_ID) or not isinstance(token.get("content"), str):
                raise _refuse(path, f"an added token is not {{\"id\": integer in [0, {MAX_TOKEN_ID}), \"content\": string}}")
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        if not isinstance(data.get(part), (dict, type(None))):
            raise _refuse(path, f"{part} is not an object")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_object_file(path: Path) -> None:
    """tokenizer_config.json, special_tokens_map.json, generation_config.json, config.json: an object whose fields
    the runner reads have the types it reads them as."""
    data = _object(path, _read(path))
    for name in SPECIAL_TOKENS:
        value = data.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if not isinstance(value, (str, type(None))):
            raise _refuse(path, f"{name} is not a string (or {{\"content\": string}})")
    if path.name == "config.json":
        _check_config(path, data)


def _check_config(path: Path, config: dict[str, Any]) -> None:
    """The sizes runner.checks.modelinfo computes with (parameters, memory): integers in the ranges the runner accepts."""
    from runner.checks.modelinfo import INT_FIELDS, POSITIVE_FLOAT_FIELDS  # torch-free

    text = config.get("text_config")
    if not isinstance(text, (dict, type(None))):
        raise _refuse(path, "text_config is not an object")
    for fields in (config, text or {}):
        for name, (low, high) in {**INT_FIELDS, "n_layer": (1, 4096), "n_head": (1, 4096), "n_embd": (1, 2**20), "num_layers": (1, 4096)}.items():
            value = fields.get(name)
            if value is not None and not _int(value, low, high + 1):
                raise _refuse(path, f"{name} is {str(value)[:40]!r}: an integer in [{low}, {high}] is required")
        for name in POSITIVE_FLOAT_FIELDS:
            value = fields.get(name)
            if value is not None and not _number(value):
                raise _refuse(path, f"{name} is {str(value)[:40]!r}: a number is required")
        tie = fields.get("tie_word_embeddings")
        if tie is not None and not isinstance(tie, bool):
            raise _refuse(path, "tie_word_embeddings is not true or false")


def check_safetensors_header(path: Path) -> None:
    """A safetensors file's header: an object of tensors, each {"dtype": string, "shape": [integers],
    "data_offsets": [begin, end]}, within MAX_SAFETENSORS_HEADER bytes."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise _refuse(path, "too short to be a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > MAX_SAFETENSORS_HEADER:
            raise _refuse(path, f"declares a {size}-byte header, more than the {MAX_SAFETENSORS_HEADER} allowed")
        data = f.read(size)
    if len(data) != size:
        raise _refuse(path, f"declares a {size}-byte header but holds {len(data)} bytes")
    header = _object(path, boundedjson.loads(data, f"{path} header", max_bytes=MAX_SAFETENSORS_HEADER, max_depth=MAX_DEPTH))
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict):
                raise _refuse(path, "__metadata__ is not an object")
            continue
        if not isinstance(info, dict) or not isinstance(info.get("dtype"), str):
            raise _refuse(path, f"tensor {name[:60]!r} is not {{\"dtype\", \"shape\", \"data_offsets\"}}")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_int(d, 0, MAX_DIM + 1) for d in shape):
            raise _refuse(path, f"tensor {name[:60]!r} shape is not a list of at most {MAX_DIMS} sizes in [0, 2**40]")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_int(o, 0, 1 << 62) for o in offsets):
            raise _refuse(path, f"tensor {name[:60]!r} data_offsets is not [begin, end]")


def check_tree(root: Path) -> None:
    """Every metadata file and safetensors header under `root` (a bundle's files, or a part of them)."""
    for path in sorted(Path(root).rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        if path.name == TOKENIZER_JSON:
            check_tokenizer_json(path)
        elif path.name in OBJECT_FILES:
            check_object_file(path)
        elif path.name.endswith(".safetensors"):
            check_safetensors_header(path)


def check_roles(root: Path, roles: dict[str, str]) -> None:
    """`check_tree` on the directories of the target, draft and tokenizer roles (paths relative to `root`)."""
    for role in ("target", "draft", "tokenizer"):
        if role in roles and (root / roles[role]).is_dir():
            check_tree(root / roles[role])
