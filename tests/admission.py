"""The admission policies of deploy/admission/ and docs/policies/, evaluated as their controllers evaluate them, and
the objects they are asked about: the shipped manifests as rendered (kustomize's `images:` applied), and the Pods
that Kubernetes and KServe make of them.

The CEL runs in cel-python (Google's CEL). What cel-python lacks and both Kubernetes and Kyverno provide is added
with the same meaning: `substring` (cel-go's strings extension). Kyverno's own image-verification functions
(`verifyImageSignatures`, `verifyAttestationSignatures`) reach a registry; here they answer from a table of what is
signed (`Signed`), and record which references the policy asked about: the test is of the policy's CEL (which
references it verifies, with which attestor, for which predicate type), not of cosign.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import celpy
import yaml

from tests.fleet import BASE, OVERLAYS, Manifests, kustomization
from tests.test_manifests import _kserve_objects, _kserve_vllm_objects

ROOT = Path(__file__).resolve().parent.parent
VAP_FILE = ROOT / "deploy" / "admission" / "validatingadmissionpolicy.yaml"
KYVERNO_IVP = ROOT / "docs" / "policies" / "kyverno-verify-bundles.yaml"
KYVERNO_SHAPE = ROOT / "docs" / "policies" / "kyverno-pod-shape.yaml"
USER = {"username": "alice", "groups": ["system:authenticated"]}
DIGEST = "sha256:" + "0" * 64
QUEUE_PROXY = "gcr.io/knative-releases/knative.dev/serving/cmd/queue@sha256:" + "9" * 64


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def vap_spec() -> dict[str, Any]:
    return next(d for d in documents(VAP_FILE) if d["kind"] == "ValidatingAdmissionPolicy")["spec"]


# -- CEL ----------------------------------------------------------------------------------------------
def _substring(s: Any, start: Any, end: Any = None) -> celpy.celtypes.StringType:
    """cel-go's strings extension: code-point indices, an error out of range."""
    text = str(s)
    stop = len(text) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(text):
        raise ValueError(f"substring({start}, {end}) out of range for {len(text)} characters")
    return celpy.celtypes.StringType(text[int(start):stop])


FUNCTIONS: dict[str, Callable[..., Any]] = {"substring": _substring}


@functools.lru_cache(maxsize=None)
def _compiled(expression: str) -> Any:
    """The parse tree of an expression, parsed once per test session (the policies' expressions repeat)."""
    return celpy.Environment().compile(expression)


def cel(expression: str, activation: dict[str, Any], functions: dict[str, Callable[..., Any]] | None = None) -> Any:
    env = celpy.Environment()
    result = env.program(_compiled(expression), functions={**FUNCTIONS, **(functions or {})}).evaluate(activation)
    if isinstance(result, celpy.CELEvalError):
        raise AssertionError(f"{expression!r}: {result}")
    return result


def _cel_map(values: dict[str, Any]) -> celpy.celtypes.MapType:
    return celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in values.items()})


def variables(spec: dict[str, Any], activation: dict[str, Any], functions: dict[str, Callable[..., Any]] | None = None) -> dict[str, Any]:
    """The variables in order, each seeing those before it (as the API server and Kyverno compose them)."""
    out: dict[str, Any] = {}
    for var in spec.get("variables", []):
        activation["variables"] = _cel_map(out)
        out[var["name"]] = cel(var["expression"], activation, functions)
    activation["variables"] = _cel_map(out)
    return out


def admit(obj: dict[str, Any], user: dict[str, Any] = USER, spec: dict[str, Any] | None = None) -> list[str]:
    """The messages of the validations that fail (empty: admitted), as the API server runs a ValidatingAdmissionPolicy
    (or Kyverno a ValidatingPolicy): the match conditions, then the variables, then every validation."""
    spec = spec or vap_spec()
    activation: dict[str, Any] = {"object": celpy.json_to_cel(obj), "request": celpy.json_to_cel({"userInfo": user})}
    if not all(cel(c["expression"], activation) for c in spec.get("matchConditions", [])):
        return []
    variables(spec, activation)
    return [v["message"] for v in spec["validations"] if not bool(cel(v["expression"], activation))]


# -- Kyverno's ImageValidatingPolicy --------------------------------------------------------------------
_POD_SPEC = {"Pod": "object.spec", "CronJob": "object.spec.jobTemplate.spec.template.spec"}
_CONTROLLERS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


def _builtin_extractors(kind: str) -> dict[str, str]:
    """Kyverno's own extractors for pods and pod controllers (pkg/cel/compiler/images.go): containers[].image."""
    where = _POD_SPEC.get(kind) or ("object.spec.template.spec" if kind in _CONTROLLERS else None)
    if where is None:
        return {}
    return {name: f"has({where}.{name}) ? {where}.{name}.map(e, e.image) : []"
            for name in ("containers", "initContainers", "ephemeralContainers")}


@dataclass
class Signed:
    """What the registry holds: per bundle reference, the attestors that signed it and, per predicate type, the
    attestors that signed an attestation of that type. `asked` records every reference a policy verified."""

    signatures: dict[str, set[str]] = field(default_factory=dict)
    attestations: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    asked: set[str] = field(default_factory=set)

    def sign(self, ref: str, *, by: str = "publisher", predicates: tuple[str, ...] = ()) -> "Signed":
        self.signatures.setdefault(ref, set()).add(by)
        for p in predicates:
            self.attestations.setdefault(ref, {}).setdefault(p, set()).add(by)
        return self

    def functions(self, attestations: dict[str, str]) -> dict[str, Callable[..., Any]]:
        def verify_image(ref: Any, attestors: Any) -> celpy.celtypes.IntType:
            self.asked.add(str(ref))
            names = {str(a["name"]) for a in attestors}
            return celpy.celtypes.IntType(len(names & self.signatures.get(str(ref), set())))

        def verify_attestation(ref: Any, attestation: Any, attestors: Any) -> celpy.celtypes.IntType:
            self.asked.add(str(ref))
            names = {str(a["name"]) for a in attestors}
            signers = self.attestations.get(str(ref), {}).get(attestations[str(attestation)], set())
            return celpy.celtypes.IntType(len(names & signers))

        return {"verifyImageSignatures": verify_image, "verifyAttestationSignatures": verify_attestation}


def ivp_spec() -> dict[str, Any]:
    return documents(KYVERNO_IVP)[0]["spec"]


def ivp_admit(obj: dict[str, Any], signed: Signed, spec: dict[str, Any] | None = None) -> list[str]:
    """What Kyverno's ImageValidatingPolicy answers (pkg/image/verification/evaluator/policy.go at the commit in
    tests/data/crds/SOURCES.json): variables; images from the built-in and the policy's extractors, filtered by
    matchImageReferences (gobwas/glob: `*` crosses `/`); verifyDigest; the validations, stopping at the first that
    fails; then `required`: every matched image verified by a policy."""
    spec = spec or ivp_spec()
    # The attestors as a map of name to attestor; the attestations as name -> predicate type (Kyverno passes the name).
    attestations = {a["name"]: a["intoto"]["type"] for a in spec.get("attestations", [])}
    functions = signed.functions(attestations)
    activation: dict[str, Any] = {"object": celpy.json_to_cel(obj), "request": celpy.json_to_cel({"userInfo": USER})}
    variables(spec, activation, functions)
    extractors = {**_builtin_extractors(obj["kind"]), **{e["name"]: e["expression"] for e in spec.get("images", [])}}
    globs = [m["glob"] for m in spec.get("matchImageReferences", [])]
    images = {name: [str(i) for i in cel(expr, activation, functions) if not globs or any(fnmatch.fnmatchcase(str(i), g) for g in globs)]
              for name, expr in extractors.items()}
    matched = [i for imgs in images.values() for i in imgs]
    config = spec.get("validationConfigurations", {})
    if config.get("verifyDigest", True):
        undigested = [i for i in matched if "@sha256:" not in i]
        if undigested:
            return [f"image {undigested[0]} does not have a digest"]
    activation["images"] = celpy.json_to_cel(images)
    activation["attestors"] = celpy.json_to_cel({a["name"]: {"name": a["name"]} for a in spec["attestors"]})
    activation["attestations"] = celpy.json_to_cel({name: name for name in attestations})
    for v in spec["validations"]:
        if not bool(cel(v["expression"], activation, functions)):
            return [v["message"]]
    if config.get("required", True):
        missing = [i for i in matched if i not in signed.asked]
        if missing:
            return [f"image {missing[0]} is not verified: no policy performed a signature or attestation check on it"]
    return []


# -- the objects ----------------------------------------------------------------------------------------
def render_images(obj: dict[str, Any], images: list[dict[str, Any]]) -> dict[str, Any]:
    """kustomize's `images:` on the containers of a pod template: the name kept or replaced, then the tag or digest."""
    for spec in _pod_specs(obj):
        for c in spec.get("initContainers", []) + spec.get("containers", []):
            for rule in images:
                if c["image"].split("@")[0].split(":")[0] == rule["name"]:
                    name = rule.get("newName", rule["name"])
                    c["image"] = f"{name}@{rule['digest']}" if "digest" in rule else f"{name}:{rule['newTag']}"
    return obj


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "Pod":
        return [obj["spec"]]
    if obj["kind"] == "CronJob":
        return [obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    return [obj["spec"]["template"]["spec"]]


def deployment(*overlays: str) -> dict[str, Any]:
    """The Deployment of deploy/kubernetes as `kubectl kustomize` renders it (overlays applied, the image by digest:
    the base's `images:`, then each overlay's, as kustomize applies an overlay's on top of its base's)."""
    images = [*kustomization(BASE).get("images", [])]
    for name in overlays:
        images += kustomization(OVERLAYS / name).get("images", [])
    return render_images(copy.deepcopy(Manifests.load(*overlays).deployment), images)


def inferenceservice() -> dict[str, Any]:
    return copy.deepcopy(next(o for o in _kserve_objects() if o["kind"] == "InferenceService"))


def inferenceservice_vllm() -> dict[str, Any]:
    """deploy/kserve/vllm's InferenceService: vLLM's CPU engine behind `serve --from-dir --runtime vllm`."""
    return copy.deepcopy(next(o for o in _kserve_vllm_objects() if o["kind"] == "InferenceService"))


def storage_container() -> dict[str, Any]:
    return copy.deepcopy(next(o for o in _kserve_objects() if o["kind"] == "ClusterStorageContainer"))


def pod_of(workload: dict[str, Any]) -> dict[str, Any]:
    """The Pod a controller makes of a workload's template."""
    template = copy.deepcopy(workload["spec"]["template"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **template.get("metadata", {})}, "spec": template["spec"]}


def kserve_pod(isvc: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Pod KServe and Knative make of the InferenceService in Serverless mode: the predictor's containers, Knative's
    queue-proxy beside them, and KServe's storage initializer (the ClusterStorageContainer's container, args
    [STORAGE_URI, /mnt/models]) with the model volume it adds to both."""
    isvc = isvc or inferenceservice()
    predictor = copy.deepcopy(isvc["spec"]["predictor"])
    main = predictor["containers"][0]
    uri = next(e["value"] for e in main["env"] if e["name"] == "STORAGE_URI")
    model = {"name": "kserve-provision-location", "mountPath": "/mnt/models"}
    init = {**storage_container()["spec"]["container"], "args": [uri, "/mnt/models"]}
    init["volumeMounts"] = [*init["volumeMounts"], model]
    main["volumeMounts"] = [*main["volumeMounts"], {**model, "readOnly": True}]
    queue = {"name": "queue-proxy", "image": QUEUE_PROXY, "ports": [{"name": "queue-port", "containerPort": 8012}],
             "env": [{"name": "SERVING_NAMESPACE", "value": "default"}, {"name": "USER_PORT", "value": "8080"}]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "smollm2-spec-predictor-00001-deployment-x", "labels": {"serving.kserve.io/inferenceservice": "smollm2-spec"}},
            "spec": {"initContainers": [init], "containers": [*predictor["containers"], queue],
                     "volumes": [*predictor["volumes"], {"name": "kserve-provision-location", "emptyDir": {}}]}}


def as_kind(workload: dict[str, Any], kind: str) -> dict[str, Any]:
    """The Deployment's pod template under another workload kind (or as a bare Pod)."""
    template = copy.deepcopy(workload["spec"]["template"])
    meta = {"name": "specbundle"}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {**meta, **template["metadata"]}, "spec": template["spec"]}
    if kind == "CronJob":
        return {"apiVersion": "batch/v1", "kind": kind, "metadata": meta,
                "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template}}}}
    group = {"Job": "batch/v1", "ReplicationController": "v1"}.get(kind, "apps/v1")
    spec: dict[str, Any] = {"template": template}
    if kind != "Job" and kind != "ReplicationController":
        spec["selector"] = {"matchLabels": template["metadata"]["labels"]}
    if kind == "StatefulSet":
        spec["serviceName"] = "specbundle"
    return {"apiVersion": group, "kind": kind, "metadata": meta, "spec": spec}


def env(container: dict[str, Any], name: str) -> dict[str, Any]:
    return next(e for e in container["env"] if e["name"] == name)


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "InferenceService":
        return obj["spec"]["predictor"]
    return _pod_specs(obj)[0]

