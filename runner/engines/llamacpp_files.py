"""llama.cpp's first contact with a GGUF file: the model opened through llama-cpp-python, or its vocabulary alone;
a file llama.cpp refuses is BundleError("invalid-bundle") with llama.cpp's own reason. No torch here: the GGUF
tokenizer gate (runner.checks.gguf_tokenizer_gate, run by pack, fetch and verify) reads the vocabularies through
this module without importing torch, which the engine (runner.engines.llamacpp) needs and these checks do not
(about 2.5 s of CPU and a few hundred MB of memory a `bundle pack` of a GGUF bundle no longer spends)."""

from __future__ import annotations

__all__ = ["open_llama", "version", "vocab_tokenize"]

import contextlib
import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core.errors import BundleError

_GGML_LOG_ERROR = 4  # ggml.h ggml_log_level (llama-cpp-python's _logger.py still says 3): the lines that say why


@contextlib.contextmanager
def _errors_logged() -> Iterator[list[str]]:
    """The error lines llama.cpp logs meanwhile (llama-cpp-python sends its log to a null stderr when not
    verbose, so the reason a file is refused would be lost); its own log callback is put back after."""
    import llama_cpp
    from llama_cpp import _logger

    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def keep(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        if level == _GGML_LOG_ERROR:
            lines.append(text.decode("utf-8", "replace").strip())

    llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
    try:
        yield lines
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


@contextlib.contextmanager
def _model_params(repack: bool) -> Iterator[None]:
    """llama-cpp-python's Llama has no argument for `use_extra_bufts`: its default model parameters, with it
    set, for the loads inside this block (the engine loads its models one at a time, on one thread)."""
    import llama_cpp.llama_cpp as capi

    if repack:
        yield
        return
    default = capi.llama_model_default_params

    def params() -> Any:
        chosen = default()
        chosen.use_extra_bufts = False
        return chosen

    capi.llama_model_default_params = params
    try:
        yield
    finally:
        capi.llama_model_default_params = default


def open_llama(path: str | Path, **kwargs):
    """llama_cpp.Llama(model_path=path, verbose=False, **kwargs); a file llama.cpp refuses is
    BundleError("invalid-bundle") with llama.cpp's own reason."""
    import llama_cpp

    from runner.engines.cpu import repack_weights

    with _errors_logged() as errors, _model_params(repack_weights()):
        try:
            return llama_cpp.Llama(model_path=str(path), **{"verbose": False, **kwargs})
        except ValueError:  # llama-cpp-python's "Failed to load model from file", the cause in the log
            pass
    raise _refused(path, errors)


def _refused(path: str | Path, errors: list[str]) -> BundleError:
    reason = next((line for line in errors if line), "no reason given")  # the first line is the cause
    return BundleError("invalid-bundle", f"llama.cpp cannot load {Path(path).name}: {reason[:300]}")


def vocab_tokenize(path: str | Path, texts: list[str]) -> list[list[int]]:
    """Each text through the file's own tokenizer (bos added as the file says, special tokens parsed), the
    vocabulary loaded alone: llama.cpp's C API directly, no context (what `Llama(vocab_only=True)`
    builds around it costs more than the vocabulary itself)."""
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    with _errors_logged() as errors:
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise _refused(path, errors)
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        out = []
        for text in texts:
            raw = text.encode()
            room = len(raw) + 8  # a token takes a byte at least, plus bos/eos
            for _ in range(2):
                buf = (llama_cpp.llama_token * room)()
                n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, room, True, True)
                if n >= 0:
                    break
                room = -n  # llama.cpp says how many it needs
            if n < 0:
                raise BundleError("invalid-bundle", f"llama.cpp cannot tokenize with {Path(path).name}")
            out.append(list(buf[:n]))
        return out
    finally:
        llama_cpp.llama_model_free(model)


def version() -> str:
    """llama-cpp-python's version (the engine version run --json and bench record)."""
    import llama_cpp

    return llama_cpp.__version__
