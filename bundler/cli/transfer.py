"""`bundle login`, `logout`, `push`, `pull` and `fetch`: bundles through OCI registries."""

from __future__ import annotations

__all__ = ["login", "logout", "push", "pull", "fetch"]

import sys
from pathlib import Path

import click

from bundler.cli.app import command, main, progress, trust_options, trusted
from bundler.store.layout import Store
from bundler.store.refs import parse_ref
from core.errors import BundleError


@main.command()
@click.argument("host")
@click.option("-u", "--username", help="User name (asked for on a terminal when missing).")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@command
def login(store: Store, host: str, username: str | None, password_stdin: bool) -> None:
    """Store credentials for a registry HOST[:PORT] in docker's config.json."""
    from bundler.registry import credentials

    if password_stdin:
        if not username:
            raise BundleError("usage", "--password-stdin needs -u USER")
        password = sys.stdin.read().rstrip("\r\n")
    elif sys.stdin.isatty():
        username = username or click.prompt("Username")
        password = click.prompt("Password", hide_input=True)
    else:
        raise BundleError("usage", "stdin is not a terminal: give -u USER --password-stdin and pipe the password")
    path = credentials.login(host, username or "", password)
    click.echo(f"login for {host} stored in {path}")


@main.command()
@click.argument("host")
@command
def logout(store: Store, host: str) -> None:
    """Remove the stored credentials for a registry HOST[:PORT]."""
    from bundler.registry import credentials

    if credentials.logout(host):
        click.echo(f"removed the login for {host} from {credentials.docker_config_path()}")
    else:
        click.echo(f"no login for {host} in {credentials.docker_config_path()}")


@main.command()
@click.argument("ref")
@click.argument("dst", required=False)
@click.option("--plain-http", is_flag=True, envvar="BUNDLE_PLAIN_HTTP", help="Speak HTTP, not HTTPS (a registry on loopback; also BUNDLE_PLAIN_HTTP=1).")
@command
def push(store: Store, ref: str, dst: str | None, plain_http: bool) -> None:
    """Push the store entry REF and its signatures, to DST (HOST[:PORT]/NAME:TAG) or to REF itself; the last line is the manifest digest."""
    from bundler.registry.push import push as do_push

    for tick in progress():
        result = do_push(store, parse_ref(ref), plain_http=plain_http, progress=tick, dest=parse_ref(dst) if dst else None,
                         trusted=trusted(()))  # run records: those $BUNDLE_TRUSTED_KEYS verify go first
    sigs = f"{len(result.signatures)} signature(s) ({'referrers API' if result.referrers == 'api' else 'referrers tag ' + result.digest.replace(':', '-', 1)[:19] + '…'})" if result.signatures else "unsigned"
    records = f", {len(result.records)} run record(s)" if result.records else ""
    records += f", {len(result.attestations)} attestation(s)" if result.attestations else ""
    click.echo(f"pushed {result.ref}: {result.blobs_uploaded} blobs uploaded ({result.bytes_uploaded:,} bytes), {result.blobs_skipped} already there; {sigs}{records}")
    click.echo(result.digest)


@main.command()
@click.argument("ref")
@trust_options
@click.option("--plain-http", is_flag=True, envvar="BUNDLE_PLAIN_HTTP", help="Speak HTTP, not HTTPS (a registry on loopback; also BUNDLE_PLAIN_HTTP=1).")
@click.option("--require", "require", multiple=True, metavar="KINDS", help="Attestations that must be attached and signed by a trusted key: sbom, provenance (comma-separated or repeated).")
@command
def pull(store: Store, ref: str, key_paths: tuple[str, ...], allow_unsigned: bool, allow_rollback: bool, allow_ref_mismatch: bool, plain_http: bool, require: tuple[str, ...]) -> None:
    """Download REF with its signatures, verify it apart from the store, then add it; the last line is the digest."""
    from bundler.trust.recordlimits import MAX_RECORDS
    from bundler.registry.pull import pull as do_pull
    from bundler.trust.attestation import parse_kinds

    trusted_keys = trusted(key_paths)
    for tick in progress():
        result = do_pull(store, parse_ref(ref), trusted=trusted_keys, allow_unsigned=allow_unsigned, plain_http=plain_http, progress=tick, allow_rollback=allow_rollback, allow_ref_mismatch=allow_ref_mismatch,
                             require_attestations=parse_kinds(require, allow_unsigned))
    who = f"signed by {result.signer}" if result.signer else "UNSIGNED (integrity only)"
    who += f" (signatures: {', '.join(result.signature_kinds)})" if result.signature_kinds else ""
    records = f"; {len(result.records)} run record(s) (check them with `bundle attestations`)" if result.records else ""
    records += f"; {len(result.attestations)} attestation(s)" if result.attestations else ""
    if result.records_dropped:
        records += f"; {result.records_dropped} more run record(s) not kept (at most {MAX_RECORDS} per bundle, trusted first: docs/security.md)"
    click.echo(f"pulled {result.ref}: {result.blobs_downloaded} blobs downloaded ({result.bytes_downloaded:,} bytes), {result.blobs_reused} reused; verified, {who}{records}")
    click.echo(result.digest)


@main.command()
@click.argument("src")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable); also every *.pub in $BUNDLE_TRUSTED_KEYS.")
@click.option("--allow-rollback", is_flag=True, help="Accept a release older than one already verified in this store.")
@click.option("--plain-http", is_flag=True, envvar="BUNDLE_PLAIN_HTTP", help="Speak HTTP, not HTTPS (a registry on loopback; also BUNDLE_PLAIN_HTTP=1).")
@click.option("--evidence-only", is_flag=True, help="Write only the evidence (manifest, config, signature, origin) into DEST: for a bundle the container runtime mounts as an image volume, checked by `serve --from-dir MOUNT --evidence DEST`.")
@command
def fetch(store: Store, src: str, dest: str, key_paths: tuple[str, ...], allow_rollback: bool, plain_http: bool, evidence_only: bool) -> None:
    """Pull SRC (bundle://HOST/REPO:TAG), verify it, check it as `run` would and unpack it into DEST with its evidence.

    The KServe storage-initializer contract: two arguments, everything else from the environment. Any refusal
    leaves DEST empty. Serve the result with `bundle serve --from-dir DEST`."""
    from bundler.verbs.fetch import fetch as do_fetch

    for tick in progress():
        result = do_fetch(store, src, Path(dest), trusted(key_paths), plain_http=plain_http, allow_rollback=allow_rollback, progress=tick,
                          evidence_only=evidence_only)
    if evidence_only:
        click.echo(f"fetched the evidence of {result.ref} into {result.dest}, signed by {result.signer}")
    else:
        click.echo(f"fetched {result.ref} into {result.dest}: {result.files} files, signed by {result.signer}, tokenizer {result.fingerprint}")
    click.echo(result.digest)
