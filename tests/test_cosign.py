"""Cosign-style signatures of the manifest digest (issue #28): made by `sign` / `pack --key`, carried by push
and pull, accepted by verify when they are the only signature that holds, each kind reported."""

from __future__ import annotations

import base64
import datetime as dt
import json
import shutil
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from conftest import assert_matches_schema, run_bundle
from registry_server import Registry, registry  # noqa: F401  (fixture)

from bundler.trust import cosign, keys
from bundler.store.modelkit import load_modelkit
from bundler.store.refs import parse_ref
from bundler.format.mediatypes import ATTESTATION_PREDICATES
from bundler.store.referrers import find_attestations, find_signatures
from bundler.trust.sign import attach_signature, sign_modelkit
from bundler.store.layout import Store

REF = "tiny-spec:1.0.0"
SIG_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
COSIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"


def _pack(tree: Path, store: Path, key: Path | None, ref: str = REF) -> str:
    args = ["pack", str(tree), "-t", ref, "--store", str(store)] + (["--key", str(key)] if key else [])
    return run_bundle(*args, check=True).out.strip().splitlines()[-1]


def _artifacts(store: Path, digest: str) -> dict[str, tuple[dict, bytes]]:
    """kind -> (signature artifact manifest, Sigstore bundle bytes) of the bundle's signatures."""
    s = Store(store)
    out = {}
    for desc, payload in find_signatures(s, digest):
        _, manifest = s.read_json_blob(desc)
        out[cosign.kind_of(payload)] = (manifest, payload)
    return out


def _statement(bundle_json: bytes) -> dict:
    return json.loads(base64.b64decode(json.loads(bundle_json)["dsseEnvelope"]["payload"]))


def _drop_model_signing(store: Path, digest: str) -> None:
    """Leave the bundle with its cosign-style signature only (as `cosign sign` alone would)."""
    s = Store(store)
    for desc, payload in find_signatures(s, digest):
        if cosign.kind_of(payload) != cosign.KIND:
            with s.lock():
                s.remove_manifest(desc.digest)


def _verify(store: Path, pub: Path, ref: str = REF):
    result = run_bundle("verify", ref, "--key", str(pub), "--json", "--store", str(store))
    return result, json.loads(result.out)


def test_pack_with_a_key_attaches_a_cosign_signature_of_the_manifest_digest(tree: Path, store_dir: Path, keypair) -> None:
    digest = _pack(tree, store_dir, keypair[0])
    manifest, payload = _artifacts(store_dir, digest)[cosign.KIND]
    assert manifest["artifactType"] == SIG_TYPE and manifest["subject"]["digest"] == digest
    assert manifest["config"]["mediaType"] == "application/vnd.oci.empty.v1+json" and manifest["config"]["size"] == 2
    assert [layer["mediaType"] for layer in manifest["layers"]] == [SIG_TYPE]
    notes = manifest["annotations"]
    assert notes["dev.sigstore.bundle.content"] == "dsse-envelope" and notes["dev.sigstore.bundle.predicateType"] == COSIGN_PREDICATE
    dt.datetime.fromisoformat(notes["org.opencontainers.image.created"].replace("Z", "+00:00"))
    bundle = json.loads(payload)
    assert bundle["mediaType"] == SIG_TYPE and bundle["verificationMaterial"]["tlogEntries"] == []
    statement = _statement(payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1" and statement["predicateType"] == COSIGN_PREDICATE
    assert statement["predicate"] == {} and [s["digest"] for s in statement["subject"]] == [{"sha256": digest[7:]}]


def test_cosign_signature_checks_with_the_public_key_alone(tree: Path, store_dir: Path, keypair) -> None:
    """ECDSA P-256 / SHA-256 over the DSSE PAE, checked here with `cryptography` only; the hint is cosign's."""
    digest = _pack(tree, store_dir, keypair[0])
    _, payload = _artifacts(store_dir, digest)[cosign.KIND]
    bundle = json.loads(payload)
    envelope = bundle["dsseEnvelope"]
    body = base64.b64decode(envelope["payload"])
    kind = envelope["payloadType"].encode()
    pae = b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)
    public = keys.load_public_key(keypair[1])
    public.verify(base64.b64decode(envelope["signatures"][0]["sig"]), pae, ec.ECDSA(hashes.SHA256()))
    assert bundle["verificationMaterial"]["publicKey"]["hint"] == cosign.cosign_hint(public)


def test_verify_reports_both_kinds_of_signature(tree: Path, store_dir: Path, keypair) -> None:
    digest = _pack(tree, store_dir, keypair[0])
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 0 and report["ok"]
    assert report["signature_kinds"] == ["cosign", "model-signing"]
    assert sorted((s["kind"], s["verified"]) for s in report["signatures"]) == [("cosign", True), ("model-signing", True)]
    attested = {d.digest for d, _, _ in find_attestations(Store(store_dir), digest)}  # the SBOM and provenance pack writes: no signatures
    assert {s["digest"] for s in report["signatures"]} == {m["digest"] for m in Store(store_dir).index()["manifests"] if m.get("artifactType") == SIG_TYPE} - attested
    assert report["digest"] == digest and report["skipped_signatures"] == []
    assert_matches_schema(report, "verify-report")


def test_verify_accepts_a_bundle_whose_only_signature_is_cosign_style(tree: Path, store_dir: Path, keypair, tmp_path: Path) -> None:
    digest = _pack(tree, store_dir, keypair[0])
    _drop_model_signing(store_dir, digest)
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 0, result.err
    assert report["signature_kinds"] == ["cosign"] and report["signer"]["key_id"] == keys.key_id(keys.load_public_key(keypair[1]))
    files = next(c for c in report["checks"] if c["name"] == "files")
    assert "hashed from the layers the signed manifest pins" in files["detail"]
    run_bundle("unpack", REF, "-d", str(tmp_path / "out"), "--key", str(keypair[1]), "--store", str(store_dir), check=True)
    assert (tmp_path / "out" / "tokenizer" / "tokenizer.json").read_bytes() == (tree / "tokenizer" / "tokenizer.json").read_bytes()


def test_cosign_only_bundle_by_another_key_is_untrusted(tree: Path, store_dir: Path, keypair, other_keypair) -> None:
    digest = _pack(tree, store_dir, keypair[0])
    _drop_model_signing(store_dir, digest)
    result, report = _verify(store_dir, other_keypair[1])
    assert result.code == 3 and report["error"]["code"] == "untrusted-signer"
    assert report["signature_kinds"] == [] and [s["kind"] for s in report["signatures"]] == ["cosign"]
    assert "Traceback" not in result.err and result.err.startswith("error: [untrusted-signer]")


def test_cosign_signature_of_another_manifest_does_not_count(tree: Path, store_dir: Path, keypair) -> None:
    digest = _pack(tree, store_dir, None)
    s = Store(store_dir)
    other = "sha256:" + "0" * 64
    attach_signature(s, load_modelkit(s, parse_ref(REF)), cosign.sign_digest(other, keys.load_private_key(keypair[0])), cosign.artifact_annotations(dt.datetime.now(dt.timezone.utc)))
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 3 and report["error"]["code"] == "signature-mismatch" and digest[:19] in report["error"]["message"]


def test_changed_payload_byte_fails_the_cosign_signature(tree: Path, store_dir: Path, keypair) -> None:
    digest = _pack(tree, store_dir, None)
    s = Store(store_dir)
    bundle = json.loads(cosign.sign_digest(digest, keys.load_private_key(keypair[0])))
    body = base64.b64decode(bundle["dsseEnvelope"]["payload"]).replace(b'"predicate":{}', b'"predicate":{ }')
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(body).decode()
    attach_signature(s, load_modelkit(s, parse_ref(REF)), json.dumps(bundle).encode(), {})
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 3 and report["error"]["code"] == "signature-invalid"


def test_expired_cosign_signature_is_refused(tree: Path, store_dir: Path, keypair) -> None:
    digest = _pack(tree, store_dir, None)
    s = Store(store_dir)
    past = {cosign.EXPIRES_ANNOTATION: "2020-01-01T00:00:00Z"}
    attach_signature(s, load_modelkit(s, parse_ref(REF)), cosign.sign_digest(digest, keys.load_private_key(keypair[0]), past), {})
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 3 and report["error"]["code"] == "expired"


def test_signing_again_replaces_the_keys_expired_cosign_signature(tree: Path, store_dir: Path, keypair) -> None:
    digest = _pack(tree, store_dir, None)
    s = Store(store_dir)
    sign_modelkit(s, load_modelkit(s, parse_ref(REF)), keys.load_private_key(keypair[0]), valid_days=-1)  # the CLI refuses <= 0
    expired = _artifacts(store_dir, digest)[cosign.KIND][0]
    run_bundle("sign", REF, "--key", str(keypair[0]), "--store", str(store_dir), check=True)
    kinds = [cosign.kind_of(p) for _, p in find_signatures(Store(store_dir), digest)]
    assert kinds.count(cosign.KIND) == 1 and _artifacts(store_dir, digest)[cosign.KIND][0] != expired
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 0 and report["signature_kinds"] == ["cosign", "model-signing"]


def test_push_lists_both_signatures_in_the_referrers_tag_fallback(registry: Registry, tree: Path, tmp_path: Path, keypair) -> None:  # noqa: F811
    ref = f"{registry.host}/cosign/tiny-spec:1.0.0"
    digest = _pack(tree, tmp_path / "s", keypair[0], ref)
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s"), check=True)
    index = requests.get(f"http://{registry.host}/v2/cosign/tiny-spec/manifests/sha256-{digest[7:]}", headers={"Accept": "application/vnd.oci.image.index.v1+json"}, timeout=10).json()
    assert {m["artifactType"] for m in index["manifests"]} == {SIG_TYPE}
    types = sorted(m["annotations"]["dev.sigstore.bundle.predicateType"] for m in index["manifests"])
    # the two signatures, and the SBOM and provenance attestations pack writes (bundler/trust/attestation.py)
    assert types == sorted([COSIGN_PREDICATE, "https://model_signing/signature/v1.0", *ATTESTATION_PREDICATES])


def test_pull_keeps_both_signatures_and_accepts_a_cosign_only_bundle(registry: Registry, tree: Path, tmp_path: Path, keypair) -> None:  # noqa: F811
    both, only = f"{registry.host}/both/tiny-spec:1.0.0", f"{registry.host}/only/tiny-spec:1.0.0"
    digest = _pack(tree, tmp_path / "s", keypair[0], both)
    run_bundle("tag", both, only, "--store", str(tmp_path / "s"), check=True)
    run_bundle("push", both, "--plain-http", "--store", str(tmp_path / "s"), check=True)
    _drop_model_signing(tmp_path / "s", digest)
    run_bundle("push", only, "--plain-http", "--store", str(tmp_path / "s"), check=True)

    run_bundle("pull", both, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "p1"), check=True)
    assert sorted(_artifacts(tmp_path / "p1", digest)) == ["cosign", "model-signing"]
    pulled = run_bundle("pull", only, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "p2"))
    assert pulled.code == 0, pulled.err
    result, report = _verify(tmp_path / "p2", keypair[1], only)
    assert result.code == 0 and report["signature_kinds"] == ["cosign"]


def test_pull_of_a_cosign_only_bundle_by_another_key_downloads_no_layer(registry: Registry, tree: Path, tmp_path: Path, keypair, other_keypair) -> None:  # noqa: F811
    ref = f"{registry.host}/foreign/tiny-spec:1.0.0"
    digest = _pack(tree, tmp_path / "s", keypair[0], ref)
    _drop_model_signing(tmp_path / "s", digest)
    layers = [d.digest for _, d in load_modelkit(Store(tmp_path / "s"), parse_ref(ref)).layers]
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s"), check=True)
    shutil.rmtree(tmp_path / "s")
    pulled = run_bundle("pull", ref, "--plain-http", "--key", str(other_keypair[1]), "--store", str(tmp_path / "p"))
    assert pulled.code == 3 and pulled.err.startswith("error: [untrusted-signer]")
    assert [registry.requests_seen("GET", f"/foreign/tiny-spec/blobs/{layer}") for layer in layers] == [0] * len(layers)


@pytest.mark.parametrize("bad", [b"not json", b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}'])
def test_a_malformed_cosign_bundle_is_a_clear_error(bad: bytes, keypair) -> None:
    with pytest.raises(Exception) as info:
        cosign.verify_digest(bad, {"k": keys.load_public_key(keypair[1])}, "sha256:" + "0" * 64)
    assert getattr(info.value, "code", None) == "signature-invalid"


def test_a_foreign_model_signing_signature_does_not_block_a_cosign_only_bundle(tree: Path, store_dir: Path, keypair, other_keypair) -> None:
    digest = _pack(tree, store_dir, None)
    s = Store(store_dir)
    mk = load_modelkit(s, parse_ref(REF))
    sign_modelkit(s, mk, keys.load_private_key(other_keypair[0]))  # anyone's signatures, both kinds, first in the index
    attach_signature(s, mk, cosign.sign_digest(digest, keys.load_private_key(keypair[0])), {})
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 0, result.err
    assert report["signature_kinds"] == ["cosign"] and report["skipped_signatures"][0]["error"]["code"] == "untrusted-signer"


def test_a_tampered_model_signing_signature_naming_the_trusted_key_decides_nothing(tree: Path, store_dir: Path, keypair) -> None:
    """A model-signing signature whose signature bytes do not verify is no statement of the key (its hint is
    unsigned): the cosign-style signature beside it decides. One validly signed by the key that fails a later
    check still decides (tests/test_hostile_referrers.py)."""
    digest = _pack(tree, store_dir, keypair[0])
    s = Store(store_dir)
    for desc, payload in find_signatures(s, digest):
        if cosign.kind_of(payload) == cosign.MODEL_SIGNING_KIND:
            bundle = json.loads(payload)
            sig = bundle["dsseEnvelope"]["signatures"][0]["sig"]
            bundle["dsseEnvelope"]["signatures"][0]["sig"] = sig[:10] + ("B" if sig[10] == "A" else "A") + sig[11:]
            with s.lock():
                s.remove_manifest(desc.digest)
            attach_signature(s, load_modelkit(s, parse_ref(REF)), json.dumps(bundle).encode(), {})
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 0, result.err
    assert report["signature_kinds"] == ["cosign"]
    assert [(x["kind"], x["verified"]) for x in report["signatures"]] == [("cosign", True), ("model-signing", False)]
    assert_matches_schema(report, "verify-report")


def test_cosign_legacy_flag_pushes_the_sig_tag_cosign_and_policy_controller_read(registry: Registry, tree: Path, tmp_path: Path, keypair) -> None:  # noqa: F811
    ref = f"{registry.host}/legacy/tiny-spec:1.0.0"
    digest = run_bundle("pack", str(tree), "-t", ref, "--key", str(keypair[0]), "--cosign-legacy", "--store", str(tmp_path / "s"), check=True).out.strip().splitlines()[-1]
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s"), check=True)
    base = f"http://{registry.host}/v2/legacy/tiny-spec"
    manifest = requests.get(f"{base}/manifests/sha256-{digest[7:]}.sig", headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}, timeout=10).json()
    [layer] = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    payload = requests.get(f"{base}/blobs/{layer['digest']}", timeout=10).content
    simple = json.loads(payload)
    assert simple["critical"]["image"]["docker-manifest-digest"] == digest
    assert simple["critical"]["type"] == "cosign container image signature"
    signature = base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"])
    keys.load_public_key(keypair[1]).verify(signature, payload, ec.ECDSA(hashes.SHA256()))


def test_without_the_flag_no_sig_tag_is_pushed(registry: Registry, tree: Path, tmp_path: Path, keypair) -> None:  # noqa: F811
    ref = f"{registry.host}/nolegacy/tiny-spec:1.0.0"
    digest = _pack(tree, tmp_path / "s", keypair[0], ref)
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s"), check=True)
    got = requests.get(f"http://{registry.host}/v2/nolegacy/tiny-spec/manifests/sha256-{digest[7:]}.sig", headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}, timeout=10)
    assert got.status_code == 404


def test_gc_removes_the_cosign_signatures_with_their_bundle(tree: Path, store_dir: Path, keypair) -> None:
    run_bundle("pack", str(tree), "-t", REF, "--key", str(keypair[0]), "--cosign-legacy", "--store", str(store_dir), check=True)
    assert len(Store(store_dir).index()["manifests"]) == 6  # the bundle, model-signing, cosign-style, legacy .sig, SBOM, provenance
    run_bundle("rm", REF, "--store", str(store_dir), check=True)
    run_bundle("gc", "--store", str(store_dir), check=True)
    assert Store(store_dir).index()["manifests"] == []
