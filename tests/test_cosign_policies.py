"""The admission policies in docs/policies/ are valid against the CRD schemas Kyverno and the Sigstore
policy-controller publish (tests/data/crds/, sources named in SOURCES.json), with unknown fields refused as
`kubectl apply --validate=strict` refuses them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CRDS = Path(__file__).parent / "data" / "crds"
SOURCES = json.loads((CRDS / "SOURCES.json").read_text())
POLICIES = {
    "kyverno-clusterpolicy-before-1.18.yaml": "kyverno.io_clusterpolicies.v1.schema.json.gz",
    "kyverno-verify-bundles.yaml": "policies.kyverno.io_imagevalidatingpolicies.v1.schema.json.gz",
    "kyverno-pod-shape.yaml": "policies.kyverno.io_validatingpolicies.v1.schema.json.gz",
    "policy-controller-verify-bundles.yaml": "policy.sigstore.dev_clusterimagepolicies.v1beta1.schema.json",
}


def _schema(name: str) -> dict[str, Any]:
    raw = gzip.decompress((CRDS / name).read_bytes()) if name.endswith(".gz") else (CRDS / name).read_bytes()
    return json.loads(raw)


def _unknown_fields(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Fields the structural schema does not declare (where it neither preserves unknown fields nor
    takes additionalProperties), as the API server's strict field validation reports them."""
    if isinstance(value, dict) and schema.get("type") == "object" and not schema.get("x-kubernetes-preserve-unknown-fields"):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        found = []
        for key, item in value.items():
            if props is not None and key in props:
                found += _unknown_fields(item, props[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                found += _unknown_fields(item, extra, f"{where}.{key}")
            elif props:
                found.append(f"{where}.{key}")
        return found
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [f for i, item in enumerate(value) for f in _unknown_fields(item, schema["items"], f"{where}[{i}]")]
    return []


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_is_valid_against_its_published_crd_schema(policy: str) -> None:
    doc = yaml.safe_load((ROOT / "docs" / "policies" / policy).read_text())
    source = SOURCES[POLICIES[policy]]
    schema = _schema(POLICIES[policy])
    assert (doc["apiVersion"], doc["kind"]) == (source["apiVersion"], source["kind"])
    jsonschema.Draft7Validator(schema).validate(doc)
    # The API server itself owns apiVersion, kind and metadata; not every CRD schema declares them.
    assert _unknown_fields({k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}, schema) == []


def test_the_strict_check_catches_a_misspelt_field() -> None:
    doc = yaml.safe_load((ROOT / "docs" / "policies" / "kyverno-clusterpolicy-before-1.18.yaml").read_text())
    doc["spec"]["rules"][0]["verifyImages"][0]["attestor"] = doc["spec"]["rules"][0]["verifyImages"][0].pop("attestors")
    assert _unknown_fields(doc, _schema(POLICIES["kyverno-clusterpolicy-before-1.18.yaml"])) == [".spec.rules[0].verifyImages[0].attestor"]


def test_a_wrong_enum_value_is_refused() -> None:
    doc = yaml.safe_load((ROOT / "docs" / "policies" / "kyverno-clusterpolicy-before-1.18.yaml").read_text())
    doc["spec"]["rules"][0]["verifyImages"][0]["type"] = "SigstoreBundles"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(_schema(POLICIES["kyverno-clusterpolicy-before-1.18.yaml"])).validate(doc)
