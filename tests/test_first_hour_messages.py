"""Mistakes a new user makes in the first hour get a one-line error that says what to do, and change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_bundle, tree_digest


@pytest.mark.parametrize("days", ["0", "-1"])
def test_valid_days_must_be_positive_for_pack_and_sign(tree: Path, store_dir: Path, keypair, days: str) -> None:
    r = run_bundle("pack", str(tree), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--valid-days", days, "--store", str(store_dir))
    assert r.code == 2 and r.err.startswith("error: [usage]") and "--valid-days" in r.err
    assert tree_digest(store_dir) == "absent"
    run_bundle("pack", str(tree), "-t", "tiny-spec:1.0.0", "--store", str(store_dir), check=True)
    before = tree_digest(store_dir)
    s = run_bundle("sign", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--valid-days", days, "--store", str(store_dir))
    assert s.code == 2 and s.err.startswith("error: [usage]") and "--valid-days" in s.err
    assert tree_digest(store_dir) == before
