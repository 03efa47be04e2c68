"""The files a third-party runtime is pointed at: the bundle verified (from the store, or a `bundle fetch`
directory checked against its evidence), every file written into a private read-only directory and hashed against
the signed list as it is written, then every check `bundle serve` runs before loading (the tokenizer gate,
config agreement, pairing, the memory preflight for the runtime's footprint), on those very files. Nothing of the
runtime exists before all of it has passed; the directory is removed when serving ends."""

from __future__ import annotations

__all__ = ["Prepared", "prepared"]

import contextlib
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from bundler.format.kitfile import runner_params
from bundler.serve.sources import DirSource, Source, StoreSource
from bundler.trust.extract import extract_verified, make_writable
from bundler.trust.verify import verify_bundle
from bundler.trust.verify_report import VerifyReport
from core.errors import BundleError


@dataclass(frozen=True)
class Prepared:
    """A verified bundle on disk, checked as `serve` checks it, ready for a runtime's command line."""

    root: Path  # read-only, below a 0700 directory only this process's user can reach
    roles: dict[str, str]  # role -> directory relative to root
    params: dict[str, Any]  # the Kitfile's speculative parameters (bundler.format.kitfile.runner_params)
    parameters: dict[str, Any]  # the Kitfile's model.parameters, as signed (the run record's)
    files: dict[str, str]  # bundle path -> sha256, the signed list every written file was hashed against
    info: dict[str, str]  # ref, digest, signer
    checks: list[str]  # the names of the checks passed
    report: VerifyReport | None  # the store's verification (run records sign it); None from a directory
    format: str  # "gguf" or "safetensors"
    dtype: str  # a GGUF file type's number, or the dtype the runtime is asked for
    fingerprint: str  # the tokenizer's
    pairing: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)

    def role_dir(self, role: str) -> Path:
        return self.root / self.roles[role]

    def has_draft(self) -> bool:
        return "draft" in self.roles

    def model_view(self, role: str) -> Path:
        """A model role's directory with the tokenizer role's files beside its config.json, as hard links to the
        verified files in a read-only directory next to the bundle (what runtimes that read a Hugging Face
        directory expect); the role's own directory where no tokenizer role is named."""
        if "tokenizer" not in self.roles:
            return self.role_dir(role)
        view = self.root.parent / "views" / role
        if not view.exists():
            view.mkdir(parents=True)
            for source in (self.role_dir(role), self.role_dir("tokenizer")):  # the tokenizer role's files win (CONTRACT.md 1)
                for path in sorted(p for p in source.iterdir() if p.is_file()):
                    (view / path.name).unlink(missing_ok=True)
                    os.link(path, view / path.name)
            view.chmod(0o555)
        return view

    def gguf(self, role: str) -> Path:
        """The one GGUF file of a model role."""
        return next(p for p in sorted(self.role_dir(role).glob("*.gguf")))


def _private_root() -> Path:
    try:
        return Path(tempfile.mkdtemp(prefix="specbundle-runtime-"))  # mode 0700
    except OSError as err:
        raise BundleError("usage", f"cannot make a private directory under {tempfile.gettempdir()} ({err.strerror}): "
                                   "set TMPDIR to a writable directory") from None


def _remove(path: Path) -> None:
    if path.exists():
        make_writable(path)
        shutil.rmtree(path, ignore_errors=True)


def _hash_tree(root: Path) -> dict[str, str]:
    """path -> sha256 of every file below root (a cosign-signed bundle's list: its layers were verified whole)."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            with open(path, "rb") as f:
                out[path.relative_to(root).as_posix()] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


@contextlib.contextmanager
def _from_store(source: StoreSource, trusted: Mapping[str, Any]) -> Iterator[tuple[Path, dict[str, Any], VerifyReport | None]]:
    report = verify_bundle(source.store, source.ref, trusted)
    report.raise_for_error()
    if not report.signer:  # verify passed without a trusted signature (never the case for serve): refused all the same
        raise BundleError("signature-missing", f"{source.ref} carries no signature by a trusted key: a runtime serves signed bundles only")
    assert report.modelkit is not None
    base = _private_root()
    try:
        root = base / "bundle"
        extract_verified(source.store, report, root, read_only=True)  # each file checked against the signed list as written
        files = dict(report.claims.files) if report.claims is not None else _hash_tree(root)
        info = {"ref": str(source.ref), "digest": str(report.digest), "signer": report.signer,
                "kitfile": report.modelkit.kitfile, "checks": [c.name for c in report.checks if c.ok], "files": files}
        yield root, info, report
    finally:
        _remove(base)


@contextlib.contextmanager
def _from_dir(source: DirSource, trusted: Mapping[str, Any]) -> Iterator[tuple[Path, dict[str, Any], VerifyReport | None]]:
    from bundler.verbs.fromdir import checked_dir, private_copy

    checked = checked_dir(source.root, trusted, expect=source.expect, store=source.store, evidence=source.evidence)
    with private_copy(checked, weights_in_place=False) as (copy, _ranges):  # every byte copied is a byte hashed
        for dirpath, dirnames, names in os.walk(copy):
            for name in names:
                os.chmod(os.path.join(dirpath, name), 0o444)
            for name in dirnames:
                os.chmod(os.path.join(dirpath, name), 0o555)
        checks = ["signature", "signed-name", "expiry", "files", "file-hashes"] + (["expected"] if source.expect else [])
        info = {"ref": checked.ref, "digest": checked.digest, "signer": checked.signer, "kitfile": checked.kitfile,
                "checks": checks, "files": dict(checked.files)}
        try:
            yield copy, info, None
        finally:
            make_writable(copy)


def _check(root: Path, roles: Mapping[str, str], params: Mapping[str, Any], footprint: Mapping[str, Any],
           memory_budget: int | None) -> dict[str, Any]:
    """serve's checks before loading, on the files at root: the same functions `bundle run` calls
    (runner.run.preflight, runner.checks.gguf_model.preflight), then the memory preflight for the runtime's
    footprint (`footprint`: {"context": tokens per sequence, "sequences", "dtype"})."""
    from runner.checks import gguf_model
    from runner.checks.memory import check_memory
    from runner.pair import gguf_dirs
    from runner.run import model_roles, preflight  # here: runner.run's module imports the tokenizer stack

    model_roles(roles, params)
    tokens = int(footprint["context"]) * int(footprint["sequences"])
    dirs = gguf_dirs(root, roles)
    if dirs:
        checked = gguf_model.preflight(dirs, params)
        memory = gguf_model.estimate_memory(checked["headers"], tokens)
        fmt, dtype = "gguf", str(checked["headers"]["target"]["metadata"].get("general.file_type", "gguf"))
    else:
        from runner.checks.modelinfo import estimate_memory

        checked = preflight(root, roles, params)
        memory = estimate_memory(checked["dirs"]["target"], checked["dirs"].get("draft"), str(footprint["dtype"]), tokens,
                                 draft_tokens=int(params.get("draft_tokens") or 5))
        fmt, dtype = "safetensors", str(footprint["dtype"])
    memory["max_tokens"] = tokens
    check_memory(memory, memory_budget, "cpu")
    return {"format": fmt, "dtype": dtype, "fingerprint": checked["fingerprint"], "pairing": checked["pairing"], "memory": memory}


@contextlib.contextmanager
def prepared(source: Source, trusted: Mapping[str, Any], footprint: Mapping[str, Any],
             memory_budget: int | None = None) -> Iterator[Prepared]:
    """Verify, write out and check the bundle for a runtime; raises the first BundleError (and nothing is left
    on disk). The directory lives until the block ends."""
    if isinstance(source, StoreSource):
        opened = _from_store(source, trusted)
    elif isinstance(source, DirSource):
        opened = _from_dir(source, trusted)
    else:
        raise BundleError("usage", f"a runtime cannot serve from {type(source).__name__}")
    with opened as (root, info, report):
        kitfile = info["kitfile"]
        roles, params = kitfile.role_paths(), runner_params(kitfile.parameters)
        checked = _check(root, roles, params, footprint, memory_budget)
        yield Prepared(root=root, roles=roles, params=params, parameters=dict(kitfile.parameters), files=info["files"],
                       info={k: info[k] for k in ("ref", "digest", "signer")}, checks=info["checks"], report=report,
                       format=checked["format"], dtype=checked["dtype"], fingerprint=checked["fingerprint"], pairing=checked["pairing"],
                       memory=checked["memory"])
