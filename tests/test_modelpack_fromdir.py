"""A ModelPack bundle served from the directory a container runtime mounts for an image volume (each layer's
file at its path, read-only), checked against the evidence `fetch --evidence-only` left beside it: the signed
manifest, config and signature. The guarantees of `serve --from-dir` hold: the bytes hashed are the bytes
loaded, the reference asked for is the one signed, and a hostile mount is refused before anything loads."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import runner.models.loading
from bundler.store.layout import Store
from bundler.store.refs import parse_ref
from bundler.trust.keys import key_id, load_private_key, load_public_key
from bundler.trust.sign import sign_modelkit
from bundler.store.modelkit import load_modelkit
from bundler.verbs.fetch import fetch
from bundler.verbs.fromdir import checked_dir, loaded_dir, parse_expected, private_copy
from bundler.verbs.pack import pack_checked
from conftest import run_bundle
from core.errors import BundleError
from registry_server import Registry, registry  # noqa: F401  (fixture)
from tests.modelpackbuild import make_writable, runtime_mount
from tests.tinymodels import make_pair

CONTEXT = (16, 8)  # prompt tokens, new tokens the caches must hold


def _trusted(pub: Path) -> dict:
    key = load_public_key(pub)
    return {key_id(key): key}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path], registry: Registry) -> dict:  # noqa: F811
    """A signed ModelPack pushed to a registry, its evidence fetched alone, the mount a runtime makes of it."""
    base = tmp_path_factory.mktemp("mpdir")
    make_pair(base / "ctx", tokenizer_in_models=True)
    ref = f"{registry.host}/mp/tiny-spec:1.0.0"
    store = Store(base / "store")
    result, _ = pack_checked(base / "ctx", parse_ref(ref), store, fmt="modelpack")
    files, roles = {f.path: f.sha256 for f in result.files}, {f.path: f.role for f in result.files}
    sign_modelkit(store, load_modelkit(store, parse_ref(ref)), load_private_key(keypair[0]), files, roles, 30)
    (base / "docker").mkdir()
    env = {"DOCKER_CONFIG": str(base / "docker"), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""}
    run_bundle("push", ref, "--plain-http", "--store", str(base / "store"), env=env, check=True)
    fetched = fetch(Store(base / "fetch-store"), f"bundle://{ref}", base / "evidence", _trusted(keypair[1]), plain_http=True, evidence_only=True)
    assert fetched.files == 0 and sorted(os.listdir(base / "evidence")) == ["config.json", "manifest.json", "origin.json", "signature.json"]
    runtime_mount(base / "store", ref, base / "mount")
    return {"base": base, "ref": ref, "digest": result.digest, "trusted": _trusted(keypair[1]), "evidence": base / "evidence", "mount": base / "mount"}


def _variant(bundle: dict, tmp_path: Path) -> Path:
    mount = tmp_path / "mount"
    shutil.copytree(bundle["mount"], mount)
    make_writable(mount)
    return mount


def test_a_runtime_mount_checked_against_its_evidence_loads_the_signed_pair(bundle: dict) -> None:
    before = runner.models.loading.LOADS
    with loaded_dir(bundle["mount"], bundle["trusted"], CONTEXT, expect=parse_expected(bundle["ref"]), evidence=bundle["evidence"]) as (pair, info, checks):
        assert info["digest"] == bundle["digest"] and info["ref"] == bundle["ref"]
        assert "files" in checks and "expected" in checks
        assert pair is not None
    assert runner.models.loading.LOADS == before + 2  # target and draft, from the mount's bytes


def test_fetch_lays_out_a_modelpack_as_the_runtime_mounts_it(bundle: dict) -> None:
    dest = bundle["base"] / "fetched"
    fetch(Store(bundle["base"] / "fetch-store"), f"bundle://{bundle['ref']}", dest, bundle["trusted"], plain_http=True)
    mounted = sorted(p.relative_to(bundle["mount"]).as_posix() for p in bundle["mount"].rglob("*") if p.is_file())
    fetched = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file() and ".specbundle" not in p.parts)
    assert fetched == mounted
    checked_dir(dest, bundle["trusted"], expect=parse_expected(bundle["ref"]))  # its own evidence, as before


def _extra(mount: Path) -> None:
    (mount / "target" / "extra.safetensors").write_bytes(b"\0" * 16)


def _symlink(mount: Path) -> None:
    (mount / "draft" / "config.json").unlink()
    os.symlink(mount / "target" / "config.json", mount / "draft" / "config.json")


def _missing(mount: Path) -> None:
    (mount / "tokenizer" / "tokenizer.json").unlink()


@pytest.mark.parametrize("change, code", [(_extra, "extra-file"), (_symlink, "unsafe-archive"), (_missing, "missing-file")])
def test_a_hostile_mount_is_refused_before_anything_loads(bundle: dict, tmp_path: Path, change, code: str) -> None:
    mount = _variant(bundle, tmp_path)
    change(mount)
    before = runner.models.loading.LOADS
    with pytest.raises(BundleError) as err:
        with loaded_dir(mount, bundle["trusted"], CONTEXT, expect=parse_expected(bundle["ref"]), evidence=bundle["evidence"]):
            pass
    assert err.value.code == code, err.value.line()
    assert runner.models.loading.LOADS == before


@pytest.mark.parametrize("path", ["tokenizer/tokenizer.json", "target/config.json"])
def test_a_file_swapped_after_the_check_is_refused_from_the_bytes_read(bundle: dict, tmp_path: Path, path: str) -> None:
    mount = _variant(bundle, tmp_path)
    checked = checked_dir(mount, bundle["trusted"], expect=parse_expected(bundle["ref"]), evidence=bundle["evidence"])
    (mount / path).write_bytes((mount / path).read_bytes().replace(b"}", b" }", 1))  # after the names were checked
    with pytest.raises(BundleError) as err:
        with private_copy(checked):
            pass
    assert err.value.code == "digest-mismatch" and path in err.value.message


def test_a_mount_of_another_bundle_is_refused_by_the_reference_asked_for(bundle: dict) -> None:
    with pytest.raises(BundleError) as err:
        checked_dir(bundle["mount"], bundle["trusted"], expect=parse_expected("other-model:1.0.0"), evidence=bundle["evidence"])
    assert err.value.code == "signature-mismatch"


def test_a_mount_without_evidence_says_how_to_get_it(bundle: dict) -> None:
    with pytest.raises(BundleError) as err:
        checked_dir(bundle["mount"], bundle["trusted"])
    assert err.value.code == "missing-file" and "--evidence-only" in err.value.message


def test_bundle_serve_from_a_runtime_mount_with_fetched_evidence_answers(bundle: dict, keypair: tuple[Path, Path], tmp_path: Path) -> None:
    """The command line a pod runs: `bundle fetch --evidence-only` into an empty directory, then `bundle serve
    --from-dir MOUNT --evidence DIR --expect REF` serves the signed pair from the read-only mount."""
    import signal
    import subprocess
    import sys
    import time

    import httpx

    from registry_server import free_port

    env = {"DOCKER_CONFIG": str(bundle["base"] / "docker"), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""}
    out = run_bundle("fetch", "--evidence-only", "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "s"),
                     f"bundle://{bundle['ref']}", str(tmp_path / "evidence"), env=env, check=True)
    assert out.out.splitlines()[-1] == bundle["digest"] and "evidence" in out.out
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bundler", "serve", "--from-dir", str(bundle["mount"]), "--evidence", str(tmp_path / "evidence"),
                             "--expect", bundle["ref"], "--key", str(keypair[1]), "--store", str(tmp_path / "s"), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    try:
        deadline, up = time.monotonic() + 180, False
        while not up and time.monotonic() < deadline and proc.poll() is None:
            try:
                up = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.3)
        assert up, proc.stderr.read() if proc.poll() is not None else "serve did not come up"
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hello", "max_tokens": 4, "temperature": 0}, timeout=120)
        assert r.status_code == 200 and r.headers["x-bundle-digest"] == bundle["digest"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_evidence_goes_with_from_dir(tmp_path: Path) -> None:
    result = run_bundle("serve", "x:1.0.0", "--evidence", str(tmp_path))
    assert result.code == 2 and "--evidence goes with --from-dir" in result.err
