"""Hostile bundles, the metadata an attacker writes: a Kitfile that fails the schema or is a YAML bomb, a config blob or
manifest that is malformed or nested 100,000 deep, a damaged index.json, a diffID that is not its layer's digest:
invalid-kitfile or invalid-bundle, never a crash, and nothing stored."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from attacker import StoreEditor
from conftest import run_bundle
from hostile_store import _context, _refused, Attack, BOMB, INVALID, REF, attack, base, packed, store  # noqa: F401  (fixtures)


def test_config_that_fails_the_kitfile_schema_is_invalid(attack: Attack) -> None:
    attack.edit.rewrite(REF, config=lambda c: c["package"].update(version=["1", "0"]))
    attack.refused("invalid-kitfile", INVALID, unpack=True)


BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize(
    "kitfile",
    [
        pytest.param(BILLION_LAUGHS, id="yaml-bomb"),
        pytest.param("manifestVersion: 1.0.0\n" + "x: " + "[" * 5000 + "]" * 5000 + "\n", id="yaml-nesting"),
        pytest.param("manifestVersion: 1.0.0\npackage: {name: tiny-spec, version: 1.0.0}\nmodel: {path: 42}\n", id="schema"),
    ],
)
def test_packing_a_hostile_kitfile_is_refused_and_stores_nothing(attack: Attack, kitfile: str) -> None:
    ctx = _context(attack.tmp / "ctx", "tiny-spec", "1.0.0", 0)
    (ctx / "Kitfile").write_text(kitfile)
    fresh = attack.tmp / "fresh-store"
    started = time.monotonic()
    result = run_bundle("pack", str(ctx), "-t", REF, "--key", str(attack.base.key), "--store", str(fresh), env=attack.env, cwd=attack.tmp / "cwd")
    assert time.monotonic() - started < 20
    assert result.code == INVALID and result.err.startswith("error: [invalid-kitfile] "), result.err
    assert len(result.err.strip().splitlines()) == 1
    assert not (fresh / "index.json").exists() or StoreEditor(fresh).index()["manifests"] == []
    attack.assert_nothing_written()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda m: m["layers"][0].pop("size"), id="layer-without-size"),
        pytest.param(lambda m: m["layers"][0].update(size=str(m["layers"][0]["size"])), id="size-as-string"),
        pytest.param(lambda m: m["layers"][0].update(size=-1), id="negative-size"),
        pytest.param(lambda m: m["config"].pop("digest"), id="config-without-digest"),
        pytest.param(lambda m: m.update(layers={"0": m["layers"][0]}), id="layers-not-a-list"),
        pytest.param(lambda m: m["layers"].__setitem__(0, "sha256:" + "0" * 64), id="layer-not-an-object"),
        pytest.param(lambda m: m["layers"][0].update(digest="sha256:../../../../etc/passwd"), id="digest-path-traversal"),
    ],
)
def test_malformed_manifest_is_an_invalid_bundle(attack: Attack, change: Any) -> None:
    attack.edit.rewrite(REF, manifest=change)
    attack.refused("invalid-bundle", INVALID)


@pytest.mark.parametrize(("depth", "code"), [(100_000, "invalid-bundle"), (500, "invalid-kitfile")])
def test_config_json_nesting_bomb_is_invalid(attack: Attack, depth: int, code: str) -> None:
    config = attack.edit.read(attack.edit.config_digest(REF))
    bomb = config.replace(b'"speculative":', b'"deep":' + b"[" * depth + b"]" * depth + b',"speculative":')

    def point(m: dict[str, Any]) -> None:
        m["config"].update(digest=attack.edit.put(bomb), size=len(bomb))

    attack.edit.rewrite(REF, manifest=point)
    attack.refused(code, INVALID)


@pytest.mark.parametrize(
    "index",
    [
        pytest.param('{"schemaVersion":2,"manifests":{"a":1}}', id="manifests-not-a-list"),
        pytest.param("[1,2,3]", id="not-an-object"),
        pytest.param('{"schemaVersion":2,"manifests":["x"]}', id="entry-not-an-object"),
        pytest.param("[" * 100_000 + "]" * 100_000, id="nesting-bomb"),
    ],
)
def test_malformed_index_is_an_invalid_bundle(attack: Attack, index: str) -> None:
    (attack.store / "index.json").write_text(index)
    attack.refused("invalid-bundle", INVALID)


@pytest.mark.parametrize("kind", ["directory", "fifo", "nesting-bomb", "too-big"])
def test_hostile_index_json_is_invalid_bundle(store: Path, keypair, kind: str) -> None:
    index = store / "index.json"
    index.unlink()
    if kind == "directory":
        index.mkdir()
    elif kind == "fifo":
        os.mkfifo(index)
    elif kind == "nesting-bomb":
        index.write_bytes(BOMB)
    else:
        with open(index, "wb") as f:
            f.truncate(65 << 20)
    result = run_bundle("verify", REF, "--key", str(keypair[1]), "--store", str(store))
    _refused(result, 6, "invalid-bundle")


def test_diffid_that_differs_from_its_layer_digest_is_invalid(store: Path, keypair) -> None:
    """Checked when the config is read, before any signature: a signer's config could not make it pass either."""
    edit = StoreEditor(store)

    def wrong_diffid(cfg: dict) -> None:
        cfg["model"]["diffId"] = "sha256:" + "0" * 64

    edit.rewrite(REF, config=wrong_diffid)
    result = run_bundle("verify", REF, "--key", str(keypair[1]), "--store", str(store))
    _refused(result, 6, "invalid-bundle")
    assert "diffId" in result.err
