"""What the hostile-bundle tests share (tests/test_hostile_*.py), imported by name into each test file.

The Attack harness: real signed bundles in a real store (tiny-spec 1.0.0 and 1.1.0, other-spec 1.0.0 with another
tokenizer), packed and signed with the CLI once per session, each test working on its own copy of the store and
editing its files directly (tests/attacker.py): the careful attacker recomputes digests up the chain and re-points
the signature, so each case reaches the check it names. Then `bundle verify` (and `bundle unpack` where files would
be written) must refuse with the right exit code and one line `error: [code] ...` on stderr, and nothing may be
written anywhere but the test's temp dirs: the store is left as it was, the unpack target never appears, no partial
directory is left beside it.

The packed store: one signed tiny-spec 1.0.0 (`packed`), copied for each test (`store`), for cases that put odd
files where the store's or a key's should be, or serve it from a hostile registry.
"""

from __future__ import annotations

import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from attacker import StoreEditor, build_tar, read_members
from bundletree import make_tree, tokenizer_json
from conftest import Result, run_bundle, tree_digest


REF = "tiny-spec:1.0.0"
NEWER = "tiny-spec:1.1.0"
OTHER = "other-spec:1.0.0"
OTHER_VOCAB = ["<unk>", "<s>", "</s>", "bonjour", "monde", "le", "la", "et", "un", "une"]

INTEGRITY, POLICY, INVALID = 3, 4, 6


def _context(root: Path, name: str, version: str, seed: int, vocab: list[str] | None = None) -> Path:
    """A bundle tree whose target and draft carry copies of the tokenizer files, as Hugging Face dirs do."""
    make_tree(root, name, version, seed)
    (root / "tokenizer" / "tokenizer.json").write_text(tokenizer_json(vocab))
    for role in ("target", "draft"):
        for f in (root / "tokenizer").iterdir():
            shutil.copy(f, root / role / f.name)
    return root


@dataclass
class Base:
    store: Path
    contexts: dict[str, Path]
    key: Path
    pub: Path
    other_key: Path
    other_pub: Path


_BASES: dict[tuple[Path, Path], Base] = {}  # one per session: every test copies its store and none changes it


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path], other_keypair: tuple[Path, Path]) -> Base:
    """tiny-spec 1.0.0 and 1.1.0 and other-spec 1.0.0 (another tokenizer), packed and signed by the trusted key."""
    if keypair in _BASES:
        return _BASES[keypair]
    root = tmp_path_factory.mktemp("hostile-base")
    store = root / "store"
    contexts = {
        REF: _context(root / "ctx-100", "tiny-spec", "1.0.0", 0),
        NEWER: _context(root / "ctx-110", "tiny-spec", "1.1.0", 1),
        OTHER: _context(root / "ctx-other", "other-spec", "1.0.0", 2, OTHER_VOCAB),
    }
    for ref, ctx in contexts.items():
        run_bundle("pack", str(ctx), "-t", ref, "--key", str(keypair[0]), "--store", str(store), check=True)
    _BASES[keypair] = Base(store, contexts, keypair[0], keypair[1], other_keypair[0], other_keypair[1])
    return _BASES[keypair]


@dataclass
class Attack:
    """One test's own copy of the base store, the attacker's hands on it, and the checks on the outcome."""

    base: Base
    tmp: Path
    store: Path
    edit: StoreEditor

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": str(self.tmp / "home"), "TMPDIR": str(self.tmp / "tmpdir")}

    def bundle(self, *args: str) -> Result:
        return run_bundle(*args, "--store", str(self.store), env=self.env, cwd=self.tmp / "cwd")

    def verify(self, *extra: str, ref: str = REF, key: Path | None = None) -> Result:
        keys = [] if "--allow-unsigned" in extra else ["--key", str(key or self.base.pub)]
        return self.bundle("verify", ref, *keys, *extra)

    def refused(self, code: str, exit_code: int, *extra: str, ref: str = REF, key: Path | None = None, unpack: bool = False) -> None:
        """verify (and unpack) fail with exit_code and exactly one stderr line `error: [code] ...`; nothing written."""
        before = tree_digest(self.store)
        calls = [("verify", self.verify(*extra, ref=ref, key=key))]
        if unpack:
            keys = [] if "--allow-unsigned" in extra else ["--key", str(key or self.base.pub)]
            calls.append(("unpack", self.bundle("unpack", ref, "-d", str(self.tmp / "out" / "bundle"), *keys, *extra)))
        for what, result in calls:
            lines = result.err.strip().splitlines()
            assert result.code == exit_code and len(lines) == 1, f"{what} exited {result.code}: {result.err}"
            assert lines[0].startswith(f"error: [{code}] "), f"{what}: {lines[0]}"
        assert tree_digest(self.store) == before, "a refused bundle changed the store"
        self.assert_nothing_written()

    def assert_nothing_written(self) -> None:
        for name in ("cwd", "tmpdir", "out"):
            assert list((self.tmp / name).iterdir()) == [], f"something was written in {name}/"
        assert not (self.tmp / "home").exists()


@pytest.fixture
def attack(base: Base, tmp_path: Path) -> Attack:
    store = tmp_path / "store"
    shutil.copytree(base.store, store)
    for name in ("cwd", "tmpdir", "out"):
        (tmp_path / name).mkdir()
    return Attack(base, tmp_path, store, StoreEditor(store))


def _draft_with(attack: Attack, *extra: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    return build_tar(read_members(attack.edit.layer(REF, "draft")) + list(extra))


BOMB = b"[" * 100_000 + b"]" * 100_000  # JSON nested 100,000 deep


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> Path:
    root = tmp_path_factory.mktemp("hostile-inputs")
    make_tree(root / "ctx")
    run_bundle("pack", str(root / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(root / "store"), check=True)
    return root / "store"


def _refused(result: Result, exit_code: int, code: str) -> None:
    lines = result.err.strip().splitlines()
    assert result.code == exit_code and len(lines) == 1 and lines[0].startswith(f"error: [{code}] "), f"exit {result.code}: {result.err}"


@pytest.fixture
def store(packed: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(packed, copy)
    return copy


def _no_creds(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "no-docker").mkdir(exist_ok=True)
    return {"DOCKER_CONFIG": str(tmp_path / "no-docker"), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""}
