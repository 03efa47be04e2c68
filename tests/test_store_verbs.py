"""Store verbs a new user needs: tag, rm, gc, list, push SRC [DST], login/logout."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from bundletree import make_tree
from conftest import run_bundle
from registry_server import Registry, auth_registry, registry  # noqa: F401  (fixtures)


def _blobs(store: Path) -> set[str]:
    return {p.name for p in (store / "blobs" / "sha256").iterdir()}


def _pack(tmp_path: Path, store: Path, ref: str, key: Path | None, seed: int = 0, name: str = "tiny-spec") -> str:
    ctx = make_tree(tmp_path / f"ctx-{seed}-{name}", name=name, seed=seed)
    args = ["pack", str(ctx), "-t", ref, "--store", str(store)] + (["--key", str(key)] if key else [])
    return run_bundle(*args, check=True).out.strip().splitlines()[-1]


@pytest.fixture
def two_bundles(tmp_path: Path, keypair) -> tuple[Path, str, str]:
    store = tmp_path / "store"
    a = _pack(tmp_path, store, "a/tiny-spec:1.0.0", keypair[0], seed=0)
    b = _pack(tmp_path, store, "b/other-spec:1.0.0", keypair[0], seed=1, name="other-spec")
    return store, a, b


def test_tag_adds_a_second_name_that_verifies_with_the_same_signature(two_bundles, keypair) -> None:
    store, a, _ = two_bundles
    out = run_bundle("tag", "a/tiny-spec:1.0.0", "127.0.0.1:5000/models/tiny-spec:1.0.0", "--store", str(store), check=True)
    assert a in out.out
    v = run_bundle("verify", "127.0.0.1:5000/models/tiny-spec:1.0.0", "--key", str(keypair[1]), "--store", str(store))
    assert v.code == 0, v.err
    assert a in v.out


def test_tag_of_an_unknown_source_is_not_found_exit_2(two_bundles) -> None:
    store, _, _ = two_bundles
    r = run_bundle("tag", "tiny/nope:1", "tiny/x:1", "--store", str(store))
    assert r.code == 2 and r.err.startswith("error: [not-found]")


def test_rm_of_an_unknown_ref_removes_nothing(two_bundles) -> None:
    store, _, _ = two_bundles
    before = (store / "index.json").read_bytes()
    r = run_bundle("rm", "a/tiny-spec:1.0.0", "tiny/nope:1", "--store", str(store))
    assert r.code == 2 and "[not-found]" in r.err and "nothing removed" in r.err
    assert (store / "index.json").read_bytes() == before


def test_gc_after_rm_frees_exactly_the_unreachable_blobs_and_the_rest_still_reads(two_bundles, keypair, tmp_path: Path) -> None:
    store, a, b = two_bundles
    run_bundle("tag", "b/other-spec:1.0.0", "b/other-spec:latest", "--store", str(store), check=True)
    all_blobs = _blobs(store)
    bytes_of = {h: (store / "blobs" / "sha256" / h).read_bytes() for h in all_blobs}
    expected_kept = _used_by(store, b)
    assert run_bundle("rm", "a/tiny-spec:1.0.0", "--store", str(store), check=True).code == 0
    assert _blobs(store) == all_blobs  # rm leaves the blobs for gc

    dry = json.loads(run_bundle("gc", "--dry-run", "--json", "--store", str(store), check=True).out)
    assert _blobs(store) == all_blobs
    done = json.loads(run_bundle("gc", "--json", "--store", str(store), check=True).out)
    assert done["removed_blobs"] == dry["removed_blobs"] and not done["dry_run"]

    # Exactly the unreachable blobs are gone: those b (its tags and its signature) does not use.
    assert set(done["removed_blobs"]) == {"sha256:" + h for h in all_blobs - expected_kept}
    assert _blobs(store) == expected_kept
    assert a[7:] not in _blobs(store) and b[7:] in _blobs(store)
    assert done["bytes_freed"] == sum(len(bytes_of[h]) for h in all_blobs - expected_kept) > 0
    assert len(done["removed_manifests"]) == 4  # a's signature artifacts (model-signing, cosign-style) and attestations (SBOM, provenance)

    for ref in ("b/other-spec:1.0.0", "b/other-spec:latest"):
        v = run_bundle("verify", ref, "--key", str(keypair[1]), "--store", str(store))
        assert v.code == 0, v.err
        tag = ref.split(":")[1]
        raw = subprocess.run(["skopeo", "inspect", "--raw", f"oci:{store}:{ref}"], capture_output=True, text=True)
        assert raw.returncode == 0, raw.stderr
        assert json.loads(raw.stdout)["schemaVersion"] == 2, tag
    again = json.loads(run_bundle("gc", "--json", "--store", str(store), check=True).out)
    assert again["removed_blobs"] == [] and again["bytes_freed"] == 0


def _used_by(store: Path, bundle: str) -> set[str]:
    """Blob hexes of a bundle and of the signature artifacts whose subject it is, read from the files directly."""
    out = set()
    for m in json.loads((store / "index.json").read_text())["manifests"]:
        manifest = json.loads((store / "blobs" / "sha256" / m["digest"][7:]).read_text())
        if m["digest"] == bundle or (manifest.get("subject") or {}).get("digest") == bundle:
            out |= {m["digest"][7:], manifest["config"]["digest"][7:]} | {layer["digest"][7:] for layer in manifest["layers"]}
    return out


def test_gc_keeps_any_untagged_referrer_of_a_kept_bundle(two_bundles, keypair) -> None:
    store, a, _ = two_bundles
    # An artifact of another type (a run record, say) whose subject is bundle a: kept with a, gone after rm.
    from bundler.format.manifest import Descriptor, go_json
    from bundler.format.mediatypes import OCI_MANIFEST
    from bundler.store.layout import Store

    s = Store(store)
    a_size = (store / "blobs" / "sha256" / a[7:]).stat().st_size
    with s.transaction() as staging:
        cfg = staging.add_bytes(b"{}")
        layer = staging.add_bytes(b'{"record": 1}')
        manifest = go_json({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": "application/vnd.example.record+json",
                            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": cfg.digest, "size": cfg.size},
                            "layers": [{"mediaType": "application/json", "digest": layer.digest, "size": layer.size}],
                            "subject": {"mediaType": OCI_MANIFEST, "digest": a, "size": a_size}})
        desc = staging.add_bytes(manifest)
        staging.commit()
        s.add_untagged(Descriptor(OCI_MANIFEST, desc.digest, desc.size), "application/vnd.example.record+json")
    kept = json.loads(run_bundle("gc", "--json", "--store", str(store), check=True).out)
    assert kept["removed_blobs"] == [] and desc.digest[7:] in _blobs(store)
    run_bundle("rm", "a/tiny-spec:1.0.0", "--store", str(store), check=True)
    gone = json.loads(run_bundle("gc", "--json", "--store", str(store), check=True).out)
    assert desc.digest in gone["removed_manifests"] and layer.digest in gone["removed_blobs"]


def test_list_has_a_header_sizes_dates_signers_and_json(two_bundles, keypair) -> None:
    store, a, _ = two_bundles
    r = run_bundle("list", "--store", str(store), check=True)
    lines = r.out.splitlines()
    assert lines[0].split() == ["REF", "DIGEST", "NAME", "VERSION", "SIZE", "CREATED", "SIGNERS"]
    assert lines[1].startswith("a/tiny-spec:1.0.0") and "tiny-spec" in lines[1] and "KiB" in lines[1]
    rows = json.loads(run_bundle("list", "--json", "--store", str(store), check=True).out)
    first = rows[0]
    assert set(first) >= {"ref", "digest", "name", "version", "size", "created", "signers"}
    assert first["digest"] == a and first["version"] == "1.0.0" and first["size"] > 0
    from bundler.trust.keys import key_id, load_public_key

    assert first["signers"] == [key_id(load_public_key(keypair[1]))]
    assert first["created"].endswith("Z")


def test_list_of_an_empty_store_says_so(tmp_path: Path) -> None:
    r = run_bundle("list", "--store", str(tmp_path / "empty"), check=True)
    assert "no bundles in the store" in r.out
    assert json.loads(run_bundle("list", "--json", "--store", str(tmp_path / "empty"), check=True).out) == []


def test_push_src_dst_sends_a_local_name_to_a_registry(registry: Registry, two_bundles, tmp_path: Path, keypair) -> None:
    store, a, _ = two_bundles
    env = {"DOCKER_CONFIG": str(tmp_path / "docker")}
    dst = f"{registry.host}/models/tiny-spec:1.0.0"
    r = run_bundle("push", "a/tiny-spec:1.0.0", dst, "--plain-http", "--store", str(store), env=env)
    assert r.code == 0, r.err
    assert r.out.strip().splitlines()[-1] == a
    pulled = run_bundle("pull", dst, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "s2"), env=env)
    assert pulled.code == 0, pulled.err


def test_push_of_a_local_name_without_dst_is_a_usage_error(two_bundles) -> None:
    store, _, _ = two_bundles
    r = run_bundle("push", "a/tiny-spec:1.0.0", "--plain-http", "--store", str(store))
    assert r.code == 2 and r.err.startswith("error: [usage]") and "DST" in r.err


def test_login_password_stdin_writes_docker_config_and_logout_removes_it(auth_registry: Registry, two_bundles, tmp_path: Path) -> None:
    store, _, _ = two_bundles
    docker = tmp_path / "docker"
    env = {"DOCKER_CONFIG": str(docker)}
    dst = f"{auth_registry.host}/models/tiny-spec:1.0.0"
    denied = run_bundle("push", "a/tiny-spec:1.0.0", dst, "--plain-http", "--store", str(store), env=env)
    assert denied.code == 5
    import os
    import sys

    full = {**os.environ, **env, "PYTHONWARNINGS": "ignore"}
    login = subprocess.run([sys.executable, "-m", "bundler", "login", auth_registry.host, "-u", auth_registry.user, "--password-stdin"],
                           input=auth_registry.password + "\n", capture_output=True, text=True, env=full)
    assert login.returncode == 0, login.stderr
    config = json.loads((docker / "config.json").read_text())
    assert base64.b64decode(config["auths"][auth_registry.host]["auth"]).decode() == f"{auth_registry.user}:{auth_registry.password}"
    assert ((docker / "config.json").stat().st_mode & 0o777) == 0o600
    assert auth_registry.password not in login.stdout + login.stderr
    ok = run_bundle("push", "a/tiny-spec:1.0.0", dst, "--plain-http", "--store", str(store), env=env)
    assert ok.code == 0, ok.err
    out = run_bundle("logout", auth_registry.host, env=env, check=True)
    assert "removed" in out.out
    assert auth_registry.host not in json.loads((docker / "config.json").read_text())["auths"]


def test_login_without_a_terminal_or_password_stdin_is_a_usage_error(tmp_path: Path) -> None:
    r = run_bundle("login", "127.0.0.1:5000", "-u", "me", env={"DOCKER_CONFIG": str(tmp_path / "d")})
    assert r.code == 2 and r.err.startswith("error: [usage]")
    assert not (tmp_path / "d" / "config.json").exists()


def test_bare_bundle_prints_help_on_stdout_exit_0() -> None:
    r = run_bundle()
    assert r.code == 0 and r.err == ""
    assert "Commands:" in r.out and "gc" in r.out and not r.out.startswith("error:")


def _wait_for_stdin_read(pid: int, limit_s: float = 60.0) -> None:
    """Until the process blocks in read(0, ...) (/proc/PID/syscall: number 0, first argument 0), at most limit_s;
    where /proc does not say, 3 s. A Ctrl-C that lands earlier, while the CLI still imports, is another case
    (a traceback, exit 1 or -2, measured): a fixed sleep is a race on a slow machine."""
    import time

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            fields = Path(f"/proc/{pid}/syscall").read_text().split()
        except OSError:
            time.sleep(3)
            return
        if fields[:2] == ["0", "0x0"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"the process did not reach the read of stdin in {limit_s} s")


def test_ctrl_c_is_interrupted_exit_130_without_claiming_the_store(tmp_path: Path) -> None:
    import os
    import signal
    import sys
    import time

    env = {**os.environ, "DOCKER_CONFIG": str(tmp_path / "d"), "PYTHONWARNINGS": "ignore"}
    # Ctrl-C as at a terminal: a test run started in the background (`make test &`) ignores SIGINT, and a child
    # would inherit that and never see the signal.
    proc = subprocess.Popen([sys.executable, "-m", "bundler", "login", "127.0.0.1:5000", "-u", "me", "--password-stdin"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for_stdin_read(proc.pid)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.strip() == "error: [interrupted] stopped by Ctrl-C"
    assert not (tmp_path / "d" / "config.json").exists()
