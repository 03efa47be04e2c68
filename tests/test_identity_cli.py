"""Certificate and Sigstore identities through the command line, as a user meets them: `keygen --csr` asks a CA
for a code-signing certificate, `pack --key --cert --chain` signs with it, `verify --ca --identity` names the
signer and refuses another identity or another CA (exit 3); `verify DIR --trusted-root` checks a real keyless
model-signing signature offline (tests/data/sigstore/SOURCE.md names its source and commit)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from conftest import run_bundle
from tests.test_cert_identity import DAY, IDENTITY, NOW, PKI
from tests.tinymodels import make_pair

SIGSTORE = Path(__file__).parent / "data" / "sigstore"
KEYLESS_IDENTITY = "stefanb@us.ibm.com"
KEYLESS_ISSUER = "https://sigstore.verify.ibm.com/oauth2"


def _pem(path: Path, *certs: x509.Certificate) -> str:
    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs))
    return str(path)


def _issue(pki: PKI, csr_path: Path) -> x509.Certificate:
    """What the CA does with the request: a leaf with the requested names and usage, under its intermediate."""
    csr = x509.load_pem_x509_csr(csr_path.read_bytes())
    assert csr.is_signature_valid
    builder = (x509.CertificateBuilder().subject_name(csr.subject).issuer_name(pki.intermediate.subject)
               .public_key(csr.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(NOW - DAY).not_valid_after(NOW + 30 * DAY)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(pki.int_key.public_key()), critical=False))
    for ext in csr.extensions:
        builder = builder.add_extension(ext.value, critical=ext.critical)
    return builder.sign(pki.int_key, hashes.SHA256())


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("identity")
    made = run_bundle("keygen", "-o", str(base / "keys"), "--csr", "release signer", "--csr-email", IDENTITY, check=True)
    assert "certificate request:" in made.out
    pki = PKI()
    leaf = _issue(pki, base / "keys" / "bundle.csr")
    make_pair(base / "ctx")
    run_bundle("pack", str(base / "ctx"), "-t", "tiny-spec:1.0.0", "--key", str(base / "keys" / "bundle.key"),
               "--cert", _pem(base / "leaf.pem", leaf), "--chain", _pem(base / "chain.pem", pki.intermediate),
               "--store", str(base / "store"), check=True)
    return {"base": base, "store": str(base / "store"), "ca": _pem(base / "root.pem", pki.root)}


def test_a_certificate_signed_bundle_verifies_by_name_with_its_ca(signed: dict) -> None:
    result = run_bundle("verify", "tiny-spec:1.0.0", "--ca", signed["ca"], "--identity", IDENTITY, "--store", signed["store"])
    assert result.code == 0, result.err
    assert f"signed by {IDENTITY}" in result.out


def test_another_identity_is_refused_with_exit_3(signed: dict) -> None:
    result = run_bundle("verify", "tiny-spec:1.0.0", "--ca", signed["ca"], "--identity", "someone@example.org", "--store", signed["store"])
    assert result.code == 3 and result.err.startswith("error: [untrusted-signer]") and len(result.err.strip().splitlines()) == 1


def test_another_ca_is_refused_with_exit_3(signed: dict, tmp_path: Path) -> None:
    other = _pem(tmp_path / "other.pem", PKI("Another Root CA").root)
    result = run_bundle("verify", "tiny-spec:1.0.0", "--ca", other, "--identity", IDENTITY, "--store", signed["store"])
    assert result.code == 3, result.err


def test_an_identity_without_a_ca_is_a_usage_error(signed: dict) -> None:
    result = run_bundle("verify", "tiny-spec:1.0.0", "--identity", IDENTITY, "--store", signed["store"])
    assert result.code == 2 and "--ca" in result.err


def test_a_cert_without_its_key_is_a_usage_error(signed: dict) -> None:
    result = run_bundle("pack", str(signed["base"] / "ctx"), "-t", "tiny-spec:2.0.0", "--cert", str(signed["base"] / "leaf.pem"),
                        "--store", signed["store"])
    assert result.code == 2 and "--cert needs --key" in result.err


def test_a_real_keyless_signature_verifies_offline(tmp_path: Path) -> None:
    pytest.importorskip("sigstore")
    shutil.copytree(SIGSTORE / "model", tmp_path / "model")
    result = run_bundle("verify", str(tmp_path / "model"), "--trusted-root", str(SIGSTORE / "trusted_root.json"),
                        "--signature", str(SIGSTORE / "model.sig"), "--identity", KEYLESS_IDENTITY, "--issuer", KEYLESS_ISSUER)
    assert result.code == 0, result.err
    assert KEYLESS_IDENTITY in result.out and "offline" in result.out


@pytest.mark.parametrize("identity, issuer, change", [
    ("someone@example.org", KEYLESS_ISSUER, False),
    (KEYLESS_IDENTITY, "https://accounts.google.com", False),
    (KEYLESS_IDENTITY, KEYLESS_ISSUER, True),
], ids=["another-identity", "another-issuer", "a-file-changed"])
def test_a_forged_keyless_variant_is_refused_with_exit_3(tmp_path: Path, identity: str, issuer: str, change: bool) -> None:
    pytest.importorskip("sigstore")
    shutil.copytree(SIGSTORE / "model", tmp_path / "model")
    if change:
        path = tmp_path / "model" / "signme-1"
        path.write_bytes(path.read_bytes() + b"!")
    result = run_bundle("verify", str(tmp_path / "model"), "--trusted-root", str(SIGSTORE / "trusted_root.json"),
                        "--signature", str(SIGSTORE / "model.sig"), "--identity", identity, "--issuer", issuer)
    assert result.code == 3 and result.err.startswith("error: [") and len(result.err.strip().splitlines()) == 1, result.err
