"""`bundle run`: verify (never skipped), extract into a private read-only directory, then hand over to the runner."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from bundler.refs import Ref
from bundler.store import Store
from bundler.unpack import extract_verified
from bundler.verify import verify_bundle


def runner_params(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The Kitfile's model.parameters as the runner takes them: the speculative settings plus the dtype."""
    params = dict(parameters.get("speculative") or {})
    if parameters.get("dtype"):
        params["dtype"] = parameters["dtype"]
    return params


def run_bundle(
    store: Store,
    ref: Ref,
    trusted: Mapping[str, Any],
    prompt: str,
    on_text: Callable[[str], None] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Verify the bundle, then decode; raises the first BundleError (before any weights are loaded)."""
    from runner.run import run_unpacked  # torch is imported only when a bundle runs

    report = verify_bundle(store, ref, trusted)
    report.raise_for_error()
    mk = report.modelkit
    assert mk is not None and report.claims is not None
    with tempfile.TemporaryDirectory(prefix="specbundle-run-") as tmp:
        root = Path(tmp) / "bundle"
        # A private, read-only copy extracted from the verified blobs, each file hashed while written;
        # the weights are hashed again as they are loaded, so nothing can be swapped in between.
        extract_verified(store, report, root, read_only=True)
        try:
            result = run_unpacked(
                root, mk.kitfile.role_paths(), runner_params(mk.kitfile.parameters), prompt,
                verified_files=report.claims.files, on_text=on_text, **options,
            )
        finally:
            for path in [root, *root.rglob("*")]:
                if path.is_dir():
                    path.chmod(0o755)  # so the temp dir can be removed
    return {"ok": True, "bundle": {"ref": str(ref), "digest": mk.digest, "signer": report.signer}, **result, "error": None}


def bench_bundle(store: Store, ref: Ref, trusted: Mapping[str, Any], prompts: list[str], **options: Any) -> dict[str, Any]:
    """Verify, extract, then benchmark the pair (runner.bench) on `prompts`."""
    from runner.bench import bench_unpacked

    report = verify_bundle(store, ref, trusted)
    report.raise_for_error()
    mk = report.modelkit
    assert mk is not None and report.claims is not None
    with tempfile.TemporaryDirectory(prefix="specbundle-bench-") as tmp:
        root = Path(tmp) / "bundle"
        extract_verified(store, report, root, read_only=True)
        try:
            result = bench_unpacked(root, mk.kitfile.role_paths(), runner_params(mk.kitfile.parameters), prompts,
                                    verified_files=report.claims.files, **options)
        finally:
            for path in [root, *root.rglob("*")]:
                if path.is_dir():
                    path.chmod(0o755)
    return {"bundle": {"ref": str(ref), "digest": mk.digest, "signer": report.signer}, **result}
