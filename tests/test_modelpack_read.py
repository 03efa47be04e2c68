"""ModelPack bundles not written by us (shaped as the specification's example, tests/data/modelpack/) are read
as bundles: they verify and run, and are refused as a ModelKit is, with the same codes."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from bundler.store.layout import Store
from bundler.store.modelkit import load_modelkit
from bundler.store.refs import parse_ref
from bundletree import make_tree, tokenizer_json
from conftest import run_bundle
from tests.modelpackbuild import CONFIG_SCHEMA, EXAMPLE_CONFIG, EXAMPLE_MANIFEST, rewrite_manifest, spec_shaped
from tests.tinymodels import make_pair
from tests.unchecked_pack import pack_unchecked

REF = "tiny-spec:1.0.0"


def _verify(store: Path, *extra: str) -> tuple[int, dict]:
    r = run_bundle("verify", REF, "--store", str(store), "--json", *(extra or ("--allow-unsigned",)))
    return r.code, json.loads(r.out)


def _code(report: dict) -> str | None:
    return report["error"]["code"] if report["error"] else None


def test_the_specs_own_example_config_satisfies_its_schema() -> None:
    # The test data is the specification's, unchanged: its example passes its schema, so what we check against is theirs.
    jsonschema.validate(EXAMPLE_CONFIG, CONFIG_SCHEMA)
    assert EXAMPLE_MANIFEST["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"


def test_a_bundle_shaped_as_the_specs_example_verifies_and_runs_as_the_modelkit_does(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    make_pair(tmp_path / "ctx")
    digest = spec_shaped(tmp_path / "ctx", tmp_path / "mp", REF)
    run_bundle("sign", REF, "--key", str(keypair[0]), "--store", str(tmp_path / "mp"), check=True)
    code, report = _verify(tmp_path / "mp", "--key", str(keypair[1]))
    assert code == 0 and report["ok"] and report["digest"] == digest, report
    pack_unchecked(tmp_path / "ctx", REF, tmp_path / "mk", keypair[0])
    outputs = []
    for store in ("mp", "mk"):
        r = run_bundle("run", REF, "--prompt", "the quick brown fox", "--max-new-tokens", "12", "--key", str(keypair[1]),
                       "--store", str(tmp_path / store), "--json", check=True)
        outputs.append(json.loads(r.out))
    assert outputs[0]["bundle"]["digest"] == digest
    assert outputs[0]["tokens"] == outputs[1]["tokens"] and outputs[0]["text"] == outputs[1]["text"]


def test_roles_come_from_the_layer_paths_without_a_kitfile_annotation(tmp_path: Path) -> None:
    make_tree(tmp_path / "ctx")
    spec_shaped(tmp_path / "ctx", tmp_path / "mp", REF, kitfile=False)
    code, report = _verify(tmp_path / "mp")
    assert code == 0, report
    roles = next(c for c in report["checks"] if c["name"] == "roles")
    assert roles["detail"].startswith("target=target, draft=draft, tokenizer=tokenizer")


def test_a_missing_draft_role_is_refused_with_the_modelkit_code(tmp_path: Path) -> None:
    make_tree(tmp_path / "ctx")
    pack_unchecked(tmp_path / "ctx", REF, tmp_path / "mk")
    mk = load_modelkit(Store(tmp_path / "mk"), parse_ref(REF))
    draft = {d.digest for s, d in mk.layers if s.role == "draft"}
    rewrite_manifest(tmp_path / "mk", REF, lambda m: m.update(layers=[x for x in m["layers"] if x["digest"] not in draft]))
    spec_shaped(tmp_path / "ctx", tmp_path / "mp", REF, skip=("draft",))
    (mk_code, mk_report), (mp_code, mp_report) = _verify(tmp_path / "mk"), _verify(tmp_path / "mp")
    assert mk_code == mp_code == 6
    assert _code(mk_report) == _code(mp_report) == "invalid-bundle"
    assert "no layer for draft entry 'draft'" in mp_report["error"]["message"]


def test_a_tokenizer_mismatch_is_refused_with_the_modelkit_code(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "ctx")
    vocab = ["<unk>", "<s>", "</s>", "hello", "world", "spec", "bundle", "draft", "target", "tokens"]
    (tree / "draft" / "tokenizer.json").write_text(tokenizer_json(vocab))
    pack_unchecked(tree, REF, tmp_path / "mk")
    spec_shaped(tree, tmp_path / "mp", REF)
    (mk_code, mk_report), (mp_code, mp_report) = _verify(tmp_path / "mk"), _verify(tmp_path / "mp")
    assert mk_code == mp_code == 4
    assert _code(mk_report) == _code(mp_report) == "tokenizer-mismatch"
    assert mk_report["error"]["message"] == mp_report["error"]["message"]


@pytest.mark.parametrize("change, code", [
    (lambda layer: layer["annotations"].update({"org.cncf.model.filepath": "../escape"}), "unsafe-archive"),
    (lambda layer: layer.pop("annotations"), "invalid-bundle"),
    (lambda layer: layer.update(mediaType=layer["mediaType"] + "+gzip"), "invalid-bundle"),
    (lambda layer: layer["annotations"].update({"specbundle.dev/role": "draft"}), "invalid-bundle"),
])
def test_a_layer_without_a_safe_place_or_a_readable_form_is_refused(tmp_path: Path, change, code: str) -> None:
    make_tree(tmp_path / "ctx")
    spec_shaped(tmp_path / "ctx", tmp_path / "mp", REF)

    def hostile(manifest: dict) -> None:
        change(next(x for x in manifest["layers"] if x["annotations"]["org.cncf.model.filepath"] == "target/config.json"))

    rewrite_manifest(tmp_path / "mp", REF, hostile)
    exit_code, report = _verify(tmp_path / "mp")
    assert _code(report) == code and exit_code in (3, 6), report
