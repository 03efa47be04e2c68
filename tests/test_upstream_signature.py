"""The publisher's signature (bundler.trust.upstream), through the library: a model directory signed with
model_signing 1.1.1 matches the files packed and verifies under its own trust entries; one changed byte is
refused before it could be carried; a keyless one verifies offline (the real signature of
tests/data/sigstore/SOURCE.md: sigstore/model-transparency e3430730bca924e672b2e59f10524a7ffb5adf79)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bundler.trust import keys, upstream
from core.errors import BundleError

DATA = Path(__file__).parent / "data" / "sigstore"


def _hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def signed_model(tmp_path):
    ms = pytest.importorskip("model_signing")
    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"weights" * 100)
    key = ec.generate_private_key(ec.SECP256R1())
    key_path = tmp_path / "publisher.key"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    ms.signing.Config().use_elliptic_key_signer(private_key=key_path).sign(model, model / "model.sig")
    return model, key.public_key()


def test_the_publishers_signature_is_found_beside_the_model_and_matches_the_files_packed(signed_model):
    model, _ = signed_model
    sig = upstream.find_signature(model)
    assert sig == model / "model.sig"
    claims = upstream.match(sig.read_bytes(), _hashes(model), "target")
    assert set(claims.files) == {"config.json", "model.safetensors"}


def test_one_changed_byte_in_a_publisher_signed_file_is_refused_at_pack(signed_model):
    model, _ = signed_model
    weights = model / "model.safetensors"
    weights.write_bytes(b"X" + weights.read_bytes()[1:])
    with pytest.raises(BundleError) as info:
        upstream.match((model / "model.sig").read_bytes(), _hashes(model), "target")
    assert info.value.code == "tampered" and info.value.exit_code == 3 and "model.safetensors" in info.value.message


def test_the_publishers_signature_verifies_under_its_own_key_and_no_other(signed_model):
    model, public = signed_model
    payload = (model / "model.sig").read_bytes()
    upstream.verify(payload, _hashes(model), "target", upstream.UpstreamTrust(trusted={keys.key_id(public): public}))
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(BundleError) as info:
        upstream.verify(payload, _hashes(model), "target", upstream.UpstreamTrust(trusted={keys.key_id(other): other}))
    assert info.value.code == "untrusted-signer"


def test_a_keyless_publisher_signature_verifies_offline_with_its_identity(tmp_path):
    pytest.importorskip("sigstore")
    model = tmp_path / "draft"
    shutil.copytree(DATA / "model", model)
    trust = upstream.UpstreamTrust(identity="stefanb@us.ibm.com", issuer="https://sigstore.verify.ibm.com/oauth2", trusted_root=DATA / "trusted_root.json")
    claims = upstream.verify((DATA / "model.sig").read_bytes(), _hashes(model), "draft", trust)
    assert claims.signer_name == "stefanb@us.ibm.com"
    with pytest.raises(BundleError) as info:
        upstream.verify((DATA / "model.sig").read_bytes(), _hashes(model), "draft", upstream.UpstreamTrust(trusted_root=DATA / "trusted_root.json", identity="x@example.org", issuer="https://sigstore.verify.ibm.com/oauth2"))
    assert info.value.code == "untrusted-signer"
