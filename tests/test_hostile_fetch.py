"""Hostile storage URIs, destinations and registry replies to `bundle fetch` (and `pull`): credentials never
shown, every destination failure a coded one-line error with nothing left behind, KitOps' `kit://` taken as
`bundle://` is. Each test runs the `bundle` command as a process against a real registry on 127.0.0.1, or the
attacker's server (tests/hostile_registry.py) where the registry's reply is the attack.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import run_bundle
from hostile_registry import Reply, Seen, hostile
from registry_server import Registry, free_port, registry  # noqa: F401  (fixture)
from tests.fleet import ROOT

SECRET = "pa55-w0rd-never-shown"
TOKEN = "tok-3xYz-never-shown"
REPO = "models/tiny-spec"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "no-docker").mkdir(exist_ok=True)
    return {"DOCKER_CONFIG": str(tmp_path / "no-docker"), "BUNDLE_HOME": str(tmp_path / "fetch-store"), **extra}


@pytest.fixture(scope="module")
def pushed(registry: Registry, tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict[str, str]:  # noqa: F811
    from tests.tinymodels import make_pair

    base = tmp_path_factory.mktemp("hostile-fetch-src")
    make_pair(base / "ctx")
    ref = f"{registry.host}/{REPO}:1.0.0"
    digest = run_bundle("pack", str(base / "ctx"), "-t", ref, "--key", str(keypair[0]), "--store", str(base / "store"), check=True).out.split()[-1]
    (base / "no-docker").mkdir()
    run_bundle("push", ref, "--plain-http", "--store", str(base / "store"), env={"DOCKER_CONFIG": str(base / "no-docker")}, check=True)
    return {"ref": ref, "digest": digest, "host": registry.host}


def _fetch(uri: str, dest: Path, tmp_path: Path, keypair, **env: str) -> Any:
    result = run_bundle("fetch", uri, str(dest), "--plain-http", "--key", str(keypair[1]), env=_env(tmp_path, **env))
    assert "Traceback" not in result.err and "[internal]" not in result.err, result.err
    return result


def _one_line(result: Any, code: str, exit_code: int) -> None:
    assert result.code == exit_code, result.err
    assert result.err.startswith(f"error: [{code}] ") and len(result.err.strip().splitlines()) == 1, result.err


# ---------------------------------------------------------------- credentials never shown


def test_a_storage_uri_with_userinfo_is_fetched_and_the_userinfo_never_shown(pushed, tmp_path: Path, keypair) -> None:
    dest = tmp_path / "models"
    result = _fetch(f"bundle://user:{SECRET}@{pushed['ref']}", dest, tmp_path, keypair)
    assert result.code == 0, result.err
    assert SECRET not in result.out + result.err
    origin = (dest / ".specbundle" / "origin.json").read_text()
    assert SECRET not in origin and json.loads(origin)["ref"] == pushed["ref"]


@pytest.mark.parametrize("uri", [
    "bundle://user:{secret}@127.0.0.1:{port}/models/tiny-spec:1.0.0",  # nothing listens there
    "kit://user:{secret}@127.0.0.1:{port}/models/tiny-spec:1.0.0",
    "bundle://user:{secret}@127.0.0.1:{port}/Not A Repo:1",
    "s3://user:{secret}@bucket/model",
    "user:{secret}@127.0.0.1:{port}/models/tiny-spec:1.0.0",
])
def test_no_error_line_shows_the_userinfo_of_a_storage_uri(tmp_path: Path, keypair, uri: str) -> None:
    dest = tmp_path / "models"
    result = _fetch(uri.format(secret=SECRET, port=free_port()), dest, tmp_path, keypair, BUNDLE_RETRIES="0")
    assert result.code in (2, 5) and result.err.startswith("error: ["), result.err
    assert SECRET not in result.out + result.err
    assert not dest.exists()


@pytest.mark.parametrize("uri", ["kit://robot:{secret}@m", "bundle://robot:{secret}@m", "robot:{secret}@m",
                                 "kit://robot:{secret}@m@sha256:" + "0" * 64])
def test_a_bad_reference_with_userinfo_and_no_slash_is_refused_with_the_userinfo_masked(tmp_path: Path, keypair, uri: str) -> None:
    dest = tmp_path / "models"
    result = _fetch(uri.format(secret=SECRET), dest, tmp_path, keypair)
    _one_line(result, "usage", 2)
    assert SECRET not in result.out + result.err and "***@" in result.err
    assert not dest.exists()


def test_pull_never_shows_the_userinfo_of_a_reference(tmp_path: Path, keypair) -> None:
    result = run_bundle("pull", f"user:{SECRET}@127.0.0.1:{free_port()}/models/tiny-spec:1.0.0", "--plain-http",
                        "--key", str(keypair[1]), env=_env(tmp_path))
    _one_line(result, "usage", 2)
    assert SECRET not in result.err and "***@" in result.err


def _echoing(status: int, extra: str = "") -> Any:
    """The attacker's registry: asks for Basic auth, then answers `status` with a body echoing the request's
    Authorization header, a bearer token and the password it decoded from it."""

    def route(req: Seen, _body: bytes) -> Reply:
        sent = req.headers.get("authorization")
        if not sent:
            return Reply(401, {"WWW-Authenticate": 'Basic realm="x"'}, b"")
        decoded = base64.b64decode(sent.split(" ", 1)[1]).decode() if sent.startswith("Basic ") else ""
        message = f"denied: you sent Authorization: {sent} ({decoded}); try token={TOKEN} or Bearer {TOKEN}{extra}"
        return Reply(status, {"Content-Type": "application/json"}, json.dumps({"errors": [{"code": "DENIED", "message": message}]}).encode())

    return route


@pytest.mark.parametrize("status,code,exit_code", [(403, "registry-auth", 5), (404, "registry-not-found", 5), (500, "registry", 5), (400, "registry", 5)])
def test_a_registry_echoing_the_credentials_gets_them_redacted(tmp_path: Path, keypair, status: int, code: str, exit_code: int) -> None:
    env = {"BUNDLE_REGISTRY_USER": "me", "BUNDLE_REGISTRY_PASSWORD": SECRET, "BUNDLE_RETRIES": "0"}
    pair = base64.b64encode(f"me:{SECRET}".encode()).decode()
    with hostile(_echoing(status)) as server:
        result = _fetch(f"bundle://{server.host}/{REPO}:1.0.0", tmp_path / "models", tmp_path, keypair, **env)
        pulled = run_bundle("pull", f"{server.host}/{REPO}:1.0.0", "--plain-http", "--key", str(keypair[1]), env=_env(tmp_path, **env))
    assert server.authorization_seen(), "the registry must have seen the credentials for the test to mean anything"
    for shown in (result, pulled):
        _one_line(shown, code, exit_code)
        assert "DENIED" in shown.err and "[redacted]" in shown.err
        for secret in (SECRET, pair, TOKEN):
            assert secret not in shown.err + shown.out, shown.err


# ---------------------------------------------------------------- kit:// as bundle://


def test_fetch_takes_a_kit_storage_uri_as_a_bundle_one(pushed, tmp_path: Path, keypair) -> None:
    dest = tmp_path / "models"
    result = _fetch(f"kit://{pushed['ref']}", dest, tmp_path, keypair)
    assert result.code == 0, result.err
    assert result.out.strip().splitlines()[-1] == pushed["digest"]
    assert json.loads((dest / ".specbundle" / "origin.json").read_text())["ref"] == pushed["ref"]


def test_a_kit_uri_is_refused_as_a_bundle_one_is(pushed, tmp_path: Path, keypair, other_keypair) -> None:
    dest = tmp_path / "models"
    result = run_bundle("fetch", f"kit://{pushed['ref']}", str(dest), "--plain-http", "--key", str(other_keypair[1]), env=_env(tmp_path))
    _one_line(result, "untrusted-signer", 3)
    assert not dest.exists()


# ---------------------------------------------------------------- destinations


def _destinations(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    """name -> (DEST, the directory that must be unchanged after the refusal)."""
    (tmp_path / "a-file").write_text("mine")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "full")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    return {
        "below-a-file": (tmp_path / "a-file" / "models", tmp_path),
        "deep-below-a-file": (tmp_path / "a-file" / "x" / "y", tmp_path),
        "a-file": (tmp_path / "a-file", tmp_path),
        "not-empty": (tmp_path / "full", tmp_path),
        "a-link": (tmp_path / "link", tmp_path),
        "a-dangling-link": (tmp_path / "dangling", tmp_path),
        "below-a-link-loop": (tmp_path / "loop" / "models", tmp_path),
        "name-too-long": (tmp_path / ("n" * 300), tmp_path),
        "in-proc": (Path("/proc/self/specbundle-models"), tmp_path),
    }


@pytest.mark.parametrize("case", ["below-a-file", "deep-below-a-file", "a-file", "not-empty", "a-link", "a-dangling-link",
                                  "below-a-link-loop", "name-too-long", "in-proc"])
def test_every_destination_failure_is_a_usage_error_leaving_nothing(pushed, tmp_path: Path, keypair, case: str) -> None:
    from conftest import tree_digest

    work = tmp_path / "work"
    work.mkdir()
    dest, around = _destinations(work)[case]
    before = tree_digest(around)
    result = _fetch(f"bundle://{pushed['ref']}", dest, tmp_path, keypair)
    _one_line(result, "usage", 2)
    assert tree_digest(around) == before


def test_a_refused_fetch_removes_the_directories_it_made(pushed, tmp_path: Path, keypair, other_keypair) -> None:
    dest = tmp_path / "made" / "by" / "fetch"
    result = run_bundle("fetch", f"bundle://{pushed['ref']}", str(dest), "--plain-http", "--key", str(other_keypair[1]), env=_env(tmp_path))
    _one_line(result, "untrusted-signer", 3)
    assert not (tmp_path / "made").exists()


def test_a_destination_that_fills_up_is_a_usage_error_leaving_it_empty(pushed, tmp_path: Path, keypair) -> None:
    """A write limit (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail with EFBIG) stands in for a full volume; the
    bundle is in the store already, so only the destination's writes reach the limit."""
    env = {**os.environ, **_env(tmp_path), "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    env.pop("BUNDLE_TRUSTED_KEYS", None)
    base = [sys.executable, "-m", "bundler", "fetch", f"bundle://{pushed['ref']}", "--plain-http", "--key", str(keypair[1])]
    first = subprocess.run([*base, str(tmp_path / "warm")], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    largest = max(p.stat().st_size for p in (tmp_path / "warm").rglob("*") if p.is_file())

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (largest // 2, largest // 2))

    dest = tmp_path / "models"
    dest.mkdir()
    result = subprocess.run([*base, str(dest)], env=env, capture_output=True, text=True, timeout=300, preexec_fn=limited)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: [usage] ") and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "File too large" in result.stderr
    assert list(dest.iterdir()) == []


# ---------------------------------------------------------------- the docker config's entries


@pytest.mark.parametrize("config", [
    {"auths": {"{host}": "not-a-map"}},
    {"auths": {"{host}": {"auth": 5}}},
    {"auths": {"{host}": {"username": ["me"], "password": "x"}}},
    {"credHelpers": {"{host}": 7}},
    {"credsStore": {"a": 1}},
], ids=["entry-a-string", "auth-a-number", "username-a-list", "helper-a-number", "store-a-map"])
def test_docker_config_entries_of_the_wrong_type_are_a_coded_error_or_anonymous(tmp_path: Path, keypair, config: dict) -> None:
    docker = tmp_path / "docker"
    docker.mkdir()
    host = f"127.0.0.1:{free_port()}"
    (docker / "config.json").write_text(json.dumps(config).replace("{host}", host))
    result = run_bundle("fetch", f"bundle://{host}/{REPO}:1.0.0", str(tmp_path / "models"), "--plain-http", "--key", str(keypair[1]),
                        env={**_env(tmp_path), "DOCKER_CONFIG": str(docker), "BUNDLE_RETRIES": "0"})
    assert result.code == 5 and result.err.startswith(("error: [registry-auth] ", "error: [registry-unreachable] ")), result.err
    assert len(result.err.strip().splitlines()) == 1 and not (tmp_path / "models").exists()
    login = run_bundle("login", host, "-u", "me", "--password-stdin", env={**_env(tmp_path), "DOCKER_CONFIG": str(docker)})
    assert "Traceback" not in login.err and "[internal]" not in login.err, login.err
