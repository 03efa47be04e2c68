"""Sigstore identities, offline: a real keyless model-signing signature verifies with its trusted root, its
identity and its issuer, with no network; each forged variant is refused with exit 3.

Test data (tests/data/sigstore/SOURCE.md): sigstore/model-transparency commit
e3430730bca924e672b2e59f10524a7ffb5adf79, scripts/tests/v1.1.0-sigstore/ (signed by stefanb@us.ibm.com via
https://sigstore.verify.ibm.com/oauth2 on the public-good instance); trusted_root.json from
sigstore/sigstore-python commit 27db13db157ecae5606eb22ec0be299ef348c370, sigstore/_store/ (production).
Checked through the library function (bundler.trust.sigstore_bundle), not through `bundle verify`.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

pytest.importorskip("sigstore")

from bundler.trust.sigstore_bundle import verify_keyless, verify_model_directory  # noqa: E402
from core.errors import BundleError  # noqa: E402

DATA = Path(__file__).parent / "data" / "sigstore"
IDENTITY = "stefanb@us.ibm.com"
ISSUER = "https://sigstore.verify.ibm.com/oauth2"


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: verification is offline."""
    def refuse(*args, **kwargs):
        raise AssertionError("network used during offline verification")
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture
def model(tmp_path):
    shutil.copytree(DATA / "model", tmp_path / "model")
    shutil.copy(DATA / "model.sig", tmp_path / "model.sig")
    return tmp_path


def _refused(fn, *args) -> BundleError:
    with pytest.raises(BundleError) as info:
        fn(*args)
    assert info.value.exit_code == 3, info.value.line()
    return info.value


def test_the_real_signature_verifies_offline_with_its_identity_and_issuer(model, no_network):
    claims = verify_model_directory(model / "model", model / "model.sig", DATA / "trusted_root.json", IDENTITY, ISSUER)
    assert claims.signer_name == IDENTITY
    assert set(claims.files) == {"signme-1", "signme-2"}


def test_another_identity_is_refused(model, no_network):
    err = _refused(verify_model_directory, model / "model", model / "model.sig", DATA / "trusted_root.json", "someone@example.org", ISSUER)
    assert err.code == "untrusted-signer"


def test_another_issuer_is_refused(model, no_network):
    err = _refused(verify_model_directory, model / "model", model / "model.sig", DATA / "trusted_root.json", IDENTITY, "https://accounts.google.com")
    assert err.code == "untrusted-signer"


def test_a_cut_inclusion_proof_is_refused(no_network):
    bundle = json.loads((DATA / "model.sig").read_bytes())
    proof = bundle["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]
    proof["hashes"] = proof["hashes"][:-1]
    err = _refused(verify_keyless, json.dumps(bundle).encode(), DATA / "trusted_root.json", IDENTITY, ISSUER)
    assert err.code == "signature-invalid"


def test_a_changed_file_is_refused(model, no_network):
    path = model / "model" / "signme-1"
    path.write_bytes(path.read_bytes()[:-1] + b"X")
    err = _refused(verify_model_directory, model / "model", model / "model.sig", DATA / "trusted_root.json", IDENTITY, ISSUER)
    assert err.code == "tampered" and "signme-1" in err.message


def test_a_changed_statement_is_refused(no_network):
    import base64

    bundle = json.loads((DATA / "model.sig").read_bytes())
    payload = base64.b64decode(bundle["dsseEnvelope"]["payload"]).replace(b"signme-1", b"signme-X")
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(payload).decode()
    err = _refused(verify_keyless, json.dumps(bundle).encode(), DATA / "trusted_root.json", IDENTITY, ISSUER)
    assert err.code == "signature-invalid"
