"""A GGUF file's header read by our own bounded reader: metadata and tensor shapes, no tensor data.

Why not gguf.GGUFReader: it builds numpy views for every element of every array, most of the time to a GGUF
bundle's first token for a real vocabulary (docs/benchmarks.md); tests/test_gguf_header.py checks both agree.
The file may be hostile (a signed bundle is not a well-formed one), so every step is bounds-checked and what
llama.cpp's own reader refuses is refused here first, with the cost of the metadata llama.cpp would hold.
"""

from __future__ import annotations

__all__ = ["MAX_ARRAY", "MAX_OTHER_METADATA", "STRING_COST", "read_header", "short_repr"]

import math
import mmap
import struct
import sys
from pathlib import Path
from typing import Callable

from core.errors import BundleError

# GGUF metadata value types (the GGUF spec; gguf.GGUFValueType): struct formats of the fixed-size ones
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # ggml's GGML_MAX_DIMS: llama.cpp refuses a tensor with more
_MAX_NAME = 64  # ggml's GGML_MAX_NAME: llama.cpp refuses a tensor name of this length or more
_MAX_KEY = 65535  # the GGUF spec's longest key
# The only arrays kept (the tokenizer gate's); every other array (scores, a hostile one) is stepped over unread.
KEPT_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")
# Elements in a kept array: published vocabularies stop near 262,144 tokens; 8x that leaves room and bounds memory.
MAX_ARRAY = 1 << 21
# The vocabulary's arrays (one element per token or merge): llama.cpp's vocabulary probe reads each, so each is
# bounded by MAX_ARRAY elements whether this reader keeps it or not.
VOCAB_ARRAYS = (*KEPT_ARRAYS, "tokenizer.ggml.scores")
# What llama.cpp's gguf reader holds for the rest of the metadata (every string and array but the vocabulary's):
# about the bytes in the file plus a std::string per string element (STRING_COST). A real file's rest (chat
# templates, a sentencepiece charsmap, per-layer lists) stays under 1 MiB; more is refused before the probe runs,
# so the probe's memory follows the vocabulary, not an array nothing needs.
MAX_OTHER_METADATA = 8 << 20
STRING_COST = 32  # bytes of a std::string in libstdc++ (the gguf reader keeps one per string element)
# Mapped bytes stepped past before their pages are given back (_Header._step_over_strings).
RELEASE_BYTES = 1 << 20
# Tensors in a file: a model of a few hundred layers holds a few thousand; more is not a model.
MAX_TENSORS = 1 << 17


class _Header:
    """A GGUF header read from its bytes, bounds-checked at every step, refusing what llama.cpp's own reader
    (ggml/src/gguf.cpp) refuses: nested arrays, duplicate keys and tensor names, more than 4 dimensions.

    Why not gguf.GGUFReader: it builds numpy views for every element of every array, most of the time to a
    GGUF bundle's first token for a real vocabulary (docs/benchmarks.md). tests/test_gguf_header.py checks both agree.
    Memory: an array that is not kept is stepped over without building anything; a kept one is built as its
    final list directly (no intermediate tuple), so the reader holds about what it returns
    (tests/test_hostile_gguf.py measures it)."""

    def __init__(self, data: memoryview, release: Callable[[int, int], None] | None = None) -> None:
        self.data, self.at = data, 0
        self.strings = 0  # string elements in arrays read or stepped over (for the metadata's cost in llama.cpp)
        self.release = release  # gives the mapped pages of a byte range back (their bytes stay in the file)

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError(f"truncated at byte {self.at} (wants {n} more of {len(self.data)})")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self, longest: int | None = None) -> str:
        n = self.scalar("<Q")
        if longest is not None and n > longest:
            raise ValueError(f"a string of {n:,} bytes where at most {longest:,} are allowed")
        return str(self.take(n), "utf-8", "replace")  # decoded from the mapped bytes: no copy first

    def skip_string(self) -> None:
        self.take(self.scalar("<Q"))

    def value(self, kind: int, keep: bool, bounded: bool = False):
        """The value of type `kind`, or None without building it when not `keep`; an array longer than
        MAX_ARRAY is refused when kept or `bounded`."""
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string() if keep else self.skip_string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item == _ARRAY:
                raise ValueError("an array of arrays (GGUF readers refuse nested arrays)")
            if item != _STRING and item not in _SCALARS:
                raise ValueError(f"unknown array element type {item}")
            if count > len(self.data) - self.at:  # every element takes a byte at least
                raise ValueError(f"an array of {count} elements is longer than the file")
            if (keep or bounded) and count > MAX_ARRAY:
                raise ValueError(f"an array of {count:,} elements (at most {MAX_ARRAY:,} are read)")
            self.strings += count if item == _STRING else 0
            if item in _SCALARS:
                raw = self.take(count * struct.calcsize(_SCALARS[item]))
                return _scalar_list(raw, _SCALARS[item], count) if keep else None
            if not keep:
                self._step_over_strings(count)
                return None
            return [self.string() for _ in range(count)]
        raise ValueError(f"unknown metadata value type {kind}")

    def _step_over_strings(self, count: int) -> None:
        """Past `count` strings without building them. Each length read touches the mapped page it is on, and a
        touched page counts in the process's resident memory while it stays mapped: a hostile 48 MiB array of
        one-byte strings added 39 MB to a `bundle pack`'s peak. So the pages stepped past are given back every
        RELEASE_BYTES (madvise DONTNEED: a read-only file mapping drops them, and refaults them from the page cache
        if they are read again)."""
        mark = self.at
        for _ in range(count):
            self.skip_string()
            if self.release is not None and self.at - mark >= RELEASE_BYTES:
                mark = self._released(mark)
        if self.release is not None:
            self._released(mark)

    def _released(self, mark: int) -> int:
        start, end = mark - mark % mmap.PAGESIZE, self.at - self.at % mmap.PAGESIZE
        if end > start:
            self.release(start, end - start)
        return max(mark, end)


def _scalar_list(raw: memoryview, fmt: str, count: int) -> list:
    """The list of `count` little-endian values of struct format `fmt` in raw, built directly."""
    if sys.byteorder == "little":  # the standard sizes of these formats are the native ones
        return raw.cast(fmt[1]).tolist()
    return list(struct.unpack(f"<{count}{fmt[1]}", raw))


def _kept(key: str, kind: int) -> bool:
    """Whether read_header keeps a key's value: the tokenizer arrays and every scalar or string but the chat
    templates (GGUFTokenizer reads those through llama.cpp)."""
    if kind == _ARRAY:
        return key in KEPT_ARRAYS
    return not key.startswith("tokenizer.chat_template")


def _parse_header(path: Path) -> dict:
    from gguf.constants import GGML_QUANT_SIZES

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        release = (lambda start, length: mapped.madvise(mmap.MADV_DONTNEED, start, length)) if hasattr(mmap, "MADV_DONTNEED") else None
        h = _Header(memoryview(mapped), release)
        try:
            if bytes(h.take(4)) != b"GGUF":
                raise ValueError("no GGUF magic")
            version = h.scalar("<I")
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version} is not 2 or 3")
            n_tensors, n_kv = h.scalar("<Q"), h.scalar("<Q")
            if n_tensors > MAX_TENSORS:
                raise ValueError(f"{n_tensors:,} tensors (at most {MAX_TENSORS:,} are read)")
            metadata, seen, other, largest = {}, set(), 0, (0, "")
            for _ in range(n_kv):
                key = h.string(longest=_MAX_KEY)
                if key in seen:
                    raise ValueError(f"metadata key {short_repr(key)} appears twice")
                seen.add(key)
                kind = h.scalar("<I")
                start, strings = h.at, h.strings
                value = h.value(kind, _kept(key, kind), bounded=key in VOCAB_ARRAYS)
                if kind in (_STRING, _ARRAY) and not (kind == _ARRAY and key in VOCAB_ARRAYS):
                    cost = h.at - start + STRING_COST * (h.strings - strings + (kind == _STRING))
                    other, largest = other + cost, max(largest, (cost, key))
                if value is not None:
                    metadata[key] = value
            tensors = {}
            for _ in range(n_tensors):
                name, n_dims = h.string(longest=_MAX_NAME - 1), h.scalar("<I")
                if name in tensors:
                    raise ValueError(f"tensor {name!r} appears twice")
                if n_dims > _MAX_DIMS:
                    raise ValueError(f"tensor {name!r} has {n_dims} dimensions (at most {_MAX_DIMS})")
                shape = tuple(h.scalar("<Q") for _ in range(n_dims))
                kind, _offset = h.scalar("<I"), h.scalar("<Q")
                if kind not in GGML_QUANT_SIZES:
                    raise ValueError(f"tensor {name!r} has unknown ggml type {kind}")
                block, size = GGML_QUANT_SIZES[kind]
                count = math.prod(shape)
                if count >= 2**63 or (shape and shape[0] % block):
                    raise ValueError(f"tensor {name!r} has an impossible shape {shape} for its type")
                tensors[name] = (shape, count // block * size)
        finally:
            h.data.release()
    return {"metadata": metadata, "tensors": tensors, "other_metadata": (other, largest[1])}


def read_header(path: Path) -> dict:
    """{"metadata": {key: value} (every scalar and string but the chat templates, and the KEPT_ARRAYS),
    "tensors": {name: (shape, bytes)}, "other_metadata": (what llama.cpp's reader would hold of every string
    and array besides the vocabulary's, the key of the largest)} from a GGUF header; no tensor data is read. A malformed header is
    BundleError("invalid-bundle") naming the file and the fault."""
    try:
        return _parse_header(Path(path))
    except (ValueError, KeyError, OSError, struct.error) as e:  # any parse failure is bad content, said once
        raise BundleError("invalid-bundle", f"{Path(path).name} is not a readable GGUF file: {e}") from None


def short_repr(value) -> str:
    """repr of a value from a file, cut to 60 characters for a message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
