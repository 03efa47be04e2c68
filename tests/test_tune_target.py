"""`bundle tune TARGET` (issue 45): a TARGET that is both a directory here and a stored reference is refused as
ambiguous (the unverified directory is never tuned where the signed bundle was meant); `tune REF --draft DIR`
tries a candidate draft against a stored bundle, whose weights stay in their blobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundler.store.layout import Store
from bundler.store.refs import Ref
from bundler.verbs.tune import tune_target
from conftest import run_bundle
from core.errors import BundleError
from tests.tinymodels import make_pair

FAST = ("--max-k", "1", "--max-new-tokens", "4", "--limit", "1", "--held-out", "none")


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict[str, Path]:
    """A work directory holding a directory named like the stored bundle's reference, and a candidate draft."""
    base = tmp_path_factory.mktemp("tune-target")
    make_pair(base / "ctx")
    make_pair(base / "other", seed=5)
    store = base / "store"
    run_bundle("pack", str(base / "ctx"), "-t", "tiny-spec:1", "--key", str(keypair[0]), "--store", str(store), check=True)
    make_pair(base / "work" / "tiny-spec:1")  # `./tiny-spec:1/`: an unverified context of the same name
    return {"base": base, "store": store, "work": base / "work", "candidate": base / "other" / "draft", "pub": keypair[1]}


def test_a_directory_that_is_also_a_stored_reference_is_ambiguous(stored: dict[str, Path], monkeypatch) -> None:
    monkeypatch.chdir(stored["work"])
    with pytest.raises(BundleError) as refused:
        tune_target(Store(stored["store"]), "tiny-spec:1")
    assert refused.value.code == "usage" and "both a directory" in refused.value.message
    assert tune_target(Store(stored["store"]), "./tiny-spec:1") == Path("./tiny-spec:1")  # said as a path: the directory
    assert isinstance(tune_target(Store(stored["base"] / "empty-store"), "tiny-spec:1"), Path)  # not stored: the directory
    monkeypatch.chdir(stored["base"])
    assert isinstance(tune_target(Store(stored["store"]), "tiny-spec:1"), Ref)  # no such directory: the bundle


def test_tune_refuses_the_ambiguous_target(stored: dict[str, Path]) -> None:
    result = run_bundle("tune", "tiny-spec:1", *FAST, "--key", str(stored["pub"]), "--store", str(stored["store"]),
                        cwd=stored["work"])
    assert result.code == 2 and result.err.startswith("error: [usage]") and "both a directory" in result.err, result.err


def test_tune_of_a_stored_bundle_tries_a_candidate_draft(stored: dict[str, Path]) -> None:
    result = run_bundle("tune", "tiny-spec:1", *FAST, "--draft", str(stored["candidate"]), "--key", str(stored["pub"]),
                        "--store", str(stored["store"]), "--json", cwd=stored["base"])
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert out["drafts"] == ["bundle", str(stored["candidate"])]
    assert any(row["draft"] == str(stored["candidate"]) for row in out["rows"])
