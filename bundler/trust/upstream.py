"""The publisher's signature: a model directory's own model-signing signature (`model.sig`), kept per role.

`match` is what pack runs: the signature's signed file list must be exactly the role's files with their
digests (less the paths the signer's hashing left out), else it is refused, never carried. `verify` is what
verify runs, under the upstream trust entries of that role: a key or certificate signature through
bundler.trust.signature, a keyless Sigstore one through bundler.trust.sigstore_bundle (offline).
"""

from __future__ import annotations

__all__ = ["SIGNATURE_NAME", "SIGNED_ROLES", "UpstreamTrust", "check_bundle", "check_context", "find_signature", "match", "read_claims", "role_signatures", "verify"]

import base64
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundler.trust import signature
from core.errors import BundleError

SIGNATURE_NAME = "model.sig"  # model_signing's default signature path beside the model
SIGNED_ROLES = ("target", "draft")  # the roles whose publisher may have signed their weights
MAX_SIGNATURE = 1 << 20  # a model-signing Sigstore bundle is a few kilobytes; its file list grows with the files


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


def role_signatures(files: Mapping[str, str], layers: Any) -> dict[str, tuple[str, dict[str, str]]]:
    """The publisher signatures a bundle carries: role -> (the signature's bundle path, the role's files relative
    to the role's directory with their sha256). `files`: the signed list (bundle path -> sha256); `layers`: the
    Kitfile's entries (LayerSpec). A role's signature is the `model.sig` at the top of its directory (a ModelKit
    entry's path, or, for a ModelPack's one-file entries, the entry that is the signature itself)."""
    found: dict[str, tuple[str, dict[str, str]]] = {}
    for spec in layers:
        if spec.role not in SIGNED_ROLES or spec.role in found:
            continue
        sig = spec.path if os.path.basename(spec.path) == SIGNATURE_NAME else f"{spec.path}/{SIGNATURE_NAME}"
        if sig not in files:
            continue
        prefix = os.path.dirname(sig)
        cut = len(prefix) + 1 if prefix else 0
        found[spec.role] = (sig, {p[cut:]: d for p, d in files.items() if not prefix or p.startswith(prefix + "/")})
    return found


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_context(context: Path, layers: Any) -> list[str]:
    """pack's check, before anything is written: each target or draft directory of the context that holds a
    publisher signature (`model.sig`) must be exactly what it signs (bundler.trust.upstream.match), else the
    pack is refused (exit 3): a signature that does not match is never carried. Returns the roles signed."""
    from bundler.format import boundedjson

    signed = []
    for spec in layers:
        root = Path(context) / spec.path
        if spec.role not in SIGNED_ROLES or not (root / SIGNATURE_NAME).is_file():
            continue
        data = boundedjson.read_regular(root / SIGNATURE_NAME, MAX_SIGNATURE, f"{spec.path}/{SIGNATURE_NAME}", "signature-invalid")
        files = {p.relative_to(root).as_posix(): _sha256(p) for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}
        match(data, files, spec.role)
        signed.append(spec.role)
    return signed


def check_bundle(store: Any, report: Any, trusts: Mapping[str, UpstreamTrust]) -> dict[str, str]:
    """verify's check of the publishers' signatures a verified, signed bundle carries, each under the trust
    entries given for its role (`trusts`: role -> UpstreamTrust): role -> who signed. A role with trust entries
    but no signature is refused (signature-missing); a signature that does not hold or does not sign exactly
    the role's files is refused (exit 3). Only the signature files are read out of the layers."""
    import tempfile

    from bundler.trust.extract import extract_leaving_in_blobs

    assert report.claims is not None and report.modelkit is not None
    carried = role_signatures(report.claims.files, [spec for spec, _ in report.modelkit.layers])
    for role in trusts:
        if role not in carried:
            raise BundleError("signature-missing", f"{role}: the bundle carries no publisher signature ({SIGNATURE_NAME}) to check")
    wanted = {carried[role][0] for role in trusts}
    signers: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="specbundle-upstream-") as tmp:
        extract_leaving_in_blobs(store, report, Path(tmp) / "sigs", lambda path: path not in wanted)
        for role, trust in trusts.items():
            path, files = carried[role]
            from bundler.format import boundedjson

            data = boundedjson.read_regular(Path(tmp) / "sigs" / path, MAX_SIGNATURE, path, "signature-invalid")
            claims = verify(data, files, role, trust)
            signers[role] = claims.signer_name or (trust.identity if trust.trusted_root else claims.key_id[:16] + "…")
    return signers
