"""Hostile files for the tests that hand them to `bundle` (prompt files, cost tables, cgroup limit files), and a
`bundle` call with a time bound: a hang is a failure, not a stuck suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
DEEP = 100_000  # nesting past json's recursion limit (a RecursionError, unless caught)


class Bounded(NamedTuple):
    code: int
    out: str
    err: str


def bundle(*args: str, env: dict[str, str] | None = None, stdin: bytes | None = None, timeout: float = 60) -> Bounded:
    """`python -m bundler ARGS` in a process of its own, killed (and the test failed) past `timeout` seconds."""
    full = {k: v for k, v in os.environ.items() if k not in ("BUNDLE_TRUSTED_KEYS", "BUNDLE_HOME", "BUNDLE_EXPECT")}
    full.update(PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT), **(env or {}))
    try:
        proc = subprocess.run([sys.executable, "-m", "bundler", *args], input=stdin, capture_output=True, env=full,
                              timeout=timeout, stdin=None if stdin is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"bundle {' '.join(args)} did not end within {timeout} s (a hang)") from None
    return Bounded(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))


def assert_clean_refusal(result: Bounded, code: int = 2) -> None:
    """One `error: [...]` line and the exit code asked: never exit 1, never a traceback."""
    assert result.code == code, (result.code, result.err[-2000:])
    assert "Traceback" not in result.err and result.err.startswith("error: ["), result.err[-2000:]


def make_hostile(path: Path, kind: str, text: str = "") -> Path:
    """At `path`: a FIFO with no writer, a link to /dev/zero, a directory, a sparse file of 64 MiB, or a regular
    file holding `text` (deep nesting, wrong types: the caller's)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(64 << 20)  # sparse: costs no disk
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def deep_json(key: str = "prompt") -> str:
    """A JSON object whose `key` nests DEEP lists."""
    return '{"' + key + '": ' + "[" * DEEP + "]" * DEEP + "}"
