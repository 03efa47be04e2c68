"""The provenance attestation and the signatures of both: SLSA v1 provenance of the pack (builder, every input
file's digest, the Kitfile as external parameters, the manifest digest as subject), in in-toto Statements whose
shapes are checked against JSON schemas written from the in-toto and SLSA specs (tests/data/attestations, each
naming its source), and whose DSSE signatures Sigstore's own JavaScript verifier (@sigstore/verify, tests/js)
accepts with the bundle's public key and refuses after a changed byte or with another key."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

from conftest import run_bundle

from bundler.format.mediatypes import CYCLONEDX_BOM, SLSA_PROVENANCE_V1
from bundler.store.layout import Store
from bundler.store.referrers import find_attestations
from bundler.trust import provenance

REF = "tiny-spec:1.0.0"
DATA = Path(__file__).parent / "data" / "attestations"
JS = Path(__file__).parent / "js"
NODE = shutil.which("node")


def _schema(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((DATA / name).read_text())
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def _attestations(tree: Path, store: Path, key: Path) -> tuple[str, dict[str, bytes]]:
    digest = run_bundle("pack", str(tree), "-t", REF, "--key", str(key), "--store", str(store), check=True).out.strip().splitlines()[-1]
    return digest, {kind: data for _, kind, data in find_attestations(Store(store), digest)}


def _statement(bundle: bytes) -> dict:
    return json.loads(base64.b64decode(json.loads(bundle)["dsseEnvelope"]["payload"]))


def test_both_statements_match_the_in_toto_statement_v1_schema(tree: Path, store_dir: Path, keypair) -> None:
    _, found = _attestations(tree, store_dir, keypair[0])
    assert set(found) == {CYCLONEDX_BOM, SLSA_PROVENANCE_V1}
    for predicate_type, bundle in found.items():
        statement = _statement(bundle)
        _schema("in-toto-statement-v1.schema.json").validate(statement)
        assert statement["predicateType"] == predicate_type


def test_the_provenance_matches_the_slsa_v1_schema_and_names_builder_inputs_kitfile_and_output(tree: Path, store_dir: Path, keypair) -> None:
    digest, found = _attestations(tree, store_dir, keypair[0])
    statement = _statement(found[SLSA_PROVENANCE_V1])
    predicate = statement["predicate"]
    _schema("slsa-provenance-v1.schema.json").validate(predicate)
    assert statement["subject"][0]["digest"] == {"sha256": digest[7:]}  # the output: the manifest digest
    assert predicate["runDetails"]["builder"]["id"] == provenance.BUILDER_ID
    assert predicate["buildDefinition"]["buildType"] == provenance.BUILD_TYPE
    assert predicate["buildDefinition"]["externalParameters"]["kitfile"]["package"] == {
        "name": "tiny-spec", "version": "1.0.0", "authors": ["tests"], "license": "Apache-2.0"}
    inputs = {d["name"]: d["digest"]["sha256"] for d in predicate["buildDefinition"]["resolvedDependencies"]}
    on_disk = {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest() for p in tree.rglob("*") if p.is_file() and p.name != "Kitfile"}
    assert inputs == on_disk
    metadata = predicate["runDetails"]["metadata"]
    assert metadata["startedOn"] <= metadata["finishedOn"]


def test_a_provenance_without_a_builder_id_fails_the_slsa_schema() -> None:
    predicate = provenance.build_provenance({"package": {}}, "x:1", {"a": "0" * 64}, "test")
    del predicate["runDetails"]["builder"]["id"]
    assert list(_schema("slsa-provenance-v1.schema.json").iter_errors(predicate))


@pytest.fixture(scope="module")
def sigstore_js() -> Path:
    if NODE is None:
        pytest.skip("node is not installed: Sigstore's JavaScript verifier cannot run")
    if not (JS / "node_modules" / "@sigstore" / "verify").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JS, check=True, capture_output=True, timeout=300)
    return JS


def _node(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([NODE, str(JS / "verify_bundle.mjs"), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_sigstore_js_verifies_both_attestations_with_the_bundle_key(sigstore_js: Path, tree: Path, store_dir: Path, keypair, tmp_path: Path) -> None:
    digest, found = _attestations(tree, store_dir, keypair[0])
    for predicate_type, bundle in found.items():
        (tmp_path / "att.json").write_bytes(bundle)
        result = _node(tmp_path / "att.json", keypair[1], digest, predicate_type)
        assert result.returncode == 0 and result.stdout.strip() == "verified", result.stderr


def test_sigstore_js_refuses_a_changed_predicate_and_another_key(sigstore_js: Path, tree: Path, store_dir: Path, keypair, other_keypair, tmp_path: Path) -> None:
    digest, found = _attestations(tree, store_dir, keypair[0])
    bundle = json.loads(found[CYCLONEDX_BOM])
    statement = _statement(found[CYCLONEDX_BOM])
    statement["predicate"]["components"][0]["name"] = "not-the-tokenizer"
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (tmp_path / "changed.json").write_text(json.dumps(bundle))
    changed = _node(tmp_path / "changed.json", keypair[1], digest, CYCLONEDX_BOM)
    assert changed.returncode == 1 and "not verified" in changed.stderr
    (tmp_path / "att.json").write_bytes(found[SLSA_PROVENANCE_V1])
    other = _node(tmp_path / "att.json", other_keypair[1], digest, SLSA_PROVENANCE_V1)
    assert other.returncode == 1 and "not verified" in other.stderr
