"""The `bundle` command line: parse, call one library function, print its value. The only place that exits."""

from __future__ import annotations

__all__ = ["main"]

import functools
import json
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from bundler.trust import keys
from core.display import shown
from core.errors import BundleError
from bundler.store.refs import parse_ref
from bundler.store.layout import Store, default_root

_DEBUG = False


def _password() -> bytes | None:
    value = os.environ.get(keys.PASSWORD_ENV)
    return value.encode() if value else None


def _trusted(key_paths: tuple[str, ...]) -> dict[str, Any]:
    return keys.trusted_keys([Path(p) for p in key_paths], os.environ.get(keys.TRUSTED_KEYS_ENV))


def _emit(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def _fail(err: BundleError, as_json: bool = False, extra: dict[str, Any] | None = None) -> None:
    if as_json:
        _emit({"ok": False, **(extra or {}), "error": {"code": err.code, "message": err.message}})
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
            _fail(err, as_json=kwargs.get("as_json", False))
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


def _progress() -> Iterator[Callable[[str, int], None] | None]:
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


@main.command()
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Directory for bundle.key and bundle.pub.")
@command
def keygen(store: Store, out_dir: str) -> None:
    """Make an ECDSA P-256 key pair (the private key encrypted when BUNDLE_KEY_PASSWORD is set)."""
    key_path, pub_path = keys.generate_keypair(Path(out_dir), _password())
    pub = keys.load_public_key(pub_path)
    click.echo(f"private key: {key_path}\npublic key:  {pub_path}\nkey id:      {keys.key_id(pub)}")


@main.command()
@click.option("--target", "target_dir", required=True, type=click.Path(), help="The target model's directory as downloaded (config.json, *.safetensors, tokenizer files).")
@click.option("--draft", "draft_dir", type=click.Path(), help="The draft model's directory as downloaded (none: a bundle for draft-free speculation, methods: [ngram]).")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(), help="Where tokenizer.json (+ tokenizer_config.json ...) are (default: the target's directory).")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(), help="The bundle context to write (must not exist, or be empty).")
@click.option("--name", help="Package name (default: the target directory's name, lower-cased).")
@click.option("--version", "version", help="Package version (default 1.0.0).")
@command
def init(store: Store, target_dir: str, draft_dir: str | None, tokenizer_dir: str | None, out_dir: str, name: str | None, version: str | None) -> None:
    """Lay out a bundle context (target/, draft/, tokenizer/, Kitfile) from two model directories; refuse a pair `run` would refuse."""
    from bundler.verbs.init import init_context

    result = init_context(Path(target_dir), Path(draft_dir) if draft_dir else None, Path(out_dir), Path(tokenizer_dir) if tokenizer_dir else None, name, version)
    params = result.kitfile.parameters
    click.echo(f"wrote {result.context}/Kitfile: {result.name} {result.version}, dtype {params.get('dtype', 'not set')}, "
               f"speculative {json.dumps(params['speculative'])}")
    for role in result.roles:
        how = ", ".join(f"{n} {w}" for n, w in ((role.linked, "hard-linked"), (role.copied, "copied")) if n)
        click.echo(f"wrote {result.context}/{role.role}/: {role.files} files, {_size(role.bytes)} from {role.source} ({how})")
    if result.skipped:
        click.echo(f"left out (hidden): {', '.join(result.skipped)}")
    p = result.pairing
    if p.get("size_ratio") is None:  # no draft: a context for draft-free speculation
        click.echo(f"checked: tokenizer {result.fingerprint}; {p['target_family']} target, {p['target_parameters']:,} parameters, no draft")
    else:
        click.echo(f"checked: tokenizer {result.fingerprint}; {p['target_family']} pair, "
                   f"{p['target_parameters']:,} / {p['draft_parameters']:,} parameters (ratio {p['size_ratio']:.1f})")
    click.echo(f"next: bundle pack {result.context} -t {result.name}:{result.version} --key keys/bundle.key"
               "   (a key: bundle keygen -o keys)")


@main.command()
@click.argument("context", type=click.Path())
@click.option("-f", "--file", "kitfile", type=click.Path(), help="Kitfile (default CONTEXT/Kitfile).")
@click.option("-t", "--tag", "ref", required=True, help="Reference NAME[:TAG] to store the bundle under.")
@click.option("--key", "key_path", type=click.Path(), help="Private key: sign the bundle too.")
@click.option("--valid-days", default=365.0, show_default=True, type=click.FloatRange(0, min_open=True), help="How long the signature is valid (days, > 0).")
@click.option("--cosign-legacy", is_flag=True, help="Also write cosign's older `sha256-<hex>.sig` tag form on push (for policy-controller key authorities; docs/cosign.md).")
@click.option("--format", "fmt", type=click.Choice(["modelkit", "modelpack"]), default="modelkit", show_default=True,
              help="modelkit: a KitOps ModelKit, one tar layer per Kitfile entry; modelpack: a CNCF ModelPack, one raw file per layer, "
                   "for image volumes and ModelPack tools (docs/format.md says when to pick which).")
@command
def pack(store: Store, context: str, kitfile: str | None, ref: str, key_path: str | None, valid_days: float, cosign_legacy: bool, fmt: str) -> None:
    """Pack CONTEXT into a ModelKit (or, with --format modelpack, a CNCF ModelPack) in the store; the last line printed is the manifest digest.

    Refused before anything is written: content `verify` or `run` would refuse (roles, the tokenizer gate,
    config.json, pairing; memory is left to `run`), and a name and version already signed here with other content.
    """
    from bundler.verbs.pack import pack_checked
    from bundler.trust.sign import sign_modelkit

    parsed = parse_ref(ref)
    private = keys.load_private_key(Path(key_path), _password()) if key_path else None  # fail before packing
    for tick in _progress():
        result, checked = pack_checked(Path(context), parsed, store, Path(kitfile) if kitfile else None, progress=tick, fmt=fmt)
    p = checked.pairing
    if p.get("size_ratio") is None:  # no draft: a bundle for draft-free speculation
        click.echo(f"checked: tokenizer {checked.fingerprint}; {p['target_family']} target ({checked.format}), "
                   f"{p['target_parameters']:,} parameters, no draft (draft-free speculation)")
    else:
        click.echo(f"checked: tokenizer {checked.fingerprint}; {p['target_family']} pair ({checked.format}), "
                   f"{p['target_parameters']:,} / {p['draft_parameters']:,} parameters (ratio {p['size_ratio']:.1f})")
    click.echo(f"packed {result.ref}: {len(result.layers)} layers, {len(result.files)} files")
    if private is not None:
        from bundler.store.modelkit import load_modelkit

        mk = load_modelkit(store, parsed)
        signed = sign_modelkit(store, mk, private, {f.path: f.sha256 for f in result.files}, {f.path: f.role for f in result.files}, valid_days, cosign_legacy)
        click.echo(f"signed by {signed.key_id[:16]}… (signature {signed.signature_digest})")
    click.echo(result.digest)


@main.command()
@click.argument("ref")
@click.option("--key", "key_path", required=True, type=click.Path(), help="Private key (PKCS#8 PEM).")
@click.option("--valid-days", default=365.0, show_default=True, type=click.FloatRange(0, min_open=True), help="How long the signature is valid (days, > 0).")
@click.option("--cosign-legacy", is_flag=True, help="Also write cosign's older `sha256-<hex>.sig` tag form on push (for policy-controller key authorities; docs/cosign.md).")
@command
def sign(store: Store, ref: str, key_path: str, valid_days: float, cosign_legacy: bool) -> None:
    """Sign a bundle already in the store; refused where `bundle pack --key` would refuse it."""
    from bundler.trust.sign import sign_checked

    parsed = parse_ref(ref)
    private = keys.load_private_key(Path(key_path), _password())
    signed = sign_checked(store, parsed, private, valid_days, cosign_legacy)
    click.echo(f"signed {parsed} ({signed.digest}) by {signed.key_id[:16]}…\n{signed.signature_digest}")


def _trust_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--allow-unsigned", is_flag=True, help="Check integrity only; the origin is NOT verified.")(fn)
    fn = click.option("--allow-rollback", is_flag=True, help="Accept a release older than one already verified in this store (this command only).")(fn)
    fn = click.option("--allow-ref-mismatch", is_flag=True, help="Accept a reference whose repository name or version tag differs from what was signed.")(fn)
    return click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable); also every *.pub in $BUNDLE_TRUSTED_KEYS.")(fn)


@main.command()
@click.argument("ref")
@_trust_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@command
def verify(store: Store, ref: str, key_paths: tuple[str, ...], allow_unsigned: bool, allow_rollback: bool, allow_ref_mismatch: bool, as_json: bool) -> None:
    """Check signature, trust, every blob, every file, archive safety, roles and tokenizer files."""
    from bundler.trust.verify import verify_bundle

    report = verify_bundle(store, parse_ref(ref), _trusted(key_paths), allow_unsigned=allow_unsigned, allow_rollback=allow_rollback, allow_ref_mismatch=allow_ref_mismatch)
    if as_json:
        _emit(report.as_json())
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

    info = inspect_bundle(store, parse_ref(ref), _trusted(key_paths), max_tokens)
    if as_json:
        _emit(info)
        _exit_if_refused(info)
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
    _exit_if_refused(info)


def _exit_if_refused(info: dict[str, Any]) -> None:
    """Metadata bundler.format.metadatacheck refused (shown above as far as it was read): its error line and exit code."""
    if info.get("error"):
        refused = BundleError(info["error"]["code"], info["error"]["message"])
        click.echo(refused.line(), err=True)
        sys.exit(refused.exit_code)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@main.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="A JSON array on stdout.")
@command
def list_(store: Store, as_json: bool) -> None:
    """Bundles in the store: one row per tag."""
    from bundler.verbs.listing import rows

    found = rows(store)
    if as_json:
        _emit([vars(r) for r in found])
        return
    if not found:
        click.echo(f"no bundles in the store {store.root} (add one with `bundle pack` or `bundle pull`)")
        return
    table = [("REF", "DIGEST", "NAME", "VERSION", "SIZE", "CREATED", "SIGNERS")]
    # Names, versions, times and key ids come from unverified configs and signatures: shown escaped.
    table += [(shown(r.ref), shown(r.digest[:19]), shown(r.name), shown(r.version), _size(r.size), shown(r.created),
               ",".join(shown(k[:16]) for k in r.signers) or "unsigned") for r in found]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


@main.command()
@click.argument("src")
@click.argument("dst")
@command
def tag(store: Store, src: str, dst: str) -> None:
    """Add the tag DST to the bundle SRC names (its signatures go with it)."""
    from bundler.store.catalog import tag as do_tag

    digest = do_tag(store, parse_ref(src), parse_ref(dst))
    click.echo(f"tagged {parse_ref(dst)} -> {digest}")


@main.command()
@click.argument("refs", nargs=-1, required=True)
@command
def rm(store: Store, refs: tuple[str, ...]) -> None:
    """Remove tags; the blobs stay until `bundle gc`."""
    from bundler.store.catalog import remove

    for name in remove(store, [parse_ref(r) for r in refs]):
        click.echo(f"removed {name}")
    click.echo("run `bundle gc` to free the space")


@main.command()
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@click.option("--drop-records", is_flag=True, help="Delete every run record too (`bundle attestations`), also those of bundles still tagged.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@command
def gc(store: Store, dry_run: bool, drop_records: bool, as_json: bool) -> None:
    """Delete the blobs no tag reaches (signatures and attestations of removed bundles included)."""
    from bundler.store.gc import collect

    result = collect(store, dry_run, drop_records)
    if as_json:
        _emit(result.as_json())
        return
    verb = "would free" if dry_run else "freed"
    click.echo(f"{verb} {result.bytes_freed:,} bytes: {len(result.removed_blobs)} blobs, {len(result.removed_manifests)} untagged manifests; {result.kept_blobs} blobs kept")


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
@click.option("-d", "--dir", "dest", required=True, type=click.Path(), help="Directory to extract into (new or empty).")
@click.option("--signature", "signature_out", type=click.Path(dir_okay=False), help="Also write the verified signature (Sigstore bundle JSON) here, outside DIR, for `model_signing verify`.")
@_trust_options
@command
def unpack(store: Store, ref: str, dest: str, signature_out: str | None, key_paths: tuple[str, ...], allow_unsigned: bool, allow_rollback: bool, allow_ref_mismatch: bool) -> None:
    """Verify, then extract the bundle into DIR; never writes outside it."""
    from bundler.verbs.unpack import unpack as do_unpack

    if signature_out and Path(signature_out).resolve().is_relative_to(Path(dest).resolve()):
        raise BundleError("usage", f"--signature {signature_out} is inside {dest}: model_signing would count it as a file of the bundle")
    for tick in _progress():
        result = do_unpack(store, parse_ref(ref), Path(dest), _trusted(key_paths), allow_unsigned, progress=tick, allow_rollback=allow_rollback, allow_ref_mismatch=allow_ref_mismatch)
    who = f"signed by {result.report.signer}" if result.report.signer else "UNSIGNED (integrity only)"
    click.echo(f"unpacked {result.files} files to {result.dest} ({who})")
    if signature_out and result.report.signature_json:
        Path(signature_out).write_bytes(result.report.signature_json)
        click.echo(f"signature: {signature_out}")


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _format_stats(stats: dict[str, Any], timings: dict[str, Any] | None = None) -> str:
    lines = [
        f"{stats['new_tokens']} tokens in {stats.get('elapsed_s', 0):.2f} s: {stats['tokens_per_second']:.1f} tokens/s, "
        f"{stats['target_passes']} target passes",
        # Nothing is drafted when the answer ends before the first draft (--max-new-tokens 1): no rate to show.
        f"acceptance {_rate(stats['acceptance_rate'])} ({stats['accepted']}/{stats['drafted']} drafted), mean accepted length {_rate(stats['mean_accepted_length'])}",
    ]
    per_pos = stats.get("per_position_acceptance")
    if per_pos:
        lines.append("per position: " + " ".join(_rate(a) for a in per_pos))
    if stats.get("fallback"):
        fb = stats["fallback"]
        lines.append(f"fallback to plain decoding at token {fb.get('at_token')}: {fb.get('reason')}")
    if timings:
        names = ("verify_s", "extract_s", "load_s", "prefill_s", "decode_s", "first_token_s")
        lines.append("timings: " + ", ".join(f"{n[:-2].replace('_', ' ')} {timings[n]:.2f} s" for n in names if isinstance(timings.get(n), (int, float))))
    return "\n".join(lines)


_DEVICE = re.compile(r"^(cpu|cuda(:[0-9]+)?|mps)$")


def _device(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not _DEVICE.match(value):
        raise click.BadParameter(f"{value!r} is not a device: use cpu, cuda or cuda:N")
    return value


def _size_option(value: str, option: str) -> int:
    """An option's size in bytes (bundler.format.sizes), its error as click's, without the option's name twice."""
    from bundler.format.sizes import parse_size

    try:
        return parse_size(value, option)
    except BundleError as err:
        raise click.BadParameter(err.message.removeprefix(f"{option} ")) from None


def _memory_budget(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    return None if value is None else _size_option(value, "--memory-budget")


def _prompt_cache(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None or value.strip() == "0":  # 0: no prompt cache (parse_size takes 1 byte at least)
        return None if value is None else 0
    return _size_option(value, "--prompt-cache")


def _max_body(ctx: click.Context, param: click.Parameter, value: str) -> int:
    size = _size_option(value, "--max-body")
    if size < 1:
        raise click.BadParameter("must be at least 1 byte")
    return size


def _read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    """The prompt from --prompt TEXT, --prompt-file FILE, or stdin (`--prompt -`, or no --prompt when stdin is piped)."""
    if prompt is not None and prompt_file is not None:
        raise BundleError("usage", "give --prompt or --prompt-file, not both")
    if prompt_file is not None:
        try:
            text = Path(prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BundleError("missing-input", f"cannot read --prompt-file {prompt_file}: {getattr(exc, 'strerror', None) or exc}") from None
        where = prompt_file
    elif prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        text = sys.stdin.read()
        where = "standard input"
    elif prompt is None:
        raise BundleError("usage", "no prompt: give --prompt TEXT, --prompt-file FILE, or pipe it on standard input")
    else:
        return prompt
    text = text.removesuffix("\n")  # the newline an editor or `echo` adds is not part of the prompt
    if not text.strip():
        raise BundleError("usage", f"the prompt from {where} is empty")
    return text


@main.command()
@click.argument("ref")
@click.option("--prompt", help="The prompt (the chat template is applied unless --raw); `-` reads standard input, as does no --prompt with piped input.")
@click.option("--prompt-file", type=click.Path(dir_okay=False), help="Read the prompt from this file.")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(1, 1 << 20))
@click.option("--draft-tokens", type=click.IntRange(1, 64), help="Tokens drafted per step (default: the bundle's).")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0.0), help="0 is greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0.0, 1.0, min_open=True))
@click.option("--seed", type=int, help="Seed for sampling (reproducible).")
@click.option("--raw", is_flag=True, help="Skip the chat template.")
@click.option("--device", callback=_device, help="cpu, cuda or cuda:N (default: cuda when available).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), help="Default: the bundle's.")
@click.option("--memory-budget", callback=_memory_budget, help="What the pair may use, like 300MB or 2GiB (default: available memory).")
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable); also $BUNDLE_TRUSTED_KEYS.")
@click.option("--attest", "attest_key", type=click.Path(), help="Private key (P-256): sign a run record into the store when the run finishes.")
@click.option("--attest-prompts", is_flag=True, help="With --attest: put the sha256 of the prompt and output in the record (never their text).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@command
def run(store: Store, ref: str, prompt: str | None, prompt_file: str | None, key_paths: tuple[str, ...], as_json: bool, attest_key: str | None, attest_prompts: bool, **options: Any) -> None:
    """Verify the bundle and the tokenizer match, then decode speculatively (losslessly)."""
    from bundler.verbs.run import run_bundle

    parsed = parse_ref(ref)
    prompt = _read_prompt(prompt, prompt_file)
    if attest_prompts and not attest_key:
        raise BundleError("usage", "--attest-prompts needs --attest KEY")
    attest = keys.load_private_key(Path(attest_key), _password()) if attest_key else None  # fail before running
    stream = None if as_json else (lambda text: click.echo(text, nl=False))
    try:
        result = run_bundle(store, parsed, _trusted(key_paths), prompt, on_text=stream, attest=attest, attest_prompts=attest_prompts, **options)
    except BundleError as err:
        if as_json:
            _fail(err, as_json=True, extra={"bundle": {"ref": ref}})
        raise
    if as_json:
        _emit(result)
    else:
        click.echo()
        click.echo(_format_stats(result["stats"], result.get("timings")), err=True)
        if result.get("attestation"):
            click.echo(f"run record {result['attestation']['digest']} signed by {result['attestation']['key_id'][:16]}…", err=True)


@main.command()
@click.argument("ref")
@click.option("--prompts", "prompts_file", metavar="open|grounded|FILE",
              help="A shipped prompt set (open: open questions; grounded: held-out edit, rewrite, extract, answer-from-text and "
                   "multi-turn tasks) or a file: JSON lines {\"prompt\": ..., \"category\": ...} or one prompt a line.  [default: open]")
@click.option("--limit", type=click.IntRange(1), help="Use only the first N prompts.")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--draft-tokens", type=click.IntRange(1, 64), help="Default: the bundle's.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 20), help="Rounds over the prompts; speed-ups are their medians.")
@click.option("--device", callback=_device, help="cpu, cuda or cuda:N (default: cuda when available).")
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@command
def bench(store: Store, ref: str, prompts_file: str | None, limit: int | None, key_paths: tuple[str, ...], as_json: bool, **options: Any) -> None:
    """Target alone, transformers' assisted generation and `bundle run`: same pair, same prompts, one process.

    A GGUF bundle: our plain decoding, llama-cpp-python's own generation of the target file and `bundle run`."""
    from bundler.verbs.run import bench_bundle
    from runner.bench.prompt_sets import read_prompts

    prompts = read_prompts(prompts_file)[:limit]
    say = None if as_json else (lambda msg: click.echo(f"… {msg}", err=True))
    result = bench_bundle(store, parse_ref(ref), _trusted(key_paths), [p.text for p in prompts], progress=say,
                          categories=[p.category for p in prompts], **options)
    if as_json:
        _emit(result)
        return
    _print_bench(result)


def _print_bench(result: dict[str, Any]) -> None:
    """bench's report as tables: the runs, the headline figures, each category, each prompt, what differed."""
    from rich.console import Console
    from rich.table import Table

    table = Table("run", "tokens/s", "new tokens", "seconds")
    for name, run in result["runs"].items():
        if run is None:  # hf_assisted on a GGUF bundle: transformers does not run GGUF files
            table.add_row(name, "n/a", "-", "-")
            continue
        table.add_row(name, f"{run['tokens_per_second']:.1f}", str(run["new_tokens"]), f"{run['seconds']:.2f}")
    console = Console()
    console.print(table)
    for key in ("speedup_vs_target", "speedup_vs_runner_plain", "speedup_vs_hf_assisted", "speedup_vs_hf_prompt_lookup",
                "speedup_vs_llama_cpp_python", "plain_vs_llama_cpp_python",
                "speedup_vs_fastest_plain", "acceptance_rate", "per_token_acceptance",
                "mean_accepted_length", "cost_ratio", "verify_cost_ratio", "theoretical_speedup", "efficiency", "break_even_acceptance", "identical_output",
                "runner_plain_identical"):
        if key in result:
            console.print(f"{key:<28} {result[key]}")
    categories = Table("category", "prompts", "tokens/s", "x our plain", "x peers", "method chosen")
    for name, c in result.get("categories", {}).items():
        peers = ", ".join(f"{key.removeprefix('speedup_vs_')} {value:.2f}" for key, value in c.items()
                          if key.startswith("speedup_vs_") and value is not None and key not in ("speedup_vs_runner_plain", "speedup_vs_target_only"))
        ours = c.get("speedup_vs_runner_plain", c.get("speedup_vs_target_only"))
        categories.add_row(name, str(c["prompts"]), f"{c['tokens_per_second']['bundle']:.1f}", "-" if ours is None else f"{ours:.2f}", peers,
                           ", ".join(f"{m} {n}" for m, n in c["methods"].items()))
    console.print(categories)
    per_prompt = Table("prompt", "tokens", "x target", "x our plain", "acceptance", "accepted/pass", "fallback at", "method")
    for p in result["per_prompt"]:
        per_prompt.add_row(str(p["prompt"]), str(p["new_tokens"]), f"{p['speedup_vs_target']:.2f}", f"{p['speedup_vs_runner_plain']:.2f}",
                           f"{p['per_token_acceptance']:.2f}",
                           f"{p['mean_accepted_length']:.2f}", "-" if p["fallback_at"] is None else str(p["fallback_at"]), p.get("method", "-"))
    console.print(per_prompt)
    for d in result["differences"]:
        if "gap_in_theirs" in d:  # GGUF: against llama-cpp-python's own greedy generation
            gaps = f"logits apart: {d['gap_in_theirs']} in theirs, {d['gap_in_ours']} in ours"
            console.print(f"prompt {d['prompt']}: differs from llama-cpp-python at token {d['position']} (tie: {d['tie']}; {gaps})")
            continue
        gaps = f"bf16 steps apart: {d.get('target_alone_gap_bf16_steps')} target alone, {d.get('bundle_pass_gap_bf16_steps')} in the bundle's pass"
        console.print(f"prompt {d['prompt']}: differs from the target alone at token {d['position']} (tie: {d['tie']}; {gaps})")
    for f in result["fallbacks"]:
        console.print(f"prompt {f['prompt']}: fell back at token {f['at_token']}: {f['reason']}")


def _expected(from_dir: str | None, expect: str | None) -> Any:
    """serve's --expect, parsed (bundler.verbs.fromdir.Expected)."""
    from bundler.verbs.fromdir import parse_expected

    if expect and not from_dir:
        source = click.get_current_context().get_parameter_source("expect")
        if source == click.core.ParameterSource.COMMANDLINE:
            raise BundleError("usage", "--expect goes with --from-dir (REF already names the bundle)")
        return None  # $BUNDLE_EXPECT set for a --from-dir pod, here serving from the store
    return parse_expected(expect) if from_dir and expect else None


@main.command()
@click.argument("target")
@click.option("--prompts", "prompts_file", metavar="SET|FILE",
              help="Prompts to tune on: a shipped set (open, grounded-tuning) or a file of JSON lines {\"prompt\": ...} or one prompt a line; "
                   "from a file, every third prompt is held out for the check.  [default: grounded-tuning, checked on grounded]")
@click.option("--held-out", metavar="SET|FILE|none", help="Prompts for the held-out check instead (none: no check).")
@click.option("--draft", "drafts", multiple=True, type=click.Path(exists=True, file_okay=False), help="A candidate draft model directory (repeatable).")
@click.option("--max-k", default=8, show_default=True, type=click.IntRange(1, 32), help="Try proposal lengths 1..N.")
@click.option("--limit", type=click.IntRange(1), help="Use only the first N prompts of each set.")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 20), help="Rounds over the prompts, pooled.")
@click.option("--device", callback=_device, help="cpu, cuda or cuda:N (default: cuda when available).")
@click.option("-f", "--file", "kitfile", type=click.Path(dir_okay=False), help="The context's Kitfile, when not CONTEXT/Kitfile.")
@click.option("--write", is_flag=True, help="Put the chosen settings into the context's Kitfile (a context only).")
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable; a stored bundle).")
@click.option("--json", "as_json", is_flag=True, help="The table and the choice as one JSON object on stdout.")
@command
def tune(store: Store, target: str, prompts_file: str | None, held_out: str | None, drafts: tuple[str, ...], max_k: int, limit: int | None,
         max_new_tokens: int, repeat: int, device: str | None, kitfile: str | None, write: bool, key_paths: tuple[str, ...],
         as_json: bool) -> None:
    """Measure each speculation method, draft length and candidate draft on TARGET (a context directory
    before `pack`, or a stored bundle REF, verified as `run` verifies it): acceptance per position and
    tokens/s on this machine; print the table and the choice, checked on held-out prompts."""
    from bundler.verbs.tune import TuneOptions, split_held_out, tune_bundle, tune_context
    from runner.bench.prompt_sets import read_prompts

    is_context = Path(target).is_dir()
    if write and not is_context:
        raise BundleError("usage", "--write needs a context directory; a stored bundle is signed as it is")
    prompts = [p.text for p in read_prompts(prompts_file, default="grounded-tuning")]
    if held_out == "none":
        held = []
    elif held_out or not prompts_file:
        held = [p.text for p in read_prompts(held_out, default="grounded")]
    else:
        prompts, held = split_held_out(prompts)
    say = None if as_json else (lambda msg: click.echo(f"… {msg}", err=True))
    options = TuneOptions(prompts[:limit], held[:limit], tuple(Path(d) for d in drafts), tuple(range(1, max_k + 1)), max_new_tokens, repeat,
                          device, say)
    if is_context:
        result = tune_context(Path(target), options, write=write, kitfile=Path(kitfile) if kitfile else None)
    else:
        result = tune_bundle(store, parse_ref(target), _trusted(key_paths), options)
    if as_json:
        _emit(result)
        return
    _print_tune(result)


def _print_tune(result: dict[str, Any]) -> None:
    """tune's table (every setting), the choice and the held-out check."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for title, rows in (("tuning prompts", result["rows"]), ("held-out prompts", result["held_out_rows"] or [])):
        table = Table("setting", "tokens/s", "x plain", "acceptance", "acceptance by position", title=title)
        for r in rows:
            table.add_row(r["setting"], f"{r['tokens_per_second']:.1f}", "-" if r["speedup_vs_plain"] is None else f"{r['speedup_vs_plain']:.2f}",
                          f"{r['per_token_acceptance']:.2f}", " ".join(f"{a:.2f}" for a in r["acceptance_at"]))
        if rows:
            console.print(table)
    choice = result["choice"]
    console.print(f"choice: {choice['setting']} ({choice['tokens_per_second']:.1f} tokens/s, {choice['speedup_vs_plain']}x plain)"
                  + (" — plain decoding was faster on these prompts; the guard falls back to it" if result["plain_fastest"] else ""))
    check = result["held_out"]
    if check:
        verdict = "within" if check["within_tolerance"] else "NOT within"
        console.print(f"held out: the choice {check['choice_tokens_per_second']:.1f} tokens/s, best there {check['best']} "
                      f"{check['best_tokens_per_second']:.1f}: {check['share_of_best']:.1%} of it, {verdict} {check['tolerance']:.0%}")
    console.print(f"settings: {json.dumps(result['settings'])}" + (f" written to {result['written']}" if result.get("written") else ""))


@main.command()
@click.argument("ref", required=False)
@click.option("--from-dir", type=click.Path(file_okay=False), help="Serve a directory `bundle fetch` filled (checked against its evidence first) instead of REF.")
@click.option("--expect", envvar="BUNDLE_EXPECT", help="With --from-dir: the bundle the directory must hold, NAME:TAG, NAME@sha256:<hex>, sha256:<hex> or the STORAGE_URI (also $BUNDLE_EXPECT); its signed name, version or digest must agree.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback unless you say otherwise).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable); also $BUNDLE_TRUSTED_KEYS.")
@click.option("--api-key-file", type=click.Path(dir_okay=False), help="File holding the API key clients must send as `Authorization: Bearer <key>`.")
@click.option("--open-probes", is_flag=True, help="GET /health, /livez and /metrics answer without the API key (Kubernetes probes and Prometheus scrapes send none; /metrics then leaves out the prompt cache's figures).")
@click.option("--served-model-name", envvar="BUNDLE_SERVED_MODEL_NAME", help="Another name the model answers to besides the bundle reference (KServe: the InferenceService's name; also $BUNDLE_SERVED_MODEL_NAME).")
@click.option("--max-queue", default=16, show_default=True, type=click.IntRange(1, 4096), help="Requests that may wait; more answer 429.")
@click.option("--time-limit", default=300.0, show_default=True, type=click.FloatRange(0.1), help="Seconds a request may take (queue included).")
@click.option("--sequences", type=click.IntRange(1, 64), help="Requests decoded at once in one batch (llama.cpp, and torch models our compact forward runs; default: as many KV caches as fit, at most 8).")
@click.option("--no-draft", "speculate", flag_value=False, default=True, help="Decode with the target alone (where requests decode in a batch): a baseline for benchmarks.")
@click.option("--prompt-cache", callback=_prompt_cache, help="Host memory for copies of finished requests' cache cells, which a request with the same start gets back (where requests decode in a batch): 2GiB, 0 for none (default: half the memory left, at most 8GiB).")
@click.option("--draft-tokens", type=click.IntRange(1, 64), help="Tokens drafted per step (default: the bundle's).")
@click.option("--device", help="cpu or cuda (default: cuda when available).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), help="Default: the bundle's.")
@click.option("--memory-budget", callback=_memory_budget, help="Memory the pair may use: 300MB, 2GiB or bytes (default: available memory).")
@click.option("--attest-key", type=click.Path(), help="Private key: sign run records of the served requests (see `bundle attestations`).")
@click.option("--max-body", default="1MiB", show_default=True, callback=_max_body, help="Largest request body (413 above it): 64KiB, 1MiB or bytes.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, help="Another Host name to answer for besides loopback and --host (repeatable; `*`: any, behind a proxy).")
@click.option("--max-connections", type=click.IntRange(1, 65536), help="Open connections at most (default: half the file limit, at most 1024).")
@click.option("--header-timeout", default=10.0, show_default=True, type=click.FloatRange(0.1, 3600), help="Seconds a client has to send a request's headers.")
@command
def serve(store: Store, ref: str | None, from_dir: str | None, expect: str | None, host: str, port: int, key_paths: tuple[str, ...], api_key_file: str | None, max_queue: int,
          time_limit: float, attest_key: str | None, open_probes: bool, served_model_name: str | None, max_body: int, allowed_hosts: tuple[str, ...],
          max_connections: int | None, header_timeout: float, sequences: int | None, speculate: bool, prompt_cache: int | None, **options: Any) -> None:
    """Verify and load the bundle as `run` does, then serve it over an OpenAI-compatible HTTP API until SIGTERM."""
    from bundler.serve.request_guard import ServeLimits, connection_room
    from bundler.serve.server import serve_bundle
    from bundler.serve.settings import BatchSettings, LoadOptions, ServeSettings
    from bundler.serve.sources import DirSource, StoreSource

    limits = ServeLimits(host=host, allowed_hosts=allowed_hosts, max_body=max_body, header_timeout_s=header_timeout)
    if max_connections is not None:
        if max_connections > connection_room():
            raise BundleError("usage", f"--max-connections {max_connections} is above what the file limit leaves room for "
                                       f"({connection_room()}); raise `ulimit -n` or ask for fewer")
        limits.max_connections = max_connections

    if (ref is None) == (from_dir is None):
        raise BundleError("usage", "give either REF or --from-dir DIR")
    if from_dir and attest_key:
        raise BundleError("usage", "--attest-key needs a bundle in the store (REF), not --from-dir")
    expected = _expected(from_dir, expect)

    api_key = None
    if api_key_file:
        try:
            api_key = Path(api_key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise BundleError("usage", f"--api-key-file {api_key_file}: cannot read it ({type(exc).__name__})") from None
        if not api_key:
            raise BundleError("usage", f"--api-key-file {api_key_file} is empty")
    records = None
    if attest_key:  # run records: one per busy hour and one at shutdown (bundler.trust.runrecord.ServeRecords)
        from bundler.trust.runrecord import ServeRecords

        recorded = {"max_queue": max_queue, "time_limit_s": time_limit, "sequences": sequences, "speculate": speculate,
                    "prompt_cache": prompt_cache, **options}
        records = ServeRecords(store, keys.load_private_key(Path(attest_key), _password()), recorded)

    def ready(info: dict[str, Any]) -> None:
        click.echo(f"serving {info['ref']} ({info['digest']}, {info['engine']}, {info['dtype']}) on {info['url']}", err=True)
        if from_dir and not expect:  # once serving: a refusal stays the one line CONTRACT.md promises
            click.echo("warning: --from-dir without --expect (or $BUNDLE_EXPECT) serves any bundle the trusted keys signed, "
                       "under its signed name: pin the reference or digest", err=True)

    try:
        source = DirSource(Path(from_dir), expected, store) if from_dir else StoreSource(store, parse_ref(ref))
        settings = ServeSettings(host=host, port=port, api_key=api_key, open_probes=open_probes, served_model_name=served_model_name,
                                 max_queue=max_queue, time_limit_s=time_limit, limits=limits, load=LoadOptions(**options),
                                 batch=BatchSettings(sequences=sequences, speculate=speculate, prompt_cache=prompt_cache))
        serve_bundle(source, _trusted(key_paths), settings, on_ready=ready, on_record=records.attach if records else None)
    finally:
        written = records.close() if records else None
        if written:
            click.echo(f"run record {written.record} signed by {written.key_id[:16]}…", err=True)


@main.command()
@click.argument("ref")
@click.argument("dst", required=False)
@click.option("--plain-http", is_flag=True, envvar="BUNDLE_PLAIN_HTTP", help="Speak HTTP, not HTTPS (a registry on loopback; also BUNDLE_PLAIN_HTTP=1).")
@command
def push(store: Store, ref: str, dst: str | None, plain_http: bool) -> None:
    """Push the store entry REF and its signatures, to DST (HOST[:PORT]/NAME:TAG) or to REF itself; the last line is the manifest digest."""
    from bundler.registry.push import push as do_push

    for tick in _progress():
        result = do_push(store, parse_ref(ref), plain_http=plain_http, progress=tick, dest=parse_ref(dst) if dst else None,
                         trusted=_trusted(()))  # run records: those $BUNDLE_TRUSTED_KEYS verify go first
    sigs = f"{len(result.signatures)} signature(s) ({'referrers API' if result.referrers == 'api' else 'referrers tag ' + result.digest.replace(':', '-', 1)[:19] + '…'})" if result.signatures else "unsigned"
    records = f", {len(result.records)} run record(s)" if result.records else ""
    click.echo(f"pushed {result.ref}: {result.blobs_uploaded} blobs uploaded ({result.bytes_uploaded:,} bytes), {result.blobs_skipped} already there; {sigs}{records}")
    click.echo(result.digest)


@main.command()
@click.argument("ref")
@_trust_options
@click.option("--plain-http", is_flag=True, envvar="BUNDLE_PLAIN_HTTP", help="Speak HTTP, not HTTPS (a registry on loopback; also BUNDLE_PLAIN_HTTP=1).")
@command
def pull(store: Store, ref: str, key_paths: tuple[str, ...], allow_unsigned: bool, allow_rollback: bool, allow_ref_mismatch: bool, plain_http: bool) -> None:
    """Download REF with its signatures, verify it apart from the store, then add it; the last line is the digest."""
    from bundler.trust.recordlimits import MAX_RECORDS
    from bundler.registry.pull import pull as do_pull

    trusted = _trusted(key_paths)
    for tick in _progress():
        result = do_pull(store, parse_ref(ref), trusted=trusted, allow_unsigned=allow_unsigned, plain_http=plain_http, progress=tick, allow_rollback=allow_rollback, allow_ref_mismatch=allow_ref_mismatch)
    who = f"signed by {result.signer}" if result.signer else "UNSIGNED (integrity only)"
    who += f" (signatures: {', '.join(result.signature_kinds)})" if result.signature_kinds else ""
    records = f"; {len(result.records)} run record(s) (check them with `bundle attestations`)" if result.records else ""
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
@command
def fetch(store: Store, src: str, dest: str, key_paths: tuple[str, ...], allow_rollback: bool, plain_http: bool) -> None:
    """Pull SRC (bundle://HOST/REPO:TAG), verify it, check it as `run` would and unpack it into DEST with its evidence.

    The KServe storage-initializer contract: two arguments, everything else from the environment. Any refusal
    leaves DEST empty. Serve the result with `bundle serve --from-dir DEST`."""
    from bundler.verbs.fetch import fetch as do_fetch

    for tick in _progress():
        result = do_fetch(store, src, Path(dest), _trusted(key_paths), plain_http=plain_http, allow_rollback=allow_rollback, progress=tick)
    click.echo(f"fetched {result.ref} into {result.dest}: {result.files} files, signed by {result.signer}, tokenizer {result.fingerprint}")
    click.echo(result.digest)


@main.command()
@click.argument("ref")
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key for run records (repeatable); also $BUNDLE_TRUSTED_KEYS.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array on stdout.")
@command
def attestations(store: Store, ref: str, key_paths: tuple[str, ...], as_json: bool) -> None:
    """List the signed run records attached to a bundle and verify each; exits with the first failure's code if any does not verify."""
    from bundler.trust.runrecord import attestations as find

    digest, records = find(store, parse_ref(ref), _trusted(key_paths))
    if as_json:
        _emit([r.as_json() for r in records])
    else:
        click.echo(f"{len(records)} run record(s) for {ref} ({digest})")
        for r in records:
            click.echo(_format_record(r))
    bad = [r for r in records if not r.verified]
    if bad:
        first = bad[0].error
        assert first is not None
        click.echo(BundleError(first.code, f"{len(bad)} of {len(records)} run record(s) did not verify; first: {first.message}").line(), err=True)
        sys.exit(first.exit_code)


def _format_record(record: Any) -> str:
    """One record: a verified one as one row (verdict, signer, time range, engine, totals); one that did not verify
    as FAIL with its reason, its claims on an indented line marked as not checked. Every field is escaped
    (core.display), so no statement can draw a row of its own."""
    predicate = (record.statement or {}).get("predicate") if isinstance(record.statement, dict) else None
    p = predicate if isinstance(predicate, dict) else {}
    totals = p.get("totals") if isinstance(p.get("totals"), dict) else {}
    rate = totals.get("acceptance_rate")
    fields = (
        f"{shown(p.get('started', '?'))} .. {shown(p.get('finished', '?'))}  "
        f"{shown(p.get('kind', '?'))} {shown(p.get('engine', '?'))}/{shown(p.get('device', '?'))}/{shown(p.get('dtype', '?'))}  "
        f"requests {shown(totals.get('requests', '?'))} tokens {shown(totals.get('tokens', '?'))} "
        f"accepted {shown(totals.get('accepted', '?'))}/{shown(totals.get('drafted', '?'))}"
        f" ({f'{rate:.2f}' if isinstance(rate, float) else '-'}) fallbacks {shown(totals.get('fallbacks', '?'))}"
    )
    if record.verified:
        return f"ok   {record.digest[:19]}…  signer {shown(record.signer[:16])}  {fields}"
    reason = record.error.line() if record.error is not None else "error: [integrity] not verified"
    claimed = shown(record.claimed_signer[:16]) if record.claimed_signer else "-"
    return f"FAIL {record.digest[:19]}…  NOT VERIFIED: {shown(reason, 1000)}\n     claimed, not checked: key {claimed}  {fields}"
