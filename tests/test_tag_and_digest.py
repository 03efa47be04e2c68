"""A reference with both a tag and a digest (NAME:TAG@sha256:...) has one meaning everywhere (issue 45): the digest
names the content, and the tag is checked as well: a version tag must be the signed version, else
signature-mismatch (exit 3), the same in `verify`, `pull`, `fetch`, `run` and `serve --expect`. A set-but-empty
expectation (`BUNDLE_EXPECT=''`) is a usage error, never "no expectation"."""

from __future__ import annotations

from pathlib import Path

import pytest

from bundler.store.refs import parse_ref
from bundler.verbs.fromdir import parse_expected
from conftest import run_bundle
from core.errors import BundleError
from registry_server import Registry, free_port, registry  # noqa: F401  (fixture)
from tests.hostile_files import assert_clean_refusal, bundle
from tests.tinymodels import make_pair, write_kitfile

REPO = "models/tiny-spec"


@pytest.mark.parametrize("text, version", [
    ("tiny-spec:1.0.0@sha256:" + "a" * 64, "1.0.0"), ("tiny-spec:v1.0.0", "1.0.0"), ("tiny-spec:1.0.0_build.7", "1.0.0"),
    ("tiny-spec:1.0.0-rc.1", "1.0.0-rc.1"), ("tiny-spec:latest@sha256:" + "a" * 64, None), ("tiny-spec@sha256:" + "a" * 64, None),
    ("tiny-spec", None),
])
def test_a_tag_names_a_version_one_way(text: str, version: str | None) -> None:
    assert parse_ref(text).version == version


def test_serve_expect_keeps_both_the_version_and_the_digest() -> None:
    expected = parse_expected("bundle://127.0.0.1:5000/models/tiny-spec:2.0.0@sha256:" + "b" * 64)
    assert (expected.name, expected.version, expected.digest) == ("tiny-spec", "2.0.0", "sha256:" + "b" * 64)


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_expectation_is_a_usage_error(value: str) -> None:
    with pytest.raises(BundleError) as refused:
        parse_expected(value)
    assert refused.value.code == "usage" and "empty" in refused.value.message


def test_a_set_but_empty_bundle_expect_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    result = bundle("serve", "--from-dir", str(tmp_path / "dir"), "--port", str(free_port()), "--store", str(tmp_path / "s"),
                    env={"BUNDLE_EXPECT": ""}, timeout=60)
    assert_clean_refusal(result)
    assert "empty" in result.err


@pytest.fixture(scope="module")
def released(registry: Registry, tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict:  # noqa: F811
    """tiny-spec 1.0.0 and 2.0.0, signed, in a store and pushed to a real registry."""
    base = tmp_path_factory.mktemp("tag-and-digest")
    make_pair(base / "ctx")
    (base / "no-docker").mkdir()
    out: dict = {"base": base, "store": base / "store", "env": {"DOCKER_CONFIG": str(base / "no-docker")}, "host": registry.host}
    for version in ("1.0.0", "2.0.0"):
        write_kitfile(base / "ctx", version=version)
        ref = f"{registry.host}/{REPO}:{version}"
        packed = run_bundle("pack", str(base / "ctx"), "-t", ref, "--key", str(keypair[0]), "--store", str(out["store"]), check=True)
        run_bundle("push", ref, "--plain-http", "--store", str(out["store"]), env=out["env"], check=True)
        out[version] = packed.out.split()[-1]
    return out


def _ref(released: dict, tag: str) -> str:
    return f"{released['host']}/{REPO}:{tag}@{released['1.0.0']}"


@pytest.mark.parametrize("tag", ["1.0.0", "v1.0.0", "latest"])
def test_verify_takes_a_tag_that_agrees_with_the_digest(released: dict, keypair, tag: str) -> None:
    result = run_bundle("verify", _ref(released, tag), "--key", str(keypair[1]), "--store", str(released["store"]))
    assert result.code == 0, result.err


def test_verify_refuses_a_version_tag_beside_another_releases_digest(released: dict, keypair) -> None:
    """`name:2.0.0@<1.0.0's digest>` no longer verifies as 1.0.0 under a label that says 2.0.0."""
    result = run_bundle("verify", _ref(released, "2.0.0"), "--key", str(keypair[1]), "--store", str(released["store"]))
    assert result.code == 3 and result.err.startswith("error: [signature-mismatch]") and "2.0.0" in result.err, result.err
    allowed = run_bundle("verify", _ref(released, "2.0.0"), "--key", str(keypair[1]), "--store", str(released["store"]),
                         "--allow-ref-mismatch")
    assert allowed.code == 0, allowed.err  # the documented override, said in the report


def test_run_refuses_it_too(released: dict, keypair) -> None:
    result = run_bundle("run", _ref(released, "2.0.0"), "--prompt", "hi", "--key", str(keypair[1]), "--store", str(released["store"]))
    assert result.code == 3 and result.err.startswith("error: [signature-mismatch]"), result.err


def test_pull_refuses_a_version_tag_beside_another_releases_digest(released: dict, keypair, tmp_path: Path) -> None:
    store = tmp_path / "pulled"
    refused = run_bundle("pull", _ref(released, "2.0.0"), "--plain-http", "--key", str(keypair[1]), "--store", str(store), env=released["env"])
    assert refused.code == 3 and refused.err.startswith("error: [signature-mismatch]"), refused.err
    assert run_bundle("list", "--json", "--store", str(store), check=True).out.strip() in ("", "[]")
    agreed = run_bundle("pull", _ref(released, "1.0.0"), "--plain-http", "--key", str(keypair[1]), "--store", str(store), env=released["env"])
    assert agreed.code == 0, agreed.err


def test_fetch_refuses_a_version_tag_beside_another_releases_digest(released: dict, keypair, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    env = {**released["env"], "BUNDLE_HOME": str(tmp_path / "fetch-store")}
    refused = run_bundle("fetch", "bundle://" + _ref(released, "2.0.0"), str(dest), "--plain-http", "--key", str(keypair[1]), env=env)
    assert refused.code == 3 and refused.err.startswith("error: [signature-mismatch]"), refused.err
    assert not dest.exists() or list(dest.iterdir()) == []
    agreed = run_bundle("fetch", "bundle://" + _ref(released, "1.0.0"), str(dest), "--plain-http", "--key", str(keypair[1]), env=env)
    assert agreed.code == 0, agreed.err
