"""The publisher's signature: a model directory's own model-signing signature (`model.sig`), kept per role.

`match` is what pack runs: the signature's signed file list must be exactly the role's files with their
digests (less the paths the signer's hashing left out), else it is refused, never carried. `verify` is what
verify runs, under the upstream trust entries of that role: a key or certificate signature through
bundler.trust.signature, a keyless Sigstore one through bundler.trust.sigstore_bundle (offline).
"""

from __future__ import annotations

__all__ = ["SIGNATURE_NAME", "UpstreamTrust", "find_signature", "match", "read_claims", "verify"]

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundler.trust import signature
from core.errors import BundleError

SIGNATURE_NAME = "model.sig"  # model_signing's default signature path beside the model


@dataclass(frozen=True)
class UpstreamTrust:
    """Who may have signed one role's weights: keys or CA roots (`trusted`, a keys.trusted_keys mapping or a
    certificates.TrustPolicy), or a Sigstore identity and issuer against `trusted_root`."""

    trusted: Mapping[str, Any] = field(default_factory=dict)
    identity: str = ""
    issuer: str = ""
    trusted_root: Path | None = None


def find_signature(model_dir: Path, given: Path | None = None) -> Path | None:
    """The publisher's signature of a model directory: `given`, else DIR/model.sig when there is one."""
    if given is not None:
        if not Path(given).is_file():
            raise BundleError("missing-input", f"upstream signature {given} does not exist")
        return Path(given)
    path = Path(model_dir) / SIGNATURE_NAME
    return path if path.is_file() else None


def read_claims(bundle_json: bytes) -> signature.SignedClaims:
    """What an upstream signature says it signs, unchecked (its signer is checked by `verify`)."""
    try:
        envelope = json.loads(bundle_json)["dsseEnvelope"]
        payload = base64.b64decode(envelope["payload"], validate=True)
        payload_type = envelope["payloadType"]
    except (ValueError, TypeError, KeyError, RecursionError) as err:
        raise BundleError("signature-invalid", f"upstream signature is not a model-signing Sigstore bundle: {err}"[:300]) from err
    return signature.statement_claims(payload_type, payload, "")


def match(bundle_json: bytes, files: Mapping[str, str], role: str) -> signature.SignedClaims:
    """The upstream signature signs exactly `files` (path relative to the model directory -> sha256 hex),
    less its own ignore paths and the signature file. Errors (exit 3): tampered, missing-file, extra-file."""
    claims = read_claims(bundle_json)
    ignored = set(claims.ignore_paths) | {SIGNATURE_NAME}
    packed = {name: digest for name, digest in files.items() if name not in ignored and name.split("/", 1)[0] not in ignored}
    for name, digest in sorted(claims.files.items()):
        if name not in packed:
            raise BundleError("missing-file", f"{role}: file {name!r} signed by its publisher is not packed")
        if packed[name] != digest:
            raise BundleError("tampered", f"{role}: file {name!r} differs from what its publisher signed (refusing to carry a signature that does not match)")
    extra = sorted(set(packed) - set(claims.files))
    if extra:
        raise BundleError("extra-file", f"{role}: file {extra[0]!r} is packed but not signed by its publisher")
    return claims


def verify(bundle_json: bytes, files: Mapping[str, str], role: str, trust: UpstreamTrust) -> signature.SignedClaims:
    """The upstream signature holds under `trust` and signs exactly `files`. Errors: exit 3 as in `match`,
    signature.verify and sigstore_bundle.verify_keyless."""
    try:
        keyless = bool(json.loads(bundle_json)["verificationMaterial"].get("tlogEntries"))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as err:
        raise BundleError("signature-invalid", f"{role}: upstream signature is not a Sigstore bundle: {err}"[:300]) from err
    if keyless:
        if trust.trusted_root is None:
            raise BundleError("untrusted-signer", f"{role}: the publisher's signature is a Sigstore (keyless) one: give its trusted root, identity and issuer")
        from bundler.trust.sigstore_bundle import verify_keyless  # imports sigstore: only for a keyless signature

        claims = verify_keyless(bundle_json, trust.trusted_root, trust.identity, trust.issuer)
    else:
        claims = signature.verify(bundle_json, trust.trusted)
    match(bundle_json, files, role)
    return claims
