"""The tokenizer gate for a GGUF pair: the files' tokenizer metadata compared field by field, then the probe set
encoded through both models' own llama.cpp tokenizers.

The probe loads each file's vocabulary only (llama.cpp's `vocab_only`), in a forked child: it is llama.cpp's first
contact with a file that may be hostile, and llama.cpp aborts the whole process on some malformed vocabularies.
"""

from __future__ import annotations

__all__ = ["check_tokenizers", "fingerprint", "tokenizer_metadata"]

import faulthandler
import hashlib
import json
import os
import pickle
import select
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any
from pathlib import Path

from core.errors import BundleError
from runner.checks.gguf_header import MAX_OTHER_METADATA, short_repr

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
            raise BundleError("invalid-bundle", f"{name}: GGUF metadata {key} is {short_repr(value)}, not of type {want.__name__}")


def tokenizer_metadata(header: Mapping) -> dict:
    return {k: header["metadata"].get(k) for k in TOKENIZER_FIELDS}


def fingerprint(tokenizer: Mapping) -> str:
    """sha256 of the tokenizer metadata, canonical JSON: equal for files that tokenize alike."""
    return "sha256:" + hashlib.sha256(json.dumps(tokenizer, sort_keys=True).encode()).hexdigest()


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
            return f"{what} {i} differs: target {short_repr(a[i])} draft {short_repr(b[i])}"
        return f"{name} differs: target {short_repr(a)} draft {short_repr(b)}"
    return None


def _probe_ids(files: Mapping[str, Path]) -> dict[str, list[list[int]]]:
    """The probe set through each file's own llama.cpp tokenizer (vocabulary only), in one child process."""
    from runner.engines import llamacpp_files

    def probe() -> dict[str, list[list[int]]]:
        out = {}
        for role, path in files.items():
            os.write(2, f"{_DOING}{Path(path).name}\n".encode())  # the log names the file if llama.cpp aborts
            out[role] = llamacpp_files.vocab_tokenize(path, list(PROBES))
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
                          f"{short_repr(key)}), more than {MAX_OTHER_METADATA >> 20} MiB: refused before llama.cpp reads it")


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
