"""Shared fixtures: a temp store, a tiny bundle tree, keys, and the `bundle` CLI run as a real process."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from bundletree import make_tree  # noqa: E402


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_bundle(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, check: bool = False) -> Result:
    """Run `bundle` in a subprocess, as a user would."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("BUNDLE_TRUSTED_KEYS", "BUNDLE_HOME", "BUNDLE_KEY_PASSWORD")}
    full_env.update(PYTHONWARNINGS="ignore", **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "bundler", *args], capture_output=True, text=True, env=full_env, cwd=cwd)
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"bundle {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return result


def copy_store(store: Path, tmp_path: Path) -> Path:
    """A writable copy of a store (blobs are read-only files), for a test that changes it."""
    dest = tmp_path / "store"
    shutil.copytree(store, dest)
    for path in dest.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def tree_digest(root: Path) -> str:
    """One hash over every path, mode and content under root: 'unchanged' means this is equal."""
    h = hashlib.sha256()
    if not root.exists():
        return "absent"
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        h.update(f"{path.relative_to(root)}|{st.st_mode}|".encode())
        if path.is_file() and not path.is_symlink():
            h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "ctx")


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture(scope="session")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from bundler.trust.keys import generate_keypair

    return generate_keypair(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="session")
def other_keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from bundler.trust.keys import generate_keypair

    return generate_keypair(tmp_path_factory.mktemp("other-keys"))


def assert_matches_schema(obj: object, name: str) -> None:
    """The object satisfies schemas/<name>.schema.json (the contract's JSON shapes)."""
    import json as _json

    import jsonschema

    schema = _json.loads((Path(__file__).parent.parent / "schemas" / f"{name}.schema.json").read_text())
    jsonschema.validate(obj, schema)
