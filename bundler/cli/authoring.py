"""`bundle keygen`, `init`, `pack` and `sign`: keys, a context from two model directories, a signed bundle."""

from __future__ import annotations

__all__ = ["keygen", "init", "pack", "sign"]

import json
from pathlib import Path

import click

from bundler.cli.app import command, human_size, main, password, progress
from bundler.store.layout import Store
from bundler.store.refs import parse_ref
from bundler.trust import keys


@main.command()
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Directory for bundle.key and bundle.pub.")
@command
def keygen(store: Store, out_dir: str) -> None:
    """Make an ECDSA P-256 key pair (the private key encrypted when BUNDLE_KEY_PASSWORD is set)."""
    key_path, pub_path = keys.generate_keypair(Path(out_dir), password())
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
        click.echo(f"wrote {result.context}/{role.role}/: {role.files} files, {human_size(role.bytes)} from {role.source} ({how})")
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

    import datetime as dt

    started = dt.datetime.now(dt.timezone.utc)
    parsed = parse_ref(ref)
    private = keys.load_private_key(Path(key_path), password()) if key_path else None  # fail before packing
    for tick in progress():
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
        from bundler.verbs.pack import attest_packed

        written = attest_packed(store, result, Path(context), private, started)
        click.echo("attested: " + ", ".join(f"{w.kind} {w.digest[:19]}…" for w in written))
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
    private = keys.load_private_key(Path(key_path), password())
    signed = sign_checked(store, parsed, private, valid_days, cosign_legacy)
    click.echo(f"signed {parsed} ({signed.digest}) by {signed.key_id[:16]}…\n{signed.signature_digest}")


@main.command()
@click.argument("ref")
@click.option("--key", "key_path", required=True, type=click.Path(), help="The bundle's private key (PKCS#8 PEM): the bundle must verify with its public half.")
@click.option("--bench", "bench_path", type=click.Path(), help="A `bundle bench REF --json` report of this bundle: its acceptance rate and speed-ups go into the SBOM's model card.")
@command
def attest(store: Store, ref: str, key_path: str, bench_path: str | None) -> None:
    """Write the SBOM (CycloneDX 1.6 ML-BOM) and SLSA v1 provenance of a bundle already in the store, signed with KEY
    (what `bundle pack --key` writes; for bundles packed before it did). Each line: type and attestation digest."""
    from bundler.trust.attest import attest_stored, read_bench

    bench = read_bench(Path(bench_path)) if bench_path else None  # a bad report: refused before anything is written
    for written in attest_stored(store, parse_ref(ref), keys.load_private_key(Path(key_path), password()), bench):
        click.echo(f"{written.kind} {written.digest}")
