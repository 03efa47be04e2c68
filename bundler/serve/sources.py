"""Where `bundle serve` takes its bundle from: the store (REF, verified as `bundle run` verifies it) or a
directory `bundle fetch` filled (`--from-dir`, checked against its evidence). Both load the pair the same way
and hand the server the same `Loaded`."""

from __future__ import annotations

__all__ = ["DirSource", "Loaded", "Source", "StoreSource"]

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol

from bundler.store.layout import Store
from bundler.store.refs import Ref
from bundler.serve.settings import LoadOptions
from bundler.trust.verify_report import VerifyReport
from bundler.verbs.fromdir import Expected
from runner.pair import LoadedPair


@dataclass(frozen=True)
class Loaded:
    """A verified, loaded pair and what the server says about it."""

    pair: LoadedPair
    info: dict[str, str]  # {"ref", "digest", "signer"}
    checks: list[str]  # the names of the checks passed (the status page)
    runs: dict[str, int] | None = None  # the store's run history counts for this bundle here (read, never written)
    report: VerifyReport | None = None  # the store's verification (run records sign it); None from a directory


class Source(Protocol):
    """A bundle to serve: a name to show while it loads, and the pair loaded for the server's lifetime."""

    def name(self) -> str: ...

    def load(self, trusted: Mapping[str, Any], context: tuple[int, int], options: LoadOptions) -> contextlib.AbstractContextManager[Loaded]: ...


@dataclass(frozen=True)
class StoreSource:
    """REF in the store: verified, gated and loaded as `bundle run` does (bundler.verbs.run.loaded_bundle)."""

    store: Store
    ref: Ref

    def name(self) -> str:
        return str(self.ref)

    @contextlib.contextmanager
    def load(self, trusted: Mapping[str, Any], context: tuple[int, int], options: LoadOptions) -> Iterator[Loaded]:
        from bundler.verbs.run import loaded_bundle, run_history

        with loaded_bundle(self.store, self.ref, trusted, context, **options.as_kwargs()) as (pair, info, report):
            checks = [check.name for check in report.checks if check.ok]
            yield Loaded(pair, info, checks, run_history(self.store, info["digest"]).counts(), report)


@dataclass(frozen=True)
class DirSource:
    """A directory `bundle fetch` filled, checked against its evidence (bundler.verbs.fromdir.loaded_dir);
    expect: the reference or digest it must hold (None: any the trusted keys signed); store: whose release
    memory refuses a rollback (None: none kept); evidence: where the manifest, config and signature lie when
    not in root/.specbundle (an image volume beside `fetch --evidence-only`'s output)."""

    root: Path
    expect: Expected | None = None
    store: Store | None = None
    evidence: Path | None = None

    def name(self) -> str:
        return str(self.root)

    @contextlib.contextmanager
    def load(self, trusted: Mapping[str, Any], context: tuple[int, int], options: LoadOptions) -> Iterator[Loaded]:
        from bundler.verbs.fromdir import loaded_dir

        with loaded_dir(self.root, trusted, context, expect=self.expect, store=self.store, evidence=self.evidence, **options.as_kwargs()) as (pair, info, checks):
            yield Loaded(pair, info, list(checks))
