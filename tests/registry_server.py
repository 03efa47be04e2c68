"""A real OCI registry for the tests: Debian's `docker-registry` on 127.0.0.1, one open, one behind htpasswd.

Use as a pytest plugin (`pytest_plugins = ["registry_server"]`) for the fixtures `registry` and
`auth_registry`, or call `start_registry` directly (the benchmark does).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
import requests

USER, PASSWORD = "tester", "s3cret-pa55"


@dataclass
class Registry:
    """A running registry: `host` is `127.0.0.1:PORT`; `storage` is its filesystem root."""

    host: str
    storage: Path
    log: Path
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def blob_file(self, digest: str) -> Path:
        """Where the registry keeps a blob's bytes (the filesystem driver's layout)."""
        hexd = digest.split(":", 1)[1]
        return self.storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"

    def requests_seen(self, method: str, path_part: str) -> int:
        """How many requests the registry logged with this method and a URI containing `path_part`."""
        text = self.log.read_text(errors="replace")
        return sum(1 for line in text.splitlines() if f'http.request.method={method}' in line and path_part in line and "response completed" in line)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _htpasswd_line(user: str, password: str) -> str:
    """A bcrypt htpasswd entry (the only hash docker-registry accepts), made with libcrypt, cost 4 to keep requests fast."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # Python <= 3.12; libxcrypt does bcrypt

        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
    if hashed and hashed.startswith("$2"):
        return f"{user}:{hashed}\n"
    out = subprocess.run(["htpasswd", "-nbB", "-C", "4", user, password], check=True, capture_output=True, text=True)
    return out.stdout.strip() + "\n"


def start_registry(workdir: Path, auth: bool = False) -> Registry:
    """Start docker-registry on a free loopback port with storage under workdir; returns once /v2/ answers."""
    if shutil.which("docker-registry") is None:
        raise RuntimeError("docker-registry is not installed (make sysdeps)")
    workdir.mkdir(parents=True, exist_ok=True)
    storage = workdir / "storage"
    storage.mkdir(exist_ok=True)
    port = free_port()
    config = [
        "version: 0.1",
        "log: {level: info, formatter: text, accesslog: {disabled: true}}",
        "storage:",
        f"  filesystem: {{rootdirectory: {storage}}}",
        "  delete: {enabled: true}",
        f"http: {{addr: '127.0.0.1:{port}', secret: test-secret}}",
    ]
    if auth:
        (workdir / "htpasswd").write_text(_htpasswd_line(USER, PASSWORD))
        config.append(f"auth: {{htpasswd: {{realm: specbundle-tests, path: {workdir / 'htpasswd'}}}}}")
    (workdir / "config.yml").write_text("\n".join(config) + "\n")
    log = workdir / "registry.log"
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(workdir / "config.yml")],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT, env={**os.environ, "OTEL_TRACES_EXPORTER": "none"},
    )
    reg = Registry(f"127.0.0.1:{port}", storage, log, USER if auth else None, PASSWORD if auth else None, proc)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(requests.ConnectionError):
            if requests.get(f"http://{reg.host}/v2/", timeout=1).status_code in (200, 401):
                return reg
        time.sleep(0.05)
    stop_registry(reg)
    raise RuntimeError("docker-registry did not start within 15 s")


def stop_registry(reg: Registry) -> None:
    if reg.proc is not None and reg.proc.poll() is None:
        reg.proc.terminate()
        try:
            reg.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            reg.proc.kill()
            reg.proc.wait()


@contextlib.contextmanager
def running_registry(auth: bool = False) -> Iterator[Registry]:
    with tempfile.TemporaryDirectory(prefix="registry-") as tmp:
        reg = start_registry(Path(tmp), auth=auth)
        try:
            yield reg
        finally:
            stop_registry(reg)


@pytest.fixture(scope="module")
def registry() -> Iterator[Registry]:
    """An open registry (no auth) on 127.0.0.1."""
    with running_registry(auth=False) as reg:
        yield reg


@pytest.fixture(scope="module")
def auth_registry() -> Iterator[Registry]:
    """A registry that demands basic auth (htpasswd) for every request."""
    with running_registry(auth=True) as reg:
        yield reg
