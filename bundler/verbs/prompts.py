"""`bundle run`'s prompt: `--prompt TEXT`, `--prompt-file FILE`, or standard input, read within bounds.

A file is read only when it is a regular file (a FIFO would block, /dev/zero never ends), and at most
MAX_PROMPT_FILE_BYTES of it; standard input at most as much. What does not fit, is not UTF-8 or is empty is a
usage error (exit 2). How long a prompt may be in tokens is the model's window (runner.checks.context_window).
"""

from __future__ import annotations

__all__ = ["read_prompt"]

import sys
from typing import BinaryIO

from core.boundedread import NotReadable, read_bounded
from core.errors import BundleError
from runner.bench.prompt_sets import MAX_PROMPT_FILE_BYTES


def _decoded(data: bytes, where: str) -> str:
    if len(data) > MAX_PROMPT_FILE_BYTES:
        raise BundleError("usage", f"the prompt from {where} is more than {MAX_PROMPT_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError("usage", f"the prompt from {where} is not UTF-8 text") from None


def read_prompt(prompt: str | None, prompt_file: str | None, stdin: BinaryIO | None = None) -> str:
    """The prompt from --prompt TEXT, --prompt-file FILE, or stdin (`--prompt -`, or no --prompt when stdin is
    piped); `stdin` defaults to the process's standard input (its bytes)."""
    if prompt is not None and prompt_file is not None:
        raise BundleError("usage", "give --prompt or --prompt-file, not both")
    stream = stdin if stdin is not None else getattr(sys.stdin, "buffer", None)  # None: stdin closed (`<&-`)
    if prompt_file is not None:
        try:
            data = read_bounded(prompt_file, MAX_PROMPT_FILE_BYTES)
        except NotReadable as why:
            code = "missing-input" if str(why) == "does not exist" or "cannot be read" in str(why) else "usage"
            raise BundleError(code, f"cannot read --prompt-file {prompt_file}: it {why}") from None
        where = prompt_file
        text = _decoded(data, where)
    elif stream is not None and (prompt == "-" or (prompt is None and not stream.isatty())):
        where = "standard input"
        text = _decoded(stream.read(MAX_PROMPT_FILE_BYTES + 1), where)  # /dev/zero on stdin ends here too
    elif prompt is None or prompt == "-":
        raise BundleError("usage", "no prompt: give --prompt TEXT, --prompt-file FILE, or pipe it on standard input")
    else:
        return prompt
    text = text.removesuffix("\n")  # the newline an editor or `echo` adds is not part of the prompt
    if not text.strip():
        raise BundleError("usage", f"the prompt from {where} is empty")
    return text
