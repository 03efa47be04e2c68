"""`bundle serve --from-dir` against whoever can write the volume it serves from, on real processes: a registry,
`bundle fetch`, and a `bundle serve` process per case.

- Writes to the volume after the server started (weights, tokenizer) do not change what it computes: what it
  loaded was read once and hashed from the bytes kept (a private copy, or the loader's own buffers).
- `--expect` (or $BUNDLE_EXPECT) refuses at start a directory holding another signed bundle, an older release
  (rollback) or a bundle signed under another name; the name reported comes from signed content only.
- `fetch` and `serve --from-dir` accept the same signatures: a bundle whose only signature is cosign-style.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import run_bundle
from registry_server import Registry, free_port, registry  # noqa: F401  (fixtures)
from tests.fleet import ROOT
from tests.test_gguf_bench import gguf_context
from tests.tinymodels import make_pair, write_kitfile

from bundler.store.layout import Store
from bundler.store.referrers import find_signatures
from bundler.trust import cosign

PROMPT = "the quick brown fox"


def _env(tmp_path: Path, keys: Path) -> dict[str, str]:
    (tmp_path / "no-docker").mkdir(exist_ok=True)
    return {"DOCKER_CONFIG": str(tmp_path / "no-docker"), "BUNDLE_PLAIN_HTTP": "1", "BUNDLE_TRUSTED_KEYS": str(keys)}


def _push(base: Path, ctx: Path, ref: str, key: Path, *, cosign_only: bool = False) -> str:
    """Pack ctx as ref, signed with key, and push it; returns the manifest digest."""
    store = base / "src-store"
    digest = run_bundle("pack", str(ctx), "-t", ref, "--key", str(key), "--store", str(store), check=True).out.split()[-1]
    if cosign_only:  # as `cosign sign` alone would leave it: the model-signing signature removed
        s = Store(store)
        for desc, payload in find_signatures(s, digest):
            if cosign.kind_of(payload) != cosign.KIND:
                with s.lock():
                    s.remove_manifest(desc.digest)
    (base / "no-docker").mkdir(exist_ok=True)
    run_bundle("push", ref, "--plain-http", "--store", str(store), env={"DOCKER_CONFIG": str(base / "no-docker")}, check=True)
    return digest


@pytest.fixture(scope="module")
def bundles(registry: Registry, tmp_path_factory: pytest.TempPathFactory, keypair) -> dict:
    """Tiny GGUF bundles in the registry: tiny-spec 1.0.0 and 1.1.0, the same content signed as other-spec
    1.0.0, a torch pair, and a cosign-only tiny-spec 1.2.0; each fetched once into a directory."""
    base = tmp_path_factory.mktemp("served-dir")
    keys = base / "keys"
    keys.mkdir()
    shutil.copy(keypair[1], keys / "bundle.pub")
    ctx = gguf_context(base / "gguf-ctx")
    out: dict = {"keys": keys, "base": base}
    cases = {"v1": ("models/tiny-spec:1.0.0", "tiny-spec", "1.0.0", ctx), "v11": ("models/tiny-spec:1.1.0", "tiny-spec", "1.1.0", ctx),
             "renamed": ("models/other-spec:1.0.0", "other-spec", "1.0.0", ctx),
             "cosign": ("models/tiny-spec:1.2.0", "tiny-spec", "1.2.0", ctx)}
    torch_ctx = base / "torch-ctx"
    make_pair(torch_ctx)
    cases["torch"] = ("models/torch-spec:1.0.0", "torch-spec", "1.0.0", torch_ctx)
    for case, (repo, name, version, context) in cases.items():
        speculative = {"draft_tokens": 3, "min_acceptance": 0.0, "min_size_ratio": 1, "guard": False} if context == ctx else None
        write_kitfile(context, name=name, version=version, speculative=speculative)
        ref = f"{registry.host}/{repo}"
        digest = _push(base, context, ref, keypair[0], cosign_only=case == "cosign")
        dest = base / "fetched" / case
        result = run_bundle("fetch", f"bundle://{ref}", str(dest), env={**_env(base, keys), "BUNDLE_HOME": str(base / f"fetch-{case}")})
        assert result.code == 0, result.err
        out[case] = {"ref": ref, "uri": f"bundle://{ref}", "digest": digest, "dir": dest}
    return out


def _volume(bundles: dict, case: str, tmp_path: Path) -> Path:
    """A copy of the fetched directory, as the shared volume the server reads."""
    dest = tmp_path / "volume" / case
    shutil.copytree(bundles[case]["dir"], dest)
    return dest


class Served:
    """`bundle serve --from-dir`, its own store and temp dir; `start` waits for /health or the exit."""

    def __init__(self, bundles: dict, volume: Path, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp = tmp_path / "server-tmp"
        self.tmp.mkdir(exist_ok=True)
        full = {k: v for k, v in os.environ.items() if k not in ("BUNDLE_TRUSTED_KEYS", "BUNDLE_HOME", "BUNDLE_EXPECT")}
        full.update({"BUNDLE_TRUSTED_KEYS": str(bundles["keys"]), "BUNDLE_HOME": str(tmp_path / "server-store"), "TMPDIR": str(self.tmp),
                     "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", **(env or {})})
        self.proc = subprocess.Popen([sys.executable, "-m", "bundler", "serve", "--from-dir", str(volume), "--port", str(self.port), *args],
                                     env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def start(self) -> bool:
        """True once /health answers 200; False when the process exited first (its stderr in self.err)."""
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.err = self.proc.stderr.read()
                return False
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError("serve --from-dir did not come up")

    def complete(self, max_tokens: int = 16) -> dict:
        r = httpx.post(self.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.err = getattr(self, "err", None) or self.proc.stderr.read()
        return code


def _overwrite_in_place(path: Path, start: int, data: bytes) -> None:
    """As `dd conv=notrunc` writes: the same inode, other bytes from `start` on."""
    path.chmod(0o644)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, start)
    finally:
        os.close(fd)


@pytest.mark.parametrize("case", ["v1", "torch"])
def test_a_write_to_the_volume_after_start_does_not_change_what_is_served(bundles, tmp_path: Path, case: str) -> None:
    volume = _volume(bundles, case, tmp_path)
    srv = Served(bundles, volume, tmp_path, "--expect", bundles[case]["uri"])
    try:
        assert srv.start(), srv.err
        before = srv.complete()
        assert before["choices"][0]["text"]
        weights = "model.gguf" if case == "v1" else "model.safetensors"
        for role in ("target", "draft"):
            path = volume / role / weights
            size = path.stat().st_size
            _overwrite_in_place(path, size // 2, b"\x00" * (size - size // 2))  # the tensors at the end: zeros
            _overwrite_in_place(path, size - 1, bytes([path.read_bytes()[-1] ^ 0xFF]))
        tokenizer = volume / "tokenizer" / "tokenizer.json"
        _overwrite_in_place(tokenizer, 0, b"\x00" * min(64, tokenizer.stat().st_size))
        after = srv.complete()
        assert after["choices"][0]["text"] == before["choices"][0]["text"]
        assert list(srv.tmp.iterdir()) == []  # the private copy is gone once loaded: nothing of it outlives the server
    finally:
        assert srv.stop() == 0, srv.err
    # The volume changed: a server started now refuses it.
    again = Served(bundles, volume, tmp_path, "--expect", bundles[case]["uri"])
    assert not again.start() and again.proc.returncode == 3 and again.err.splitlines()[-1].startswith("error: [digest-mismatch]"), again.err


def test_the_name_reported_is_the_expected_reference_once_the_signed_content_agrees(bundles, tmp_path: Path) -> None:
    volume = _volume(bundles, "v1", tmp_path)
    srv = Served(bundles, volume, tmp_path, env={"BUNDLE_EXPECT": bundles["v1"]["uri"]})
    try:
        assert srv.start(), srv.err
        models = httpx.get(srv.url + "/v1/models").json()["data"]
        health = httpx.get(srv.url + "/health").json()
        metrics = httpx.get(srv.url + "/metrics").text
    finally:
        assert srv.stop() == 0
    assert models[0]["id"] == bundles["v1"]["ref"] and health["bundle"] == {"ref": bundles["v1"]["ref"], "digest": bundles["v1"]["digest"]}
    assert f'ref="{bundles["v1"]["ref"]}"' in metrics
    assert "warning:" not in srv.err


def test_without_expect_the_name_comes_from_the_signature_not_origin_json_and_a_warning_says_so(bundles, tmp_path: Path) -> None:
    volume = _volume(bundles, "renamed", tmp_path)
    origin = volume / ".specbundle" / "origin.json"
    data = json.loads(origin.read_text())
    data["ref"] = bundles["v1"]["ref"]  # the unsigned record claims the expected name
    origin.write_text(json.dumps(data))
    srv = Served(bundles, volume, tmp_path)
    try:
        assert srv.start(), srv.err
        models = httpx.get(srv.url + "/v1/models").json()["data"]
        metrics = httpx.get(srv.url + "/metrics").text
    finally:
        assert srv.stop() == 0
    assert models[0]["id"] == "other-spec:1.0.0" and 'ref="other-spec:1.0.0"' in metrics
    warnings = [line for line in srv.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "--expect" in warnings[0]


@pytest.mark.parametrize("held, expect, code", [
    ("v1", "{v11[uri]}@{v11[digest]}", "signature-mismatch"),  # another signed bundle than the digest pinned
    ("v1", "{v11[digest]}", "signature-mismatch"),  # a bare digest
    ("v1", "{v11[uri]}", "rollback"),  # an older release than the version expected
    ("renamed", "{v1[uri]}", "signature-mismatch"),  # the same content signed under another name
    ("renamed", "{v1[ref]}", "signature-mismatch"),  # the same, as a plain reference
    ("v11", "{v1[uri]}", "signature-mismatch"),  # a newer release is not the one expected either
    ("v1", "kit://robot:pa55w0rd@{v11[ref]}", "rollback"),  # KitOps' URI form; the credentials never shown
])
def test_expect_refuses_a_directory_holding_another_bundle_at_start(bundles, tmp_path: Path, held: str, expect: str, code: str) -> None:
    volume = _volume(bundles, held, tmp_path)
    value = expect.format(**bundles)
    srv = Served(bundles, volume, tmp_path, "--expect", value)
    assert not srv.start()
    assert srv.proc.returncode == 3 and srv.err.splitlines()[-1].startswith(f"error: [{code}]"), srv.err
    assert "Traceback" not in srv.err and "pa55w0rd" not in srv.err and list(srv.tmp.iterdir()) == []


def test_a_release_older_than_one_served_before_is_refused_by_the_release_memory(bundles, tmp_path: Path) -> None:
    """--expect with a tag that is not a version (`:latest`) pins the name only: the server's store remembers
    the newest release it served (here 1.1.0), and refuses 1.0.0 in the same place afterwards."""
    latest = bundles["v1"]["uri"].rsplit(":", 1)[0] + ":latest"
    newer = Served(bundles, _volume(bundles, "v11", tmp_path), tmp_path, "--expect", latest)
    try:
        assert newer.start(), newer.err
    finally:
        assert newer.stop() == 0
    older = Served(bundles, _volume(bundles, "v1", tmp_path), tmp_path, "--expect", latest)
    assert not older.start()
    assert older.proc.returncode == 3 and older.err.splitlines()[-1].startswith("error: [rollback]"), older.err
    # Pinned by digest, the operator chooses it on purpose: served.
    pinned = Served(bundles, _volume(bundles, "v1", tmp_path / "again"), tmp_path, "--expect", f"{bundles['v1']['ref']}@{bundles['v1']['digest']}")
    try:
        assert pinned.start(), pinned.err
    finally:
        assert pinned.stop() == 0


@pytest.mark.parametrize("value", ["s3://bucket/model", "Not A Ref", "sha256:1234"])
def test_a_malformed_expectation_is_a_usage_error(bundles, tmp_path: Path, value: str) -> None:
    result = run_bundle("serve", "--from-dir", str(bundles["v1"]["dir"]), "--expect", value, "--port", str(free_port()),
                        env={"BUNDLE_TRUSTED_KEYS": str(bundles["keys"])})
    assert result.code == 2 and result.err.startswith("error: [usage]"), result.err


@pytest.mark.parametrize("value", ["kit://robot:{secret}@m", "bundle://robot:{secret}@m", "robot:{secret}@m"])
def test_a_bad_expectation_with_userinfo_and_no_slash_is_refused_with_the_userinfo_masked(tmp_path: Path, value: str) -> None:
    secret = "pa55-w0rd-never-shown"
    result = run_bundle("serve", "--from-dir", str(tmp_path), "--expect", value.format(secret=secret), "--port", str(free_port()))
    assert result.code == 2 and result.err.startswith("error: [usage]"), result.err
    assert secret not in result.out + result.err and "***@" in result.err


def test_fetch_and_serve_from_dir_accept_a_bundle_signed_cosign_style_only(bundles, tmp_path: Path) -> None:
    fetched = bundles["cosign"]["dir"]
    assert cosign.kind_of((fetched / ".specbundle" / "signature.json").read_bytes()) == cosign.KIND
    volume = _volume(bundles, "cosign", tmp_path)
    srv = Served(bundles, volume, tmp_path, "--expect", bundles["cosign"]["uri"])
    try:
        assert srv.start(), srv.err
        assert srv.complete()["choices"][0]["text"]
        assert httpx.get(srv.url + "/health").json()["bundle"]["digest"] == bundles["cosign"]["digest"]
    finally:
        assert srv.stop() == 0
    # Its files are checked as strictly: the signed layers are written again from them.
    _overwrite_in_place(volume / "tokenizer" / "tokenizer.json", 0, b" ")
    again = Served(bundles, volume, tmp_path, "--expect", bundles["cosign"]["uri"])
    assert not again.start() and again.proc.returncode == 3 and again.err.splitlines()[-1].startswith("error: [digest-mismatch]"), again.err
