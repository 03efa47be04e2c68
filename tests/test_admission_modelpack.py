"""The admission policies on KServe's two paths without a ClusterStorageContainer (deploy/kserve/modelpack/): the
InferenceService whose predictor serves a ModelPack bundle from an `oci+native://` image volume, and the
LLMInferenceService that fetches its bundle in an init container. The shipped objects (and the Pods KServe makes of
them) are admitted by every shipped policy and their bundle verified by Kyverno's; each bypass family that
tests/test_admission_bypasses.py tries on the Deployment is tried on these two shapes and refused by the
ValidatingAdmissionPolicy and by Kyverno's ValidatingPolicy (the same rules; both evaluated here).

The Pod KServe 0.20 makes of an `oci+native://` predictor is modelled as KServe's docs describe it: the predictor's
pod spec and annotations, plus an image volume of the reference (kserve-provision-location) mounted read-only at
/mnt/models (subPath models, the artefact's models/ directory) in the serving container."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import yaml

from tests.admission import (DIGEST, KYVERNO_SHAPE, ROOT, Signed, admit, documents, env, ivp_admit, vap_spec)

MODELPACK = ROOT / "deploy" / "kserve" / "modelpack"
IMAGE_PIN = "specbundle@" + DIGEST
OTHER = "registry.example.com/models/other@sha256:" + "1" * 64
SBOM, PROVENANCE = "https://cyclonedx.org/bom", "https://slsa.dev/provenance/v1"

ENTRY = "overrides the image's entrypoint"
IMAGE = "runs the specbundle image pinned by digest"
UNSIGNED = "--allow-unsigned"
KEYS = "the trusted keys must come only from the Secret"
ANNOTATION = "the pod annotation specbundle.bundle-ref must name"
URI = "every STORAGE_URI of a pod that serves a bundle"
IV_SERVE = "from an image volume, the predictor runs serve"
IV_INIT = "from an image volume, the init containers"
IV_VOLUMES = "every image volume is the annotation's bundle"
LLM = "an LLMInferenceService that serves a bundle"
FETCH = "the pod must fetch STORAGE_URI before serve starts"
DIR_SERVE = "the predictor must run serve --from-dir with BUNDLE_EXPECT"


def _shipped(kind: str) -> dict[str, Any]:
    names = yaml.safe_load((MODELPACK / "kustomization.yaml").read_text())["resources"]
    return copy.deepcopy(next(d for n in names for d in documents(MODELPACK / n) if d["kind"] == kind))


def oci_isvc() -> dict[str, Any]:
    return _shipped("InferenceService")


def llm() -> dict[str, Any]:
    return _shipped("LLMInferenceService")


def oci_pod(isvc: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Pod KServe makes of the oci+native predictor: its annotations and pod spec, the image volume added."""
    predictor = copy.deepcopy((isvc or oci_isvc())["spec"]["predictor"])
    main = predictor["containers"][0]
    ref = env(main, "STORAGE_URI")["value"].removeprefix("oci+native://")
    main["volumeMounts"].append({"name": "kserve-provision-location", "mountPath": "/mnt/models", "subPath": "models", "readOnly": True})
    spec = {k: predictor[k] for k in ("initContainers", "containers", "volumes", "automountServiceAccountToken")}
    spec["volumes"].append({"name": "kserve-provision-location", "image": {"reference": ref, "pullPolicy": "IfNotPresent"}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "smollm2-spec-modelpack-predictor-x", "annotations": predictor["annotations"]},
            "spec": spec}


def llm_pod(obj: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Pod of the LLMInferenceService's workload: its spec.template."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "smollm2-spec-llm-kserve-x"},
            "spec": copy.deepcopy((obj or llm())["spec"]["template"])}


SHIPPED: dict[str, Callable[[], dict[str, Any]]] = {
    "oci-native-inferenceservice": oci_isvc, "oci-native-pod": oci_pod, "llminferenceservice": llm, "llm-pod": llm_pod}


def _refused(obj: dict[str, Any]) -> list[list[str]]:
    """What the ValidatingAdmissionPolicy and Kyverno's ValidatingPolicy (kyverno-pod-shape.yaml) answer."""
    return [admit(obj), admit(obj, spec=documents(KYVERNO_SHAPE)[0]["spec"])]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_shipped_modelpack_objects_and_their_pods_are_admitted(name: str) -> None:
    assert _refused(SHIPPED[name]()) == [[], []]


@pytest.mark.parametrize("policy", [vap_spec, lambda: documents(KYVERNO_SHAPE)[0]["spec"],
                                    lambda: documents(ROOT / "docs" / "policies" / "kyverno-verify-bundles.yaml")[0]["spec"]],
                         ids=["vap", "kyverno-shape", "kyverno-signatures"])
def test_every_policy_matches_llminferenceservices(policy: Callable[[], dict[str, Any]]) -> None:
    rules = policy()["matchConstraints"]["resourceRules"]
    assert any("llminferenceservices" in r["resources"] and r["apiGroups"] == ["serving.kserve.io"]
               and {"v1alpha1", "v1alpha2"} <= set(r["apiVersions"]) for r in rules)


# -- the image-volume InferenceService ------------------------------------------------------------------
def _predictor(i: dict[str, Any]) -> dict[str, Any]:
    return i["spec"]["predictor"] if i["kind"] == "InferenceService" else i["spec"]


def _serve(i: dict[str, Any]) -> dict[str, Any]:
    return _predictor(i)["containers"][0]


def _evidence_init(i: dict[str, Any]) -> dict[str, Any]:
    return _predictor(i)["initContainers"][0]


def _annotations(i: dict[str, Any]) -> dict[str, str]:
    return i["spec"]["predictor"]["annotations"] if i["kind"] == "InferenceService" else i["metadata"]["annotations"]


def _second_server(storage_uri: str) -> Callable[[dict[str, Any]], None]:
    def add(i: dict[str, Any]) -> None:
        second = copy.deepcopy(_serve(i))
        second["name"] = "second"
        env(second, "STORAGE_URI")["value"] = storage_uri
        second["args"] = ["serve", OTHER, "--port", "8081"]
        _predictor(i)["containers"].append(second)
    return add


def _retag(i: dict[str, Any]) -> None:
    tagged = OTHER.replace("@", ":2.0.0@").replace("other", "smollm2-spec").replace("1" * 64, "0" * 64)
    _annotations(i)["specbundle.bundle-ref"] = tagged
    env(_serve(i), "STORAGE_URI")["value"] = "oci+native://" + tagged


def _keys_volume_to_configmap(i: dict[str, Any]) -> None:
    volume = next(v for v in _predictor(i)["volumes"] if v["name"] == "specbundle-trusted-keys")
    volume.pop("secret")
    volume["configMap"] = {"name": "attacker-keys"}


def _evidence_from_configmap(i: dict[str, Any]) -> None:
    volume = next(v for v in _predictor(i)["volumes"] if v["name"] == "evidence")
    volume.pop("emptyDir")
    volume["configMap"] = {"name": "crafted-evidence"}


def _drop_init(i: dict[str, Any]) -> None:
    _predictor(i)["initContainers"] = []


IMAGE_VOLUME_BYPASSES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "command-override": (lambda i: _serve(i).update(command=["sh", "-c", f"exec bundle serve --from-dir /mnt --expect {OTHER}"]), ENTRY),
    "second-serving-container": (_second_server("oci+native://" + OTHER), IV_SERVE),
    "second-container-of-another-image": (lambda i: _predictor(i)["containers"].append(
        {"name": "runner", "image": "registry.example.com/tools/runner:1", "args": ["serve", OTHER]}), IMAGE),
    "verifier-neutralised-by-command": (lambda i: _evidence_init(i).update(command=["true"]), ENTRY),
    "verifier-does-something-else": (lambda i: _evidence_init(i).update(args=["fetch", "--evidence-only", OTHER, "/evidence"]), IV_INIT),
    "verifier-removed": (_drop_init, IV_INIT),
    "allow-unsigned-on-serve": (lambda i: _serve(i)["args"].append("--allow-unsigned"), UNSIGNED),
    "allow-unsigned-in-a-shell-string": (lambda i: _evidence_init(i).update(command=["sh", "-c", "bundle fetch --allow-unsigned x /evidence"]), UNSIGNED),
    "allow-unsigned-from-an-env-var": (lambda i: _serve(i)["env"].append({"name": "EXTRA", "value": "--allow-unsigned"}), UNSIGNED),
    "tag-beside-the-digest": (_retag, ANNOTATION),
    "image-by-tag": (lambda i: _serve(i).update(image="specbundle:0.1.0"), IMAGE),
    "storage-uri-names-another-bundle": (lambda i: env(_serve(i), "STORAGE_URI").update(value="oci+native://" + OTHER), IV_SERVE),
    "expect-names-another-bundle": (lambda i: env(_serve(i), "BUNDLE_EXPECT").update(value=OTHER, valueFrom=None), IV_SERVE),
    "expect-flag": (lambda i: _serve(i)["args"].extend(["--expect", OTHER]), IV_SERVE),
    "serve-another-directory": (lambda i: _serve(i)["args"].__setitem__(2, "/tmp"), IV_SERVE),
    "keys-flag": (lambda i: _serve(i)["args"].extend(["--key", "/tmp/k.pub"]), KEYS),
    "keys-env-elsewhere": (lambda i: env(_serve(i), "BUNDLE_TRUSTED_KEYS").update(value="/tmp/keys"), KEYS),
    "keys-from-another-volume": (_keys_volume_to_configmap, KEYS),
    "evidence-from-another-volume": (_evidence_from_configmap, IV_VOLUMES),
}


def _unset(obj: Any) -> Any:
    """Drop the keys a case set to None (a field removed)."""
    if isinstance(obj, dict):
        return {k: _unset(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_unset(v) for v in obj]
    return obj


@pytest.mark.parametrize("on", ["inferenceservice", "pod"])
@pytest.mark.parametrize("case", sorted(IMAGE_VOLUME_BYPASSES))
def test_an_image_volume_bypass_is_refused(case: str, on: str) -> None:
    break_it, message = IMAGE_VOLUME_BYPASSES[case]
    obj = oci_isvc() if on == "inferenceservice" else oci_pod()
    break_it(obj)
    for refused in _refused(_unset(obj)):
        assert any(message in m for m in refused), refused


def test_an_image_volume_of_another_bundle_is_refused() -> None:
    pod = oci_pod()
    next(v for v in pod["spec"]["volumes"] if "image" in v)["image"]["reference"] = OTHER
    for refused in _refused(pod):
        assert any(IV_VOLUMES in m for m in refused), refused


def test_an_image_volume_outside_the_image_volume_shape_is_refused() -> None:
    pod = llm_pod()
    pod["spec"]["volumes"].append({"name": "extra", "image": {"reference": OTHER}})
    for refused in _refused(pod):
        assert any("an image volume joins a pod that serves a bundle only" in m for m in refused), refused


# -- the LLMInferenceService ----------------------------------------------------------------------------
def _llm_spec(o: dict[str, Any]) -> dict[str, Any]:
    return o["spec"]["template"] if o["kind"] == "LLMInferenceService" else o["spec"]


def _llm_serve(o: dict[str, Any]) -> dict[str, Any]:
    return _llm_spec(o)["containers"][0]


def _llm_fetch(o: dict[str, Any]) -> dict[str, Any]:
    return _llm_spec(o)["initContainers"][0]


def _llm_second_server(o: dict[str, Any]) -> None:
    second = copy.deepcopy(_llm_serve(o))
    second["name"] = "second"
    env(second, "STORAGE_URI")["value"] = "bundle://" + OTHER
    _llm_spec(o)["containers"].append(second)


def _llm_retag(o: dict[str, Any]) -> None:
    tagged = "bundle://registry.example.com/models/smollm2-spec:2.0.0@" + DIGEST
    for c in (_llm_serve(o), _llm_fetch(o)):
        env(c, "STORAGE_URI")["value"] = tagged
    if o["kind"] == "LLMInferenceService":
        o["spec"]["model"]["uri"] = tagged


def _llm_keys_to_configmap(o: dict[str, Any]) -> None:
    volume = next(v for v in _llm_spec(o)["volumes"] if v["name"] == "specbundle-trusted-keys")
    volume.pop("secret")
    volume["configMap"] = {"name": "attacker-keys"}


LLM_BYPASSES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "command-override": (lambda o: _llm_serve(o).update(command=["sh", "-c", f"exec bundle serve {OTHER}"]), ENTRY),
    "second-serving-container": (_llm_second_server, FETCH),
    "second-container-of-another-image": (lambda o: _llm_spec(o)["containers"].append(
        {"name": "runner", "image": "registry.example.com/tools/runner:1", "args": ["serve", OTHER]}), IMAGE),
    "verifier-neutralised-by-command": (lambda o: _llm_fetch(o).update(command=["true"]), ENTRY),
    "verifier-does-something-else": (lambda o: _llm_fetch(o).update(args=["version"]), FETCH),
    "verifier-removed": (lambda o: _llm_spec(o).update(initContainers=[]), FETCH),
    "verifier-fetches-another-bundle": (lambda o: env(_llm_fetch(o), "STORAGE_URI").update(value="bundle://" + OTHER), FETCH),
    "allow-unsigned-on-serve": (lambda o: _llm_serve(o)["args"].append("--allow-unsigned"), UNSIGNED),
    "allow-unsigned-in-a-shell-string": (lambda o: _llm_fetch(o).update(command=["sh", "-c", "bundle fetch --allow-unsigned x /mnt/models"]), UNSIGNED),
    "allow-unsigned-from-an-env-var": (lambda o: _llm_serve(o)["env"].append({"name": "EXTRA", "value": "--allow-unsigned"}), UNSIGNED),
    "tag-beside-the-digest": (_llm_retag, URI),
    "image-by-tag": (lambda o: _llm_serve(o).update(image="specbundle:0.1.0"), IMAGE),
    "serve-expects-another-bundle": (lambda o: env(_llm_serve(o), "BUNDLE_EXPECT").update(value=OTHER), DIR_SERVE),
    "storage-uri-by-tag": (lambda o: [env(c, "STORAGE_URI").update(value="bundle://registry.example.com/models/smollm2-spec:1.0.0")
                                      for c in (_llm_serve(o), _llm_fetch(o))], URI),
    "keys-flag": (lambda o: _llm_serve(o)["args"].extend(["--key", "/tmp/k.pub"]), KEYS),
    "keys-env-elsewhere": (lambda o: env(_llm_fetch(o), "BUNDLE_TRUSTED_KEYS").update(value="/tmp/keys"), KEYS),
    "keys-from-another-volume": (_llm_keys_to_configmap, KEYS),
}


@pytest.mark.parametrize("on", ["llminferenceservice", "pod"])
@pytest.mark.parametrize("case", sorted(LLM_BYPASSES))
def test_an_llminferenceservice_bypass_is_refused(case: str, on: str) -> None:
    break_it, message = LLM_BYPASSES[case]
    obj = llm() if on == "llminferenceservice" else llm_pod()
    break_it(obj)
    for refused in _refused(obj):
        assert any(message in m for m in refused), refused


def _worker(o: dict[str, Any]) -> None:
    o["spec"]["worker"] = {"containers": [{"name": "worker", "image": IMAGE_PIN, "args": ["serve", OTHER]}]}


def _prefill(o: dict[str, Any]) -> None:
    o["spec"]["prefill"] = {"template": {"containers": [{"name": "main", "image": "registry.example.com/vllm:1", "command": ["vllm", "serve"]}]}}


LLM_SHAPES: dict[str, Callable[[dict[str, Any]], None]] = {
    "a-worker-pod-spec": _worker,
    "a-prefill-pod-spec": _prefill,
    "kserves-storage-initializer-on": lambda o: o["spec"].update(storageInitializer={"enabled": True}),
    "model-uri-names-another-bundle": lambda o: o["spec"]["model"].update(uri="bundle://" + OTHER),
    "model-uri-of-another-scheme": lambda o: o["spec"]["model"].update(uri="hf://someone/model"),
    "lora-adapters": lambda o: o["spec"]["model"].update(lora={"adapters": [{"name": "a", "uri": "hf://x/y"}]}),
    "base-refs": lambda o: o["spec"].update(baseRefs=[{"name": "kserve-config-llm-template"}]),
}


@pytest.mark.parametrize("case", sorted(LLM_SHAPES))
def test_an_llminferenceservice_outside_the_checked_shape_is_refused(case: str) -> None:
    o = llm()
    LLM_SHAPES[case](o)
    for refused in _refused(o):
        assert any(LLM in m for m in refused), refused


def test_a_bundle_served_only_by_a_worker_is_seen() -> None:
    """No bundle in spec.template or spec.model: the worker's container alone makes the object one that serves."""
    o = llm()
    o["spec"]["model"]["uri"] = "hf://someone/model"
    o["spec"]["template"] = {"containers": [{"name": "main", "image": "registry.example.com/vllm:1"}]}
    o["spec"]["worker"] = {"containers": [{"name": "w", "image": IMAGE_PIN, "args": ["serve", OTHER]}]}
    for refused in _refused(o):
        assert refused and any(LLM in m for m in refused), refused


# -- Kyverno's signature check sees the bundle reference on both ----------------------------------------
def _signed(*refs: str) -> Signed:
    signed = Signed()
    for ref in refs:
        signed.sign(ref, predicates=(SBOM, PROVENANCE))
    return signed


def _ref(name: str) -> str:
    obj = SHIPPED[name]()
    if name.startswith("oci"):
        return _annotations(obj)["specbundle.bundle-ref"]
    return llm()["spec"]["model"]["uri"].removeprefix("bundle://")


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_kyverno_verifies_the_bundle_each_modelpack_object_names(name: str) -> None:
    ref = _ref(name)
    signed = _signed(ref)
    assert ivp_admit(SHIPPED[name](), signed) == [] and signed.asked == {ref}
    assert any("not signed" in m for m in ivp_admit(SHIPPED[name](), Signed()))


@pytest.mark.parametrize("where", ["storage-uri", "image-volume", "model-uri"])
def test_kyverno_verifies_every_bundle_named_beside_the_shipped_one(where: str) -> None:
    ref = _ref("llminferenceservice")
    if where == "storage-uri":
        obj = oci_isvc()
        env(_serve(obj), "STORAGE_URI")["value"] = "oci+native://" + OTHER
    elif where == "image-volume":
        obj = oci_pod()
        obj["spec"]["volumes"].append({"name": "second", "image": {"reference": OTHER}})
    else:
        obj = llm()
        obj["spec"]["model"]["uri"] = "bundle://" + OTHER
    signed = _signed(ref)
    assert any("not signed" in m for m in ivp_admit(obj, signed)) and OTHER in signed.asked
    assert ivp_admit(obj, _signed(ref, OTHER)) == []


@pytest.mark.parametrize("name", sorted(set(SHIPPED) - {"llminferenceservice"}))
def test_the_deprecated_clusterpolicy_sees_the_reference_on_both_paths(name: str) -> None:
    """docs/policies/kyverno-clusterpolicy-before-1.18.yaml (Kyverno < 1.18): its image extractors hand the pinned
    reference to verifyImages on each path (an LLMInferenceService itself is not matched there: its Pods are)."""
    from tests.test_admission_policy import _filtered, kyverno_references

    assert _filtered(kyverno_references(SHIPPED[name]())) == {_ref(name)}


def test_a_predictor_annotation_naming_another_bundle_is_refused_on_the_storage_initializer_path() -> None:
    """deploy/kserve's InferenceService (by directory) with a predictor annotation: the pods would carry a second
    name for the bundle, so it is held to the by-reference shape, which it does not have."""
    from tests.admission import inferenceservice

    isvc = inferenceservice()
    isvc["spec"]["predictor"]["annotations"] = {"specbundle.bundle-ref": OTHER}
    for refused in _refused(isvc):
        assert any("serve must serve $(BUNDLE_REF)" in m for m in refused), refused
