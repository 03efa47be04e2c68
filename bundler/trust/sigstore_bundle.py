"""Sigstore identities, offline: a model-signing keyless signature (Fulcio certificate, Rekor inclusion proof,
signed timestamps) checked against a trusted root the user gives, pinned to an identity and an issuer.

The checking is the `sigstore` package's own `Verifier` (sigstore 4.x) with `TrustedRoot.from_file`: no TUF
update and no network. `sigstore` is imported inside the functions so `bundle --help` stays light.
"""

from __future__ import annotations

__all__ = ["verify_keyless", "verify_model_directory"]

import hashlib
from pathlib import Path

from bundler.trust import signature
from core.errors import BundleError

MAX_BUNDLE = 1 << 20  # a Sigstore bundle is a few kilobytes


def verify_keyless(bundle_json: bytes, trusted_root: Path, identity: str, issuer: str) -> signature.SignedClaims:
    """Verify a Sigstore DSSE bundle offline and return what its model-signing statement signs.

    Errors (exit 3): untrusted-signer (another identity or issuer), signature-invalid (a malformed bundle,
    a cut inclusion proof, a bad signature or timestamp, a certificate outside the trusted root);
    key-error / missing-input for an unreadable trusted root.
    """
    # Imported here: sigstore pulls in its protobuf models and HTTP clients, kept out of `bundle --help`.
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import Bundle, TrustedRoot
    from sigstore.verify import Verifier, policy

    if not identity or not issuer:
        raise BundleError("usage", "a Sigstore signature is checked against an identity and an issuer: give both (--identity, --issuer)")
    root = _trusted_root(trusted_root, TrustedRoot)
    try:
        bundle = Bundle.from_json(bundle_json)
    except (SigstoreError, ValueError) as err:
        raise BundleError("signature-invalid", f"not a valid Sigstore bundle: {err}"[:400]) from err
    try:
        payload_type, payload = Verifier(trusted_root=root).verify_dsse(bundle, policy.Identity(identity=identity, issuer=issuer))
    except (SigstoreError, ValueError) as err:
        message = str(err).replace("\n", " ")
        if "SAN" in message or "issuer" in message.lower() or "identity" in message.lower():
            raise BundleError("untrusted-signer", f"Sigstore signature is not by {identity!r} from {issuer!r}: {message}"[:400]) from err
        raise BundleError("signature-invalid", f"Sigstore signature does not verify against {trusted_root}: {message}"[:400]) from err
    return signature.statement_claims(payload_type, payload, identity)


def _trusted_root(path: Path, trusted_root_type: type) -> object:
    path = Path(path)
    if not path.is_file():
        raise BundleError("missing-input", f"trusted root {path} does not exist (a trusted_root.json, e.g. the public-good instance's)")
    try:
        return trusted_root_type.from_file(str(path))  # type: ignore[attr-defined]
    except Exception as err:  # sigstore raises pydantic and its own errors for a bad file
        raise BundleError("key-error", f"trusted root {path} cannot be read: {err}"[:400]) from err


def verify_model_directory(model_dir: Path, bundle_path: Path, trusted_root: Path, identity: str, issuer: str) -> signature.SignedClaims:
    """`model_signing verify sigstore` offline: the signature as above, then every file of `model_dir`
    (less the signer's ignore_paths and the signature itself) is exactly a signed file with its digest."""
    from bundler.format import boundedjson

    bundle_json = boundedjson.read_regular(Path(bundle_path), MAX_BUNDLE, "signature", "signature-invalid")
    claims = verify_keyless(bundle_json, Path(trusted_root), identity, issuer)
    root = Path(model_dir)
    ignored = set(claims.ignore_paths) | {Path(bundle_path).name}
    found: dict[str, str] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel.split("/", 1)[0] in ignored or rel in ignored:
            continue
        found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    for name, digest in claims.files.items():
        if name not in found:
            raise BundleError("missing-file", f"signed file {name!r} is not in {root}")
        if found[name] != digest:
            raise BundleError("tampered", f"file {name!r} differs from what {identity} signed")
    extra = sorted(set(found) - set(claims.files))
    if extra:
        raise BundleError("extra-file", f"file {extra[0]!r} is in {root} but not in the signature")
    return claims
