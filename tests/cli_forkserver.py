"""A fork server for the tests' `bundle` processes (conftest.run_bundle): each call is still its own process,
with its own arguments, environment, working directory, stdin, stdout and stderr, started as `python -m
bundler` starts (runpy, `__main__` the bundler package) and ended as it ends (its exit code, or minus the
signal that killed it); only the imports that every call repeats (click, cryptography, jsonschema, the
KitOps model: about 0.6 s of a 1.1 s call on a 2-core EPYC, and some 650 calls in the suite) are done once,
here, before the fork.

Protocol, one JSON line each way per call on this process's stdin/stdout: {"args", "env", "cwd", "stdout",
"stderr"} (the two files the call writes) in; {"returncode"} out once the call's process has ended.
The server forks only while it is single-threaded (checked), and exits when its stdin closes.
"""

from __future__ import annotations

import json
import os
import sys
import threading


def _child(request: dict) -> None:
    """In the forked process: become the call, then run `python -m bundler` in it; never returns."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    stdout = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    stderr = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    import runpy
    import tempfile

    tempfile.tempdir = None  # found again from this call's TMPDIR
    sys.path[0] = request["cwd"]  # as `python -m` puts the working directory first
    sys.argv = ["bundler", *request["args"]]  # runpy sets argv[0] to bundler/__main__.py, as python -m does
    # SystemExit (the CLI's exit code) or an uncaught exception ends this process the way it ends
    # `python -m bundler`: through the interpreter's own exit (atexit handlers, flushed streams, exit 1 with
    # the traceback on stderr).
    runpy.run_module("bundler", run_name="__main__", alter_sys=True)
    sys.exit(0)


def serve() -> None:
    import bundler.cli  # noqa: F401  the imports every call shares

    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    while line := requests.readline():
        request = json.loads(line)
        if threading.active_count() != 1:  # a fork copies only the calling thread: a pool would be left half
            raise SystemExit("cli_forkserver: a thread was started before the fork")
        pid = os.fork()
        if pid == 0:
            _child(request)
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        replies.flush()


if __name__ == "__main__":
    serve()
