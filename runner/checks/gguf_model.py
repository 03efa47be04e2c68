"""GGUF bundles before any weights load: which files, their tokenizer metadata (the gate), pairing and memory.

Everything here reads GGUF headers (metadata and tensor shapes; no tensor data; `_Header` says why not with
the `gguf` package's reader),
except the probe check, which loads each file's vocabulary only (llama.cpp's `vocab_only`) to encode the
probe set through both models' own tokenizers.
"""

from __future__ import annotations

__all__ = [
    "MAX_ARRAY", "MAX_OTHER_METADATA", "STRING_COST", "bundle_format", "check_tokenizers", "estimate_memory", "fingerprint", "gguf_files",
    "parameters", "preflight", "read_header", "tokenizer_metadata",
]

import faulthandler
import hashlib
import json
import math
import mmap
import os
import pickle
import select
import signal
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any
from pathlib import Path

from core.errors import BundleError
from runner.checks.pairing import PairingPolicy

# The tokenizer metadata that decides which ids a text becomes, compared field by field.
TOKENIZER_FIELDS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.eot_token_id",
)
# The longest llama.cpp may take to read a vocabulary in its child process (the demo's 49,152 tokens: well under 1 s).
CHILD_SECONDS = 120
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
    for role in (r for r in ("target", "draft") if r in dirs):  # no draft: a bundle for draft-free speculation
        files = gguf_files(dirs[role])
        if len(files) > 1:
            raise BundleError("invalid-bundle", f"the {role} holds {len(files)} GGUF files; a role holds one")
        if files and has_safetensors(dirs[role]):
            raise BundleError("invalid-bundle", f"the {role} holds both a GGUF and safetensors weights")
        kinds[role] = "gguf" if files else "safetensors"
    if kinds["target"] != kinds.get("draft", kinds["target"]):
        raise BundleError("invalid-bundle", f"the target is {kinds['target']} and the draft {kinds['draft']}: "
                          "a bundle pairs two GGUF files or two safetensors models, not one of each")
    return kinds["target"]


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
# Tensors in a file: a model of a few hundred layers holds a few thousand; more is not a model.
MAX_TENSORS = 1 << 17


class _Header:
    """A GGUF header read from its bytes, bounds-checked at every step, refusing what llama.cpp's own reader
    (ggml/src/gguf.cpp) refuses: nested arrays, duplicate keys and tensor names, more than 4 dimensions.

    Why not gguf.GGUFReader: it builds numpy views for every element of every array, most of the time to a
    GGUF bundle's first token for a real vocabulary (docs/benchmarks.md). tests/test_gguf_bundle.py checks both agree.
    Memory: an array that is not kept is stepped over without building anything; a kept one is built as its
    final list directly (no intermediate tuple), so the reader holds about what it returns
    (tests/test_hostile_gguf.py measures it)."""

    def __init__(self, data: memoryview) -> None:
        self.data, self.at = data, 0
        self.strings = 0  # string elements in arrays read or stepped over (for the metadata's cost in llama.cpp)

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
                for _ in range(count):
                    self.skip_string()
                return None
            return [self.string() for _ in range(count)]
        raise ValueError(f"unknown metadata value type {kind}")


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
        h = _Header(memoryview(mapped))
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
                    raise ValueError(f"metadata key {_short(key)} appears twice")
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


# The type each tokenizer field must have where present (the GGUF spec's): what llama.cpp and GGUFTokenizer use.
_FIELD_TYPES = {"tokenizer.ggml.model": str, "tokenizer.ggml.pre": str, "tokenizer.ggml.tokens": list,
                "tokenizer.ggml.token_type": list, "tokenizer.ggml.merges": list, "tokenizer.ggml.add_bos_token": bool,
                "tokenizer.ggml.add_eos_token": bool}


def _check_types(fields: Mapping, name: str) -> None:
    """Refuses tokenizer metadata of the wrong type (a string for a token id, numbers for the tokens)."""
    for key, value in fields.items():
        want = _FIELD_TYPES.get(key, int)  # the rest are token ids
        if value is None:
            continue
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
        if ok and key == "tokenizer.ggml.token_type":
            ok = all(isinstance(v, int) for v in value)
        elif ok and want is list:
            ok = all(isinstance(v, str) for v in value)
        if not ok:
            raise BundleError("invalid-bundle", f"{name}: GGUF metadata {key} is {_short(value)}, not of type {want.__name__}")


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


def _probe_ids(files: Mapping[str, Path]) -> dict[str, list[list[int]]]:
    """The probe set through each file's own llama.cpp tokenizer (vocabulary only), in one child process."""
    from runner.engines import llamacpp

    def probe() -> dict[str, list[list[int]]]:
        out = {}
        for role, path in files.items():
            os.write(2, f"{_DOING}{Path(path).name}\n".encode())  # the log names the file if llama.cpp aborts
            out[role] = llamacpp.vocab_tokenize(path, list(PROBES))
        return out

    return _in_child(probe)


_DOING = "specbundle: reading the vocabulary of "


def _in_child(work: Callable[[], Any]) -> Any:
    """work() in a forked child, its result back by pipe. Why: this is llama.cpp's first contact with a file
    that may be hostile, and llama.cpp aborts the whole process on some malformed vocabularies (GGML_ASSERT,
    e.g. two equal tokens); here that is BundleError("invalid-bundle") with its assertion, not a dead `bundle`."""
    import llama_cpp  # noqa: F401 - loaded once here, so the child does not import it again

    deadline = time.monotonic() + CHILD_SECONDS
    with tempfile.TemporaryFile() as log:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                os.close(r)
                for fd in (1, 2):  # llama.cpp's output and abort message go here, not to the user's terminal
                    os.dup2(log.fileno(), fd)
                faulthandler.disable()  # (pytest's and PYTHONFAULTHANDLER's dump would go to the terminal)
                os.environ["GGML_NO_BACKTRACE"] = "1"  # else ggml's abort attaches gdb, where installed, for seconds
                try:
                    reply = ("ok", work())
                except BundleError as err:
                    reply = ("error", err.code, err.message)
                except BaseException as err:  # noqa: BLE001 - reported by the parent as what it is
                    reply = ("error", "internal", f"{type(err).__name__}: {err}")
                with os.fdopen(w, "wb") as out:
                    pickle.dump(reply, out)
            finally:
                os._exit(0)
        os.close(w)
        data, status = b"", None
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
                chunk = os.read(r, 1 << 20) if ready else b""
                if ready and not chunk:
                    break
                data += chunk
            else:
                os.kill(pid, signal.SIGKILL)
        finally:
            os.close(r)
            status = os.waitpid(pid, 0)[1]
        size = log.seek(0, os.SEEK_END)
        log.seek(max(0, size - (1 << 20)))  # the end of what it said: the file it was at, the assertion
        said = [line.strip() for line in log.read().decode("utf-8", "replace").splitlines()]
        doing = next((line.removeprefix("specbundle: ") for line in reversed(said) if line.startswith(_DOING)),
                     "reading a vocabulary")
        if os.WIFSIGNALED(status):
            why = next((line for line in said if "GGML_ASSERT" in line), "") or next(
                (line for line in said if "error" in line.lower()), "")
            why = why.rsplit("/", 1)[-1] if "GGML_ASSERT" in why else why  # from the source file's name on
            if os.WTERMSIG(status) == signal.SIGKILL and time.monotonic() >= deadline:
                raise BundleError("invalid-bundle", f"llama.cpp took over {CHILD_SECONDS} s {doing}")
            raise BundleError("invalid-bundle", f"llama.cpp crashed {doing} ({signal.Signals(os.WTERMSIG(status)).name}"
                              + (f": {why[:200]}" if why else "") + ")")
    if not data:
        raise BundleError("invalid-bundle", f"llama.cpp ended without an answer {doing} (exit status {status})")
    reply = pickle.loads(data)
    if reply[0] == "ok":
        return reply[1]
    raise BundleError(reply[1], reply[2])


def _check_other_metadata(name: str, header: Mapping) -> None:
    """Refuse, before llama.cpp reads the file, metadata besides the vocabulary that would cost its reader more
    than MAX_OTHER_METADATA (read_header measured it while stepping over it)."""
    cost, key = header.get("other_metadata", (0, ""))
    if cost > MAX_OTHER_METADATA:
        raise BundleError("invalid-bundle", f"{name}: metadata besides the vocabulary takes {cost / (1 << 20):.1f} MiB (the most at "
                          f"{_short(key)}), more than {MAX_OTHER_METADATA >> 20} MiB: refused before llama.cpp reads it")


def check_tokenizers(files: Mapping[str, Path], headers: Mapping[str, Mapping]) -> str:
    """The tokenizer gate for GGUF: the metadata field by field, then the probe set through both models'
    own llama.cpp tokenizers (vocabulary only, no weights). Returns the fingerprint; raises
    BundleError("tokenizer-mismatch") with the first difference."""
    target = tokenizer_metadata(headers["target"])
    if target["tokenizer.ggml.tokens"] is None:
        raise BundleError("invalid-bundle", f"{files['target'].name} carries no tokenizer")
    if "draft" not in files:  # draft-free speculation: the target's own tokenizer, nothing to compare it with
        _check_types(target, files["target"].name)
        _check_other_metadata(files["target"].name, headers["target"])
        return fingerprint(target)
    draft = tokenizer_metadata(headers["draft"])
    for role, fields in (("target", target), ("draft", draft)):
        _check_types(fields, files[role].name)
    found = difference(target, draft)
    if found:
        raise BundleError("tokenizer-mismatch", found)
    for role in ("target", "draft"):
        _check_other_metadata(files[role].name, headers[role])
    ids = _probe_ids(files)
    for probe, a, b in zip(PROBES, ids["target"], ids["draft"]):
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
    policy = PairingPolicy.from_params(params)
    arch = {role: headers[role]["metadata"].get("general.architecture", "unknown") for role in ("target", "draft")}
    if arch["target"] != arch["draft"] and not policy.allow_cross_family:
        raise BundleError("model-family", f"target is {arch['target']}, draft is {arch['draft']}: different model "
                          "families (set speculative.allow_cross_family in the Kitfile to allow)")
    vocab = {role: (headers[role]["tensors"].get("token_embd.weight", ((0,), 0))[0] or (0,))[-1] for role in arch}
    if vocab["target"] != vocab["draft"]:
        raise BundleError("model-family", f"target embeds {vocab['target']} tokens, draft {vocab['draft']}")
    counts = {role: parameters(headers[role]) for role in arch}
    ratio = counts["target"] / max(counts["draft"], 1)
    min_ratio = policy.min_size_ratio
    if ratio < min_ratio:
        raise BundleError("size-ratio", f"target has {counts['target']:,} parameters, draft {counts['draft']:,}: "
                          f"ratio {ratio:.2f} < {min_ratio:g} (speculative.min_size_ratio)")
    return {"target_family": arch["target"], "draft_family": arch["draft"], "target_parameters": counts["target"],
            "draft_parameters": counts["draft"], "size_ratio": ratio}


def preflight(dirs: Mapping[str, Path], params: Mapping) -> dict:
    """The checks of a GGUF pair before any weights load (what runner.run.preflight is for safetensors): one
    file per role, the tokenizer gate, pairing. Returns {"files", "headers", "fingerprint", "pairing"};
    raises BundleError on the first failure."""
    files = {role: gguf_files(dirs[role])[0] for role in ("target", "draft") if role in dirs}
    headers = {role: read_header(path) for role, path in files.items()}
    # the tokenizer gate before pairing, as for safetensors
    fingerprint_ = check_tokenizers(files, headers)
    pairing = check_pairing(headers, params) if "draft" in files else {
        "target_family": headers["target"]["metadata"].get("general.architecture", "unknown"), "draft_family": None,
        "target_parameters": parameters(headers["target"]), "draft_parameters": 0, "size_ratio": None}
    return {"files": files, "headers": headers, "fingerprint": fingerprint_, "pairing": pairing}


def _count(metadata: Mapping, key: str, default: int) -> int:
    """A size from the metadata (a layer or head count): a non-negative integer, else the file is refused."""
    value = metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BundleError("invalid-bundle", f"GGUF metadata {key} is {_short(value)}, not a count")
    return value


def estimate_memory(headers: Mapping[str, Mapping], n_ctx: int) -> dict:
    """Weights (tensor bytes as stored) plus each model's f16 KV cache for n_ctx positions."""
    weights = sum(b for h in headers.values() for _, b in h["tensors"].values())
    kv = 0
    for h in headers.values():
        m = h["metadata"]
        arch = m.get("general.architecture", "llama")
        layers, embd = _count(m, f"{arch}.block_count", 0), _count(m, f"{arch}.embedding_length", 0)
        heads, kv_heads = _count(m, f"{arch}.attention.head_count", 1), _count(m, f"{arch}.attention.head_count_kv", 0)
        kv_width = embd // max(heads, 1) * (kv_heads or heads)
        kv += 2 * layers * n_ctx * kv_width * 2  # K and V, f16
    overhead = 64 * 2**20  # llama.cpp's compute buffers and the binding's (measured order of magnitude)
    total = weights + kv + overhead
    return {"weights_bytes": weights, "kv_cache_bytes": kv, "activation_bytes": overhead, "loader_bytes": 0,
            "total_bytes": total, "predicted_peak_bytes": total}
