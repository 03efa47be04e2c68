"""The signature checks of `verify`: which attached signature holds for a bundle, and why the others did not.

Each candidate is checked in order (valid, by a trusted key, for this name and version, listing exactly the
bundle's files, over this manifest, not expired); the first that passes every check is the bundle's, and when
none does the failure of the one that got furthest is the error. A cosign-style signature names only the manifest
digest and decides only where no model-signing signature by a trusted key speaks. `signed_before_download` is
the part of this a pull runs before any layer is here.
"""

from __future__ import annotations

__all__ = ["MAX_SIGNATURES", "check_expiry", "check_files", "select_signature", "signed_before_download"]

import datetime as dt
from typing import Any, Mapping

from bundler.format.manifest import Descriptor
from bundler.store.layout import Store
from bundler.store.modelkit import ModelKit, file_hashes
from bundler.store.referrers import damaged_signatures, find_signatures
from bundler.trust import cosign, signature
from bundler.trust.verify_report import Check, VerifyReport
from core.errors import BundleError

# Candidate signatures looked at per bundle, of each kind (model-signing, cosign-style): anyone able to
# attach referrers in a registry can attach thousands, and each costs a verification; the owner's own are
# among the first few in practice.
MAX_SIGNATURES = 16

# How far a failing candidate got, so the error shown is the one a user can act on: a trusted, valid
# signature over something else says more than a malformed one or one by an unknown key.
_STAGES = ("signature", "signed-name", "files", "subject", "expiry")


def _candidate_checks(mk: ModelKit, files: Mapping[str, int], payload: bytes, trusted: Mapping[str, Any], now: dt.datetime) -> tuple[signature.SignedClaims | None, list[Check], BundleError | None]:
    """Every per-signature check on one candidate, in order; stops at the first failure."""
    checks: list[Check] = []
    claims: signature.SignedClaims | None = None
    steps = [
        ("signature", lambda: _signature_valid(payload, trusted)),
        ("signed-name", lambda: _signed_name(mk, claims)),
        ("files", lambda: check_files(files, claims)),
        ("subject", lambda: _subject(mk, claims)),
        ("expiry", lambda: check_expiry(claims, now)),
    ]
    for name, fn in steps:
        try:
            result, detail = fn()
        except BundleError as err:
            checks.append(Check(name, False, err.message))
            return claims, checks, err
        if name == "signature":
            claims = result
        checks.append(Check(name, True, detail))
    return claims, checks, None


# A candidate signature: its descriptor, its Sigstore bundle bytes, its kind (cosign.kind_of). A failed one: how
# far it got (higher says more), its checks, its error.
_Candidate = tuple[Descriptor, bytes, str | None]
_Failure = tuple[int, list[Check], BundleError]


def select_signature(store: Store, mk: ModelKit, report: VerifyReport, trusted: Mapping[str, Any], now: dt.datetime) -> tuple[signature.SignedClaims, bytes] | None:
    """The first attached signature that passes every per-signature check: a model-signing one, else a
    cosign-style one where no model-signing signature carries a valid signature by a trusted key. Model-signing
    candidates that fail go to skipped_signatures; every candidate, of each kind, is listed in report.signatures.

    A bundle verifies when ANY trusted signature holds (a renewal, a second signer), so a foreign, broken or
    expired signature attached beside a good one cannot make it fail. When none holds, the failure of the
    candidate that got furthest is the error: it is in the report (its checks and `error`), and None is returned.
    """
    found = find_signatures(store, mk.digest)
    refused = _store_refusal(mk, found, damaged_signatures(store, mk.digest))
    if refused is not None:
        report.checks.append(Check("signature", False, refused.message))
        report.error = refused
        return None
    # Cosign-style signatures name only the manifest digest: each is checked (one ECDSA verification) and
    # listed, but decides only where no model-signing signature is validly signed by a trusted key: that one
    # is the key's full statement (files, name, version, expiry), and its failure stands (docs/cosign.md).
    kinds = [(desc, payload, cosign.kind_of(payload)) for desc, payload in found]
    candidates = [c for k in (cosign.KIND, cosign.MODEL_SIGNING_KIND) for c in [c for c in kinds if c[2] == k][:MAX_SIGNATURES]]
    by_cosign, cosign_best = _try_cosign(candidates, mk, report, trusted, now)
    held, best, names_trusted = _try_model_signing(candidates, mk, report, trusted, now)
    if held is not None:
        return held
    if by_cosign is not None and not names_trusted:
        desc, payload, claims = by_cosign
        report.signature_digest = desc.digest
        return _cosign_claims(store, mk, report, claims), payload
    if cosign_best is not None and not names_trusted and (best is None or cosign_best[0] > best[0]):
        best = cosign_best
    if len(found) > len(candidates):
        report.skipped_signatures.append({"digest": None, "key_id": None, "check": "signature", "error": {"code": "signature-invalid", "message": f"{len(found) - len(candidates)} more signatures not considered (at most {MAX_SIGNATURES} of each kind)"}})
    assert best is not None
    report.checks.extend(best[1])
    report.error = best[2]
    return None


def _store_refusal(mk: ModelKit, found: list[tuple[Descriptor, bytes]], damaged: list[str]) -> BundleError | None:
    """Why the store's signatures are not looked at: one is damaged beside usable ones (every blob verify walks
    is checked: a damaged store is refused, not verified around), or there is none usable; None when they are."""
    if found and damaged:
        return BundleError("digest-mismatch", f"{mk.ref} ({mk.digest[:19]}…): signature artifact {damaged[0][:19]}… in the store is "
                           "damaged (a blob is missing or does not match its digest); pull or sign the bundle again")
    if not found:
        why = (f"has no usable signature: signature artifact {damaged[0][:19]}… is damaged (a blob is missing or does not match "
               "its digest); pull or sign it again" if damaged else "has no signature (sign it with `bundle sign`, or pass --allow-unsigned to check integrity only)")
        return BundleError("signature-missing", f"{mk.ref} ({mk.digest[:19]}…) {why}")
    return None


def _try_cosign(candidates: list[_Candidate], mk: ModelKit, report: VerifyReport, trusted: Mapping[str, Any],
                now: dt.datetime) -> tuple[tuple[Descriptor, bytes, cosign.CosignClaims] | None, _Failure | None]:
    """Every cosign-style candidate checked against the manifest digest and listed in report.signatures: the
    first that holds, and the failure that says most (ranked below any model-signing failure past its signature check)."""
    by_cosign: tuple[Descriptor, bytes, cosign.CosignClaims] | None = None
    cosign_best: _Failure | None = None
    for desc, payload, kind in candidates:
        if kind != cosign.KIND:
            continue
        try:
            held = cosign.verify_digest(payload, trusted, mk.digest, now)
        except BundleError as err:
            report.signatures.append({"kind": kind, "digest": desc.digest, "key_id": None, "verified": False, "error": {"code": err.code, "message": err.message}})
            # Below any model-signing failure past its signature check: that one says more.
            rank = {"signature-invalid": 0, "untrusted-signer": 1, "key-error": 1}.get(err.code, 2)
            if cosign_best is None or rank > cosign_best[0]:
                cosign_best = (rank, [Check("signature", False, err.message)], err)
            continue
        report.signatures.append({"kind": kind, "digest": desc.digest, "key_id": held.key_id, "verified": True})
        by_cosign = by_cosign or (desc, payload, held)
    return by_cosign, cosign_best


def _try_model_signing(candidates: list[_Candidate], mk: ModelKit, report: VerifyReport, trusted: Mapping[str, Any],
                       now: dt.datetime) -> tuple[tuple[signature.SignedClaims, bytes] | None, _Failure | None, bool]:
    """The model-signing candidates in order, each listed in report.signatures: the first that passes every check
    (its checks and digest put in the report), else None with the failure of the one that got furthest (the others
    in skipped_signatures); and whether one by a trusted key held its signature check."""
    best: _Failure | None = None
    # Whether a model-signing signature by a trusted key held its signature check: only such a one is the
    # key's statement. A hint is outside the signed bytes, so an unsigned artifact naming the key counts for nothing.
    names_trusted = False
    for desc, payload, kind in candidates:
        if kind == cosign.KIND:
            continue
        claims, checks, err = _candidate_checks(mk, report.files, payload, trusted, now)
        names_trusted = names_trusted or claims is not None
        report.signatures.append({"kind": kind, "digest": desc.digest, "key_id": claims.key_id if claims else None, "verified": err is None}
                                 | ({"error": {"code": err.code, "message": err.message}} if err else {}))
        if err is None and claims is not None:
            report.checks.extend(checks)
            report.signature_digest = desc.digest
            return (claims, payload), best, names_trusted
        assert err is not None
        report.skipped_signatures.append({"digest": desc.digest, "key_id": claims.key_id if claims else None, "check": checks[-1].name, "error": {"code": err.code, "message": err.message}})
        rank = _STAGES.index(checks[-1].name) * 2 + (err.code != "signature-invalid")
        if best is None or rank > best[0]:
            best = (rank, checks, err)
    return None, best, names_trusted


def _cosign_claims(store: Store, mk: ModelKit, report: VerifyReport, held: cosign.CosignClaims) -> signature.SignedClaims:
    """What a cosign-style signature vouches for, as the claims unpack and run check files against: the
    manifest digest pins the config (so the Kitfile's name and version) and every layer's digest, so the
    file hashes are read from those layers, checked by the "blobs" check against the signed digests."""
    hashes, _ = file_hashes(store, mk)
    expires = held.expires
    report.checks += [
        Check("signature", True, f"cosign-style ECDSA P-256 signature of the manifest digest by trusted key {held.key_id[:16]}… (no model-signing signature held)"),
        Check("subject", True, f"signed manifest digest equals {mk.digest[:19]}…"),
        Check("files", True, f"{len(hashes)} files, hashed from the layers the signed manifest pins (no signed file list)"),
        Check("expiry", True, f"valid until {expires}" if expires else "no expiry in the signature"),
    ]
    fields: dict[str, Any] = {"name": mk.kitfile.name, "version": mk.kitfile.version, "manifest_digest": mk.digest}
    return signature.SignedClaims(key_id=held.key_id, files=hashes, bundle=fields | ({"expires": expires} if expires else {}), statement=held.statement)


def signed_before_download(manifest_digest: str, payloads: list[bytes], trusted: Mapping[str, Any], now: dt.datetime | None = None) -> signature.SignedClaims:
    """The checks a signature allows before any layer is here: valid, by a trusted key, over this manifest
    digest, not expired. Pull runs this so a bundle nobody trusted signed costs no layer download.
    Raises the failure of the candidate that got furthest (signature-missing when there is none)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    if not payloads:
        raise BundleError("signature-missing", f"{manifest_digest[:19]}… has no signature (pass --allow-unsigned to check integrity only)")
    best: tuple[int, BundleError] | None = None
    for payload in payloads[:2 * MAX_SIGNATURES]:  # of each kind
        stage = 0
        try:
            if cosign.kind_of(payload) == cosign.KIND:
                held = cosign.verify_digest(payload, trusted, manifest_digest, now)
                return signature.SignedClaims(key_id=held.key_id, files={}, bundle={"manifest_digest": manifest_digest}, statement=held.statement)
            claims = signature.verify(payload, trusted)
            stage = 2
            if claims.bundle.get("manifest_digest") != manifest_digest:
                raise BundleError("signature-mismatch", f"signature is over manifest {str(claims.bundle.get('manifest_digest'))[:19]}…, this bundle is {manifest_digest[:19]}…")
            stage = 4
            check_expiry(claims, now)
            return claims
        except BundleError as err:
            rank = stage + (err.code != "signature-invalid")
            if best is None or rank > best[0]:
                best = (rank, err)
    assert best is not None
    raise best[1]


def _signature_valid(payload: bytes, trusted: Mapping[str, Any]) -> tuple[signature.SignedClaims, str]:
    claims = signature.verify(payload, trusted)
    if claims.signer_name:  # a certificate signer: named by its identity, its path checked to a trusted CA
        return claims, f"ECDSA signature by certificate {claims.signer_name!r} (key {claims.key_id[:16]}…), chained to a trusted CA"
    return claims, f"ECDSA P-256 signature by trusted key {claims.key_id[:16]}…"


def _signed_name(mk: ModelKit, claims: signature.SignedClaims) -> tuple[None, str]:
    signed = claims.bundle
    if (signed.get("name"), signed.get("version")) != (mk.kitfile.name, mk.kitfile.version):
        raise BundleError("signature-mismatch", f"signature is for {signed.get('name')} {signed.get('version')}, this bundle is {mk.kitfile.name} {mk.kitfile.version}")
    return None, f"signature is for {mk.kitfile.name} {mk.kitfile.version}"


def _subject(mk: ModelKit, claims: signature.SignedClaims) -> tuple[None, str]:
    signed = claims.bundle
    if signed.get("manifest_digest") != mk.digest:
        raise BundleError("signature-mismatch", f"signature is over manifest {str(signed.get('manifest_digest'))[:19]}…, this bundle is {mk.digest[:19]}…: its content changed since signing")
    if signed.get("config_digest") not in (None, mk.config_desc.digest):
        raise BundleError("signature-mismatch", "signature is over another config")
    return None, f"signed manifest digest equals {mk.digest[:19]}…"


def check_files(files: Mapping[str, int], claims: signature.SignedClaims) -> tuple[None, str]:
    # Content is pinned by each layer's digest, which the signed manifest digest pins; here the names must agree.
    missing = sorted(set(claims.files) - set(files))
    extra = sorted(set(files) - set(claims.files))
    if missing and extra:
        raise BundleError("tampered", f"file {missing[0]!r} is signed but the bundle has {extra[0]!r} instead (renamed?)")
    if missing:
        raise BundleError("missing-file", f"signed file {missing[0]!r} is not in the bundle")
    if extra:
        raise BundleError("extra-file", f"file {extra[0]!r} is in the bundle but not in the signature")
    return None, f"{len(files)} files, exactly the signed list"


def check_expiry(claims: signature.SignedClaims, now: dt.datetime) -> tuple[None, str]:
    """The signed `expires` is in the future (signature-invalid unless RFC 3339 UTC with `Z`)."""
    expires = claims.bundle.get("expires")
    moment = signature.signed_expiry(expires, "signed expires")
    if moment is None:
        return None, "no expiry in the signature"
    if moment <= now:
        raise BundleError("expired", f"signature expired at {expires}")
    return None, f"valid until {expires}"
