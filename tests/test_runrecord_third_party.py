"""A third party checks a run record without specbundle: the store's files read as plain OCI layout JSON,
the DSSE signature checked with `cryptography` primitives alone, the statement with its published JSON
Schema. This module imports nothing of the project (the `bundle` CLI runs only as a subprocess)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import jsonschema
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from conftest import run_bundle
from tinymodels import make_pair

SCHEMA = Path(__file__).parent.parent / "schemas" / "run-record.schema.json"
REF = "tiny-spec:1.0.0"


def _write_keypair(directory: Path) -> tuple[Path, Path, ec.EllipticCurvePublicKey]:
    directory.mkdir()
    key = ec.generate_private_key(ec.SECP256R1())
    private = directory / "run.key"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    public = directory / "run.pub"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public, key.public_key()


def _blob(store: Path, digest: str) -> bytes:
    data = (store / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest  # content-addressed: the bytes are the ones named
    return data


def _pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding, from the DSSE specification."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("third-party")
    bundle_key, bundle_pub, _ = _write_keypair(base / "bundle-keys")
    run_key, run_pub, run_public = _write_keypair(base / "run-keys")
    make_pair(base / "ctx")
    store = base / "store"
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(bundle_key), "--store", str(store), check=True)
    out = run_bundle("run", REF, "--prompt", "hello", "--max-new-tokens", "6", "--key", str(bundle_pub),
                     "--attest", str(run_key), "--store", str(store), "--json", check=True)
    return {"store": store, "run": json.loads(out.out), "public": run_public}


def test_a_run_record_verifies_with_cryptography_alone(recorded: dict) -> None:
    store, public = recorded["store"], recorded["public"]
    index = json.loads((store / "index.json").read_text())
    bundle = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == REF)
    records = [m for m in index["manifests"] if m.get("artifactType") == "application/vnd.in-toto+json"]
    assert len(records) == 1
    manifest = json.loads(_blob(store, records[0]["digest"]))
    assert manifest["subject"]["digest"] == bundle["digest"]
    (layer,) = manifest["layers"]
    envelope = json.loads(_blob(store, layer["digest"]))
    (signature,) = envelope["signatures"]
    payload = base64.b64decode(envelope["payload"])

    # The signature: ECDSA P-256 / SHA-256 over the PAE; raises InvalidSignature if not.
    public.verify(base64.b64decode(signature["sig"]), _pae(envelope["payloadType"], payload), ec.ECDSA(hashes.SHA256()))
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert signature["keyid"] == hashlib.sha256(pem).hexdigest()
    assert envelope["payloadType"] == "application/vnd.in-toto+json"

    statement = json.loads(payload)
    jsonschema.validate(statement, json.loads(SCHEMA.read_text()))
    assert statement["predicateType"] == "https://specbundle.dev/run/v1"
    assert "sha256:" + statement["subject"][0]["digest"]["sha256"] == bundle["digest"] == recorded["run"]["bundle"]["digest"]
    assert statement["predicate"]["totals"]["tokens"] == recorded["run"]["stats"]["new_tokens"]


def test_a_changed_statement_fails_the_same_check(recorded: dict) -> None:
    from cryptography.exceptions import InvalidSignature

    store, public = recorded["store"], recorded["public"]
    index = json.loads((store / "index.json").read_text())
    record = next(m for m in index["manifests"] if m.get("artifactType") == "application/vnd.in-toto+json")
    envelope = json.loads(_blob(store, json.loads(_blob(store, record["digest"]))["layers"][0]["digest"]))
    payload = base64.b64decode(envelope["payload"]).replace(b'"requests":1', b'"requests":2')
    assert payload != base64.b64decode(envelope["payload"])
    with pytest.raises(InvalidSignature):
        public.verify(base64.b64decode(envelope["signatures"][0]["sig"]), _pae(envelope["payloadType"], payload), ec.ECDSA(hashes.SHA256()))
