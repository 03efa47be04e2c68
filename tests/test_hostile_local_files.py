"""Hostile local files: key files and trusted-key directories that are devices, FIFOs, directories or huge; an unpack
target under a regular file; a run history or an upload session file that is damaged or oversized. Each is refused
with its code or ignored and replaced, never a crash."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bundletree import make_tree
from conftest import run_bundle, tree_digest
from hostile_store import _no_creds, _refused, REF, packed, store  # noqa: F401  (fixtures)
from registry_server import registry  # noqa: F401  (fixture)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "directory", "huge"])
def test_hostile_key_file_is_a_key_error(store: Path, tmp_path: Path, kind: str) -> None:
    key = tmp_path / "odd.pub"
    if kind == "dev-zero":
        key = Path("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(key)
    elif kind == "directory":
        key.mkdir()
    else:
        key.write_bytes(b"-" * (1 << 20))
    result = run_bundle("verify", REF, "--key", str(key), "--store", str(store))
    _refused(result, 3, "key-error")


def test_hostile_trusted_keys_dir_entry_is_a_key_error(store: Path, tmp_path: Path) -> None:
    keys = tmp_path / "trusted"
    keys.mkdir()
    os.mkfifo(keys / "evil.pub")
    result = run_bundle("verify", REF, "--store", str(store), env={"BUNDLE_TRUSTED_KEYS": str(keys)})
    _refused(result, 3, "key-error")


def test_unpack_under_a_regular_file_is_a_usage_error(store: Path, tmp_path: Path, keypair) -> None:
    (tmp_path / "file").write_text("x")
    before = tree_digest(store)
    result = run_bundle("unpack", REF, "-d", str(tmp_path / "file" / "out"), "--key", str(keypair[1]), "--store", str(store))
    _refused(result, 2, "usage")
    assert tree_digest(store) == before and (tmp_path / "file").read_text() == "x"


def test_oversized_run_history_is_ignored_and_replaced(tmp_path: Path) -> None:
    from bundler.verbs.run import HISTORY_MAX_BYTES, HISTORY_STATE, run_history
    from bundler.store.layout import PRIVATE, Store

    store = Store(tmp_path / "store")
    store.ensure()
    path = tmp_path / "store" / PRIVATE / f"{HISTORY_STATE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"[" + b"[]," * (HISTORY_MAX_BYTES // 3 + 10) + b"[]]")  # a valid JSON array, too large
    history = run_history(store, "sha256:" + "a" * 64)
    assert (history.runs, history.unpaid) == (0, 0)
    history.record({"speculative_iterations": 3, "fallback": None}, advised=False, seeded=False)
    replaced = json.loads(path.read_text())
    assert isinstance(replaced, dict) and len(replaced) == 1 and path.stat().st_size < 1024


@pytest.mark.parametrize("content", [b"[1, 2]", b'"text"', b"{\"k\": " * 5000, b"\xff\xfe"])
def test_malformed_run_history_is_ignored_and_replaced(tmp_path: Path, content: bytes) -> None:
    from bundler.verbs.run import HISTORY_STATE, run_history
    from bundler.store.layout import PRIVATE, Store

    store = Store(tmp_path / "store")
    store.ensure()
    path = tmp_path / "store" / PRIVATE / f"{HISTORY_STATE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    history = run_history(store, "sha256:" + "b" * 64)
    history.record({"speculative_iterations": 1, "fallback": None}, advised=False, seeded=False)
    assert list(json.loads(path.read_text()).values()) == [{"runs": 1, "unpaid": 0}]


def test_a_damaged_upload_session_file_starts_the_upload_afresh(registry, tmp_path: Path, keypair) -> None:
    import hashlib

    env = _no_creds(tmp_path)
    ref = f"{registry.host}/sessions/tiny-spec:v1"
    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", ref, "--key", str(keypair[0]), "--store", str(store), check=True)
    sessions = store / ".specbundle" / "uploads"
    sessions.mkdir(parents=True, exist_ok=True)
    where = hashlib.sha256(f"{registry.host}/sessions/tiny-spec".encode()).hexdigest()[:16]
    for i, blob in enumerate(sorted((store / "blobs" / "sha256").iterdir())):
        content = [b"[1, 2]", b"x" * (1 << 20), b'{"location": 7}', b'{"location": ' * 3000][i % 4]
        (sessions / f"{where}-{blob.name}.json").write_bytes(content)
    pushed = run_bundle("push", ref, "--plain-http", "--store", str(store), env=env)
    assert pushed.code == 0, pushed.err
