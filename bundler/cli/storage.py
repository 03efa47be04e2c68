"""`bundle list`, `tag`, `rm` and `gc`: the local store."""

from __future__ import annotations

__all__ = ["list_", "tag", "rm", "gc"]


import click

from bundler.cli.app import command, emit, human_size, main
from bundler.store.layout import Store
from bundler.store.refs import parse_ref
from core.display import shown


@main.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="A JSON array on stdout.")
@command
def list_(store: Store, as_json: bool) -> None:
    """Bundles in the store: one row per tag."""
    from bundler.verbs.listing import rows

    found = rows(store)
    if as_json:
        emit([vars(r) for r in found])
        return
    if not found:
        click.echo(f"no bundles in the store {store.root} (add one with `bundle pack` or `bundle pull`)")
        return
    table = [("REF", "DIGEST", "NAME", "VERSION", "SIZE", "CREATED", "SIGNERS")]
    # Names, versions, times and key ids come from unverified configs and signatures: shown escaped.
    table += [(shown(r.ref), shown(r.digest[:19]), shown(r.name), shown(r.version), human_size(r.size), shown(r.created),
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
        emit(result.as_json())
        return
    verb = "would free" if dry_run else "freed"
    click.echo(f"{verb} {result.bytes_freed:,} bytes: {len(result.removed_blobs)} blobs, {len(result.removed_manifests)} untagged manifests; {result.kept_blobs} blobs kept")
