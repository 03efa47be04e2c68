"""Attestations through a real registry (docker-registry 2.8: no referrers API, so the referrers tag schema):
after `pack --key` and `push`, the registry lists the SBOM and provenance as cosign 3 lists attestations;
`pull --require sbom,provenance` into a second store keeps them, and refuses with exit 3, keeping nothing, when
one is missing or its signature is wrong."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path

import requests

from conftest import run_bundle
from registry_server import registry  # noqa: F401  (fixture)

from bundler.format.mediatypes import CYCLONEDX_BOM, PREDICATE_TYPE_ANNOTATION, SIGSTORE_BUNDLE, SLSA_PROVENANCE_V1
from bundler.store.layout import Store
from bundler.store.modelkit import load_modelkit
from bundler.store.referrers import find_attestations
from bundler.store.refs import parse_ref
from bundler.trust import attestation


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "no-docker").mkdir(exist_ok=True)
    return {"DOCKER_CONFIG": str(tmp_path / "no-docker"), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""}


def _packed(tree: Path, store: Path, ref: str, key: Path) -> str:
    return run_bundle("pack", str(tree), "-t", ref, "--key", str(key), "--store", str(store), check=True).out.strip().splitlines()[-1]


def _pull(ref: str, store: Path, pub: Path, env: dict[str, str], *extra: str):
    return run_bundle("pull", ref, "--plain-http", "--key", str(pub), "--store", str(store), *extra, env=env)


def test_push_puts_sbom_and_provenance_referrers_and_pull_require_keeps_them(registry, tree: Path, tmp_path: Path, keypair) -> None:  # noqa: F811
    env = _env(tmp_path)
    ref = f"{registry.host}/attest/tiny-spec:1.0.0"
    src, dst = tmp_path / "src", tmp_path / "dst"
    digest = _packed(tree, src, ref, keypair[0])
    pushed = run_bundle("push", ref, "--plain-http", "--store", str(src), env=env, check=True)
    assert "2 signature(s)" in pushed.out and "2 attestation(s)" in pushed.out
    index = requests.get(f"http://{registry.host}/v2/attest/tiny-spec/manifests/sha256-{digest[7:]}",
                         headers={"Accept": "application/vnd.oci.image.index.v1+json"}, timeout=10).json()
    listed = [m for m in index["manifests"] if m["artifactType"] == SIGSTORE_BUNDLE]
    assert sorted(m["annotations"][PREDICATE_TYPE_ANNOTATION] for m in listed if m["annotations"][PREDICATE_TYPE_ANNOTATION] in
                  (CYCLONEDX_BOM, SLSA_PROVENANCE_V1)) == [CYCLONEDX_BOM, SLSA_PROVENANCE_V1]
    pulled = _pull(ref, dst, keypair[1], env, "--require", "sbom,provenance")
    assert pulled.code == 0, pulled.err
    assert pulled.out.strip().splitlines()[-1] == digest and "2 attestation(s)" in pulled.out
    run_bundle("verify", ref, "--key", str(keypair[1]), "--store", str(dst), "--require", "sbom,provenance", check=True)
    rows = json.loads(run_bundle("attestations", ref, "--key", str(keypair[1]), "--store", str(dst), "--type", "all", "--json", check=True).out)
    assert sorted(r["type"] for r in rows) == ["provenance", "sbom"] and all(r["verified"] for r in rows)


def test_pull_require_fails_with_exit_3_when_the_sbom_is_missing(registry, tree: Path, tmp_path: Path, keypair) -> None:  # noqa: F811
    env = _env(tmp_path)
    ref = f"{registry.host}/no-sbom/tiny-spec:1.0.0"
    src, dst = tmp_path / "src", tmp_path / "dst"
    digest = _packed(tree, src, ref, keypair[0])
    store = Store(src)
    [sbom] = [desc for desc, kind, _ in find_attestations(store, digest) if kind == CYCLONEDX_BOM]
    store.remove_manifest(sbom.digest)
    run_bundle("push", ref, "--plain-http", "--store", str(src), env=env, check=True)
    refused = _pull(ref, dst, keypair[1], env, "--require", "sbom,provenance")
    assert refused.code == 3 and refused.err.startswith("error: [signature-missing]") and "no sbom attestation" in refused.err
    assert run_bundle("list", "--store", str(dst)).out.count("tiny-spec") == 0  # nothing landed
    assert _pull(ref, dst, keypair[1], env, "--require", "provenance").code == 0  # what is there is enough for what is asked


def test_pull_require_fails_with_exit_3_when_a_signature_is_wrong(registry, tree: Path, tmp_path: Path, keypair) -> None:  # noqa: F811
    env = _env(tmp_path)
    ref = f"{registry.host}/bad-sig/tiny-spec:1.0.0"
    src, dst = tmp_path / "src", tmp_path / "dst"
    digest = _packed(tree, src, ref, keypair[0])
    store = Store(src)
    [(prov, _, data)] = [a for a in find_attestations(store, digest) if a[1] == SLSA_PROVENANCE_V1]
    bundle = json.loads(data)
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["buildDefinition"]["externalParameters"]["reference"] = "evil/other:1.0.0"  # a changed claim, same signature
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    store.remove_manifest(prov.digest)
    subject = load_modelkit(store, parse_ref(ref)).manifest_desc
    attestation.store_attestation(store, subject, SLSA_PROVENANCE_V1, json.dumps(bundle).encode(), dt.datetime.now(dt.timezone.utc))
    run_bundle("push", ref, "--plain-http", "--store", str(src), env=env, check=True)
    refused = _pull(ref, dst, keypair[1], env, "--require", "sbom,provenance")
    assert refused.code == 3 and refused.err.startswith("error: [signature-invalid]") and "provenance attestation" in refused.err
    assert run_bundle("list", "--store", str(dst)).out.count("tiny-spec") == 0
    kept = _pull(ref, dst, keypair[1], env)  # without --require the bundle lands, the bad attestation stays behind
    assert kept.code == 0 and "1 attestation(s)" in kept.out
