"""Registry credentials and trust order: a hostile registry (tests/hostile_registry.py, a small HTTP server on
127.0.0.1) and a second local server it points at: credentials reach only the registry host the user named,
whatever the registry says; a hostile docker config is a registry-auth error; pull checks the signature before any
layer. Hostile registry responses: tests/test_hostile_registry_responses.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attacker import StoreEditor
from bundletree import make_tree
from conftest import run_bundle, tree_digest
from hostile_registry import Reply, Seen, hostile

PASSWORD = "s3cret-password"


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> Path:
    """A store holding tiny-spec 1.0.0, signed: its files are what the hostile registry serves."""
    root = tmp_path_factory.mktemp("hostile-registry")
    make_tree(root / "ctx")
    run_bundle("pack", str(root / "ctx"), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--store", str(root / "store"), check=True)
    return root / "store"


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "docker").mkdir(exist_ok=True)
    return {"DOCKER_CONFIG": str(tmp_path / "docker"), "BUNDLE_REGISTRY_USER": "alice", "BUNDLE_REGISTRY_PASSWORD": PASSWORD}


def _basic_required(req: Seen) -> Reply | None:
    if "authorization" not in req.headers:
        return Reply(401, {"WWW-Authenticate": 'Basic realm="registry"'})
    return None


def test_cross_host_upload_location_gets_no_credentials(packed: Path, tmp_path: Path) -> None:
    """The registry answers the upload POST with a Location on another server: that server never sees the password."""
    with hostile(lambda req, body: Reply(202, {"Location": f"http://{other.host}/upload/1", "Range": "0-0"}) if req.method == "PATCH" else Reply(201)) as other:

        def registry(req: Seen, body: bytes) -> Reply:
            if (challenge := _basic_required(req)) is not None:
                return challenge
            if req.method == "HEAD":
                return Reply(404)
            if req.method == "POST":
                return Reply(202, {"Location": f"http://{other.host}/upload/1"})
            if req.method == "GET":
                return Reply(404)
            return Reply(201)

        with hostile(registry) as reg:
            store = tmp_path / "store"
            shutil.copytree(packed, store)
            StoreEditor(store).retag("tiny-spec:1.0.0", f"{reg.host}/org/tiny-spec:1.0.0")
            result = run_bundle("push", f"{reg.host}/org/tiny-spec:1.0.0", "--plain-http", "--store", str(store), env=_env(tmp_path))
    assert result.code in (0, 2, 5), result.err  # never a crash; the registry told us where to put the bytes
    assert reg.authorization_seen(), f"the registry itself got the credentials (so they were in use): {result.err} {[(r.method, r.path) for r in reg.seen]}"
    assert other.seen, "the upload went to the other server"
    assert other.authorization_seen() == [], "credentials leaked to the upload Location's host"
    assert PASSWORD not in result.out + result.err


def test_redirect_target_bearer_challenge_gets_no_credentials(packed: Path, tmp_path: Path) -> None:
    """Blobs redirect to another server which answers 401 Bearer with a token service of its own choosing."""
    index = json.loads((packed / "index.json").read_text())
    [entry] = [m for m in index["manifests"] if "annotations" in m]
    manifest = (packed / "blobs" / "sha256" / entry["digest"].split(":")[1]).read_bytes()

    def other_route(req: Seen, body: bytes) -> Reply:
        return Reply(401, {"WWW-Authenticate": f'Bearer realm="http://{other.host}/token",service="evil",scope="repository:org/tiny-spec:pull"'})

    with hostile(other_route) as other:

        def registry(req: Seen, body: bytes) -> Reply:
            if (challenge := _basic_required(req)) is not None:
                return challenge
            if "/manifests/1.0.0" in req.path:
                return Reply(200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json", "Docker-Content-Digest": entry["digest"]}, manifest)
            if "/blobs/" in req.path:
                return Reply(307, {"Location": f"http://{other.host}/blob{req.path}"})
            return Reply(404)

        with hostile(registry) as reg:
            store = tmp_path / "pulled"
            result = run_bundle("pull", f"{reg.host}/org/tiny-spec:1.0.0", "--plain-http", "--allow-unsigned", "--store", str(store), env=_env(tmp_path))
    assert result.code == 5 and result.err.startswith("error: [registry-auth] "), result.err
    assert reg.authorization_seen()
    assert any(r.path.startswith("/blob") for r in other.seen), "the redirect was followed"
    assert other.authorization_seen() == [], "credentials leaked to the redirect target or its token service"
    assert not any(r.path.startswith("/token") for r in other.seen), "the redirect target's token service was asked"
    assert tree_digest(store / "blobs") == "absent" or not list((store / "blobs" / "sha256").iterdir())


def test_plain_http_is_refused_for_a_registry_off_loopback(tmp_path: Path) -> None:
    result = run_bundle("pull", "registry.example.com/org/tiny-spec:1.0.0", "--plain-http", "--allow-unsigned", "--store", str(tmp_path / "s"), env=_env(tmp_path))
    assert result.code == 2 and result.err.startswith("error: [usage] ") and "loopback" in result.err, result.err


def _serve_store(store: Path, signed: bool = True):
    """A registry route serving a store's bundle (and, when signed, its signatures via the fallback tag)."""
    from bundler.format.mediatypes import OCI_INDEX

    index = json.loads((store / "index.json").read_text())
    [entry] = [m for m in index["manifests"] if "annotations" in m]
    sigs = [m for m in index["manifests"] if "artifactType" in m] if signed else []

    def blob(digest: str) -> bytes:
        return (store / "blobs" / "sha256" / digest.split(":")[1]).read_bytes()

    def route(req: Seen, body: bytes) -> Reply:
        if req.path.endswith("/manifests/1.0.0") or req.path.endswith(f"/manifests/{entry['digest']}"):
            return Reply(200, {"Content-Type": entry["mediaType"], "Docker-Content-Digest": entry["digest"]}, blob(entry["digest"]))
        for sig in sigs:
            if req.path.endswith(f"/manifests/{sig['digest']}"):
                return Reply(200, {"Content-Type": sig["mediaType"]}, blob(sig["digest"]))
        if sigs and req.path.endswith("/manifests/" + entry["digest"].replace(":", "-")):
            return Reply(200, {"Content-Type": OCI_INDEX}, json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": sigs}).encode())
        if "/blobs/sha256:" in req.path:
            return Reply(200, {}, blob(req.path.rsplit("/", 1)[1]))
        return Reply(404)

    return route, json.loads(blob(entry["digest"]))


def test_pull_checks_the_signature_before_downloading_any_layer(packed: Path, tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    route, manifest = _serve_store(packed, signed=False)
    layers = {layer["digest"] for layer in manifest["layers"]}
    with hostile(route) as reg:
        store = tmp_path / "pulled"
        result = run_bundle("pull", f"{reg.host}/org/tiny-spec:1.0.0", "--plain-http", "--key", str(keypair[1]), "--store", str(store), env=_env(tmp_path))
    assert result.code == 3 and result.err.startswith("error: [signature-missing] "), result.err
    fetched = {r.path.rsplit("/", 1)[1] for r in reg.seen if "/blobs/" in r.path}
    assert not fetched & layers, "a layer was downloaded before the signature was checked"


def test_pull_keeps_only_the_signature_that_verified(packed: Path, tmp_path: Path, keypair: tuple[Path, Path], other_keypair: tuple[Path, Path]) -> None:
    source = tmp_path / "source"
    shutil.copytree(packed, source)
    editor = StoreEditor(source)
    mine = {m["digest"] for m in editor.signatures()}  # the trusted key's model-signing and cosign-style signatures
    editor.sign_with_key("tiny-spec:1.0.0", other_keypair[0])  # a foreign signature beside the trusted one
    assert len(mine) == 2 and len(editor.signatures()) == 4
    route, _ = _serve_store(source)
    with hostile(route) as reg:
        store = tmp_path / "pulled"
        result = run_bundle("pull", f"{reg.host}/org/tiny-spec:1.0.0", "--plain-http", "--key", str(keypair[1]), "--store", str(store), env=_env(tmp_path))
    assert result.code == 0, result.err
    assert {m["digest"] for m in StoreEditor(store).signatures()} == mine


@pytest.mark.parametrize("content", [b"[1]", b'{"auths": [1]}', b'{"credHelpers": "x"}', b"[" * 100_000, b" " * (5 << 20)])
def test_a_hostile_docker_config_is_a_registry_auth_error(tmp_path: Path, content: bytes) -> None:
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / "config.json").write_bytes(content)
    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", "127.0.0.1:9/x/tiny-spec:1.0.0", "--store", str(store), check=True)
    result = run_bundle("push", "127.0.0.1:9/x/tiny-spec:1.0.0", "--plain-http", "--store", str(store),
                        env={"DOCKER_CONFIG": str(docker), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""})
    assert result.code == 5 and result.err.startswith("error: [registry-auth] "), result.err
    assert len(result.err.strip().splitlines()) == 1
