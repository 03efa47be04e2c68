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


@main.command()
@click.argument("ref")
@trust_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.option("--require", "require", multiple=True, metavar="KINDS", help="Attestations that must be attached and signed by a trusted key: sbom, provenance (comma-separated or repeated).")
@command
def verify(store: Store, ref: str, key_paths: tuple[str, ...], allow_unsigned: bool, allow_rollback: bool, allow_ref_mismatch: bool, as_json: bool, require: tuple[str, ...]) -> None:
    """Check signature, trust, every blob, every file, archive safety, roles and tokenizer files."""
    from bundler.trust.attestation import parse_kinds
    from bundler.trust.verify import verify_bundle

    report = verify_bundle(store, parse_ref(ref), trusted(key_paths), allow_unsigned=allow_unsigned, allow_rollback=allow_rollback, allow_ref_mismatch=allow_ref_mismatch,
                           require_attestations=parse_kinds(require, allow_unsigned))
    if as_json:
        emit(report.as_json())
    else:
        for c in report.checks:
            click.echo(f"{'ok  ' if c.ok else 'FAIL'} {c.name:<16} {shown(c.detail, 1000)}")
    if report.error:
        click.echo(report.error.line(), err=True)
        sys.exit(report.error.exit_code)
    if not as_json:
        who = f"signed by {report.signer}" if report.signer else "UNSIGNED (integrity only)"
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
def unpack(store: Store, ref: str, dest: str, signature_out: str | None, key_paths: tuple[str, ...], allow_unsigned: bool, allow_rollback: bool, allow_ref_mismatch: bool) -> None:
    """Verify, then extract the bundle into DIR; never writes outside it."""
    from bundler.verbs.unpack import unpack as do_unpack

    if signature_out and Path(signature_out).resolve().is_relative_to(Path(dest).resolve()):
        raise BundleError("usage", f"--signature {signature_out} is inside {dest}: model_signing would count it as a file of the bundle")
    for tick in progress():
        result = do_unpack(store, parse_ref(ref), Path(dest), trusted(key_paths), allow_unsigned, progress=tick, allow_rollback=allow_rollback, allow_ref_mismatch=allow_ref_mismatch)
    who = f"signed by {result.report.signer}" if result.report.signer else "UNSIGNED (integrity only)"
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
