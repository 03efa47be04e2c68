"""`bundle fetch SRC DEST` (the KServe storage-initializer contract) and `bundle serve --from-dir DIR`, on a real
registry and real server processes, run as deploy/kserve's manifests say (their commands read from the YAML)."""

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
import yaml

from conftest import run_bundle
from registry_server import Registry, free_port, registry  # noqa: F401  (fixtures)
from tests.fleet import ROOT, expand
from tests.tinymodels import make_pair
from tests.unchecked_pack import pack_unchecked

KSERVE = ROOT / "deploy" / "kserve"
REPO = "models/tiny-spec"


def _env(tmp_path: Path, keys_dir: Path | None = None) -> dict[str, str]:
    """No registry credentials (an empty DOCKER_CONFIG), a loopback registry over HTTP, trusted keys from a directory."""
    (tmp_path / "no-docker").mkdir(exist_ok=True)
    env = {"DOCKER_CONFIG": str(tmp_path / "no-docker"), "BUNDLE_PLAIN_HTTP": "1", "BUNDLE_HOME": str(tmp_path / "fetch-store")}
    if keys_dir is not None:
        env["BUNDLE_TRUSTED_KEYS"] = str(keys_dir)
    return env


def _keys_dir(tmp_path: Path, pub: Path, name: str = "keys") -> Path:
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    shutil.copy(pub, d / "bundle.pub")
    return d


@pytest.fixture(scope="module")
def pushed(registry: Registry, tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict[str, str]:
    """The tiny signed pair in the registry, as bundle://HOST/models/tiny-spec:1.0.0."""
    base = tmp_path_factory.mktemp("fetch-src")
    make_pair(base / "ctx")
    ref = f"{registry.host}/{REPO}:1.0.0"
    digest = run_bundle("pack", str(base / "ctx"), "-t", ref, "--key", str(keypair[0]), "--store", str(base / "store"), check=True).out.split()[-1]
    (base / "no-docker").mkdir()
    run_bundle("push", ref, "--plain-http", "--store", str(base / "store"), env={"DOCKER_CONFIG": str(base / "no-docker")}, check=True)
    return {"uri": f"bundle://{ref}", "ref": ref, "digest": digest}


def _storage_initializer(uri: str, dest: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The ClusterStorageContainer's container as KServe runs it: its command, then the args [uri, dest]."""
    doc = yaml.safe_load((KSERVE / "clusterstoragecontainer.yaml").read_text())
    container = doc["spec"]["container"]
    assert container["command"][0] == "bundle" and "args" not in container  # KServe sets args; command is ours
    argv = [sys.executable, "-m", "bundler", *container["command"][1:], uri, str(dest)]
    manifest_env = {e["name"]: e.get("value") for e in container["env"]}  # registry credentials: valueFrom a Secret
    assert set(manifest_env) >= {"BUNDLE_TRUSTED_KEYS", "BUNDLE_REGISTRY_USER", "BUNDLE_REGISTRY_PASSWORD", "BUNDLE_HOME"}
    # The mounts and the throwaway store are the pod's: here, the test's directories.
    full = {k: v for k, v in os.environ.items() if k not in ("BUNDLE_TRUSTED_KEYS", "BUNDLE_HOME")}
    return subprocess.run(argv, env={**full, **env, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"},
                          capture_output=True, text=True, timeout=180)


def _listing(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_fetch_unpacks_the_verified_bundle_with_its_evidence(pushed: dict[str, str], tmp_path: Path, keypair) -> None:
    dest = tmp_path / "models"
    dest.mkdir()  # KServe's /mnt/models: an empty volume, filled in place
    result = _storage_initializer(pushed["uri"], dest, _env(tmp_path, _keys_dir(tmp_path, keypair[1])))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == pushed["digest"]
    files = _listing(dest)
    assert "target/config.json" in files and "draft/model.safetensors" in files and "tokenizer/tokenizer.json" in files
    origin = json.loads((dest / ".specbundle" / "origin.json").read_text())
    assert origin["digest"] == pushed["digest"] and origin["ref"] == pushed["ref"]
    import hashlib

    assert "sha256:" + hashlib.sha256((dest / ".specbundle" / "manifest.json").read_bytes()).hexdigest() == pushed["digest"]
    assert not any(name.startswith(".fetch-") for name in os.listdir(dest))


@pytest.mark.parametrize("case", ["untrusted-key", "no-keys"])
def test_fetch_refuses_an_untrusted_bundle_and_leaves_dest_empty(pushed, tmp_path: Path, other_keypair, case: str) -> None:
    dest = tmp_path / "models"
    dest.mkdir()
    keys_dir = _keys_dir(tmp_path, other_keypair[1]) if case == "untrusted-key" else None
    result = _storage_initializer(pushed["uri"], dest, _env(tmp_path, keys_dir))
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("error: [") and "Traceback" not in result.stderr
    assert list(dest.iterdir()) == []


def test_fetch_refuses_a_damaged_registry_copy_and_leaves_dest_empty(tmp_path: Path, keypair) -> None:
    from registry_server import running_registry

    make_pair(tmp_path / "ctx", seed=3)
    with running_registry() as reg:
        ref = f"{reg.host}/{REPO}:1.0.0"
        run_bundle("pack", str(tmp_path / "ctx"), "-t", ref, "--key", str(keypair[0]), "--store", str(tmp_path / "src"), check=True)
        run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "src"), env=_env(tmp_path), check=True)
        manifest = httpx.get(f"http://{reg.host}/v2/{REPO}/manifests/1.0.0", headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}).json()
        blob = reg.blob_file(max(manifest["layers"], key=lambda d: d["size"])["digest"])
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF  # the same size, other bytes: the registry serves it as is
        blob.write_bytes(bytes(data))
        dest = tmp_path / "models"
        result = _storage_initializer(f"bundle://{ref}", dest, _env(tmp_path, _keys_dir(tmp_path, keypair[1])))
    assert result.returncode == 3 and result.stderr.startswith("error: [digest-mismatch]"), result.stderr
    assert not dest.exists()  # it did not exist before: nothing is left


def test_fetch_refuses_what_run_refuses_and_leaves_dest_empty(registry: Registry, tmp_path: Path, keypair) -> None:
    make_pair(tmp_path / "ctx", speculative={"draft_tokens": 4, "min_size_ratio": 1000})  # a pairing run refuses
    ref = f"{registry.host}/bad-pair/tiny-spec:1.0.0"
    pack_unchecked(tmp_path / "ctx", ref, tmp_path / "src", keypair[0])  # `bundle pack` refuses it; fetch's refusal is tested
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "src"), env=_env(tmp_path), check=True)
    dest = tmp_path / "models"
    dest.mkdir()
    result = _storage_initializer(f"bundle://{ref}", dest, _env(tmp_path, _keys_dir(tmp_path, keypair[1])))
    assert result.returncode == 4 and result.stderr.startswith("error: [size-ratio]"), result.stderr
    assert list(dest.iterdir()) == []


def test_fetch_refuses_a_dest_that_is_not_empty_and_a_foreign_scheme(pushed, tmp_path: Path, keypair) -> None:
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    env = _env(tmp_path, _keys_dir(tmp_path, keypair[1]))
    result = run_bundle("fetch", pushed["uri"], str(dest), env=env)
    assert result.code == 2 and result.err.startswith("error: [usage]") and (dest / "keep.txt").read_text() == "mine"
    assert _listing(dest) == ["keep.txt"]
    result = run_bundle("fetch", "s3://bucket/model", str(tmp_path / "other"), env=env)
    assert result.code == 2 and result.err.startswith("error: [usage]") and not (tmp_path / "other").exists()


# -- serve --from-dir, as the InferenceService says -------------------------------------------------
def _predictor(dest: Path, keys_dir: Path, api_key_dir: Path, port: int, expect: str | None = None) -> subprocess.Popen:
    """The InferenceService's kserve-container: its args, /mnt/models and the mounts mapped to the test's dirs;
    expect: BUNDLE_EXPECT, which the manifests set from the storage URI (here the test registry's)."""
    doc = yaml.safe_load((KSERVE / "inferenceservice.yaml").read_text())
    container = doc["spec"]["predictor"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {"/mnt/models": dest, "/etc/specbundle/keys": keys_dir, "/etc/specbundle/api-key": api_key_dir}
    args = []
    for arg in (expand(a, env) for a in container["args"]):
        for mount, local in mounts.items():
            arg = arg.replace(mount, str(local), 1) if arg.startswith(mount) else arg
        args.append(arg)
    args = ["127.0.0.1" if a == "0.0.0.0" else str(port) if a == str(container["ports"][0]["containerPort"]) else a for a in args]
    full = {k: v for k, v in os.environ.items() if k not in ("BUNDLE_TRUSTED_KEYS", "BUNDLE_HOME")}
    return subprocess.Popen([sys.executable, "-m", "bundler", *args],
                            env={**full, "BUNDLE_TRUSTED_KEYS": str(keys_dir), "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore",
                                 "BUNDLE_HOME": str(dest.parent / "unused-store"), **({"BUNDLE_EXPECT": expect} if expect else {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def fetched_once(pushed, tmp_path_factory: pytest.TempPathFactory, keypair) -> Path:
    """The pushed bundle fetched once by the storage initializer; each test works on its own copy."""
    base = tmp_path_factory.mktemp("fetched")
    result = _storage_initializer(pushed["uri"], base / "models", _env(base, _keys_dir(base, keypair[1])))
    assert result.returncode == 0, result.stderr
    return base / "models"


def _fetched(fetched_once: Path, tmp_path: Path, keypair) -> tuple[Path, Path, Path]:
    dest, keys_dir = tmp_path / "models", _keys_dir(tmp_path, keypair[1])
    shutil.copytree(fetched_once, dest)
    api = tmp_path / "api-key"
    api.mkdir()
    (api / "key").write_text("fleet-key\n")
    return dest, keys_dir, api


def test_serve_from_dir_serves_the_fetched_digest(pushed, fetched_once: Path, tmp_path: Path, keypair) -> None:
    dest, keys_dir, api = _fetched(fetched_once, tmp_path, keypair)
    port = free_port()
    proc = _predictor(dest, keys_dir, api, port, expect=pushed["uri"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:  # --open-probes: no key
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        health = httpx.get(url + "/health").json()
        assert health["bundle"]["digest"] == pushed["digest"] and health["bundle"]["ref"] == pushed["ref"]
        assert httpx.get(url + "/v1/models").status_code == 401  # the API still needs the key
        auth = {"Authorization": "Bearer fleet-key"}
        r = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4, "temperature": 0}, headers=auth, timeout=60)
        assert r.status_code == 200 and r.headers["x-bundle-digest"] == pushed["digest"]
        metrics = httpx.get(url + "/metrics").text
        assert f'digest="{pushed["digest"]}"' in metrics and "specbundle_bundle_info" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _flip(path: Path) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, code", [
    ("tampered-weights", "digest-mismatch"),
    ("extra-file", "extra-file"),
    ("missing-file", "missing-file"),
    ("no-evidence", "missing-file"),
    ("evidence-of-another-manifest", "digest-mismatch"),
])
def test_serve_from_dir_refuses_a_directory_that_differs_from_its_evidence(fetched_once: Path, tmp_path: Path, keypair, damage: str, code: str) -> None:
    dest, keys_dir, _ = _fetched(fetched_once, tmp_path, keypair)
    if damage == "tampered-weights":
        _flip(dest / "draft" / "model.safetensors")
    elif damage == "extra-file":
        (dest / "target" / "extra.py").write_text("print('hi')\n")
    elif damage == "missing-file":
        (dest / "tokenizer" / "tokenizer.json").unlink()
    elif damage == "no-evidence":
        shutil.rmtree(dest / ".specbundle")
    else:
        manifest = json.loads((dest / ".specbundle" / "manifest.json").read_text())
        manifest["config"]["digest"] = "sha256:" + "0" * 64
        (dest / ".specbundle" / "manifest.json").write_text(json.dumps(manifest))
    result = run_bundle("serve", "--from-dir", str(dest), "--port", str(free_port()), env={"BUNDLE_TRUSTED_KEYS": str(keys_dir)})
    assert result.code == 3 and result.err.startswith(f"error: [{code}]"), result.err
    assert "Traceback" not in result.err


def test_serve_from_dir_refuses_an_untrusted_signer(fetched_once: Path, tmp_path: Path, keypair, other_keypair) -> None:
    dest, _, _ = _fetched(fetched_once, tmp_path, keypair)
    result = run_bundle("serve", "--from-dir", str(dest), "--port", str(free_port()),
                        env={"BUNDLE_TRUSTED_KEYS": str(_keys_dir(tmp_path, other_keypair[1], "other"))})
    assert result.code == 3 and result.err.startswith("error: [untrusted-signer]"), result.err


def test_serve_takes_either_a_ref_or_from_dir(tmp_path: Path) -> None:
    for args in ([], ["x:1.0.0", "--from-dir", str(tmp_path)]):
        result = run_bundle("serve", *args, "--port", str(free_port()))
        assert result.code == 2 and result.err.startswith("error: [usage]")
