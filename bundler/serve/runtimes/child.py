"""The runtime as a supervised child process: started with its translated command line from a private working
directory (nothing it writes lands beside the verified files), its stdout and stderr copied line by line into our
log behind a `[runtime]` prefix, its readiness polled, its exit seen at once, and stopped with SIGTERM (then
SIGKILL) when serving ends. The child is asked to die with the thread that started it (PR_SET_PDEATHSIG), so a
`bundle serve` killed outright leaves no runtime behind."""

from __future__ import annotations

__all__ = ["Child", "free_port"]

import collections
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, TextIO

import httpx

from core import display
from core.errors import BundleError

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 20.0  # SIGTERM, then SIGKILL after this
TAIL_LINES = 20  # of the child's output, kept for the error when it dies


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now (the child binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _before_exec() -> None:
    """In the child before exec: a process group of its own, led by it, so that `stop` reaches its workers too
    (killpg), in serve's session, not a new one: where the kernel groups CPU time by session (autogroup, a host
    whose processes sit in no cgroup of their own) a runtime in a session of its own weighed as much as every
    other process of serve's session together, the front door and, in a benchmark, the clients (docs/benchmarks.md,
    "Where the slow first tokens waited"); one service, one share, as a pod's cgroup holds both. A terminal's
    Ctrl-C still reaches serve alone (the runtime is not in the foreground group), which drains and stops it.
    Then SIGKILL when the thread that started it ends (Linux; elsewhere nothing)."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Child:
    """One runtime process. `start` from the thread that will outlive it (it `wait`s for it)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], workdir: Path, log: TextIO) -> None:
        self.name, self.argv, self.env, self.workdir, self.log = name, argv, env, workdir, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.log_lock = threading.Lock()
        self.exited = threading.Event()
        self.stopping = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "HOME": os.environ.get("HOME", str(self.workdir))}
        try:
            self.proc = subprocess.Popen(self.argv, cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, preexec_fn=_before_exec)
        except OSError as err:
            raise BundleError("runtime-failed", f"--runtime {self.name}: cannot start {self.argv[0]} ({err.strerror})") from None
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._pump, args=(stream,), name=f"specbundle-{self.name}-log", daemon=True).start()

    def _pump(self, stream) -> None:
        """The child's lines into our log, prefixed and made safe for a terminal."""
        for raw in iter(stream.readline, b""):
            line = display.line(raw.decode("utf-8", "replace").rstrip("\n"))
            self.tail.append(line)
            with self.log_lock:
                self.log.write(f"[{self.name}] {line}\n")
                self.log.flush()
        stream.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def died(self) -> BundleError:
        """The error of a runtime that ended by itself: its exit status and its last words."""
        code = self.returncode()
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
        last = " | ".join(list(self.tail)[-3:])
        return BundleError("runtime-failed", f"the runtime {self.name} (pid {self.pid}) {how}" + (f": {last}" if last else ""))

    def wait_ready(self, url: str, timeout_s: float, headers: dict[str, str], stopping: Callable[[], bool]) -> bool:
        """Poll url until it answers 200 (True), the runtime dies (its error), the time runs out (runtime-failed),
        or serving stops (False)."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if stopping():
                    return False
                if not self.alive():
                    raise self.died()
                try:
                    if client.get(url, headers=headers).status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise BundleError("runtime-failed", f"the runtime {self.name} did not answer {url} within {timeout_s:g} s (--runtime-start-timeout)")

    def wait(self) -> int:
        """Block until the child has ended; its status."""
        assert self.proc is not None
        code = self.proc.wait()
        self.exited.set()
        return code

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the runtime's process group (its own workers too), SIGKILL after grace_s."""
        self.stopping = True
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue
