"""Hostile cgroup limit files (through `$SPECBUNDLE_CGROUP_ROOT`, as a hostile /sys would lay them out; issue 45):
each limit file is read as a few hundred bytes at most, from a regular file, without blocking; what cannot be read
so sets no limit. `bundle run` and `bundle serve` start and answer with a FIFO, /dev/zero, a directory or a huge
file where cpu.max, cpu.cfs_quota_us, memory.max and memory.current should be."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from conftest import run_bundle
from runner.checks.cgroups import CGROUP_ROOT_ENV, LIMIT_FILE_BYTES, cgroup_dirs, read_limit
from runner.checks.cpus import cgroup_cpu_quota
from runner.checks.memory import cgroup_room
from tests.hostile_files import ROOT, bundle, make_hostile
from tests.tinymodels import make_pair

REF = "tiny-spec:1.0.0"
KINDS = ["fifo", "dev-zero", "directory", "huge"]
LIMIT_FILES = ("cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us", "memory.max", "memory.current",
               "memory.limit_in_bytes", "memory.usage_in_bytes")


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn() in a thread: its value, or the test failed when it has not returned within `seconds` (a hang)."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"did not return within {seconds} s (a blocking read)"
    return out[0]


def _tree(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """A cgroup v2 tree whose process sits in /pod/ctr, every limit file at every level a hostile `kind`."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc-cgroup"
    for level in ("", "pod", "pod/ctr"):
        (root / level).mkdir(parents=True, exist_ok=True)
        for name in ("cpu.max", "memory.max", "memory.current"):
            make_hostile(root / level / name, kind)
    proc.write_text("0::/pod/ctr\n")
    return root, proc


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_limit_file_sets_no_limit_and_never_blocks(kind: str, tmp_path: Path) -> None:
    root, proc = _tree(tmp_path, kind)
    assert _within(10, lambda: cgroup_cpu_quota(proc, root)) is None
    assert _within(10, lambda: cgroup_room(proc, root)) is None


def test_a_limit_file_longer_than_a_few_hundred_bytes_is_unread(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("1" * (LIMIT_FILE_BYTES + 1))
    (tmp_path / "memory.max").write_text("1" * LIMIT_FILE_BYTES)
    assert read_limit(tmp_path / "cpu.max") is None and read_limit(tmp_path / "memory.max") == "1" * LIMIT_FILE_BYTES


def test_a_hostile_proc_cgroup_lists_no_cgroups(tmp_path: Path) -> None:
    for kind in KINDS:
        assert _within(10, lambda: cgroup_dirs("cpu", make_hostile(tmp_path / kind, kind), tmp_path)) == []


def test_a_readable_limit_beside_hostile_ones_still_counts(tmp_path: Path) -> None:
    root, proc = _tree(tmp_path, "fifo")
    (root / "pod" / "cpu.max").unlink()
    (root / "pod" / "cpu.max").write_text("150000 100000\n")
    assert _within(10, lambda: cgroup_cpu_quota(proc, root)) == 1.5


def _hostile_root(tmp_path: Path, kind: str) -> Path:
    """A hierarchy for the `bundle` process (it reads the real /proc/self/cgroup): every directory it would read a
    limit in, v2 and v1, holding hostile limit files."""
    root = tmp_path / "cgroup"
    for controller in ("cpu", "memory"):
        for directory, _v2 in cgroup_dirs(controller, root=root):
            directory.mkdir(parents=True, exist_ok=True)
            for name in LIMIT_FILES:
                if not (directory / name).exists() and not (directory / name).is_symlink():
                    make_hostile(directory / name, kind)
    return root


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hostile-cgroups")
    make_pair(base / "ctx")
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return {"store": base / "store", "pub": keypair[1]}


@pytest.mark.parametrize("kind", KINDS)
def test_run_answers_under_a_hostile_cgroup_tree(kind: str, signed: dict[str, Path], tmp_path: Path) -> None:
    root = _hostile_root(tmp_path, kind)
    result = bundle("run", REF, "--prompt", "hello", "--raw", "--max-new-tokens", "4", "--key", str(signed["pub"]),
                    "--store", str(signed["store"]), "--json", env={CGROUP_ROOT_ENV: str(root)}, timeout=120)
    assert result.code == 0 and "Traceback" not in result.err, result.err[-2000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_answers_under_a_hostile_cgroup_tree(signed: dict[str, Path], tmp_path: Path) -> None:
    root, port = _hostile_root(tmp_path, "fifo"), _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("BUNDLE_TRUSTED_KEYS", "BUNDLE_HOME")}
    env.update(PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT), **{CGROUP_ROOT_ENV: str(root)})
    proc = subprocess.Popen([sys.executable, "-m", "bundler", "serve", REF, "--key", str(signed["pub"]), "--store",
                             str(signed["store"]), "--port", str(port)], stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline, healthy = time.monotonic() + 120, False
        while time.monotonic() < deadline and proc.poll() is None and not healthy:
            try:
                healthy = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.3)
        assert healthy, f"serve did not come up (exit {proc.poll()})"
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hello", "max_tokens": 3}, timeout=60)
        assert answer.status_code == 200
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in proc.stderr.read()
