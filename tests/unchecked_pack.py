"""Bundles that `bundle pack` refuses, built on purpose for tests of verify's and run's own refusals.

`bundle pack` and `bundle sign` refuse content verify or run would refuse (bundler.trust.contentcheck) and a
release signed before with other content. A test of what verify or run does with such a bundle (one that
came from elsewhere: another tool, an older specbundle, a registry) builds it in-process with the library's
`bundler.verbs.pack.pack`, which checks only the Kitfile and the tree, and `bundler.trust.sign.sign_modelkit`. No user-facing
command or flag skips the checks.
"""

from __future__ import annotations

from pathlib import Path

from bundler.trust.keys import load_private_key
from bundler.store.modelkit import load_modelkit
from bundler.verbs.pack import pack
from bundler.store.refs import parse_ref
from bundler.trust.sign import sign_modelkit
from bundler.store.layout import Store


def pack_unchecked(context: Path, ref: str, store: Path, key: Path | None = None, valid_days: float = 365) -> str:
    """Pack `context` into `store` under `ref` without the content checks, and sign it with `key` if given.
    Returns the manifest digest."""
    parsed, target = parse_ref(ref), Store(Path(store))
    result = pack(Path(context), parsed, target)
    if key is not None:
        files = {f.path: f.sha256 for f in result.files}
        roles = {f.path: f.role for f in result.files}
        sign_modelkit(target, load_modelkit(target, parsed), load_private_key(Path(key)), files, roles, valid_days)
    return result.digest
