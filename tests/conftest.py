"""Shared fixtures: a temp store, a tiny bundle tree, keys, and the `bundle` CLI run as a real process."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from bundletree import make_tree  # noqa: E402


@dataclass
class Result:
    code: int
    out: str
    err: str


def _startup_vars(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("PYTHON") or k in ("LANG", "LC_ALL", "LC_CTYPE")}


class _ForkServer:
    """tests/cli_forkserver.py, started on the first call: each `bundle` call a process forked from one that
    has done the CLI's imports already. A call while another is in flight (a test's threads) or with
    SPECBUNDLE_TEST_NO_FORKSERVER set runs as a fresh `python -m bundler` instead."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.startup: dict[str, str] = {}  # what the running server's interpreter read as it started
        self.lock = threading.Lock()

    def run(self, args: tuple[str, ...], env: dict[str, str], cwd: Path | None) -> Result | None:
        if os.environ.get("SPECBUNDLE_TEST_NO_FORKSERVER") or not self.lock.acquire(blocking=False):
            return None
        try:
            if self.proc is None or self.proc.poll() is not None:
                server_env = {**os.environ, "PYTHONWARNINGS": "ignore"}
                self.proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "cli_forkserver.py")],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=server_env)
                self.startup = _startup_vars(server_env)
            if _startup_vars(env) != self.startup:  # the interpreter reads these once, as it starts
                return None
            with tempfile.TemporaryDirectory(prefix="bundle-call-") as tmp:
                out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
                request = {"args": list(args), "env": env, "cwd": str(cwd or os.getcwd()), "stdout": str(out), "stderr": str(err)}
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                self.proc.stdin.flush()
                reply = self.proc.stdout.readline()
                if not reply:
                    raise RuntimeError(f"cli_forkserver exited {self.proc.wait()}")
                code = json.loads(reply)["returncode"]
                return Result(code, out.read_text(), err.read_text())  # as subprocess.run(text=True) decodes
        finally:
            self.lock.release()

    def stop(self) -> None:
        """Its stdin closed, the server exits; by its pid if it does not."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


_FORK_SERVER = _ForkServer()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _FORK_SERVER.stop()


def run_bundle(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, check: bool = False) -> Result:
    """Run `bundle` in a process of its own, as a user would (see _ForkServer)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("BUNDLE_TRUSTED_KEYS", "BUNDLE_HOME", "BUNDLE_KEY_PASSWORD")}
    full_env.update(PYTHONWARNINGS="ignore", **(env or {}))
    result = _FORK_SERVER.run(args, full_env, cwd)
    if result is None:
        proc = subprocess.run([sys.executable, "-m", "bundler", *args], capture_output=True, text=True, env=full_env, cwd=cwd)
        result = Result(proc.returncode, proc.stdout, proc.stderr)
    if check and result.code != 0:
        raise AssertionError(f"bundle {' '.join(args)} failed ({result.code}): {result.err}")
    return result


def copy_store(store: Path, tmp_path: Path) -> Path:
    """A writable copy of a store (blobs are read-only files), for a test that changes it."""
    dest = tmp_path / "store"
    shutil.copytree(store, dest)
    for path in dest.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def tree_digest(root: Path) -> str:
    """One hash over every path, mode and content under root: 'unchanged' means this is equal."""
    h = hashlib.sha256()
    if not root.exists():
        return "absent"
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        h.update(f"{path.relative_to(root)}|{st.st_mode}|".encode())
        if path.is_file() and not path.is_symlink():
            h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "ctx")


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture(scope="session")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from bundler.trust.keys import generate_keypair

    return generate_keypair(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="session")
def other_keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from bundler.trust.keys import generate_keypair

    return generate_keypair(tmp_path_factory.mktemp("other-keys"))


def assert_matches_schema(obj: object, name: str) -> None:
    """The object satisfies schemas/<name>.schema.json (the contract's JSON shapes)."""
    import json as _json

    import jsonschema

    schema = _json.loads((Path(__file__).parent.parent / "schemas" / f"{name}.schema.json").read_text())
    jsonschema.validate(obj, schema)
