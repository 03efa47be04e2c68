"""deploy/ is valid: every Kubernetes object against a named Kubernetes version's schemas (kubernetes-validate,
strict: an unknown field is an error), the KServe and Prometheus-operator objects against their published CRD
schemas (tests/data/*/SOURCE.md), and every overlay patch applies to the base."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from bundler.serve.server import DRAIN_LIMIT_S
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


KSERVE_VLLM = ROOT / "deploy" / "kserve" / "vllm"  # the InferenceService of vLLM's CPU engine behind `serve --runtime vllm`


def _kserve_vllm_objects() -> list[dict[str, Any]]:
    k = kustomization(KSERVE_VLLM)
    return [d for name in k["resources"] for d in yaml.safe_load_all((KSERVE_VLLM / name).read_text()) if d]


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
    return base_objects() + _kserve_objects() + _kserve_vllm_objects()


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
    """The containers inside the KServe objects are Kubernetes containers: checked as a Pod's (the storage
    initializer as KServe injects it: an init container of the predictor's pod, with the model volume it adds)."""
    objects = {o["kind"]: o for o in _kserve_objects()}
    predictor = objects["InferenceService"]["spec"]["predictor"]
    init = objects["ClusterStorageContainer"]["spec"]["container"]
    init = {**init, "volumeMounts": [*init["volumeMounts"], {"name": "kserve-provision-location", "mountPath": "/mnt/models"}]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"},
           "spec": {"initContainers": [init], "containers": predictor["containers"],
                    "volumes": [*predictor["volumes"], {"name": "kserve-provision-location", "emptyDir": {}}],
                    "automountServiceAccountToken": predictor["automountServiceAccountToken"]}}
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
    """Non-root, read-only root file system, the store on an emptyDir, probes on the health endpoints, the API key,
    the registry credentials and the trusted keys from Secrets, the bundle pinned once in a pod annotation, a grace
    period above serve's drain, a preStop delay, Prometheus annotations."""
    m = Manifests.load()
    spec = m.pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["automountServiceAccountToken"] is False
    init, main = spec["initContainers"][0], spec["containers"][0]
    assert init["args"][:2] == ["pull", "$(BUNDLE_REF)"] and main["args"][:2] == ["serve", "$(BUNDLE_REF)"]
    for c in (init, main):
        assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["allowPrivilegeEscalation"] is False
        ref = next(e for e in c["env"] if e["name"] == "BUNDLE_REF")
        assert ref["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['specbundle.bundle-ref']"
    assert re.fullmatch(r"[a-z0-9.-]+/[a-z0-9/._-]+@sha256:[0-9a-f]{64}", m.annotations()["specbundle.bundle-ref"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["store"] and volumes["registry-auth"]["secret"]["items"][0]["key"] == ".dockerconfigjson"
    assert "secret" in volumes["trusted-keys"] and "secret" in volumes["api-key"]
    assert main["startupProbe"]["httpGet"]["path"] == main["readinessProbe"]["httpGet"]["path"] == "/health"
    assert main["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert main["startupProbe"]["periodSeconds"] * main["startupProbe"]["failureThreshold"] >= 300  # loading time
    pre_stop = main["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] > DRAIN_LIMIT_S + pre_stop
    notes = m.annotations()
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
    assert notes["prometheus.io/port"] == str(main["ports"][0]["containerPort"])


def test_disruption_budget_and_network_policy_cover_the_deployments_pods() -> None:
    objects = {o["kind"]: o for o in base_objects()}
    labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    replicas = objects["Deployment"]["spec"]["replicas"]
    pdb, netpol = objects["PodDisruptionBudget"]["spec"], objects["NetworkPolicy"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items() and 0 < replicas - pdb["maxUnavailable"]
    assert netpol["podSelector"]["matchLabels"].items() <= labels.items() and netpol["policyTypes"] == ["Ingress"]
    sources = [rule["from"] for rule in netpol["ingress"]]
    assert [{"podSelector": {}}] in sources  # the namespace's own pods
    scraper = next(s for s in sources if "namespaceSelector" in s[0])[0]
    assert scraper["podSelector"]["matchLabels"]  # only the scraper's pods in that namespace, not all of it
    assert all(p["port"] == "http" for rule in netpol["ingress"] for p in rule["ports"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) is not installed; the overlays are applied by tests/fleet.py")
@pytest.mark.parametrize("directory", [BASE, *sorted(OVERLAYS.iterdir()), ROOT / "deploy" / "kserve", KSERVE_VLLM],
                         ids=lambda p: p.relative_to(ROOT / "deploy").as_posix())
def test_kustomize_builds_each_directory_into_valid_objects(directory: Path) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for obj in (d for d in yaml.safe_load_all(out.stdout) if d):
        if (obj["apiVersion"], obj["kind"]) in CRD_SCHEMAS:
            _crd_validate(obj)
        else:
            _k8s_validate(obj)


# -- KServe in its default Serverless mode: Knative's admission rules ---------------------------------
KNATIVE = json.loads((DATA / "knative" / "rules.json").read_text())
KSERVE_COMPONENT_FIELDS = {  # ComponentExtensionSpec and PredictorSpec's own fields: KServe's, not the Revision's PodSpec
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType", "autoScaling", "containerConcurrency",
    "timeout", "canaryTrafficPercent", "logger", "batcher", "labels", "annotations", "deploymentStrategy",
    "storageUris", "storageContainerName", "workerSpec", "model",
}
SUBOBJECTS = {  # where each masked kind sits inside its parent, and whether it is a list
    "PodSpec": {"containers": ("Container", True), "volumes": ("Volume", True)},
    "Container": {"securityContext": ("SecurityContext", False), "volumeMounts": ("VolumeMount", True), "env": ("EnvVar", True),
                  "ports": ("ContainerPort", True), "resources": ("ResourceRequirements", False),
                  "livenessProbe": ("Probe", False), "readinessProbe": ("Probe", False), "startupProbe": ("Probe", False)},
    "SecurityContext": {"capabilities": ("Capabilities", False)},
    "EnvVar": {"valueFrom": ("EnvVarSource", False)},
    "Probe": {"httpGet": ("HTTPGetAction", False)},
}


def knative_errors(pod_spec: dict[str, Any]) -> list[str]:
    """What Knative's webhook refuses in a Revision's PodSpec under the default features (tests/data/knative)."""
    errors: list[str] = []

    def masked(kind: str, value: dict[str, Any], where: str) -> None:
        rule = KNATIVE["allowed_fields"][kind]
        for key, item in value.items():
            if key not in rule["fields"] or (key in rule.get("only_false", []) and item is not False):
                errors.append(f"{where}.{key}: must not set")
            elif key in SUBOBJECTS.get(kind, {}):
                sub, is_list = SUBOBJECTS[kind][key]
                for i, one in enumerate(item if is_list else [item]):
                    masked(sub, one, f"{where}.{key}[{i}]" if is_list else f"{where}.{key}")

    masked("PodSpec", pod_spec, "spec")
    mounted = {m["name"] for c in pod_spec.get("containers", []) for m in c.get("volumeMounts", [])}
    declared = {v["name"] for v in pod_spec.get("volumes", [])}
    errors += [f"volume with name {name!r} not mounted" for name in sorted(declared - mounted)]
    errors += [f"volumeMount {name!r} has no matching volume" for name in sorted(mounted - declared)]
    for c in pod_spec.get("containers", []):
        errors += [f"{e['name']!r} is a reserved environment variable" for e in c.get("env", []) if e["name"] in KNATIVE["reserved_env"]["names"]]
        port = (c.get("ports") or [{}])[0]
        if c.get("ports"):
            if port.get("name", "") not in KNATIVE["user_port"]["names"] or port.get("protocol", "") not in KNATIVE["user_port"]["protocols"]:
                errors.append(f"port {port} is not a user port")
            if port["containerPort"] in KNATIVE["reserved_ports"]["ports"]:
                errors.append(f"port {port['containerPort']} is reserved")
        for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
            get = (c.get(probe_name) or {}).get("httpGet")
            if get and isinstance(get["port"], str) and get["port"] != port.get("name"):
                errors.append(f"{probe_name}: Probe port must match container port")
        probe = c.get("readinessProbe") or {}
        if probe.get("periodSeconds", 10) > 0 and (probe.get("timeoutSeconds", 1) < 1 or probe.get("failureThreshold", 3) < 1):
            errors.append("readinessProbe: timeoutSeconds and failureThreshold must be at least 1")
        for key in ("runAsUser", "runAsGroup"):
            value = (c.get("securityContext") or {}).get(key)
            if value is not None and not KNATIVE["id_bounds"]["min"] <= value <= KNATIVE["id_bounds"]["max"]:
                errors.append(f"securityContext.{key} out of bounds")
    return errors


def _predictor() -> dict[str, Any]:
    return next(o for o in _kserve_objects() if o["kind"] == "InferenceService")["spec"]["predictor"]


def _revision_pod_spec(predictor: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in predictor.items() if k not in KSERVE_COMPONENT_FIELDS}


def test_the_inferenceservice_declares_serverless_and_passes_knatives_rules() -> None:
    isvc = next(o for o in _kserve_objects() if o["kind"] == "InferenceService")
    mode = (isvc["metadata"].get("annotations") or {}).get("serving.kserve.io/deploymentMode", "Serverless")
    assert mode == "Serverless"
    assert knative_errors(_revision_pod_spec(isvc["spec"]["predictor"])) == []


@pytest.mark.parametrize("break_it, expected", [
    (lambda p: p.update(securityContext={"runAsNonRoot": True}), "spec.securityContext: must not set"),
    (lambda p: p.update(terminationGracePeriodSeconds=90), "spec.terminationGracePeriodSeconds: must not set"),
    (lambda p: p.update(automountServiceAccountToken=True), "spec.automountServiceAccountToken: must not set"),
    (lambda p: p["volumes"].append({"name": "specbundle-registry", "secret": {"secretName": "specbundle-registry"}}),
     "volume with name 'specbundle-registry' not mounted"),
    (lambda p: p["containers"][0].update(lifecycle={"preStop": {"sleep": {"seconds": 5}}}), "spec.containers[0].lifecycle: must not set"),
    (lambda p: p["containers"][0]["ports"][0].update(name="http"), "is not a user port"),
    (lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["NET_ADMIN"]), "capabilities.add: must not set"),
    (lambda p: p["containers"][0]["env"].append({"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}), "valueFrom.fieldRef: must not set"),
    (lambda p: p["containers"][0]["livenessProbe"]["httpGet"].update(port="metrics"), "Probe port must match"),
])
def test_knatives_rules_catch_what_the_old_manifest_did(break_it, expected: str) -> None:
    pod_spec = _revision_pod_spec(json.loads(json.dumps(_predictor())))
    break_it(pod_spec)
    assert any(expected in e for e in knative_errors(pod_spec)), knative_errors(pod_spec)


def _arg(args: list[str], flag: str) -> int:
    return int(args[args.index(flag) + 1])


def test_kserve_concurrency_follows_serves_batch_and_queue() -> None:
    """queue-proxy lets in at most what serve decodes plus what it queues (no 429 from serve), and the autoscaler
    adds a pod when more than serve decodes at once are in flight."""
    predictor = _predictor()
    args = predictor["containers"][0]["args"]
    assert predictor["containerConcurrency"] == _arg(args, "--sequences") + _arg(args, "--max-queue")
    assert predictor["scaleMetric"] == "concurrency" and predictor["scaleTarget"] == _arg(args, "--sequences")
    assert predictor["timeout"] > DRAIN_LIMIT_S  # Knative's grace period is the Revision's timeout


def test_kserve_scrapes_the_port_serve_exposes_metrics_on() -> None:
    isvc = next(o for o in _kserve_objects() if o["kind"] == "InferenceService")
    notes, main = isvc["metadata"]["annotations"], isvc["spec"]["predictor"]["containers"][0]
    assert notes["serving.kserve.io/enable-metric-aggregation"] == "true"
    assert notes["prometheus.kserve.io/port"] == str(main["ports"][0]["containerPort"]) and notes["prometheus.kserve.io/path"] == "/metrics"
    assert "prometheus.io/port" not in notes  # KServe's webhook sets it to the aggregation port (9088)
    assert "--open-probes" in main["args"]  # queue-proxy scrapes without the API key


def test_kserve_predictor_probes_bundle_reference_and_model_name() -> None:
    isvc = next(o for o in _kserve_objects() if o["kind"] == "InferenceService")
    main = isvc["spec"]["predictor"]["containers"][0]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert re.fullmatch(r"bundle://[a-z0-9.-]+/[a-z0-9/._-]+@sha256:[0-9a-f]{64}", env["STORAGE_URI"])
    assert env["BUNDLE_EXPECT"] == "$(STORAGE_URI)" and env["BUNDLE_SERVED_MODEL_NAME"] == isvc["metadata"]["name"]
    assert main["startupProbe"]["httpGet"]["path"] == main["readinessProbe"]["httpGet"]["path"] == "/health"
    assert main["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert isvc["spec"]["predictor"]["automountServiceAccountToken"] is False
    keys = next(v for v in isvc["spec"]["predictor"]["volumes"] if v["name"] == "specbundle-trusted-keys")
    assert "secret" in keys


@pytest.mark.parametrize("where", ["predictor", "storage-initializer"])
def test_kserve_containers_meet_pod_security_restricted(where: str) -> None:
    """PSS "restricted", container by container: non-root, no privilege escalation, every capability dropped, the
    runtime's seccomp profile (Knative refuses these at pod level)."""
    objects = {o["kind"]: o for o in _kserve_objects()}
    c = objects["InferenceService"]["spec"]["predictor"]["containers"][0] if where == "predictor" else objects["ClusterStorageContainer"]["spec"]["container"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0 and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert sc["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost") and sc["readOnlyRootFilesystem"] is True


def test_the_storage_initializer_gets_registry_credentials_without_a_volume_and_claims_both_schemes() -> None:
    csc = next(o for o in _kserve_objects() if o["kind"] == "ClusterStorageContainer")["spec"]
    env = {e["name"]: e for e in csc["container"]["env"]}
    for name in ("BUNDLE_REGISTRY_USER", "BUNDLE_REGISTRY_PASSWORD"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "specbundle-registry"
    predictor_volumes = {v["name"] for v in _predictor()["volumes"]}
    assert {m["name"] for m in csc["container"]["volumeMounts"]} <= predictor_volumes
    assert [f["prefix"] for f in csc["supportedUriFormats"]] == ["bundle://", "kit://"]
