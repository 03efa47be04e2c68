"""`bundle verify`: every check that makes a bundle trustworthy, each reported by name.

Order: the bundle's own structure (manifest, config, Kitfile), every blob's bytes and archive safety,
roles and weights, tokenizer files, then the signature: present, valid, trusted, for this name and
version, listing exactly its files, over this manifest, not expired, not a rollback.
"""

from __future__ import annotations

import datetime as dt
import os
import posixpath
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping

from bundler import signature
from bundler.errors import BundleError
from bundler.kitfile import MODEL_ROLES, pickle_files
from bundler.layerread import LayerScan, scan_layer
from bundler.modelkit import ModelKit, load_modelkit
from bundler.refs import Ref
from bundler.sign import find_signatures
from bundler.store import Store

ROLLBACK_STATE = "versions"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class VerifyReport:
    """The outcome of verify: never raised, so a failed report can still be printed whole."""

    ref: str
    digest: str | None = None
    signer: str | None = None  # key id of the trusted signer
    checks: list[Check] = field(default_factory=list)
    error: BundleError | None = None
    modelkit: ModelKit | None = None
    files: dict[str, int] = field(default_factory=dict)  # path -> size, every file of every layer
    claims: signature.SignedClaims | None = None
    signature_json: bytes | None = None  # the Sigstore bundle that verified
    tokenizer_hashes: dict[str, str] = field(default_factory=dict)
    unsigned: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def raise_for_error(self) -> None:
        if self.error is not None:
            raise self.error

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "ref": self.ref,
            "digest": self.digest,
            "signer": {"key_id": self.signer} if self.signer else None,
            "unsigned": self.unsigned,
            "checks": [c.as_dict() for c in self.checks],
            "error": {"code": self.error.code, "message": self.error.message} if self.error else None,
        }


class _Failed(Exception):
    pass


def verify_bundle(
    store: Store,
    ref: Ref,
    trusted: Mapping[str, Any],
    allow_unsigned: bool = False,
    now: dt.datetime | None = None,
    record: bool = True,
) -> VerifyReport:
    """Run every check on a bundle in the store; the report holds the first failure, if any."""
    report = VerifyReport(ref=str(ref))

    def check(name: str, fn: Any) -> Any:
        try:
            result, detail = fn()
        except BundleError as err:
            report.checks.append(Check(name, False, err.message))
            report.error = err
            raise _Failed from err
        report.checks.append(Check(name, True, detail))
        return result

    try:
        mk = check("manifest", lambda: _load(store, ref))
        report.modelkit, report.digest = mk, mk.digest
        scans = check("blobs", lambda: _scan_all(store, mk))
        for scan in scans.values():
            report.files.update(scan.files)
            report.tokenizer_hashes.update(scan.small_hashes)
        check("roles", lambda: _roles(mk, scans))
        check("tokenizer-files", lambda: _tokenizer_files(mk, report.tokenizer_hashes))
        if allow_unsigned:
            report.unsigned = True
            report.checks.append(Check("signature", True, "skipped (--allow-unsigned): integrity checked, origin NOT verified"))
            return report
        claims, report.signature_json = check("signature", lambda: _signature(store, mk, trusted))
        report.claims, report.signer = claims, claims.key_id
        # Name and version first, then the file names, then the digests: so a signature taken from another
        # bundle says so, and an added, removed or renamed file is named rather than shown as "another manifest".
        check("signed-name", lambda: _signed_name(mk, claims))
        check("files", lambda: _files(report.files, claims))
        check("subject", lambda: _subject(mk, claims))
        check("expiry", lambda: _expiry(claims, now or dt.datetime.now(dt.timezone.utc)))
        check("rollback", lambda: _rollback(store, mk, claims, record))
    except _Failed:
        pass
    return report


def _load(store: Store, ref: Ref) -> tuple[ModelKit, str]:
    mk = load_modelkit(store, ref)
    return mk, f"{mk.kitfile.name} {mk.kitfile.version}, {len(mk.layers)} layers, config {mk.config_desc.digest[:19]}…"


def _scan_all(store: Store, mk: ModelKit) -> tuple[dict[str, LayerScan], str]:
    """Every layer read once, in parallel (hashlib releases the GIL), biggest first."""
    order = sorted(mk.layers, key=lambda item: -item[1].size)
    with ThreadPoolExecutor(max_workers=max(1, min(len(order), os.cpu_count() or 1))) as pool:
        futures = {spec.path: pool.submit(scan_layer, store, desc, spec.path) for spec, desc in order}
        scans = {path: fut.result() for path, fut in futures.items()}
    seen: dict[str, str] = {}
    for path, scan in scans.items():
        for name in [*scan.files, *scan.dirs]:
            if name in scan.files and name in seen:
                raise BundleError("unsafe-archive", f"file {name!r} is in two layers ({seen[name]} and {path})")
            seen.setdefault(name, path)
    total = sum(desc.size for _, desc in mk.layers)
    nfiles = sum(len(s.files) for s in scans.values())
    return scans, f"{len(scans)} layers, {total} bytes, {nfiles} files: digests, sizes and entries safe"


def _roles(mk: ModelKit, scans: Mapping[str, LayerScan]) -> tuple[None, str]:
    for spec, _ in mk.layers:
        files = list(scans[spec.path].files)
        if spec.role in MODEL_ROLES:
            found = pickle_files(files)
            if found:
                raise BundleError("pickle-weights", f"{spec.role} holds pickle-based weights {found[0]!r}")
            ggufs = [f for f in files if f.endswith(".gguf")]  # one GGUF file: weights and their own config
            if len(ggufs) > 1:
                raise BundleError("invalid-bundle", f"{spec.role} ({spec.path}) holds {len(ggufs)} GGUF files; a role holds one")
            if ggufs and any(f.endswith(".safetensors") for f in files):
                raise BundleError("invalid-bundle", f"{spec.role} ({spec.path}) holds both GGUF and safetensors weights")
            if ggufs:
                continue
            if not any(f.endswith(".safetensors") for f in files):
                raise BundleError("invalid-bundle", f"{spec.role} ({spec.path}) holds no safetensors weights")
            if not any(posixpath.basename(f) == "config.json" for f in files):
                raise BundleError("invalid-bundle", f"{spec.role} ({spec.path}) has no config.json")
        if spec.role == "tokenizer" and not any(posixpath.basename(f) == "tokenizer.json" for f in files):
            raise BundleError("invalid-bundle", f"tokenizer ({spec.path}) has no tokenizer.json")
    roles = {spec.role: spec.path for spec, _ in mk.layers if spec.role in ("target", "draft", "tokenizer")}
    kind = "GGUF" if any(f.endswith(".gguf") for s in scans.values() for f in s.files) else "safetensors"
    return None, ", ".join(f"{r}={p}" for r, p in roles.items()) + f"; weights are {kind}"


def _tokenizer_files(mk: ModelKit, hashes: Mapping[str, str]) -> tuple[None, str]:
    """Where target or draft carry tokenizer files too, each must equal the tokenizer role's file."""
    roots = {spec.role: spec.path for spec, _ in mk.layers}
    reference = {posixpath.relpath(p, roots["tokenizer"]): h for p, h in hashes.items() if p.startswith(roots["tokenizer"] + "/")}
    compared = 0
    for role in MODEL_ROLES:
        for path, digest in hashes.items():
            if not path.startswith(roots[role] + "/"):
                continue
            name = posixpath.relpath(path, roots[role])
            if name in reference and reference[name] != digest:
                raise BundleError("tokenizer-mismatch", f"{role}'s {name} differs from the tokenizer role's {name}")
            compared += name in reference
    return None, f"{len(reference)} tokenizer files; {compared} copies in model roles identical"


def _signature(store: Store, mk: ModelKit, trusted: Mapping[str, Any]) -> tuple[tuple[signature.SignedClaims, bytes], str]:
    found = find_signatures(store, mk.digest)
    if not found:
        raise BundleError("signature-missing", f"{mk.ref} ({mk.digest[:19]}…) has no signature (sign it with `bundle sign`, or pass --allow-unsigned to check integrity only)")
    first_error: BundleError | None = None
    for _, payload in found:
        try:
            claims = signature.verify(payload, trusted)
            return (claims, payload), f"ECDSA P-256 signature by trusted key {claims.key_id[:16]}…"
        except BundleError as err:
            # Prefer telling "untrusted" over "invalid": it is the one a user can act on.
            if first_error is None or (err.code == "untrusted-signer" and first_error.code != "untrusted-signer"):
                first_error = err
    assert first_error is not None
    raise first_error


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


def _files(files: Mapping[str, int], claims: signature.SignedClaims) -> tuple[None, str]:
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


def _expiry(claims: signature.SignedClaims, now: dt.datetime) -> tuple[None, str]:
    expires = claims.bundle.get("expires")
    if not expires:
        return None, "no expiry in the signature"
    if signature.parse_time(expires) <= now:
        raise BundleError("expired", f"signature expired at {expires}")
    return None, f"valid until {expires}"


def version_key(version: str) -> tuple:
    """Order semantic versions: numbers numerically, a pre-release before its release."""
    core, _, pre = re.split(r"\+", version)[0].partition("-")
    nums = tuple(int(x) if x.isdigit() else 0 for x in core.split("."))
    return nums + ((1,) if not pre else (0, pre))


def _rollback(store: Store, mk: ModelKit, claims: signature.SignedClaims, record: bool) -> tuple[None, str]:
    """The store remembers, per bundle name and signer, the highest version seen and each version's digest."""
    key = f"{mk.kitfile.name}|{claims.key_id}"
    state = store.state(ROLLBACK_STATE)
    seen = state.get(key, {"highest": None, "digests": {}})
    version = mk.kitfile.version
    known = seen["digests"].get(version)
    if known and known != mk.digest:
        raise BundleError("rollback", f"{mk.kitfile.name} {version} was signed before with other content ({known[:19]}…): refusing a replaced release")
    if seen["highest"] and version_key(version) < version_key(seen["highest"]):
        raise BundleError("rollback", f"{mk.kitfile.name} {version} is older than {seen['highest']}, already verified from this signer")
    if record and not known:
        seen["digests"][version] = mk.digest
        if not seen["highest"] or version_key(version) > version_key(seen["highest"]):
            seen["highest"] = version
        with store.lock():
            state = store.state(ROLLBACK_STATE)
            state[key] = seen
            store.write_state(ROLLBACK_STATE, state)
    return None, f"{version} is the newest seen from this signer"
