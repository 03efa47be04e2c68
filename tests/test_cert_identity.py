"""Certificate identities: a signature made with a leaf certificate and its chain (model-signing's certificate
format) verifies against the CA roots and identities a user trusts, at the signing time, and each way it can
be wrong is refused with exit 3 and one line naming the reason. The CA, intermediate and leaves are made
here with `cryptography`; model_signing 1.1.1 checks ours and we check its."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bundler.trust import certificates, signature
from core.errors import BundleError

NOW = dt.datetime.now(dt.timezone.utc)
DAY = dt.timedelta(days=1)
IDENTITY = "release@example.org"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key, issuer_name: str, issuer_key, *, ca: bool, start=NOW - DAY, end=NOW + 30 * DAY, eku=True, email=None):
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer_name))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(start).not_valid_after(end)
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False))
    if ca:
        b = b.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
    else:
        b = b.add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        if eku:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        if email:
            b = b.add_extension(x509.SubjectAlternativeName([x509.RFC822Name(email)]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


class PKI:
    """A root, an intermediate under it, and leaves made on demand."""

    def __init__(self, cn: str = "Test Root CA") -> None:
        self.root_key = ec.generate_private_key(ec.SECP256R1())
        self.root = _cert(cn, self.root_key, cn, self.root_key, ca=True, start=NOW - 400 * DAY, end=NOW + 3650 * DAY)
        self.int_key = ec.generate_private_key(ec.SECP256R1())
        self.intermediate = _cert("Test Intermediate", self.int_key, cn, self.root_key, ca=True, start=NOW - 400 * DAY, end=NOW + 3650 * DAY)

    def leaf(self, **kw):
        key = ec.generate_private_key(ec.SECP256R1())
        kw.setdefault("email", IDENTITY)
        return key, _cert("signer", key, "Test Intermediate", self.int_key, ca=False, **kw)


FILES = {"target/model.safetensors": hashlib.sha256(b"w").hexdigest()}


def _sign(key, chain, created=NOW) -> bytes:
    fields = {"name": "m", "version": "1.0.0", "manifest_digest": "sha256:" + "0" * 64, "created": signature.format_time(created)}
    return signature.sign(FILES, fields, key, "m", certificates=chain)


def _trust(pki: PKI, identities=(IDENTITY,)) -> certificates.TrustPolicy:
    return certificates.TrustPolicy({}, certificates.CertificateTrust(roots=(pki.root,), identities=tuple(identities)))


def _refused(payload: bytes, trust) -> BundleError:
    with pytest.raises(BundleError) as info:
        signature.verify(payload, trust)
    assert info.value.exit_code == 3 and "\n" not in info.value.message
    return info.value


def test_a_certificate_signature_verifies_with_its_ca_and_names_the_signer():
    pki = PKI()
    key, leaf = pki.leaf()
    claims = signature.verify(_sign(key, [leaf, pki.intermediate]), _trust(pki))
    assert claims.signer_name == IDENTITY and claims.files == FILES


def test_another_ca_is_refused():
    pki, other = PKI(), PKI("Other Root CA")
    key, leaf = pki.leaf()
    err = _refused(_sign(key, [leaf, pki.intermediate]), _trust(other))
    assert err.code == "untrusted-signer" and "none of the trusted CAs" in err.message


def test_a_leaf_expired_at_signing_time_is_refused():
    pki = PKI()
    key, leaf = pki.leaf(start=NOW - 10 * DAY, end=NOW - 5 * DAY)
    err = _refused(_sign(key, [leaf, pki.intermediate]), _trust(pki))
    assert err.code == "expired" and "had expired at the signing time" in err.message


def test_a_leaf_not_yet_valid_at_signing_time_is_refused():
    pki = PKI()
    key, leaf = pki.leaf(start=NOW + DAY)
    err = _refused(_sign(key, [leaf, pki.intermediate]), _trust(pki))
    assert err.code == "expired" and "not yet valid" in err.message


def test_validity_is_judged_at_the_signing_time_not_now():
    pki = PKI()
    key, leaf = pki.leaf(start=NOW - 10 * DAY, end=NOW - 5 * DAY)
    claims = signature.verify(_sign(key, [leaf, pki.intermediate], created=NOW - 7 * DAY), _trust(pki))
    assert claims.signer_name == IDENTITY


def test_a_leaf_without_code_signing_usage_is_refused():
    pki = PKI()
    key, leaf = pki.leaf(eku=False)
    err = _refused(_sign(key, [leaf, pki.intermediate]), _trust(pki))
    assert err.code == "signature-invalid" and "code signing" in err.message


def test_a_wrong_identity_is_refused():
    pki = PKI()
    key, leaf = pki.leaf(email="intruder@example.org")
    err = _refused(_sign(key, [leaf, pki.intermediate]), _trust(pki))
    assert err.code == "untrusted-signer" and "intruder@example.org" in err.message


def test_a_broken_chain_is_refused():
    pki = PKI()
    key, leaf = pki.leaf()
    err = _refused(_sign(key, [leaf]), _trust(pki))  # the intermediate left out
    assert err.code == "signature-invalid" and "broken certificate chain" in err.message


def test_a_self_issued_leaf_is_never_a_signer_even_when_given_as_a_ca():
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = _cert("signer", key, "signer", key, ca=False, email=IDENTITY)
    trust = certificates.TrustPolicy({}, certificates.CertificateTrust(roots=(leaf,)))
    err = _refused(_sign(key, [leaf]), trust)
    assert err.code == "signature-invalid" and "self-issued" in err.message


def test_a_leaf_given_as_a_ca_root_is_refused_when_the_policy_is_read(tmp_path):
    pki = PKI()
    _, leaf = pki.leaf()
    path = tmp_path / "leaf.pem"
    path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(BundleError) as info:
        certificates.roots_from([path])
    assert info.value.code == "key-error" and "is not a CA" in info.value.message


def test_a_changed_payload_under_a_valid_certificate_is_refused():
    import base64
    import json

    pki = PKI()
    key, leaf = pki.leaf()
    bundle = json.loads(_sign(key, [leaf, pki.intermediate]))
    other = json.loads(_sign(key, [leaf, pki.intermediate], created=NOW - DAY))
    bundle["dsseEnvelope"]["signatures"] = other["dsseEnvelope"]["signatures"]
    err = _refused(json.dumps(bundle).encode(), _trust(pki))
    assert err.code == "signature-invalid"
    assert base64  # the payload is intact; only the signature belongs to another one


# ---------------------------------------------------------------- model_signing 1.1.1 both ways


def _pem(path: Path, *certs) -> Path:
    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs))
    return path


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    (model / "target").mkdir(parents=True)
    (model / "target" / "model.safetensors").write_bytes(b"w")
    return model


def test_model_signing_verifies_our_certificate_signature(tmp_path):
    ms = pytest.importorskip("model_signing")
    pki = PKI()
    key, leaf = pki.leaf()
    model = _model_dir(tmp_path)
    sig = tmp_path / "model.sig"
    sig.write_bytes(_sign(key, [leaf, pki.intermediate]))
    config = ms.verifying.Config().use_certificate_verifier(certificate_chain=[_pem(tmp_path / "ca.pem", pki.root)])
    config.verify(model, sig)  # raises on failure


def test_we_verify_model_signings_certificate_signature(tmp_path):
    ms = pytest.importorskip("model_signing")
    pki = PKI()
    key, leaf = pki.leaf()
    model = _model_dir(tmp_path)
    key_path = tmp_path / "leaf.key"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    sig = tmp_path / "model.sig"
    ms.signing.Config().use_certificate_signer(
        private_key=key_path, signing_certificate=_pem(tmp_path / "leaf.pem", leaf),
        certificate_chain=[_pem(tmp_path / "int.pem", pki.intermediate)]).sign(model, sig)
    claims = signature.verify(sig.read_bytes(), _trust(pki))
    assert claims.signer_name == IDENTITY
    assert claims.files == FILES


# ---------------------------------------------------------------- a bundle in the store


def test_a_bundle_signed_with_a_certificate_verifies_by_name_and_refuses_another_identity(tree, tmp_path):
    from bundler.store.layout import Store
    from bundler.store.modelkit import load_modelkit
    from bundler.store.refs import parse_ref
    from bundler.trust.sign import sign_modelkit
    from bundler.trust.verify import verify_bundle
    from conftest import run_bundle

    store = tmp_path / "store"
    run_bundle("pack", str(tree), "-t", "tiny-spec:1.0.0", "--store", str(store), check=True)
    pki = PKI()
    key, leaf = pki.leaf()
    mk = load_modelkit(Store(store), parse_ref("tiny-spec:1.0.0"))
    sign_modelkit(Store(store), mk, key, certificates=[leaf, pki.intermediate])
    report = verify_bundle(Store(store), parse_ref("tiny-spec:1.0.0"), _trust(pki))
    assert report.ok, report.error
    assert report.claims is not None and report.claims.signer_name == IDENTITY
    assert any(IDENTITY in c.detail for c in report.checks if c.name == "signature")
    refused = verify_bundle(Store(store), parse_ref("tiny-spec:1.0.0"), _trust(pki, identities=("other@example.org",)), record=False)
    assert refused.error is not None and refused.error.code == "untrusted-signer" and refused.error.exit_code == 3


def test_signing_with_a_certificate_of_another_key_is_refused(tree, tmp_path):
    from bundler.store.layout import Store
    from bundler.store.modelkit import load_modelkit
    from bundler.store.refs import parse_ref
    from bundler.trust.sign import sign_modelkit
    from conftest import run_bundle

    store = tmp_path / "store"
    run_bundle("pack", str(tree), "-t", "tiny-spec:1.0.0", "--store", str(store), check=True)
    pki = PKI()
    _, leaf = pki.leaf()
    with pytest.raises(BundleError) as info:
        sign_modelkit(Store(store), load_modelkit(Store(store), parse_ref("tiny-spec:1.0.0")), ec.generate_private_key(ec.SECP256R1()), certificates=[leaf])
    assert info.value.code == "key-error"


# ---------------------------------------------------------------- what the command line will call


def test_signing_certificates_take_the_leaf_of_the_key_and_its_chain(tmp_path):
    pki = PKI()
    key, leaf = pki.leaf()
    chain = certificates.signing_certificates(key, _pem(tmp_path / "leaf.pem", leaf), _pem(tmp_path / "chain.pem", pki.intermediate))
    assert chain == [leaf, pki.intermediate]
    with pytest.raises(BundleError) as info:
        certificates.signing_certificates(ec.generate_private_key(ec.SECP256R1()), tmp_path / "leaf.pem")
    assert info.value.code == "key-error" and "not the certificate of the private key" in info.value.message


def test_a_trust_policy_from_options_needs_a_ca_for_an_identity(tmp_path):
    pki = PKI()
    policy = certificates.trust_policy({}, [_pem(tmp_path / "ca.pem", pki.root)], [IDENTITY])
    key, leaf = pki.leaf()
    assert signature.verify(_sign(key, [leaf, pki.intermediate]), policy).signer_name == IDENTITY
    with pytest.raises(BundleError) as info:
        certificates.trust_policy({}, [], [IDENTITY])
    assert info.value.code == "usage"


def test_a_csr_asks_for_a_code_signing_certificate_of_the_key(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    path = certificates.write_csr(key, "release", tmp_path / "bundle.csr", email=IDENTITY)
    csr = x509.load_pem_x509_csr(path.read_bytes())
    assert csr.is_signature_valid and csr.public_key() == key.public_key()
    assert ExtendedKeyUsageOID.CODE_SIGNING in csr.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    with pytest.raises(BundleError):
        certificates.write_csr(key, "release", path)
