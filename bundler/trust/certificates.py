"""Certificate identities: who signed, by name, proved by an X.509 path to a CA the user trusts.

A signature made with a certificate carries the leaf and its chain in model-signing's format
(`verificationMaterial.x509CertificateChain.certificates`, leaf first, DER in base64). Verification
builds the path with `cryptography`'s X.509 verifier (`PolicyBuilder`): the trusted roots are the
user's CA certificates only, the time is the signing time (not now), the leaf must allow code signing
(extended key usage) and digital signatures, and a leaf that issued itself, or that is a CA, is never a
signer. The identity allowed is matched against the leaf's subject alternative names (URI, email, DNS)
and its subject common name.
"""

from __future__ import annotations

__all__ = [
    "CertificateTrust", "TrustPolicy", "chain_material", "identities_of", "load_certificates",
    "material_certificates", "oidc_issuer", "roots_from", "signer_name", "signing_certificates", "trust_policy",
    "validate_signer", "write_csr",
]

import base64
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bundler.format import boundedjson
from core.errors import BundleError

MAX_PEM_FILE = 1 << 20  # a chain of a few certificates is a few kilobytes
# Fulcio's OIDC issuer extensions (v2 first: a DER UTF8String; v1: raw bytes).
FULCIO_ISSUER_V2 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
FULCIO_ISSUER_V1 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.1")


@dataclass(frozen=True)
class CertificateTrust:
    """The certificate part of a trust policy: the CA roots and the identities (and issuers) allowed."""

    roots: tuple[x509.Certificate, ...] = ()
    identities: tuple[str, ...] = ()  # empty: any identity the CA vouches for
    issuers: tuple[str, ...] = field(default=())  # OIDC issuers (Fulcio's extension), where a leaf names one


class TrustPolicy(dict):  # type: ignore[type-arg]
    """Trusted keys by key id (as before: every caller that reads keys reads them here), plus the CA roots
    and identities allowed in `certificates`."""

    def __init__(self, keys: dict[str, Any] | None = None, certificates: CertificateTrust | None = None) -> None:
        super().__init__(keys or {})
        self.certificates = certificates or CertificateTrust()


def load_certificates(path: Path, what: str = "certificate") -> list[x509.Certificate]:
    """Every PEM certificate in a file, in order. Errors: missing-input, key-error."""
    path = Path(path)
    if not path.exists():
        raise BundleError("missing-input", f"{what} {path} does not exist")
    data = boundedjson.read_regular(path, MAX_PEM_FILE, what, "key-error")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as err:
        raise BundleError("key-error", f"{what} {path} holds no PEM certificate: {err}") from err
    return certs


def roots_from(paths: Sequence[Path]) -> tuple[x509.Certificate, ...]:
    """CA roots for a trust policy: each must be a CA certificate (basicConstraints CA:TRUE), so a leaf
    given by mistake is refused here rather than trusted as its own anchor."""
    roots: list[x509.Certificate] = []
    for path in paths:
        for cert in load_certificates(Path(path), "CA certificate"):
            if not _is_ca(cert):
                raise BundleError("key-error", f"CA certificate {path} ({signer_name(cert)}) is not a CA (basicConstraints CA:TRUE): give the root that issued the signer's chain")
            roots.append(cert)
    return tuple(roots)


def chain_material(leaf: x509.Certificate, chain: Sequence[x509.Certificate]) -> dict[str, Any]:
    """model-signing's `verificationMaterial` for a certificate signature: leaf first, then its chain."""
    certs = [leaf, *chain]
    raw = [base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode("ascii") for c in certs]
    return {"x509CertificateChain": {"certificates": [{"rawBytes": r} for r in raw]}, "tlogEntries": []}


def material_certificates(material: dict[str, Any]) -> list[x509.Certificate] | None:
    """The certificates a `verificationMaterial` carries (leaf first), or None when it holds a key hint.
    Errors: signature-invalid for a malformed certificate list."""
    if "x509CertificateChain" in material:
        entries = material["x509CertificateChain"].get("certificates") if isinstance(material["x509CertificateChain"], dict) else None
    elif "certificate" in material:
        entries = [material["certificate"]]
    else:
        return None
    if not isinstance(entries, list) or not entries:
        raise BundleError("signature-invalid", "signature's certificate chain is empty or malformed")
    certs = []
    for entry in entries:
        try:
            certs.append(x509.load_der_x509_certificate(base64.b64decode(entry["rawBytes"], validate=True)))
        except (TypeError, KeyError, ValueError) as err:
            raise BundleError("signature-invalid", f"signature carries a certificate that cannot be read: {err}"[:300]) from err
    return certs


def identities_of(cert: x509.Certificate) -> list[str]:
    """The names a certificate vouches for: its SAN URIs, emails and DNS names, then its subject CN."""
    names: list[str] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        for kind in (x509.UniformResourceIdentifier, x509.RFC822Name, x509.DNSName):
            names += [str(v) for v in san.get_values_for_type(kind)]
    except x509.ExtensionNotFound:
        pass
    names += [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    return names


def signer_name(cert: x509.Certificate) -> str:
    """The name to print for a signer: its first identity, else its subject."""
    names = identities_of(cert)
    return names[0] if names else cert.subject.rfc4514_string()


def oidc_issuer(cert: x509.Certificate) -> str | None:
    """The OIDC issuer a Fulcio certificate names (None for a certificate of a private PKI)."""
    for oid in (FULCIO_ISSUER_V2, FULCIO_ISSUER_V1):
        try:
            raw = cert.extensions.get_extension_for_oid(oid).value.value  # type: ignore[attr-defined]
        except x509.ExtensionNotFound:
            continue
        if oid == FULCIO_ISSUER_V2 and len(raw) > 2 and raw[0] == 0x0C:  # DER UTF8String, short length
            raw = raw[2:]
        return raw.decode("utf-8", "replace")
    return None


def validate_signer(certs: Sequence[x509.Certificate], trust: CertificateTrust, signed_at: dt.datetime) -> x509.Certificate:
    """Check the path leaf -> chain -> a trusted root at `signed_at`, code-signing usage, and the identity.

    Returns the leaf. Errors (exit 3, one line naming the reason): untrusted-signer (no CA trusted,
    another CA, wrong identity or issuer), expired (leaf not valid at the signing time),
    signature-invalid (a broken chain, no code-signing usage, a self-issued or CA leaf).
    """
    leaf, chain = certs[0], list(certs[1:])
    name = signer_name(leaf)
    if not trust.roots:
        raise BundleError("untrusted-signer", f"signed with a certificate for {name!r}, and no CA is trusted: pass the root with --ca ROOT.pem")
    if leaf.issuer == leaf.subject or _is_ca(leaf):
        raise BundleError("signature-invalid", f"signing certificate {name!r} is self-issued or a CA: a signer's certificate must be issued by a trusted CA")
    _check_time(leaf, signed_at, name)
    _check_usage(leaf, name)
    builder = verification.PolicyBuilder().store(verification.Store(list(trust.roots))).time(signed_at)
    builder = builder.extension_policies(ca_policy=verification.ExtensionPolicy.webpki_defaults_ca(),
                                         ee_policy=verification.ExtensionPolicy.permit_all())
    try:
        builder.build_client_verifier().verify(leaf, chain)
    except verification.VerificationError as err:
        raise _path_error(leaf, chain, trust, name, err) from err
    _check_identity(leaf, trust, name)
    return leaf


def _check_time(leaf: x509.Certificate, signed_at: dt.datetime, name: str) -> None:
    if signed_at < leaf.not_valid_before_utc:
        raise BundleError("expired", f"signing certificate {name!r} was not yet valid at the signing time {signed_at:%Y-%m-%dT%H:%M:%SZ} (valid from {leaf.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ})")
    if signed_at > leaf.not_valid_after_utc:
        raise BundleError("expired", f"signing certificate {name!r} had expired at the signing time {signed_at:%Y-%m-%dT%H:%M:%SZ} (valid until {leaf.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ})")


def _check_usage(leaf: x509.Certificate, name: str) -> None:
    try:
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        eku = None
    if eku is None or ExtendedKeyUsageOID.CODE_SIGNING not in eku:
        raise BundleError("signature-invalid", f"signing certificate {name!r} does not allow code signing (extended key usage codeSigning)")
    try:
        if not leaf.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature:
            raise BundleError("signature-invalid", f"signing certificate {name!r} does not allow digital signatures (key usage)")
    except x509.ExtensionNotFound:
        pass


def _path_error(leaf: x509.Certificate, chain: list[x509.Certificate], trust: CertificateTrust, name: str, err: Exception) -> BundleError:
    """Name why no path was found: a whole chain that ends under an untrusted CA (another CA), or a chain
    with a missing or wrong link (broken)."""
    path = [leaf, *chain]
    for child, parent in zip(path, path[1:]):
        try:
            child.verify_directly_issued_by(parent)
        except (ValueError, TypeError, InvalidSignature):
            return BundleError("signature-invalid", f"signing certificate {name!r}: broken certificate chain ({child.subject.rfc4514_string()!r} is not issued by the next certificate)")
    top = path[-1]
    root_names = {r.subject for r in trust.roots}
    if _is_ca(top) and top.issuer not in root_names:
        return BundleError("untrusted-signer", f"signing certificate {name!r} chains to {top.issuer.rfc4514_string()!r}, which is none of the trusted CAs")
    return BundleError("signature-invalid", f"signing certificate {name!r}: broken certificate chain ({err})"[:400])


def _check_identity(leaf: x509.Certificate, trust: CertificateTrust, name: str) -> None:
    if trust.identities and not set(trust.identities) & set(identities_of(leaf)):
        raise BundleError("untrusted-signer", f"signed by {name!r}, which is none of the identities allowed ({', '.join(trust.identities)})")
    issuer = oidc_issuer(leaf)
    if trust.issuers and issuer not in trust.issuers:
        raise BundleError("untrusted-signer", f"signed by {name!r} with identity issuer {issuer!r}, which is none of the issuers allowed ({', '.join(trust.issuers)})")


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def trust_policy(keys: dict[str, Any], ca_paths: Sequence[Path] = (), identities: Sequence[str] = (), issuers: Sequence[str] = ()) -> TrustPolicy:
    """The trust a verification uses, from the command line: the trusted keys (bundler.trust.keys.trusted_keys)
    plus `--ca ROOT.pem` (repeatable), `--identity` and `--issuer` (repeatable). An identity without a CA is a
    usage error: it would allow nothing."""
    if (identities or issuers) and not ca_paths:
        raise BundleError("usage", "--identity/--issuer name who may sign under a CA: give the CA root with --ca ROOT.pem")
    return TrustPolicy(keys, CertificateTrust(roots_from([Path(p) for p in ca_paths]), tuple(identities), tuple(issuers)))


def signing_certificates(private_key: Any, cert_path: Path, chain_path: Path | None = None) -> list[x509.Certificate]:
    """`--cert LEAF.pem [--chain CHAIN.pem]` for signing: the leaf first, then its chain. The leaf must be the
    certificate of `private_key` and allow code signing. Errors: missing-input, key-error."""
    leaf = load_certificates(Path(cert_path), "signing certificate")[0]
    if leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) != \
            private_key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
        raise BundleError("key-error", f"signing certificate {cert_path} is not the certificate of the private key (--key)")
    try:
        _check_usage(leaf, signer_name(leaf))
    except BundleError as err:
        raise BundleError("key-error", err.message) from err
    chain = load_certificates(Path(chain_path), "certificate chain") if chain_path else []
    return [leaf, *chain]


def write_csr(private_key: Any, common_name: str, path: Path, email: str | None = None, uri: str | None = None) -> Path:
    """A PKCS#10 request for a code-signing certificate of `private_key` (for `bundle keygen --csr`): the CA
    answers with the leaf that `--cert` takes. Never overwrites a file."""
    from cryptography.hazmat.primitives import hashes

    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
    names: list[x509.GeneralName] = ([x509.RFC822Name(email)] if email else []) + ([x509.UniformResourceIdentifier(uri)] if uri else [])
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
    pem = builder.sign(private_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    from bundler.format.atomicfile import write_atomically

    try:
        write_atomically(Path(path), pem, 0o644, replace=False)
    except FileExistsError as err:
        raise BundleError("usage", f"{path} already exists; refusing to overwrite it") from err
    return Path(path)
