"""The checks `verify` and `run` make on a bundle's content, on a directory that holds it: a context about to be
packed (`bundle pack`, `bundle init`) or a stored bundle extracted for `bundle sign`. So nothing gets packed
or signed that verify or run would then refuse.

They need no signature and load no weights: verify's roles check, then what `bundle run` checks before loading
(runner.run.preflight: pickle weights, config.json, the tokenizer gate, config agreement, pairing, the draft
vocabulary; for a GGUF pair runner.checks.gguf_model's tokenizer gate and pairing). The memory preflight is not
among them: it depends on the machine that runs the bundle, so it is left to `run`.
"""

from __future__ import annotations

__all__ = ["ContentReport", "check_content", "check_stored"]

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundler.format.kitfile import Kitfile, LayerSpec, runner_params
from bundler.format.layerread import LayerScan
from bundler.format.metadatacheck import check_roles
from bundler.store.layout import Store
from bundler.trust.extract import extract_verified
from bundler.trust.verify import check_layer_roles


@dataclass(frozen=True)
class ContentReport:
    """What the checks found: the weights' format, the tokenizer fingerprint and the pairing figures."""

    format: str  # "safetensors" or "gguf"
    fingerprint: str
    pairing: dict[str, Any]


def _nested(spec: LayerSpec, kitfile: Kitfile) -> list[str]:
    """Paths of other entries inside this one: they are in their own layers, as pack writes them."""
    return [o.path for o in kitfile.layers if o is not spec and o.path.startswith(spec.path + "/")]


def _scans(root: Path, kitfile: Kitfile) -> dict[str, LayerScan]:
    """Each entry's files (bundle path -> size) as its layer will hold them, for verify's roles check."""
    scans: dict[str, LayerScan] = {}
    for spec in kitfile.layers:
        top = root / spec.path
        paths = [p for p in top.rglob("*") if p.is_file()] if top.is_dir() else [top] if top.is_file() else []
        names = {p.relative_to(root).as_posix(): p.stat().st_size for p in paths}
        skip = _nested(spec, kitfile)
        scans[spec.path] = LayerScan(files={n: s for n, s in names.items() if not any(n.startswith(e + "/") for e in skip)})
    return scans


def check_content(root: Path, kitfile: Kitfile) -> ContentReport:
    """Every check verify and run make on content without a signature or the machine: raises the BundleError
    (with the code) that verify or run would raise for it; returns what they found."""
    from runner.pair import gguf_dirs  # torch-free

    check_layer_roles(kitfile.layers, _scans(root, kitfile))
    check_roles(Path(root), kitfile.role_paths())  # a downloaded model directory is untrusted: bounded before it is read
    roles = kitfile.role_paths()
    params = runner_params(kitfile.parameters)
    ggufs = gguf_dirs(Path(root), roles)
    if ggufs:  # the checks runner.gguf_run makes before loading
        from runner.checks import gguf_model

        checked = gguf_model.preflight(ggufs, params)
        return ContentReport("gguf", checked["fingerprint"], checked["pairing"])
    from runner.run import preflight

    checked = preflight(Path(root), roles, params)
    return ContentReport("safetensors", checked["fingerprint"], checked["pairing"])


def check_stored(store: Store, report: Any) -> ContentReport:
    """`check_content` on a bundle in the store that verify (--allow-unsigned at least) has passed: its files
    extracted into a private temp directory (bundler.trust.extract), checked there, removed afterwards."""
    mk = report.modelkit
    assert mk is not None and report.ok
    with tempfile.TemporaryDirectory(prefix="specbundle-check-") as tmp:
        root = Path(tmp) / "bundle"
        extract_verified(store, report, root)
        return check_content(root, mk.kitfile)
