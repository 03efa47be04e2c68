"""Hostile registry responses (tests/hostile_registry.py, a small HTTP server on 127.0.0.1 whose answers the test
writes): referrers lists that are huge, malformed or too many, manifests that are bombs or cut short, uploads
without a location, 5xx, a trickled blob. Each is a registry or bundle error with its exit code, never a crash."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

from attacker import StoreEditor
from conftest import Result, run_bundle
from hostile_registry import Reply, Seen, hostile
from hostile_store import _refused, BOMB, REF, packed  # noqa: F401  (fixtures)


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "docker").mkdir(exist_ok=True)
    return {"DOCKER_CONFIG": str(tmp_path / "docker"), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": "", **extra}


def _bundle_route(store: Path, override: Callable[[Seen], Reply | None]) -> Callable[[Seen, bytes], Reply]:
    """Serve the store's bundle as a registry would, except where `override` answers."""
    index = json.loads((store / "index.json").read_text())
    [entry] = [m for m in index["manifests"] if "annotations" in m]

    def blob(digest: str) -> bytes:
        return (store / "blobs" / "sha256" / digest.split(":")[1]).read_bytes()

    def route(req: Seen, body: bytes) -> Reply:
        if (reply := override(req)) is not None:
            return reply
        if req.path.endswith("/manifests/1.0.0"):
            return Reply(200, {"Content-Type": OCI_MANIFEST}, blob(entry["digest"]))
        if "/blobs/sha256:" in req.path:
            return Reply(200, {}, blob(req.path.rsplit("/", 1)[1]))
        return Reply(404)

    return route


def _pull(reg_host: str, tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[Result, Path]:
    store = tmp_path / "pulled"
    result = run_bundle("pull", f"{reg_host}/org/tiny-spec:1.0.0", "--plain-http", *extra, "--store", str(store), env=env or _env(tmp_path))
    return result, store


def _store_empty(store: Path) -> bool:
    return not (store / "index.json").exists() or json.loads((store / "index.json").read_text())["manifests"] == []


@pytest.mark.parametrize(
    ("body", "content_type"),
    [(b"not json at all", OCI_INDEX), (BOMB, OCI_INDEX), (b'{"manifests": "no"}', OCI_INDEX)],
    ids=["not-json", "nesting-bomb", "manifests-not-a-list"],
)
def test_hostile_referrers_response_is_a_registry_error(packed: Path, tmp_path: Path, keypair, body: bytes, content_type: str) -> None:
    route = _bundle_route(packed, lambda req: Reply(200, {"Content-Type": content_type}, body) if "/referrers/" in req.path else None)
    with hostile(route) as reg:
        result, store = _pull(reg.host, tmp_path, "--key", str(keypair[1]))
    _refused(result, 5, "registry")
    assert _store_empty(store)


def test_thousands_of_referrers_cost_at_most_32_requests(packed: Path, tmp_path: Path, keypair) -> None:
    """2 x MAX_SIGNATURES listed referrers are read, each missing one skipped (one bad referrer must not end
    the pull: issue #40), the rest never asked for."""
    from bundler.trust.signature_checks import MAX_SIGNATURES

    fake = [{"mediaType": OCI_MANIFEST, "digest": f"sha256:{i:064x}", "size": 100, "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json"} for i in range(3000)]
    listing = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": fake}).encode()
    route = _bundle_route(packed, lambda req: Reply(200, {"Content-Type": OCI_INDEX}, listing) if "/referrers/" in req.path else None)
    with hostile(route) as reg:
        result, store = _pull(reg.host, tmp_path, "--key", str(keypair[1]), env=_env(tmp_path, BUNDLE_RETRIES="0"))
    assert result.code in (3, 5) and result.err.startswith("error: ["), result.err
    assert result.err.startswith("error: [signature-missing] "), result.err
    assert len([r for r in reg.seen if "/manifests/sha256:" in r.path]) <= 2 * MAX_SIGNATURES
    assert _store_empty(store)


def test_referrers_response_larger_than_the_bound_is_a_registry_error(packed: Path, tmp_path: Path, keypair) -> None:
    huge = b'{"manifests": [' + b" " * (5 << 20) + b"]}"
    route = _bundle_route(packed, lambda req: Reply(200, {"Content-Type": OCI_INDEX}, huge) if "/referrers/" in req.path else None)
    with hostile(route) as reg:
        result, store = _pull(reg.host, tmp_path, "--key", str(keypair[1]))
    _refused(result, 5, "registry")


@pytest.mark.parametrize(("body", "code"), [(BOMB, "invalid-bundle"), (b"{\"schemaVersion\": 2, \"layers\": [", "invalid-bundle")], ids=["nesting-bomb", "cut-short-json"])
def test_hostile_manifest_is_invalid_bundle(packed: Path, tmp_path: Path, body: bytes, code: str) -> None:
    route = _bundle_route(packed, lambda req: Reply(200, {"Content-Type": OCI_MANIFEST}, body) if "/manifests/1.0.0" in req.path else None)
    with hostile(route) as reg:
        result, store = _pull(reg.host, tmp_path, "--allow-unsigned")
    _refused(result, 6, code)
    assert _store_empty(store)


def test_manifest_connection_cut_short_is_a_network_error(packed: Path, tmp_path: Path) -> None:
    route = _bundle_route(packed, lambda req: Reply(200, {"Content-Type": OCI_MANIFEST}, b'{"schemaVersion": 2', content_length=5000) if "/manifests/1.0.0" in req.path else None)
    with hostile(route) as reg:
        result, store = _pull(reg.host, tmp_path, "--allow-unsigned", env=_env(tmp_path, BUNDLE_RETRIES="0"))
    _refused(result, 5, "registry-unreachable")


def test_signature_manifest_with_subject_as_a_list_counts_as_no_signature(packed: Path, tmp_path: Path, keypair) -> None:
    import hashlib

    index = json.loads((packed / "index.json").read_text())
    sigs = [m for m in index["manifests"] if "artifactType" in m]
    assert len(sigs) == 4  # model-signing, cosign-style, the SBOM and provenance attestations: each served with its subject as a list
    [entry] = [m for m in index["manifests"] if "annotations" in m]
    served: dict[str, bytes] = {}
    for sig in sigs:
        sig_manifest = json.loads((packed / "blobs" / "sha256" / sig["digest"].split(":")[1]).read_bytes())
        sig_manifest["subject"] = [sig_manifest["subject"]]
        data = json.dumps(sig_manifest).encode()
        served["sha256:" + hashlib.sha256(data).hexdigest()] = data
    listing = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [{**sig, "digest": d, "size": len(data)} for sig, (d, data) in zip(sigs, served.items())]}).encode()

    def override(req: Seen) -> Reply | None:
        if req.path.endswith("/manifests/" + entry["digest"].replace(":", "-")):
            return Reply(200, {"Content-Type": OCI_INDEX}, listing)
        for digest, data in served.items():
            if req.path.endswith(f"/manifests/{digest}"):
                return Reply(200, {"Content-Type": OCI_MANIFEST}, data)
        return None

    with hostile(_bundle_route(packed, override)) as reg:
        result, store = _pull(reg.host, tmp_path, "--key", str(keypair[1]))
    _refused(result, 3, "signature-missing")
    assert _store_empty(store)


def test_upload_accepted_without_location_is_a_registry_error(packed: Path, tmp_path: Path) -> None:
    def route(req: Seen, body: bytes) -> Reply:
        return Reply(202) if req.method == "POST" else Reply(404)

    with hostile(route) as reg:
        store = tmp_path / "store"
        shutil.copytree(packed, store)
        StoreEditor(store).retag(REF, f"{reg.host}/org/tiny-spec:1.0.0")
        result = run_bundle("push", f"{reg.host}/org/tiny-spec:1.0.0", "--plain-http", "--store", str(store), env=_env(tmp_path))
    _refused(result, 5, "registry")
    assert "Location" in result.err


def test_5xx_is_retried_a_bounded_number_of_times_then_exit_5(packed: Path, tmp_path: Path) -> None:
    route = _bundle_route(packed, lambda req: Reply(503) if "/manifests/" in req.path else None)
    with hostile(route) as reg:
        result, _ = _pull(reg.host, tmp_path, "--allow-unsigned", env=_env(tmp_path, BUNDLE_RETRIES="2"))
    _refused(result, 5, "registry")
    assert len([r for r in reg.seen if "/manifests/" in r.path]) == 3, "one try and two retries"


def test_5xx_then_success_is_retried_through(packed: Path, tmp_path: Path) -> None:
    failures = {"left": 2}

    def flaky(req: Seen) -> Reply | None:
        if "/manifests/1.0.0" in req.path and failures["left"]:
            failures["left"] -= 1
            return Reply(502)
        return None

    with hostile(_bundle_route(packed, flaky)) as reg:
        result, store = _pull(reg.host, tmp_path, "--allow-unsigned")
    assert result.code == 0, result.err


def test_blob_trickled_below_the_minimum_rate_is_cut_off(packed: Path, tmp_path: Path) -> None:
    def trickle(req: Seen) -> Reply | None:
        if "/blobs/sha256:" in req.path:
            data = (packed / "blobs" / "sha256" / req.path.rsplit(":", 1)[1]).read_bytes()
            return Reply(200, {}, data, trickle=0.5)
        return None

    with hostile(_bundle_route(packed, trickle)) as reg:
        env = _env(tmp_path, BUNDLE_MIN_RATE="1000", BUNDLE_MIN_RATE_GRACE="1", BUNDLE_RETRIES="0")
        result, store = _pull(reg.host, tmp_path, "--allow-unsigned", env=env)
    _refused(result, 5, "registry-unreachable")
    assert "minimum rate" in result.err
    assert _store_empty(store)
