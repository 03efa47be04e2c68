"""The `bundle` group and what every command shares: --store and --debug, errors as one line with their exit code,
the trusted keys, JSON output, the progress bar."""

from __future__ import annotations

__all__ = ["command", "emit", "exit_if_refused", "fail", "human_size", "identity_options", "main", "password", "progress", "trust_options", "trusted"]

import functools
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from bundler.trust import keys
from core.display import shown
from core.errors import BundleError
from bundler.store.layout import Store, default_root

_DEBUG = False


def password() -> bytes | None:
    value = os.environ.get(keys.PASSWORD_ENV)
    return value.encode() if value else None


def trusted(key_paths: tuple[str, ...], ca_paths: tuple[str, ...] = (), identities: tuple[str, ...] = (),
            issuers: tuple[str, ...] = ()) -> dict[str, Any]:
    """The trust policy of a command: --key (and $BUNDLE_TRUSTED_KEYS), plus the CA roots and the identities
    (and OIDC issuers) a certificate signer may have (bundler.trust.certificates.trust_policy)."""
    found = keys.trusted_keys([Path(p) for p in key_paths], os.environ.get(keys.TRUSTED_KEYS_ENV))
    if not (ca_paths or identities or issuers):
        return found
    from bundler.trust.certificates import trust_policy

    return trust_policy(found, [Path(p) for p in ca_paths], identities, issuers)


def identity_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--ca, --identity, --issuer: certificate signers trusted beside --key (docs/trust.md)."""
    fn = click.option("--issuer", "issuers", multiple=True, help="With --ca: the OIDC issuer a signer's certificate must name, where it names one (repeatable).")(fn)
    fn = click.option("--identity", "identities", multiple=True, help="With --ca: a signer identity allowed (the certificate's email, URI or DNS SAN, or its subject CN; repeatable; none: any the CA vouches for).")(fn)
    return click.option("--ca", "ca_paths", multiple=True, type=click.Path(dir_okay=False), help="A CA root (PEM) whose code-signing certificates are trusted signers (repeatable).")(fn)


def emit(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def fail(err: BundleError, as_json: bool = False, extra: dict[str, Any] | None = None) -> None:
    if as_json:
        emit({"ok": False, **(extra or {}), "error": {"code": err.code, "message": err.message}})
    click.echo(err.line(), err=True)
    sys.exit(err.exit_code)


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Every command: --store and --debug, errors shown as one line with their exit code."""

    @click.option("--store", "store_dir", envvar=None, default=None, help="Store directory (default $BUNDLE_HOME or ~/.local/share/specbundle).")
    @click.option("--debug", is_flag=True, help="Show tracebacks.")
    @functools.wraps(fn)
    def wrapper(*args: Any, store_dir: str | None, debug: bool, **kwargs: Any) -> None:
        global _DEBUG
        _DEBUG = _DEBUG or debug
        try:
            fn(*args, store=Store(default_root(store_dir)), **kwargs)
        except BundleError as err:
            if _DEBUG:
                traceback.print_exc()
            fail(err, as_json=kwargs.get("as_json", False))
        except KeyboardInterrupt:
            # Every store write is staged and renamed into place last, so an interrupt leaves what was there.
            click.echo("error: [interrupted] stopped by Ctrl-C", err=True)
            sys.exit(130)

    return wrapper


class _Group(click.Group):
    """Usage errors as one line, `error: [usage] ...`, exit 2; bugs as `error: [internal] ...`, exit 1."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        argv = args[0] if args else kwargs.get("args", sys.argv[1:])
        if not argv:  # bare `bundle`: the help, on stdout, as success
            with click.Context(self, info_name="bundle") as ctx:
                click.echo(self.get_help(ctx))
            sys.exit(0)
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except (click.Abort, KeyboardInterrupt):
            click.echo("error: [interrupted] stopped by Ctrl-C", err=True)
            sys.exit(130)
        except click.UsageError as exc:
            hint = f" (see `bundle {exc.ctx.info_name} --help`)" if exc.ctx and exc.ctx.info_name != "bundle" else " (see `bundle --help`)"
            click.echo(f"error: [usage] {exc.format_message()}{hint}", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"error: [usage] {exc.format_message()}", err=True)
            sys.exit(2)
        except SystemExit:
            raise
        except BaseException as exc:  # a bug: one line unless --debug
            if _DEBUG or "--debug" in sys.argv:
                traceback.print_exc()
            click.echo(f"error: [internal] {type(exc).__name__}: {shown(exc, 1000)} (a bug; rerun with --debug for the traceback)", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specbundle")
def main() -> None:
    """specbundle: a speculative-decoding pair (target, draft, tokenizer, config) as one signed KitOps ModelKit."""


def progress() -> Iterator[Callable[[str, int], None] | None]:
    """A rich progress bar on a terminal; nothing otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True) as bar:
        tasks: dict[str, Any] = {}

        def tick(label: str, n: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=None)
            bar.advance(tasks[label], n)

        yield tick


def trust_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--allow-unsigned", is_flag=True, help="Check integrity only; the origin is NOT verified.")(fn)
    fn = click.option("--allow-rollback", is_flag=True, help="Accept a release older than one already verified in this store (this command only).")(fn)
    fn = click.option("--allow-ref-mismatch", is_flag=True, help="Accept a reference whose repository name or version tag differs from what was signed.")(fn)
    fn = identity_options(fn)
    return click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable); also every *.pub in $BUNDLE_TRUSTED_KEYS.")(fn)


def exit_if_refused(info: dict[str, Any]) -> None:
    """Metadata bundler.format.metadatacheck refused (shown above as far as it was read): its error line and exit code."""
    if info.get("error"):
        refused = BundleError(info["error"]["code"], info["error"]["message"])
        click.echo(refused.line(), err=True)
        sys.exit(refused.exit_code)


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
