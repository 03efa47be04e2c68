"""docs/policies/kyverno-verify-bundles.yaml, Kyverno's ImageValidatingPolicy (policies.kyverno.io/v1), evaluated as
Kyverno's source evaluates it (tests/admission.py): it verifies the bundle each shipped object names, with the
publisher's attestor, and its SBOM and SLSA provenance attestations; it refuses a bundle unsigned, signed by
another key, without either attestation, outside the trusted repository, without a digest or with a tag beside it.
docs/policies/kyverno-pod-shape.yaml (a ValidatingPolicy) carries the ValidatingAdmissionPolicy's rules, identical.
Both files are checked against the CRD schemas of Kyverno's source (tests/data/crds/SOURCES.json)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Callable

import jsonschema
import pytest

from tests.admission import (DIGEST, KYVERNO_IVP, KYVERNO_SHAPE, Signed, as_kind, deployment, documents, env,
                             inferenceservice, inferenceservice_vllm, ivp_admit, kserve_pod, pod_of, vap_spec)
from tests.test_cosign_policies import _unknown_fields

CRDS = Path(__file__).parent / "data" / "crds"
SOURCES = json.loads((CRDS / "SOURCES.json").read_text())
SBOM, PROVENANCE = "https://cyclonedx.org/bom", "https://slsa.dev/provenance/v1"
PINNED = "registry.example.com/models/smollm2-spec@" + DIGEST


def _all_signed(*refs: str) -> Signed:
    signed = Signed()
    for ref in refs:
        signed.sign(ref, predicates=(SBOM, PROVENANCE))
    return signed


def _isvc_ref() -> str:
    uri = env(inferenceservice()["spec"]["predictor"]["containers"][0], "STORAGE_URI")["value"]
    return uri.removeprefix("bundle://")


SHIPPED: dict[str, Callable[[], dict[str, Any]]] = {
    "deployment": deployment,
    "deployment-pod": lambda: pod_of(deployment()),
    "cronjob": lambda: as_kind(deployment(), "CronJob"),
    "statefulset": lambda: as_kind(deployment(), "StatefulSet"),
    "inferenceservice": inferenceservice,
    "kserve-pod": kserve_pod,
    "deployment-vllm": lambda: deployment("vllm"),  # by directory: STORAGE_URI, fetch, serve --from-dir --runtime vllm
    "deployment-vllm-pod": lambda: pod_of(deployment("vllm")),
    "inferenceservice-vllm": inferenceservice_vllm,
    "kserve-pod-vllm": lambda: kserve_pod(inferenceservice_vllm()),
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_object_is_admitted_and_its_bundle_verified(name: str) -> None:
    obj = SHIPPED[name]()
    ref = _isvc_ref() if "inferenceservice" in name or "kserve" in name else PINNED
    signed = _all_signed(ref)
    assert ivp_admit(obj, signed) == []
    assert signed.asked == {ref}  # the bundle itself was verified (the specbundle image is not a bundle)


def test_the_kit_scheme_is_read_too() -> None:
    isvc = inferenceservice()
    uri = env(isvc["spec"]["predictor"]["containers"][0], "STORAGE_URI")
    uri["value"] = uri["value"].replace("bundle://", "kit://")
    signed = _all_signed(_isvc_ref())
    assert ivp_admit(isvc, signed) == [] and signed.asked == {_isvc_ref()}


@pytest.mark.parametrize("signed, message", [
    (Signed(), "not signed with the publisher's key"),
    (Signed().sign(PINNED, by="someone-else", predicates=(SBOM, PROVENANCE)), "not signed with the publisher's key"),
    (Signed().sign(PINNED, predicates=(PROVENANCE,)), "CycloneDX SBOM"),
    (Signed().sign(PINNED, predicates=(SBOM,)), "SLSA provenance"),
    (Signed().sign(PINNED, predicates=(SBOM,)).sign(PINNED, by="someone-else", predicates=(PROVENANCE,)), "SLSA provenance"),
], ids=["unsigned", "another-key", "no-sbom", "no-provenance", "provenance-by-another-key"])
def test_a_bundle_without_the_publishers_signature_or_attestations_is_refused(signed: Signed, message: str) -> None:
    refused = ivp_admit(deployment(), signed)
    assert any(message in m for m in refused), refused


def _annotate(value: str) -> dict[str, Any]:
    d = deployment()
    d["spec"]["template"]["metadata"]["annotations"]["specbundle.bundle-ref"] = value
    return d


@pytest.mark.parametrize("ref, message", [
    ("registry.example.com/models/smollm2-spec:1.0.0", "does not have a digest"),  # verifyDigest, before any validation
    ("registry.example.com/models/smollm2-spec:2.0.0@" + DIGEST, "no tag beside it"),
    ("evil.example.com/models/smollm2-spec@" + DIGEST, "trusted repository"),
], ids=["tag-only", "tag-beside-digest", "another-registry"])
def test_a_reference_that_is_not_pinned_in_the_trusted_repository_is_refused(ref: str, message: str) -> None:
    """Signed or not: a reference outside the glob would be skipped by matchImageReferences; a validation refuses it."""
    refused = ivp_admit(_annotate(ref), _all_signed(ref))
    assert any(message in m for m in refused), refused


def test_every_bundle_an_object_names_is_verified() -> None:
    """A second container's STORAGE_URI, an InferenceService's model storageUri, a CronJob's template: each reference
    is handed to the signature check, and one unsigned among them refuses the object."""
    other = "registry.example.com/models/other@sha256:" + "1" * 64
    isvc = inferenceservice()
    isvc["spec"]["predictor"]["model"] = {"modelFormat": {"name": "x"}, "storageUri": "kit://" + other}
    signed = _all_signed(_isvc_ref())
    assert any("not signed" in m for m in ivp_admit(isvc, signed)) and other in signed.asked
    assert ivp_admit(isvc, _all_signed(_isvc_ref(), other)) == []
    pod = kserve_pod()
    pod["spec"]["containers"][0]["env"].append({"name": "SECOND", "value": "bundle://" + other})
    assert any("one per container" in m for m in ivp_admit(pod, _all_signed(_isvc_ref(), other)))


# -- the pod shapes, and the CRD schemas -------------------------------------------------------------------
def test_the_kyverno_pod_shape_policy_is_the_validating_admission_policy() -> None:
    """One set of rules: the ValidatingPolicy's match, variables and validations are the VAP's, word for word."""
    shape, vap = documents(KYVERNO_SHAPE)[0]["spec"], vap_spec()
    for key in ("failurePolicy", "matchConstraints", "matchConditions", "variables", "validations"):
        assert shape[key] == vap[key], key


def _crd_schema(name: str) -> dict[str, Any]:
    return json.loads(gzip.decompress((CRDS / name).read_bytes()))


@pytest.mark.parametrize("policy, schema", [
    (KYVERNO_IVP, "policies.kyverno.io_imagevalidatingpolicies.v1.schema.json.gz"),
    (KYVERNO_SHAPE, "policies.kyverno.io_validatingpolicies.v1.schema.json.gz"),
])
def test_the_kyverno_policies_are_valid_against_kyvernos_crd_schemas(policy: Path, schema: str) -> None:
    doc, source = documents(policy)[0], SOURCES[schema]
    assert (doc["apiVersion"], doc["kind"]) == (source["apiVersion"], source["kind"]) == ("policies.kyverno.io/v1", doc["kind"])
    crd = _crd_schema(schema)
    jsonschema.Draft7Validator(crd).validate(doc)
    assert _unknown_fields({k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}, crd) == []


def test_the_schema_check_catches_a_misspelt_field() -> None:
    doc = documents(KYVERNO_IVP)[0]
    doc["spec"]["attestors"][0]["cosign"]["keys"] = doc["spec"]["attestors"][0]["cosign"].pop("key")
    assert _unknown_fields(doc, _crd_schema("policies.kyverno.io_imagevalidatingpolicies.v1.schema.json.gz")) == [
        ".spec.attestors[0].cosign.keys"]
