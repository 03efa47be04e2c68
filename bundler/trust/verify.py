"""`bundle verify`: every check that makes a bundle trustworthy, each reported by name.

Order: the bundle's own structure (manifest, config, Kitfile), every blob's bytes and archive safety,
roles and weights, tokenizer files, then the signature: present, valid, trusted, for this name and
version, listing exactly its files, over this manifest, not expired, not a rollback.
"""

from __future__ import annotations

__all__ = [
    "Check", "MAX_SIGNATURES", "VerifyReport", "check_expiry", "check_files", "check_layer_roles",
    "signed_before_download", "verify_bundle",
]

import datetime as dt
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from bundler.trust import attestation, cosign, signature
from core.errors import BundleError
from bundler.format.kitfile import MODEL_ROLES, LayerSpec, pickle_files
from bundler.format.layerread import LayerScan, merge_scans, scan_layer
from bundler.format.modelpack import layer_members, layer_path
from bundler.format.manifest import Descriptor
from bundler.store.modelkit import ModelKit, file_hashes, load_modelkit
from bundler.store.refs import Ref
from bundler.store.referrers import damaged_signatures, find_signatures
from bundler.trust.releases import ROLLBACK_STATE, memory, remember, version_key
from bundler.store.layout import Store



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
    def signed_by(self) -> str | None:
        """Who signed, as a person reads it: a certificate's identity (its name), else the key id."""
        return (self.claims.signer_name if self.claims is not None and self.claims.signer_name else None) or self.signer
    skipped_signatures: list[dict[str, Any]] = field(default_factory=list)  # candidates that did not pass, and why
    signature_digest: str | None = None  # the signature artifact that verified
    # Every signature artifact looked at: {"kind": model-signing | cosign, "digest", "key_id", "verified"}
    # (an addition to CONTRACT.md's verify --json, see docs/cosign.md).
    signatures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verified_signatures(self) -> list[str]:
        """Digests of the signature artifacts that held, of every kind."""
        return [s["digest"] for s in self.signatures if s["verified"]]

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
            "signer": ({"key_id": self.signer, **({"name": self.signed_by} if self.signed_by != self.signer else {})}
                       if self.signer else None),
            "unsigned": self.unsigned,
            "checks": [c.as_dict() for c in self.checks],
            "skipped_signatures": self.skipped_signatures,
            "signatures": self.signatures,
            "signature_kinds": sorted({s["kind"] for s in self.signatures if s["verified"]}),
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
    allow_rollback: bool = False,
    allow_ref_mismatch: bool = False,
    require_attestations: Sequence[str] = (),
) -> VerifyReport:
    """Run every check on a bundle in the store; the report holds the first failure, if any.
    `require_attestations` (sbom, provenance): each must be attached and signed by a trusted key."""
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
        check("roles", lambda: check_layer_roles([spec for spec, _ in mk.layers], scans))
        check("tokenizer-files", lambda: _tokenizer_files(store, mk, report.tokenizer_hashes))
        if allow_unsigned:
            report.unsigned = True
            report.checks.append(Check("signature", True, "skipped (--allow-unsigned): integrity checked, origin NOT verified"))
            return report
        claims, report.signature_json = _select_signature(store, mk, report, trusted, now or dt.datetime.now(dt.timezone.utc))
        report.claims, report.signer = claims, claims.key_id
        check("reference", lambda: _reference(ref, mk, allow_ref_mismatch))
        check("rollback", lambda: _rollback(store, mk, claims, record, allow_rollback))
        if require_attestations:
            check("attestations", lambda: _attestations(store, mk, trusted, require_attestations))
    except _Failed:
        pass
    return report


def _attestations(store: Store, mk: ModelKit, trusted: Mapping[str, Any], required: Sequence[str]) -> tuple[None, str]:
    """The required standard attestations (bundler.trust.attestation) are attached and verify."""
    checks = attestation.attestation_checks(store, mk.digest, trusted)
    return None, attestation.require_kinds(checks, required, f"{mk.ref} ({mk.digest[:19]}…)")


def _load(store: Store, ref: Ref) -> tuple[ModelKit, str]:
    mk = load_modelkit(store, ref)
    return mk, f"{mk.kitfile.name} {mk.kitfile.version}, {len(mk.layers)} layers, config {mk.config_desc.digest[:19]}…"


def _scan_all(store: Store, mk: ModelKit) -> tuple[dict[str, LayerScan], str]:
    """Every layer read once, in parallel (hashlib releases the GIL), biggest first."""
    order = sorted(mk.layers, key=lambda item: -item[1].size)
    with ThreadPoolExecutor(max_workers=max(1, min(len(order), os.cpu_count() or 1))) as pool:
        futures = [(spec.path, layer_path(desc, spec.path), pool.submit(scan_layer, store, desc, layer_path(desc, spec.path))) for spec, desc in order]
        scans = merge_scans([(entry, shown, fut.result()) for entry, shown, fut in futures])
    total = sum(desc.size for _, desc in mk.layers)
    nfiles = sum(len(s.files) for s in scans.values())
    return scans, f"{len(mk.layers)} layers, {total} bytes, {nfiles} files: digests, sizes and entries safe"


def check_layer_roles(specs: Sequence[LayerSpec], scans: Mapping[str, LayerScan]) -> tuple[None, str]:
    """Each role holds what it must (weights, config, tokenizer) and no pickle; `scans[path]` lists a layer's files."""
    for spec in specs:
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
    roles = {spec.role: spec.path for spec in specs if spec.role in ("target", "draft", "tokenizer")}
    kind = "GGUF" if any(f.endswith(".gguf") for s in scans.values() for f in s.files) else "safetensors"
    return None, ", ".join(f"{r}={p}" for r, p in roles.items()) + f"; weights are {kind}"


def _tokenizer_files(store: Store, mk: ModelKit, hashes: Mapping[str, str]) -> tuple[None, str]:
    """Where target or draft carry tokenizer files too, each must mean the same as the tokenizer role's.

    Equal bytes pass at once. Otherwise the tokenizer gate judges the meaning (CONTRACT.md section 1): a
    difference that changes token ids is refused with its field-by-field message; another chat template or
    other formatting passes.
    """
    roots = {spec.role: spec.path for spec, _ in mk.layers}
    reference = {posixpath.relpath(p, roots["tokenizer"]): h for p, h in hashes.items() if p.startswith(roots["tokenizer"] + "/")}
    compared = 0
    differing: list[str] = []
    for role in (r for r in MODEL_ROLES if r in roots):  # a bundle for draft-free speculation has no draft
        for path, digest in hashes.items():
            if not path.startswith(roots[role] + "/"):
                continue
            name = posixpath.relpath(path, roots[role])
            if name in reference and reference[name] != digest and role not in differing:
                differing.append(role)
            compared += name in reference
    if not differing:
        return None, f"{len(reference)} tokenizer files; {compared} copies in model roles identical"
    _judge_tokenizer_copies(store, mk, ["tokenizer", *differing])
    return None, f"{len(reference)} tokenizer files; copies in {', '.join(differing)} differ in bytes but tokenize identically"


def _judge_tokenizer_copies(store: Store, mk: ModelKit, roles: list[str]) -> None:
    """Extract only the tokenizer files of `roles` (small) into a temp dir and run the tokenizer gate on them."""
    import tempfile
    from pathlib import Path

    from bundler.format.layerread import TOKENIZER_FILES
    from bundler.format.metadatacheck import check_tree
    from runner.checks.tokenizer_gate import check_tokenizers  # torch-free

    with tempfile.TemporaryDirectory(prefix="specbundle-tok-") as tmp:
        dirs: dict[str, Path] = {}
        for spec, desc in mk.layers:
            if spec.role not in roles:
                continue
            out = Path(tmp) / spec.role
            out.mkdir(exist_ok=True)  # a ModelPack role has a layer per file
            dirs[spec.role] = out
            with open(store.blob_path(desc.digest), "rb") as f:
                for member, content in layer_members(f, desc, spec.path):
                    rel = posixpath.relpath(member.name, spec.path)
                    if member.kind == "file" and content is not None and "/" not in rel and rel in TOKENIZER_FILES:
                        (out / rel).write_bytes(content.read())
        check_tree(Path(tmp))  # read before the signature is checked: bounded first
        check_tokenizers(dirs)


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


def _select_signature(store: Store, mk: ModelKit, report: VerifyReport, trusted: Mapping[str, Any], now: dt.datetime) -> tuple[signature.SignedClaims, bytes]:
    """The first attached signature that passes every per-signature check: a model-signing one, else a
    cosign-style one where no model-signing signature carries a valid signature by a trusted key. Model-signing
    candidates that fail go to skipped_signatures; every candidate, of each kind, is listed in report.signatures.

    A bundle verifies when ANY trusted signature holds (a renewal, a second signer), so a foreign, broken or
    expired signature attached beside a good one cannot make it fail. When none holds, the failure of the
    candidate that got furthest is the error.
    """
    found = find_signatures(store, mk.digest)
    damaged = damaged_signatures(store, mk.digest)
    if found and damaged:  # every blob verify walks is checked: a damaged store is refused, not verified around
        err = BundleError("digest-mismatch", f"{mk.ref} ({mk.digest[:19]}…): signature artifact {damaged[0][:19]}… in the store is "
                          "damaged (a blob is missing or does not match its digest); pull or sign the bundle again")
        report.checks.append(Check("signature", False, err.message))
        report.error = err
        raise _Failed from err
    if not found:
        why = (f"has no usable signature: signature artifact {damaged[0][:19]}… is damaged (a blob is missing or does not match "
               "its digest); pull or sign it again" if damaged else "has no signature (sign it with `bundle sign`, or pass --allow-unsigned to check integrity only)")
        err = BundleError("signature-missing", f"{mk.ref} ({mk.digest[:19]}…) {why}")
        report.checks.append(Check("signature", False, err.message))
        report.error = err
        raise _Failed from err
    # Cosign-style signatures name only the manifest digest: each is checked (one ECDSA verification) and
    # listed, but decides only where no model-signing signature is validly signed by a trusted key: that one
    # is the key's full statement (files, name, version, expiry), and its failure stands (docs/cosign.md).
    kinds = [(desc, payload, cosign.kind_of(payload)) for desc, payload in found]
    candidates = [c for k in (cosign.KIND, cosign.MODEL_SIGNING_KIND) for c in [c for c in kinds if c[2] == k][:MAX_SIGNATURES]]
    by_cosign: tuple[Descriptor, bytes, cosign.CosignClaims] | None = None
    cosign_best: tuple[int, list[Check], BundleError] | None = None
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
    best: tuple[int, list[Check], BundleError] | None = None
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
            return claims, payload
        assert err is not None
        report.skipped_signatures.append({"digest": desc.digest, "key_id": claims.key_id if claims else None, "check": checks[-1].name, "error": {"code": err.code, "message": err.message}})
        rank = _STAGES.index(checks[-1].name) * 2 + (err.code != "signature-invalid")
        if best is None or rank > best[0]:
            best = (rank, checks, err)
    if by_cosign is not None and not names_trusted:
        desc, payload, held = by_cosign
        report.signature_digest = desc.digest
        return _cosign_claims(store, mk, report, held), payload
    if cosign_best is not None and not names_trusted and (best is None or cosign_best[0] > best[0]):
        best = cosign_best
    if len(found) > len(candidates):
        report.skipped_signatures.append({"digest": None, "key_id": None, "check": "signature", "error": {"code": "signature-invalid", "message": f"{len(found) - len(candidates)} more signatures not considered (at most {MAX_SIGNATURES} of each kind)"}})
    assert best is not None
    report.checks.extend(best[1])
    report.error = best[2]
    raise _Failed from best[2]


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


def _reference(ref: Ref, mk: ModelKit, allow: bool) -> tuple[None, str]:
    """What the user asked for is what was signed: a version tag equals the signed version and the
    repository's last path component equals the signed name (else a re-pointed tag is a silent downgrade
    or a substitution). A digest reference names the content itself and is always fine; one with a tag
    beside its digest has the tag checked as well (bundler.store.refs: one meaning everywhere)."""
    if ref.digest and ref.tag is None:
        return None, f"digest reference {ref.digest[:19]}…"
    name, version = mk.kitfile.name, mk.kitfile.version
    repo_name = ref.repository.rsplit("/", 1)[-1]
    problems = []
    if repo_name != name:
        problems.append(f"repository {repo_name!r} is not the signed name {name!r}")
    if ref.version is not None and ref.version != version.split("+", 1)[0]:
        problems.append(f"tag {ref.tag!r} is a version but the signed version is {version!r}")
    if problems and not allow:
        raise BundleError("signature-mismatch", f"{ref.full}: {'; '.join(problems)} (pass --allow-ref-mismatch to accept it for this command)")
    if problems:
        return None, f"{'; '.join(problems)}: allowed by --allow-ref-mismatch"
    return None, f"{ref.full} names {name} {version}"


def check_expiry(claims: signature.SignedClaims, now: dt.datetime) -> tuple[None, str]:
    """The signed `expires` is in the future (signature-invalid unless RFC 3339 UTC with `Z`)."""
    expires = claims.bundle.get("expires")
    moment = signature.signed_expiry(expires, "signed expires")
    if moment is None:
        return None, "no expiry in the signature"
    if moment <= now:
        raise BundleError("expired", f"signature expired at {expires}")
    return None, f"valid until {expires}"



def _rollback(store: Store, mk: ModelKit, claims: signature.SignedClaims, record: bool, allow_rollback: bool = False) -> tuple[None, str]:
    """The store remembers, per bundle name (across all trusted keys), the highest version seen and each version's digest."""
    name, version = mk.kitfile.name, mk.kitfile.version
    seen = memory(store.state(ROLLBACK_STATE), name)
    known = seen["digests"].get(version)
    if known and known != mk.digest:
        raise BundleError("rollback", f"{name} {version} was signed before with other content ({str(known)[:19]}…): refusing a replaced release")
    older = bool(seen["highest"]) and version_key(version) < version_key(seen["highest"])
    if older and not allow_rollback:
        raise BundleError("rollback", f"{name} {version} is older than {seen['highest']}, already verified in this store (pass --allow-rollback to accept an older release for this command)")
    if record and not known:
        remember(store, name, version, mk.digest)
    if older:
        return None, f"{version} is older than {seen['highest']}: allowed by --allow-rollback"
    return None, f"{version} is the newest seen for {name}"
