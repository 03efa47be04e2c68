"""deploy/admission's ValidatingAdmissionPolicy, its CEL evaluated with cel-python (tests/admission.py) (Google's CEL, as the API server
evaluates it): the shipped Deployment and InferenceService pass; a pod that would serve a bundle unpinned, without
the verifying init container, bound to another reference, or with --allow-unsigned is refused. And the Kyverno
ClusterPolicy's image extractors (kept for Kyverno < 1.18), applied as Kyverno's source applies them (pkg/utils/api/image.go at the commit in
tests/data/crds/SOURCES.json), name exactly the reference the manifests pin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import jmespath
import jmespath.functions
import pytest
import yaml

from tests.admission import VAP_FILE, admit, inferenceservice
from tests.admission import deployment as rendered_deployment

ROOT = Path(__file__).resolve().parent.parent
POLICY_FILE = VAP_FILE
KYVERNO = ROOT / "docs" / "policies" / "kyverno-clusterpolicy-before-1.18.yaml"  # the ClusterPolicy, Kyverno < 1.18


def _policy() -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d and d["kind"] == "ValidatingAdmissionPolicy")


def _deployment() -> dict[str, Any]:
    return rendered_deployment()


def _isvc() -> dict[str, Any]:
    return inferenceservice()


def _containers(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]["predictor"]


def _env(container: dict[str, Any], name: str) -> dict[str, Any]:
    return next(e for e in container["env"] if e["name"] == name)


@pytest.mark.parametrize("overlay", [(), ("gguf",), ("bundle-ref",), ("vllm",)], ids=lambda o: "base" if not o else o[0])
def test_the_shipped_deployments_are_admitted(overlay: tuple[str, ...]) -> None:
    assert admit(rendered_deployment(*overlay)) == []


def test_the_shipped_inferenceservice_is_admitted() -> None:
    assert admit(_isvc()) == []


def _set_annotation(d: dict[str, Any], value: str) -> None:
    d["spec"]["template"]["metadata"]["annotations"]["specbundle.bundle-ref"] = value


def _drop_init(d: dict[str, Any]) -> None:
    d["spec"]["template"]["spec"].pop("initContainers")


def _init_allow_unsigned(d: dict[str, Any]) -> None:
    d["spec"]["template"]["spec"]["initContainers"][0]["args"].append("--allow-unsigned")


def _serve_literal_ref(d: dict[str, Any]) -> None:
    d["spec"]["template"]["spec"]["containers"][0]["args"][1] = "registry.example.com/models/other:1.0.0"


def _init_literal_env(d: dict[str, Any]) -> None:
    _env(d["spec"]["template"]["spec"]["initContainers"][0], "BUNDLE_REF").update(
        value="registry.example.com/models/other:1.0.0", valueFrom=None)
    _env(d["spec"]["template"]["spec"]["initContainers"][0], "BUNDLE_REF").pop("valueFrom")


def _init_not_pull(d: dict[str, Any]) -> None:
    d["spec"]["template"]["spec"]["initContainers"][0]["args"] = ["inspect", "$(BUNDLE_REF)"]


def _serve_through_command(d: dict[str, Any]) -> None:
    main = d["spec"]["template"]["spec"]["containers"][0]
    main["command"] = ["bundle", "serve", "registry.example.com/models/other:1.0.0", "--allow-unsigned"]
    main.pop("args")


BROKEN_DEPLOYMENTS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "tag-not-digest": (lambda d: _set_annotation(d, "registry.example.com/models/smollm2-spec:1.0.0"), "pinned by digest"),
    "short-digest": (lambda d: _set_annotation(d, "registry.example.com/models/smollm2-spec@sha256:abcd"), "pinned by digest"),
    "no-annotation": (lambda d: d["spec"]["template"]["metadata"]["annotations"].pop("specbundle.bundle-ref"), "pinned by digest"),
    "no-init-container": (_drop_init, "no init container"),
    "init-not-a-pull": (_init_not_pull, "no init container"),
    "init-literal-ref": (_init_literal_env, "no init container"),
    "init-allow-unsigned": (_init_allow_unsigned, "--allow-unsigned"),
    "serve-another-ref": (_serve_literal_ref, "serve must serve $(BUNDLE_REF)"),
    "serve-via-command": (_serve_through_command, "--allow-unsigned"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_DEPLOYMENTS))
def test_a_broken_deployment_is_refused(case: str) -> None:
    break_it, message = BROKEN_DEPLOYMENTS[case]
    deployment = _deployment()
    break_it(deployment)
    refused = admit(deployment)
    assert any(message in m for m in refused), refused


def _isvc_uri(value: str) -> Callable[[dict[str, Any]], None]:
    return lambda i: _env(i["spec"]["predictor"]["containers"][0], "STORAGE_URI").update(value=value)


BROKEN_ISVCS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "tag-not-digest": (_isvc_uri("bundle://registry.example.com/models/smollm2-spec:1.0.0"), "pinned by digest"),
    "another-scheme": (_isvc_uri("s3://bucket/models/smollm2-spec@sha256:" + "0" * 64), "bundle:// or kit://"),
    "allow-unsigned": (lambda i: i["spec"]["predictor"]["containers"][0]["args"].append("--allow-unsigned"), "--allow-unsigned"),
    "no-expect": (lambda i: i["spec"]["predictor"]["containers"][0]["env"].remove(_env(i["spec"]["predictor"]["containers"][0], "BUNDLE_EXPECT")), "BUNDLE_EXPECT"),
    "expect-elsewhere": (lambda i: _env(i["spec"]["predictor"]["containers"][0], "BUNDLE_EXPECT").update(value="sha256:" + "1" * 64), "BUNDLE_EXPECT"),
    "expect-flag": (lambda i: i["spec"]["predictor"]["containers"][0]["args"].extend(["--expect", "other:1"]), "BUNDLE_EXPECT"),
    "another-storage-container": (lambda i: i["spec"]["predictor"].update(storageContainerName="default"), "ClusterStorageContainer"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_ISVCS))
def test_a_broken_inferenceservice_is_refused(case: str) -> None:
    break_it, message = BROKEN_ISVCS[case]
    isvc = _isvc()
    break_it(isvc)
    refused = admit(isvc)
    assert any(message in m for m in refused), refused


def test_kit_scheme_is_admitted_and_unrelated_deployments_are_left_alone() -> None:
    isvc = _isvc()
    uri = _env(isvc["spec"]["predictor"]["containers"][0], "STORAGE_URI")
    uri["value"] = uri["value"].replace("bundle://", "kit://")
    assert admit(isvc) == []
    other = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
             "spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx", "args": ["--allow-unsigned"]}]}}}}
    assert admit(other) == []


def test_what_kserve_and_knative_render_is_not_checked_again() -> None:
    """Their Deployments carry no init container (KServe adds the storage initializer to the pod): the
    InferenceService was the object checked."""
    deployment = _deployment()
    _drop_init(deployment)
    assert admit(deployment, {"username": "system:serviceaccount:knative-serving:controller"}) == []
    assert admit(deployment) != []


# -- Kyverno's image extractors ----------------------------------------------------------------------
class _KyvernoFunctions(jmespath.functions.Functions):
    @jmespath.functions.signature({"types": ["string"]}, {"types": ["string"]})
    def _func_trim_prefix(self, value: str, prefix: str) -> str:  # Kyverno's trim_prefix (strings.TrimPrefix)
        return value[len(prefix):] if value.startswith(prefix) else value


def _extract(obj: Any, fields: list[str], key: str, value: str, jmes: str, out: dict[str, str], path: tuple = ()) -> None:
    """Kyverno's extract (pkg/utils/api/image.go): `*` walks a list or map, the last field holds the value."""
    if obj is None:
        return
    if fields and fields[0] == "*":
        items = enumerate(obj) if isinstance(obj, list) else obj.items()
        for k, v in items:
            _extract(v, fields[1:], key, value, jmes, out, path + (str(k),))
        return
    assert isinstance(obj, dict), "invalid image config"
    if fields:
        _extract(obj.get(fields[0]), fields[1:], key, value, jmes, out, path + (fields[0],))
        return
    found = obj.get(value)
    if not isinstance(found, str) or not found.strip():
        return
    if jmes:
        found = jmespath.search(jmes, found, options=jmespath.Options(custom_functions=_KyvernoFunctions()))
        assert isinstance(found, str), f"jmespath {jmes} must produce a string"
    out[obj[key] if key else "/" + "/".join(path) + "/" + value] = found


def kyverno_references(obj: dict[str, Any]) -> set[str]:
    """The references Kyverno's verifyImages rule sees in obj (before its imageReferences filter)."""
    rule = yaml.safe_load(KYVERNO.read_text())["spec"]["rules"][0]
    out: dict[str, str] = {}
    for ext in rule["imageExtractors"][obj["kind"]]:
        fields = [f for f in ext["path"].split("/") if f.strip()]
        value = ext.get("value") or fields.pop()
        _extract(obj, fields, ext.get("key", ""), value, ext.get("jmesPath", ""), out)
    return set(out.values())


def _filtered(refs: set[str]) -> set[str]:
    import fnmatch

    patterns = yaml.safe_load(KYVERNO.read_text())["spec"]["rules"][0]["verifyImages"][0]["imageReferences"]
    return {r for r in refs if any(fnmatch.fnmatch(r, p) for p in patterns)}


def test_kyverno_verifies_the_reference_the_deployment_pins() -> None:
    deployment = _deployment()
    pinned = deployment["spec"]["template"]["metadata"]["annotations"]["specbundle.bundle-ref"]
    assert _filtered(kyverno_references(deployment)) == {pinned}
    pod = {"kind": "Pod", "metadata": deployment["spec"]["template"]["metadata"], "spec": deployment["spec"]["template"]["spec"]}
    assert _filtered(kyverno_references(pod)) == {pinned}


def test_kyverno_verifies_the_reference_the_inferenceservice_pins() -> None:
    isvc = _isvc()
    uri = _env(isvc["spec"]["predictor"]["containers"][0], "STORAGE_URI")["value"]
    assert uri.startswith("bundle://")
    assert _filtered(kyverno_references(isvc)) == {uri.removeprefix("bundle://")}
    uri_kit = uri.replace("bundle://", "kit://")
    _env(isvc["spec"]["predictor"]["containers"][0], "STORAGE_URI")["value"] = uri_kit
    assert _filtered(kyverno_references(isvc)) == {uri.removeprefix("bundle://")}
    # The pod KServe creates carries the same env in kserve-container.
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": isvc["spec"]["predictor"]["containers"]}}
    assert _filtered(kyverno_references(pod)) == {uri.removeprefix("bundle://")}


def test_the_admission_policy_is_valid_kubernetes() -> None:
    import kubernetes_validate

    for doc in yaml.safe_load_all(POLICY_FILE.read_text()):
        kubernetes_validate.validate(doc, "1.32.0", strict=True)
    json.dumps(_policy())  # plain data, nothing YAML-specific
