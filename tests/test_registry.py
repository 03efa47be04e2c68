"""`bundle push` / `bundle pull` against a real registry (Debian's docker-registry on 127.0.0.1)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import requests

from bundletree import _model_dir, make_tree
from conftest import run_bundle, tree_digest
from registry_server import Registry, auth_registry, free_port, registry  # noqa: F401  (fixtures)

from bundler.trust import keys
from bundler.registry import pull as pulling, push as pushing
from bundler.store.refs import parse_ref
from bundler.store.layout import Store

SIG_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"


def _pack(tree: Path, store: Path, ref: str, key: Path | None) -> str:
    args = ["pack", str(tree), "-t", ref, "--store", str(store)] + (["--key", str(key)] if key else [])
    return run_bundle(*args, check=True).out.strip().splitlines()[-1]


def _no_creds(tmp_path: Path) -> dict[str, str]:
    """An environment with no registry credentials anywhere (an empty DOCKER_CONFIG)."""
    (tmp_path / "no-docker").mkdir(exist_ok=True)
    return {"DOCKER_CONFIG": str(tmp_path / "no-docker"), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _big_tree(root: Path, seed: int) -> Path:
    """A bundle whose target layer (~4 MiB) spans several 1 MiB reads."""
    make_tree(root, name="big-spec", seed=seed)
    _model_dir(root / "target", 256, 8, seed)
    return root


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return _no_creds(tmp_path)


def test_round_trip_gives_the_same_digest_files_and_signature(registry: Registry, tree: Path, tmp_path: Path, keypair, env) -> None:
    ref = f"{registry.host}/tiny/tiny-spec:v1"
    digest = _pack(tree, tmp_path / "s1", ref, keypair[0])
    pushed = run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s1"), env=env, check=True)
    assert pushed.out.strip().splitlines()[-1] == digest
    shutil.rmtree(tmp_path / "s1")
    pulled = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "s2"), env=env, check=True)
    assert pulled.out.strip().splitlines()[-1] == digest
    verified = run_bundle("verify", ref, "--key", str(keypair[1]), "--json", "--store", str(tmp_path / "s2"), check=True)
    report = json.loads(verified.out)
    assert report["digest"] == digest and report["signer"]["key_id"] == keys.key_id(keys.load_public_key(keypair[1]))
    run_bundle("unpack", ref, "-d", str(tmp_path / "out"), "--key", str(keypair[1]), "--store", str(tmp_path / "s2"), check=True)
    unpacked = _files(tmp_path / "out")
    assert {k: v for k, v in unpacked.items() if k != "Kitfile"} == {k: v for k, v in _files(tree).items() if k != "Kitfile"}


def test_second_push_uploads_no_blob(registry: Registry, tree: Path, tmp_path: Path, keypair, env) -> None:
    ref = f"{registry.host}/twice/tiny-spec:v1"
    _pack(tree, tmp_path / "s", ref, keypair[0])
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s"), env=env, check=True)
    uploads = registry.requests_seen("POST", "/twice/tiny-spec/blobs/uploads"), registry.requests_seen("PATCH", "/twice/tiny-spec/blobs/uploads")
    again = run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s"), env=env, check=True)
    assert "0 blobs uploaded (0 bytes)" in again.out
    assert (registry.requests_seen("POST", "/twice/tiny-spec/blobs/uploads"), registry.requests_seen("PATCH", "/twice/tiny-spec/blobs/uploads")) == uploads


def test_registry_serves_our_manifest_byte_for_byte(registry: Registry, tree: Path, tmp_path: Path, keypair, env) -> None:
    ref = f"{registry.host}/bytes/tiny-spec:v1"
    digest = _pack(tree, tmp_path / "s", ref, keypair[0])
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s"), env=env, check=True)
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"], capture_output=True, check=True).stdout
    assert raw == (tmp_path / "s" / "blobs" / "sha256" / digest[7:]).read_bytes()


def test_signature_travels_in_the_referrers_tag_fallback(registry: Registry, tree: Path, tmp_path: Path, keypair, env) -> None:
    ref = f"{registry.host}/sig/tiny-spec:v1"
    digest = _pack(tree, tmp_path / "s", ref, keypair[0])
    sigs = Store(tmp_path / "s").untagged(SIG_TYPE)
    # the model-signing signature and the cosign-style one (docs/cosign.md), the SBOM and the provenance (docs/trust.md)
    assert len(sigs) == 4
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s"), env=env, check=True)
    base = f"http://{registry.host}/v2/sig/tiny-spec"
    assert requests.get(f"{base}/referrers/{digest}").status_code == 404  # docker-registry 2.8 has no referrers API
    index = requests.get(f"{base}/manifests/sha256-{digest[7:]}", headers={"Accept": "application/vnd.oci.image.index.v1+json"}).json()
    assert sorted((m["digest"], m["artifactType"]) for m in index["manifests"]) == sorted((sig.digest, SIG_TYPE) for sig in sigs)
    for sig in sigs:
        subject = requests.get(f"{base}/manifests/{sig.digest}", headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}).json()["subject"]
        assert subject["digest"] == digest


def test_corrupted_blob_in_registry_is_caught_and_nothing_is_stored(registry: Registry, tmp_path: Path, keypair, env) -> None:
    ref = f"{registry.host}/corrupt/tiny-spec:v1"
    tree = make_tree(tmp_path / "ctx", seed=41)  # blobs no other test shares: this one damages them
    digest = _pack(tree, tmp_path / "s1", ref, keypair[0])
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s1"), env=env, check=True)
    layers = json.loads((tmp_path / "s1" / "blobs" / "sha256" / digest[7:]).read_bytes())["layers"]
    blob = registry.blob_file(max(layers, key=lambda l: l["size"])["digest"])
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    store = tmp_path / "s2"
    run_bundle("pull", ref, "--plain-http", "--allow-unsigned", "--store", str(store), env=env)  # lays out .specbundle
    before = tree_digest(store)
    result = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(store), env=env)
    assert result.code == 3 and "[digest-mismatch]" in result.err
    assert tree_digest(store) == before and Store(store).entries() == []


def test_interrupted_pull_resumes_and_verifies(registry: Registry, tmp_path: Path, keypair, monkeypatch) -> None:
    monkeypatch.delenv("BUNDLE_REGISTRY_USER", raising=False)
    ref = parse_ref(f"{registry.host}/resume/big-spec:v1")
    digest = _pack(_big_tree(tmp_path / "ctx", 3), tmp_path / "s1", str(ref), keypair[0])
    pushing.push(Store(tmp_path / "s1"), ref, plain_http=True)
    total = sum(p.stat().st_size for p in (tmp_path / "s1" / "blobs" / "sha256").iterdir()) - (tmp_path / "s1" / "blobs" / "sha256" / digest[7:]).stat().st_size
    (tmp_path / "no-keys").mkdir()
    trusted = keys.trusted_keys([keypair[1]], tmp_path / "no-keys")
    seen: dict[str, int] = {}

    class Killed(Exception):
        pass

    def die_halfway(label: str, n: int) -> None:
        seen[label] = seen.get(label, 0) + n
        if seen[label] >= 2 << 20:
            raise Killed(label)

    store = Store(tmp_path / "s2")
    with pytest.raises(Killed):
        pulling.pull(store, ref, trusted=trusted, plain_http=True, progress=die_halfway)
    assert store.entries() == []
    result = pulling.pull(store, ref, trusted=trusted, plain_http=True)
    assert result.digest == digest and result.signer
    # the second run fetched only what the first did not finish: the big layer from 2 MiB on (a Range request)
    # (manifest bytes are not blobs here, so `total` counts config, layers and signature blobs)
    assert 0 < result.bytes_downloaded <= total - (2 << 20)
    assert registry.requests_seen("GET", "/resume/big-spec/blobs/") and "http.response.status=206" in registry.log.read_text()
    assert [e.ref for e in store.entries()] == [str(ref)]


def test_large_blobs_go_up_in_chunks_and_a_broken_upload_resumes(registry: Registry, tmp_path: Path, keypair, monkeypatch) -> None:
    monkeypatch.delenv("BUNDLE_REGISTRY_USER", raising=False)
    monkeypatch.setattr(pushing, "CHUNK", 1 << 20)
    ref = parse_ref(f"{registry.host}/chunks/big-spec:v1")
    _pack(_big_tree(tmp_path / "ctx", 5), tmp_path / "s1", str(ref), keypair[0])
    sent: dict[str, int] = {}

    class Broken(Exception):
        pass

    def break_in_chunk_three(label: str, n: int) -> None:
        sent[label] = sent.get(label, 0) + n
        if sent[label] > (2 << 20) + 4096:
            raise Broken(label)

    store = Store(tmp_path / "s1")
    with pytest.raises(Broken):
        pushing.push(store, ref, plain_http=True, progress=break_in_chunk_three)
    patches = registry.requests_seen("PATCH", "/chunks/big-spec/blobs/uploads")
    assert patches >= 2
    result = pushing.push(store, ref, plain_http=True)
    layer_total = sum(layer["size"] for layer in store.read_json_blob(store.resolve(ref))[1]["layers"])
    small_blobs = 64 << 10  # config and signature blobs
    assert 0 < result.bytes_uploaded <= layer_total + small_blobs - (2 << 20)  # the first two chunks were not sent again
    (tmp_path / "no-keys").mkdir()
    pulled = pulling.pull(Store(tmp_path / "s2"), ref, trusted=keys.trusted_keys([keypair[1]], tmp_path / "no-keys"), plain_http=True)
    assert pulled.digest == result.digest


def test_auth_registry_takes_env_credentials_and_never_prints_the_password(auth_registry: Registry, tree: Path, tmp_path: Path, keypair, env) -> None:
    ref = f"{auth_registry.host}/env/tiny-spec:v1"
    digest = _pack(tree, tmp_path / "s1", ref, keypair[0])
    creds = env | {"BUNDLE_REGISTRY_USER": auth_registry.user, "BUNDLE_REGISTRY_PASSWORD": auth_registry.password}
    pushed = run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s1"), env=creds, check=True)
    pulled = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "s2"), env=creds, check=True)
    assert pulled.out.strip().splitlines()[-1] == digest
    assert all(auth_registry.password not in text for text in (pushed.out, pushed.err, pulled.out, pulled.err))


def test_auth_registry_takes_docker_config_json(auth_registry: Registry, tree: Path, tmp_path: Path, keypair, env) -> None:
    ref = f"{auth_registry.host}/dockercfg/tiny-spec:v1"
    digest = _pack(tree, tmp_path / "s1", ref, keypair[0])
    docker = tmp_path / "docker"
    docker.mkdir()
    token = base64.b64encode(f"{auth_registry.user}:{auth_registry.password}".encode()).decode()
    (docker / "config.json").write_text(json.dumps({"auths": {auth_registry.host: {"auth": token}}}))
    cfg = env | {"DOCKER_CONFIG": str(docker)}
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s1"), env=cfg, check=True)
    pulled = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "s2"), env=cfg, check=True)
    assert pulled.out.strip().splitlines()[-1] == digest


def test_auth_registry_without_credentials_is_registry_auth_exit_5(auth_registry: Registry, tmp_path: Path, env) -> None:
    result = run_bundle("pull", f"{auth_registry.host}/env/tiny-spec:v1", "--plain-http", "--allow-unsigned", "--store", str(tmp_path / "s"), env=env)
    assert result.code == 5 and result.err.startswith("error: [registry-auth]") and len(result.err.strip().splitlines()) == 1


def test_wrong_password_is_registry_auth_and_not_printed(auth_registry: Registry, tmp_path: Path, env) -> None:
    bad = env | {"BUNDLE_REGISTRY_USER": auth_registry.user, "BUNDLE_REGISTRY_PASSWORD": "not-the-Password-42"}
    result = run_bundle("pull", f"{auth_registry.host}/env/tiny-spec:v1", "--plain-http", "--allow-unsigned", "--store", str(tmp_path / "s"), env=bad)
    assert result.code == 5 and "[registry-auth]" in result.err and "not-the-Password-42" not in result.err + result.out


def test_unreachable_registry_is_exit_5(tmp_path: Path, env) -> None:
    result = run_bundle("pull", f"127.0.0.1:{free_port()}/x/tiny-spec:v1", "--plain-http", "--allow-unsigned", "--store", str(tmp_path / "s"), env=env)
    assert result.code == 5 and result.err.startswith("error: [registry-unreachable]")


def test_unknown_tag_is_registry_not_found_exit_5(registry: Registry, tmp_path: Path, env) -> None:
    result = run_bundle("pull", f"{registry.host}/tiny/tiny-spec:no-such-tag", "--plain-http", "--allow-unsigned", "--store", str(tmp_path / "s"), env=env)
    assert result.code == 5 and result.err.startswith("error: [registry-not-found]")


def test_unsigned_bundle_pulled_with_a_key_is_refused_and_the_store_unchanged(registry: Registry, tree: Path, tmp_path: Path, keypair, env) -> None:
    signed, unsigned = f"{registry.host}/signed/tiny-spec:v1", f"{registry.host}/unsigned/other-spec:v1"
    _pack(tree, tmp_path / "s1", signed, keypair[0])
    _pack(make_tree(tmp_path / "ctx2", name="other-spec", seed=9), tmp_path / "s1", unsigned, None)
    for ref in (signed, unsigned):
        run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s1"), env=env, check=True)
    store = tmp_path / "s2"
    run_bundle("pull", signed, "--plain-http", "--key", str(keypair[1]), "--store", str(store), env=env, check=True)
    before = tree_digest(store)
    result = run_bundle("pull", unsigned, "--plain-http", "--key", str(keypair[1]), "--store", str(store), env=env)
    assert result.code == 3 and "[signature-missing]" in result.err
    assert tree_digest(store) == before


def test_bundle_signed_by_an_untrusted_key_is_refused(registry: Registry, tree: Path, tmp_path: Path, keypair, other_keypair, env) -> None:
    ref = f"{registry.host}/untrusted/tiny-spec:v1"
    _pack(tree, tmp_path / "s1", ref, keypair[0])
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s1"), env=env, check=True)
    result = run_bundle("pull", ref, "--plain-http", "--key", str(other_keypair[1]), "--store", str(tmp_path / "s2"), env=env)
    assert result.code == 3 and "[untrusted-signer]" in result.err
    assert Store(tmp_path / "s2").entries() == []


def test_push_of_a_name_without_registry_host_is_a_usage_error(tree: Path, tmp_path: Path, env) -> None:
    _pack(tree, tmp_path / "s", "tiny-spec:1.0.0", None)
    result = run_bundle("push", "tiny-spec:1.0.0", "--store", str(tmp_path / "s"), env=env)
    assert result.code == 2 and "names no registry" in result.err


@pytest.mark.parametrize("repo_tag", ["tiny-spec:1.1.0", "prod-model:9.9.9"], ids=["newer-version-tag", "other-name"])
def test_pull_of_a_tag_that_is_not_what_was_signed_is_refused(registry: Registry, tree: Path, tmp_path: Path, keypair, env, repo_tag: str) -> None:
    ref = f"{registry.host}/org/{repo_tag}"  # the signed bundle is tiny-spec 1.0.0
    _pack(tree, tmp_path / "s1", ref, keypair[0])
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s1"), env=env, check=True)
    store = tmp_path / "s2"
    result = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(store), env=env)
    assert result.code == 3 and result.err.startswith("error: [signature-mismatch] ") and "--allow-ref-mismatch" in result.err, result.err
    assert Store(store).entries() == []
    run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--allow-ref-mismatch", "--store", str(store), env=env, check=True)
