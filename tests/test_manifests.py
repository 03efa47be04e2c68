"""deploy/ is valid: every Kubernetes object against a named Kubernetes version's schemas (kubernetes-validate,
strict: an unknown field is an error), the KServe and Prometheus-operator objects against their published CRD
schemas (tests/data/*/SOURCE.md), and every overlay patch applies to the base."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.fleet import BASE, OVERLAYS, ROOT, Manifests, base_objects, kustomization

KUBERNETES_VERSION = "1.32.0"  # a release still supported when this was written; kubectl 1.32 was at hand
DATA = Path(__file__).parent / "data"
CRD_SCHEMAS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): DATA / "kserve" / "inferenceservice-v1beta1.schema.json.gz",
    ("serving.kserve.io/v1alpha1", "ClusterStorageContainer"): DATA / "kserve" / "clusterstoragecontainer-v1alpha1.schema.json.gz",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): DATA / "prometheus-operator" / "servicemonitor-v1.schema.json.gz",
}


def _kserve_objects() -> list[dict[str, Any]]:
    k = kustomization(ROOT / "deploy" / "kserve")
    return [d for name in k["resources"] for d in yaml.safe_load_all((ROOT / "deploy" / "kserve" / name).read_text()) if d]


def _strict(schema: Any) -> Any:
    """A CRD schema that refuses unknown fields, as the API server's strict field validation (kubectl apply
    --validate=strict) does: `additionalProperties: false` wherever an object lists its properties and does not
    keep unknown fields. The schema itself is otherwise used as published."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _crd_validate(obj: dict[str, Any]) -> None:
    data = json.loads(gzip.decompress(CRD_SCHEMAS[(obj["apiVersion"], obj["kind"])].read_bytes()))
    schema = _strict(data["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # metadata is the API server's: checked by kubernetes-validate's ObjectMeta
    jsonschema.validate(obj, schema, cls=jsonschema.Draft4Validator)


def _k8s_validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def _all_objects() -> list[dict[str, Any]]:
    return base_objects() + _kserve_objects()


@pytest.mark.parametrize("obj", _all_objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_every_object_is_valid(obj: dict[str, Any]) -> None:
    if (obj["apiVersion"], obj["kind"]) in CRD_SCHEMAS:
        _crd_validate(obj)
        # Its metadata and any core types it embeds are checked as Kubernetes' own, too.
        _k8s_validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})
    else:
        _k8s_validate(obj)


@pytest.mark.parametrize("overlay", sorted(p.name for p in OVERLAYS.iterdir()))
def test_every_overlay_gives_a_valid_deployment(overlay: str) -> None:
    deployment = Manifests.load(overlay).deployment
    _k8s_validate(deployment)


def test_the_kserve_predictor_and_storage_container_are_valid_core_containers() -> None:
    """The containers inside the KServe objects are Kubernetes containers: checked as a Pod's."""
    objects = {o["kind"]: o for o in _kserve_objects()}
    predictor = objects["InferenceService"]["spec"]["predictor"]
    init = objects["ClusterStorageContainer"]["spec"]["container"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"},
           "spec": {"initContainers": [init], "containers": predictor["containers"], "volumes": predictor["volumes"],
                    "securityContext": predictor["securityContext"]}}
    _k8s_validate(pod)


def test_a_wrong_field_is_caught() -> None:
    """The checks above can fail: a misspelt field in each kind of object is refused."""
    deployment = next(o for o in base_objects() if o["kind"] == "Deployment")
    bad = json.loads(json.dumps(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = bad["spec"]["template"]["spec"]["containers"][0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        _k8s_validate(bad)
    isvc = next(o for o in _kserve_objects() if o["kind"] == "InferenceService")
    bad = json.loads(json.dumps(isvc))
    bad["spec"]["predictor"]["minReplica"] = bad["spec"]["predictor"].pop("minReplicas")
    with pytest.raises(jsonschema.ValidationError):
        _crd_validate(bad)


def test_the_deployment_is_what_the_issue_asks() -> None:
    """Non-root, read-only root file system, the store on an emptyDir, probes on the health endpoint, the API key
    and the registry credentials from Secrets, the trusted keys from a ConfigMap, Prometheus annotations."""
    m = Manifests.load()
    spec = m.pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    init, main = spec["initContainers"][0], spec["containers"][0]
    assert init["args"][:2] == ["pull", "$(BUNDLE_REF)"] and main["args"][:2] == ["serve", "$(BUNDLE_REF)"]
    for c in (init, main):
        assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["allowPrivilegeEscalation"] is False
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["store"] and volumes["registry-auth"]["secret"]["items"][0]["key"] == ".dockerconfigjson"
    assert "configMap" in volumes["trusted-keys"] and "secret" in volumes["api-key"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["httpGet"]["path"] == "/health"
    notes = m.annotations()
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
    assert notes["prometheus.io/port"] == str(main["ports"][0]["containerPort"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) is not installed; the overlays are applied by tests/fleet.py")
@pytest.mark.parametrize("directory", [BASE, *sorted(OVERLAYS.iterdir()), ROOT / "deploy" / "kserve"], ids=lambda p: p.name)
def test_kustomize_builds_each_directory_into_valid_objects(directory: Path) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for obj in (d for d in yaml.safe_load_all(out.stdout) if d):
        if (obj["apiVersion"], obj["kind"]) in CRD_SCHEMAS:
            _crd_validate(obj)
        else:
            _k8s_validate(obj)
