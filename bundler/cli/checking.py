"""`bundle verify`, `inspect`, `unpack` and `attestations`: what a stored bundle proves, and its signed run records."""

from __future__ import annotations

__all__ = ["verify", "inspect", "unpack", "attestations"]

import sys
from pathlib import Path
from typing import Any

import click

from bundler.cli.app import command, emit, main, progress, trust_options, trusted, exit_if_refused
from bundler.cli.render import format_record
from bundler.store.layout import Store
from bundler.store.refs import parse_ref
from core.display import shown
from core.errors import BundleError


def verify_keyless_directory(model_dir: Path, trusted_root: str | None, signature_path: str | None, identities: tuple[str, ...],
                             issuers: tuple[str, ...], as_json: bool) -> None:
    """`verify DIR --trusted-root ROOT --identity ID --issuer ISS`: a model directory signed keyless with
    model-signing (Fulcio certificate, Rekor inclusion proof), checked offline with sigstore's verifier."""
    if not trusted_root:
        raise BundleError("usage", "--signature (a keyless model-signing signature) goes with --trusted-root")
    if len(identities) != 1 or len(issuers) != 1:
        raise BundleError("usage", "a keyless signature is checked against one --identity and one --issuer")
    if not model_dir.is_dir():
        raise BundleError("usage", f"with --trusted-root, {str(model_dir)!r} must be a model directory")
    try:
        from bundler.trust.sigstore_bundle import verify_model_directory
    except ImportError:
        raise BundleError("usage", "keyless verification needs the sigstore package: pip install 'specbundle[sigstore]'") from None
    sig = Path(signature_path) if signature_path else model_dir / "model.sig"
    claims = verify_model_directory(model_dir, sig, Path(trusted_root), identities[0], issuers[0])
    if as_json:
        emit({"ok": True, "model": str(model_dir), "signer": {"identity": identities[0], "issuer": issuers[0]}, "files": len(claims.files)})
    else:
        click.echo(f"verified {model_dir}: {len(claims.files)} files signed by {identities[0]} ({issuers[0]}), Sigstore keyless, offline")


def _by_role(values: tuple[str, ...], option: str) -> dict[str, str]:
    from bundler.trust.upstream import SIGNED_ROLES

    out: dict[str, str] = {}
    for value in values:
        role, sep, rest = value.partition("=")
        if not sep or role not in SIGNED_ROLES or not rest:
            raise BundleError("usage", f"{option} {value!r}: expected ROLE=VALUE with ROLE one of {', '.join(SIGNED_ROLES)}")
        out[role] = rest
    return out


def upstream_trusts(key_values: tuple[str, ...], identity_values: tuple[str, ...], issuer_values: tuple[str, ...],
                    trusted_root: str | None) -> dict[str, Any]:
    """--upstream-key / --upstream-identity / --upstream-issuer / --upstream-trusted-root as role -> UpstreamTrust."""
    from bundler.trust import keys
    from bundler.trust.upstream import UpstreamTrust

    by_key = _by_role(key_values, "--upstream-key")
    by_identity, by_issuer = _by_role(identity_values, "--upstream-identity"), _by_role(issuer_values, "--upstream-issuer")
    if set(by_identity) != set(by_issuer) or (by_identity and not trusted_root) or set(by_key) & set(by_identity):
        raise BundleError("usage", "a keyless publisher signature needs --upstream-identity and --upstream-issuer for its role and "
                                   "--upstream-trusted-root; a role takes a key or an identity, not both")
    trusts: dict[str, Any] = {}
    for role, path in by_key.items():
        key = keys.load_public_key(Path(path))
        trusts[role] = UpstreamTrust(trusted={keys.key_id(key): key})
    for role, identity in by_identity.items():
        trusts[role] = UpstreamTrust(identity=identity, issuer=by_issuer[role], trusted_root=Path(trusted_root or ""))
    return trusts


def check_upstream(store: Store, report: Any, trusts: dict[str, Any]) -> None:
    """The publishers' signatures, as one more check of the report (bundler.trust.upstream.check_bundle)."""
    from bundler.trust.upstream import check_bundle
    from bundler.trust.verify_report import Check

    try:
        signers = check_bundle(store, report, trusts)
    except BundleError as err:
        report.checks.append(Check("upstream", False, err.message))
        report.error = err
        return
    report.checks.append(Check("upstream", True, "; ".join(f"{role}: its publisher's signature by {who}, over exactly its files"
                                                             for role, who in signers.items())))


@main.command()
@click.argument("ref")
@trust_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.option("--require", "require", multiple=True, metavar="KINDS", help="Attestations that must be attached and signed by a trusted key: sbom, provenance (comma-separated or repeated).")
@click.option("--trusted-root", type=click.Path(dir_okay=False), help="A Sigstore trusted_root.json (the public-good instance's or a private one): REF is then a model directory signed keyless with model-signing, checked offline against --identity and --issuer.")
@click.option("--signature", "signature_path", type=click.Path(dir_okay=False), help="With --trusted-root: the model-signing signature (default DIR/model.sig).")
@click.option("--upstream-key", "upstream_keys", multiple=True, metavar="ROLE=KEY.pub", help="Check the publisher's model-signing signature the bundle carries for ROLE (target or draft) against this public key (repeatable).")
@click.option("--upstream-identity", "upstream_identities", multiple=True, metavar="ROLE=IDENTITY", help="Check ROLE's publisher signature as a Sigstore (keyless) one by IDENTITY, with --upstream-issuer and --upstream-trusted-root (repeatable).")
@click.option("--upstream-issuer", "upstream_issuers", multiple=True, metavar="ROLE=ISSUER", help="The OIDC issuer of ROLE's keyless publisher signature (repeatable).")
@click.option("--upstream-trusted-root", type=click.Path(dir_okay=False), help="The Sigstore trusted_root.json the keyless publisher signatures are checked against (offline).")
@command
def verify(store: Store, ref: str, key_paths: tuple[str, ...], ca_paths: tuple[str, ...], identities: tuple[str, ...], issuers: tuple[str, ...], allow_unsigned: bool, allow_rollback: bool, allow_ref_mismatch: bool, as_json: bool, require: tuple[str, ...],
           trusted_root: str | None, signature_path: str | None, upstream_keys: tuple[str, ...], upstream_identities: tuple[str, ...],
           upstream_issuers: tuple[str, ...], upstream_trusted_root: str | None) -> None:
    """Check signature, trust, every blob, every file, archive safety, roles and tokenizer files."""
    from bundler.trust.attestation import parse_kinds
    from bundler.trust.verify import verify_bundle

    if trusted_root or signature_path:
        return verify_keyless_directory(Path(ref), trusted_root, signature_path, identities, issuers, as_json)
    upstream = upstream_trusts(upstream_keys, upstream_identities, upstream_issuers, upstream_trusted_root)

    report = verify_bundle(store, parse_ref(ref), trusted(key_paths, ca_paths, identities, issuers), allow_unsigned=allow_unsigned, allow_rollback=allow_rollback, allow_ref_mismatch=allow_ref_mismatch,
                           require_attestations=parse_kinds(require, allow_unsigned))
    if upstream and report.ok:
        check_upstream(store, report, upstream)
    if as_json:
        emit(report.as_json())
    else:
        for c in report.checks:
            click.echo(f"{'ok  ' if c.ok else 'FAIL'} {c.name:<16} {shown(c.detail, 1000)}")
    if report.error:
        click.echo(report.error.line(), err=True)
        sys.exit(report.error.exit_code)
    if not as_json:
        who = f"signed by {report.signed_by}" if report.signer else "UNSIGNED (integrity only)"
        kinds = report.as_json()["signature_kinds"]
        click.echo(f"verified {report.ref} {report.digest} {who}" + (f" (signatures: {', '.join(kinds)})" if kinds else ""))


@main.command()
@click.argument("ref")
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable).")
@click.option("--max-tokens", default=2048, show_default=True, help="Context length for the memory estimate.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@command
def inspect(store: Store, ref: str, key_paths: tuple[str, ...], max_tokens: int, as_json: bool) -> None:
    """Manifest, layers, roles, signer, tokenizer fingerprint, memory needed to run."""
    from bundler.verbs.inspect import inspect_bundle

    info = inspect_bundle(store, parse_ref(ref), trusted(key_paths), max_tokens)
    if as_json:
        emit(info)
        exit_if_refused(info)
        return
    # Plain lines, never wrapped or coloured: refs and digests stay whole for copying and for pipes.
    # Every value from the bundle is shown escaped (core.display): none may draw a line of its own.
    click.echo(f"{shown(info['ref'])}  {info['digest']}")
    rows = [("ROLE", "PATH", "SIZE", "DIGEST")] + [(shown(layer["role"]), shown(layer["path"]), f"{layer['size']:,}", shown(layer["digest"])) for layer in info["layers"]]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    ver = info["verification"]
    if ver["ok"]:
        click.echo(f"verified: yes, signed by {shown(ver['signer'] or 'nobody (integrity only)')}")
    else:
        reason = str(ver["error"] or "").removeprefix("error: ")
        click.echo(f"verified: no ({shown(reason, 1000)})")
        click.echo(f"signer (claimed, not checked): {shown(ver['signer'])}" if ver.get("signer") else "signer: -")
    tok = info.get("tokenizer") or {}
    if tok.get("fingerprint"):
        click.echo(f"tokenizer: {shown(tok['fingerprint'])}")
    else:
        click.echo(f"tokenizer: unknown ({shown(str(tok.get('error') or 'no tokenizer fingerprint').removeprefix('error: '), 1000)})")
    for role, m in info.get("models", {}).items():
        if isinstance(m, dict):
            click.echo(f"{shown(role)}: {m['parameters']:,} parameters")
    if "memory" in info:
        mem = info["memory"]
        click.echo(f"memory to run ({shown(mem['dtype'])}, {mem['max_tokens']} tokens): {mem['total_bytes'] / 2**20:,.0f} MiB")
    exit_if_refused(info)


@main.command()
@click.argument("ref")
@click.option("-d", "--dir", "dest", required=True, type=click.Path(), help="Directory to extract into (new or empty).")
@click.option("--signature", "signature_out", type=click.Path(dir_okay=False), help="Also write the verified signature (Sigstore bundle JSON) here, outside DIR, for `model_signing verify`.")
@trust_options
@command
def unpack(store: Store, ref: str, dest: str, signature_out: str | None, key_paths: tuple[str, ...], ca_paths: tuple[str, ...], identities: tuple[str, ...], issuers: tuple[str, ...], allow_unsigned: bool, allow_rollback: bool, allow_ref_mismatch: bool) -> None:
    """Verify, then extract the bundle into DIR; never writes outside it."""
    from bundler.verbs.unpack import unpack as do_unpack

    if signature_out and Path(signature_out).resolve().is_relative_to(Path(dest).resolve()):
        raise BundleError("usage", f"--signature {signature_out} is inside {dest}: model_signing would count it as a file of the bundle")
    for tick in progress():
        result = do_unpack(store, parse_ref(ref), Path(dest), trusted(key_paths, ca_paths, identities, issuers), allow_unsigned, progress=tick, allow_rollback=allow_rollback, allow_ref_mismatch=allow_ref_mismatch)
    who = f"signed by {result.report.signed_by}" if result.report.signer else "UNSIGNED (integrity only)"
    click.echo(f"unpacked {result.files} files to {result.dest} ({who})")
    if signature_out and result.report.signature_json:
        Path(signature_out).write_bytes(result.report.signature_json)
        click.echo(f"signature: {signature_out}")


@main.command()
@click.argument("ref")
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key for run records (repeatable); also $BUNDLE_TRUSTED_KEYS.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array on stdout.")
@click.option("--type", "types", multiple=True, type=click.Choice(["run", "sbom", "provenance", "all"]), default=("run",), show_default=True,
              help="Which attestations: run records, the SBOM, the SLSA provenance, or all (repeatable).")
@command
def attestations(store: Store, ref: str, key_paths: tuple[str, ...], as_json: bool, types: tuple[str, ...]) -> None:
    """List the signed run records (with --type, the SBOM and provenance too) attached to a bundle and verify each; exits with the first failure's code if any does not verify."""
    from bundler.trust.attestation import attestation_checks
    from bundler.trust.runrecord import attestations as find

    trusted_keys = trusted(key_paths)
    digest, records = find(store, parse_ref(ref), trusted_keys)
    wanted = {"run", "sbom", "provenance"} if "all" in types else set(types)
    records = records if "run" in wanted else []
    standard = [c for c in attestation_checks(store, digest, trusted_keys) if c.kind in wanted]
    if as_json:
        emit([r.as_json() for r in records] + [c.as_json() for c in standard])
    else:
        click.echo(f"{len(records)} run record(s) for {ref} ({digest})" if "run" in wanted else f"{len(standard)} attestation(s) for {ref} ({digest})")
        for r in records:
            click.echo(format_record(r))
        for c in standard:
            click.echo(_format_attestation(c))
    bad = [r for r in [*records, *standard] if not r.verified]
    if bad:
        first = bad[0].error
        assert first is not None
        what = "run record(s)" if not standard else "attestation(s)"
        click.echo(BundleError(first.code, f"{len(bad)} of {len(records) + len(standard)} {what} did not verify; first: {first.message}").line(), err=True)
        sys.exit(first.exit_code)


def _format_attestation(check: Any) -> str:
    """One SBOM or provenance attestation: its verdict, signer or reason, and its type."""
    if check.verified:
        return f"ok   {check.digest[:19]}…  signer {shown(check.signer[:16])}  {check.kind} ({shown(check.predicate_type)})"
    reason = check.error.line() if check.error is not None else "error: [integrity] not verified"
    return f"FAIL {check.digest[:19]}…  NOT VERIFIED: {shown(reason, 1000)}  {check.kind} ({shown(check.predicate_type)})"
