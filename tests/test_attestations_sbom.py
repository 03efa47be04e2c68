"""The SBOM attestation: `bundle pack --key` (and `bundle attest` for an older bundle) attaches a CycloneDX 1.6
ML-BOM, signed with the bundle's key, that passes cyclonedx-python-lib's strict JSON validator and names what
the bundle is made of: target and draft as machine-learning models with hashes, licences, parameter counts,
dtype and architecture, the tokenizer, and the draft's dependency on the target."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from conftest import run_bundle

from bundler.format.mediatypes import CYCLONEDX_BOM
from bundler.store.layout import Store
from bundler.store.referrers import find_attestations, find_signatures
from bundler.store.refs import parse_ref

REF = "tiny-spec:1.0.0"


def _statement(store: Path, predicate_type: str) -> dict:
    s = Store(store)
    digest = s.resolve(parse_ref(REF)).digest
    [(_, _, data)] = [a for a in find_attestations(s, digest) if a[1] == predicate_type]
    return json.loads(base64.b64decode(json.loads(data)["dsseEnvelope"]["payload"]))


def _packed(tree: Path, store: Path, key: Path) -> str:
    return run_bundle("pack", str(tree), "-t", REF, "--key", str(key), "--store", str(store), check=True).out.strip().splitlines()[-1]


def test_pack_with_a_key_attaches_a_bom_that_passes_cyclonedx_strict_validation(tree: Path, store_dir: Path, keypair) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    digest = _packed(tree, store_dir, keypair[0])
    statement = _statement(store_dir, CYCLONEDX_BOM)
    assert statement["subject"][0]["digest"]["sha256"] == digest[7:]
    bom = statement["predicate"]
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.6"
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(bom)) is None


def test_the_bom_names_both_models_with_hashes_licences_parameters_dtype_and_architecture(tree: Path, store_dir: Path, keypair) -> None:
    _packed(tree, store_dir, keypair[0])
    bom = _statement(store_dir, CYCLONEDX_BOM)["predicate"]
    parts = {c["bom-ref"]: c for c in bom["components"]}
    assert {parts["target"]["type"], parts["draft"]["type"]} == {"machine-learning-model"} and parts["tokenizer"]["type"] == "data"
    for role, params in (("target", 32 * 10 + 4 * 64 * 32), ("draft", 8 * 10 + 16 * 8)):  # tests/bundletree.py's shapes, embeddings tied
        props = {p["name"]: p["value"] for p in parts[role]["properties"]}
        assert props["specbundle:parameters"] == str(params) and props["specbundle:dtype"] == "F32"
        assert parts[role]["licenses"] == [{"license": {"id": "Apache-2.0"}}]  # the Kitfile's package licence
        assert parts[role]["modelCard"]["modelParameters"]["modelArchitecture"] == "LlamaForCausalLM"
        assert parts[role]["modelCard"]["modelParameters"]["architectureFamily"] == "llama"
        files = {f["name"]: f["hashes"][0]["content"] for f in parts[role]["components"]}
        assert set(files) == {f"{role}/config.json", f"{role}/model.safetensors"}
    assert files["draft/model.safetensors"] == hashlib.sha256((tree / "draft" / "model.safetensors").read_bytes()).hexdigest()
    deps = {d["ref"]: set(d.get("dependsOn", [])) for d in bom["dependencies"]}
    assert "target" in deps["draft"] and "tokenizer" in deps["draft"]
    assert bom["metadata"]["component"]["hashes"][0]["content"] == _statement(store_dir, CYCLONEDX_BOM)["subject"][0]["digest"]["sha256"]


def test_the_bom_records_the_kitfiles_speculative_settings_and_no_invented_measurements(tree: Path, store_dir: Path, keypair) -> None:
    _packed(tree, store_dir, keypair[0])
    bom = _statement(store_dir, CYCLONEDX_BOM)["predicate"]
    props = {p["name"]: p["value"] for p in bom["metadata"]["component"]["properties"]}
    assert json.loads(props["specbundle:speculative"]) == {"draft_tokens": 4, "min_acceptance": 0.3}
    assert not any("quantitativeAnalysis" in c.get("modelCard", {}) for c in bom["components"])  # nothing measured here


def test_attestations_are_not_taken_for_signatures(tree: Path, store_dir: Path, keypair) -> None:
    digest = _packed(tree, store_dir, keypair[0])
    assert len(find_signatures(Store(store_dir), digest)) == 2  # model-signing and cosign-style: the two attestations apart
    assert len(find_attestations(Store(store_dir), digest)) == 2


def test_attest_writes_them_for_a_bundle_packed_without_them(tree: Path, store_dir: Path, keypair) -> None:
    run_bundle("pack", str(tree), "-t", REF, "--store", str(store_dir), check=True)
    run_bundle("sign", REF, "--key", str(keypair[0]), "--store", str(store_dir), check=True)
    missing = run_bundle("verify", REF, "--key", str(keypair[1]), "--store", str(store_dir), "--require", "sbom,provenance")
    assert missing.code == 3 and missing.err.startswith("error: [signature-missing]") and "no sbom attestation" in missing.err
    out = run_bundle("attest", REF, "--key", str(keypair[0]), "--store", str(store_dir), check=True).out.split()
    assert out[0::2] == ["sbom", "provenance"]
    run_bundle("verify", REF, "--key", str(keypair[1]), "--store", str(store_dir), "--require", "sbom", "--require", "provenance", check=True)
    again = run_bundle("attest", REF, "--key", str(keypair[0]), "--store", str(store_dir), check=True).out.split()
    listed = json.loads(run_bundle("attestations", REF, "--key", str(keypair[1]), "--store", str(store_dir), "--type", "all", "--json", check=True).out)
    assert sorted(r["digest"] for r in listed) == sorted(again[1::2])  # a second attest by the same key replaces the first
    assert {r["type"] for r in listed} == {"sbom", "provenance"} and all(r["verified"] for r in listed)


def test_attest_refuses_a_key_that_did_not_sign_the_bundle(tree: Path, store_dir: Path, keypair, other_keypair) -> None:
    _packed(tree, store_dir, keypair[0])
    result = run_bundle("attest", REF, "--key", str(other_keypair[0]), "--store", str(store_dir))
    assert result.code == 3 and result.err.startswith("error: [untrusted-signer]")


def test_require_with_an_unknown_kind_or_allow_unsigned_is_a_usage_error(tree: Path, store_dir: Path, keypair) -> None:
    _packed(tree, store_dir, keypair[0])
    unknown = run_bundle("verify", REF, "--key", str(keypair[1]), "--store", str(store_dir), "--require", "spdx")
    assert unknown.code == 2 and "unknown attestation 'spdx'" in unknown.err
    unsigned = run_bundle("verify", REF, "--allow-unsigned", "--store", str(store_dir), "--require", "sbom")
    assert unsigned.code == 2 and unsigned.err.startswith("error: [usage]")


def test_a_gguf_model_is_described_from_its_header(tmp_path: Path) -> None:
    from tests.tinygguf import write_gguf

    from bundler.trust import sbom
    from runner.checks import gguf_header, gguf_model

    model = tmp_path / "target"
    model.mkdir()
    write_gguf(model / "model.gguf")
    facts = sbom.model_facts(model)
    assert (facts.format, facts.family, facts.quantization) == ("gguf", "llama", "ALL_F32")
    assert facts.parameters == gguf_model.parameters(gguf_header.read_header(model / "model.gguf")) > 0


def test_verify_require_refuses_an_sbom_signed_by_a_key_it_does_not_trust(tree: Path, store_dir: Path, keypair, other_keypair) -> None:
    import datetime as dt

    from bundler.store.modelkit import load_modelkit
    from bundler.trust import attestation
    from bundler.trust.keys import load_private_key

    _packed(tree, store_dir, keypair[0])
    store = Store(store_dir)
    mk = load_modelkit(store, parse_ref(REF))
    statement = _statement(store_dir, CYCLONEDX_BOM)
    [(sbom, _, _)] = [a for a in find_attestations(store, mk.digest) if a[1] == CYCLONEDX_BOM]
    store.remove_manifest(sbom.digest)
    forged = attestation.sign_statement(statement, load_private_key(other_keypair[0]))
    attestation.store_attestation(store, mk.manifest_desc, CYCLONEDX_BOM, forged, dt.datetime.now(dt.timezone.utc))
    refused = run_bundle("verify", REF, "--key", str(keypair[1]), "--store", str(store_dir), "--require", "sbom")
    assert refused.code == 3 and refused.err.startswith("error: [untrusted-signer]") and "sbom attestation" in refused.err
    assert "FAIL attestations" in refused.out
    both = run_bundle("verify", REF, "--key", str(keypair[1]), "--key", str(other_keypair[1]), "--store", str(store_dir), "--require", "sbom")
    assert both.code == 0, both.err  # trusted once the key that signed it is


# A `bundle bench --json` report's required part (schemas/bench-report.schema.json), as a user passes it to attest.
BENCH = {"runs": {"target_only": {"tokens_per_second": 20.0}, "hf_assisted": {"tokens_per_second": 25.0}, "bundle": {"tokens_per_second": 33.0}},
         "speedup_vs_target": 1.65, "speedup_vs_hf_assisted": 1.32, "acceptance_rate": 0.61, "cost_ratio": 0.1,
         "theoretical_speedup": 2.0, "identical_output": True, "per_prompt": [{}, {}, {}]}


def test_attest_with_a_bench_report_records_its_measurements_in_the_drafts_model_card(tree: Path, store_dir: Path, keypair, tmp_path: Path) -> None:
    _packed(tree, store_dir, keypair[0])
    (tmp_path / "bench.json").write_text(json.dumps(BENCH))
    run_bundle("attest", REF, "--key", str(keypair[0]), "--bench", str(tmp_path / "bench.json"), "--store", str(store_dir), check=True)
    bom = _statement(store_dir, CYCLONEDX_BOM)["predicate"]
    card = {c["bom-ref"]: c["modelCard"] for c in bom["components"] if "modelCard" in c}
    metrics = {m["type"]: m for m in card["draft"]["quantitativeAnalysis"]["performanceMetrics"]}
    assert metrics["acceptance rate (accepted / drafted tokens)"] == {"type": "acceptance rate (accepted / drafted tokens)", "value": "0.61", "slice": "bundle bench, 3 prompts"}
    assert metrics["speed-up over the target alone (tokens/s)"]["value"] == "1.65"
    assert len(metrics) == 2 and "quantitativeAnalysis" not in card["target"]  # only what the report measured
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(bom)) is None


def test_attest_refuses_a_file_that_is_not_a_bench_report(tree: Path, store_dir: Path, keypair, tmp_path: Path) -> None:
    digest = _packed(tree, store_dir, keypair[0])
    before = {d.digest for d, _, _ in find_attestations(Store(store_dir), digest)}
    (tmp_path / "bench.json").write_text(json.dumps({**BENCH, "acceptance_rate": 7}))
    refused = run_bundle("attest", REF, "--key", str(keypair[0]), "--bench", str(tmp_path / "bench.json"), "--store", str(store_dir))
    assert refused.code == 2 and "is not a `bundle bench --json` report" in refused.err
    assert {d.digest for d, _, _ in find_attestations(Store(store_dir), digest)} == before
