"""deploy/admission's ValidatingAdmissionPolicy decides on what each container will actually execute (`command` +
`args`, env, the mounts of the trusted keys, the image), on every object that can run a pod and on the pod itself.
Each bypass of issue 45 is tried here against the shipped manifests as rendered and refused; the shipped objects,
under every workload kind and as the Pods Kubernetes and KServe make of them, are admitted. The CEL is evaluated
with cel-python (tests/admission.py)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any, Callable

import pytest
import yaml

from tests.admission import (DIGEST, ROOT, admit, as_kind, deployment, env, inferenceservice, kserve_pod, pod_of,
                             pod_spec)

OTHER = "registry.example.com/models/other@sha256:" + "1" * 64
COMMAND = "overrides the image's entrypoint"
KEYS = "trusted keys must come only from the Secret"
IMAGE = "runs the specbundle image pinned by digest"
Break = Callable[[dict[str, Any]], None]


def _main(obj: dict[str, Any]) -> dict[str, Any]:
    return pod_spec(obj)["containers"][0]


def _init(obj: dict[str, Any]) -> dict[str, Any]:
    return pod_spec(obj)["initContainers"][0]


def _shell(script: str) -> Break:
    def apply(obj: dict[str, Any]) -> None:
        _main(obj).update(command=["sh", "-c", script])
        _main(obj).pop("args", None)
    return apply


def _second_container(image: str, args: list[str]) -> Break:
    def apply(obj: dict[str, Any]) -> None:
        extra = {**_main(obj), "name": "another", "image": image, "args": args}
        pod_spec(obj)["containers"].append(extra)
    return apply


def _mount(path: str, volume: str = "tmp") -> Break:
    return lambda obj: _main(obj)["volumeMounts"].append({"name": volume, "mountPath": path})


def _flag_from_env(obj: dict[str, Any]) -> None:
    _main(obj)["env"].append({"name": "EXTRA", "value": "--allow-unsigned"})
    _main(obj)["args"].append("$(EXTRA)")


def _ephemeral(obj: dict[str, Any]) -> None:
    pod_spec(obj)["ephemeralContainers"] = [{"name": "debug", "image": _main(obj)["image"], "args": ["serve", OTHER]}]


def _annotation(value: str) -> Break:
    return lambda d: d["spec"]["template"]["metadata"]["annotations"].update({"specbundle.bundle-ref": value})


DEPLOYMENT_BYPASSES: dict[str, tuple[Break, str]] = {
    # issue 45: "command: [sh, -c, 'exec bundle serve OTHER@sha256:... --key /elsewhere/k.pub']"
    "command-serves-another-bundle": (_shell(f"exec bundle serve {OTHER} --key /elsewhere/k.pub"), COMMAND),
    "command-is-bundle-itself": (lambda d: _main(d).update(command=["bundle"]), COMMAND),
    "init-neutralised-with-true": (lambda d: _init(d).update(command=["true"]), COMMAND),
    "allow-unsigned-in-a-shell-string": (_shell("exec bundle serve $(BUNDLE_REF) --allow-unsigned"), "--allow-unsigned"),
    "allow-unsigned-from-an-env-var": (_flag_from_env, "--allow-unsigned"),
    "second-container-serves-another-bundle": (_second_container("specbundle@" + DIGEST, ["serve", OTHER]), "serve must serve $(BUNDLE_REF)"),
    "second-container-of-another-image": (_second_container("registry.example.com/tools/runner:1", ["serve", OTHER]), IMAGE),
    "serve-from-a-directory": (lambda d: _main(d)["args"].extend(["--from-dir", "/tmp"]), "serve must serve $(BUNDLE_REF)"),
    "key-flag-to-another-volume": (lambda d: _main(d)["args"].extend(["--key", "/elsewhere/k.pub"]), KEYS),
    "key-flag-on-the-init-container": (lambda d: _init(d)["args"].append("--key=/tmp/k.pub"), KEYS),
    "trusted-keys-env-elsewhere": (lambda d: env(_main(d), "BUNDLE_TRUSTED_KEYS").update(value="/tmp/keys"), KEYS),
    "trusted-keys-env-twice": (lambda d: _main(d)["env"].append({"name": "BUNDLE_TRUSTED_KEYS", "value": "/tmp"}), KEYS),
    "trusted-keys-from-a-configmap": (lambda d: next(v for v in pod_spec(d)["volumes"] if v["name"] == "trusted-keys").update(
        secret={"secretName": "someone-elses-keys"}), KEYS),
    "a-key-mounted-under-the-keys": (_mount("/etc/specbundle/keys/extra.pub"), KEYS),
    "a-mount-over-the-keys": (_mount("/etc/specbundle"), KEYS),
    "env-from-a-configmap": (lambda d: _main(d).update(envFrom=[{"configMapRef": {"name": "x"}}]), KEYS),
    "another-env-var-in-args": (lambda d: _main(d)["args"].append("$(HOME)"), "refer to no env var"),
    "image-by-tag": (lambda d: _main(d).update(image="specbundle:0.1.0"), IMAGE),
    "image-tag-beside-digest": (lambda d: _main(d).update(image="specbundle:0.1.0@" + DIGEST), IMAGE),
    "bundle-tag-beside-digest": (_annotation("registry.example.com/models/smollm2-spec:2.0.0@" + DIGEST), "no tag beside it"),
}


@pytest.mark.parametrize("case", sorted(DEPLOYMENT_BYPASSES))
def test_a_deployment_bypass_is_refused(case: str) -> None:
    break_it, message = DEPLOYMENT_BYPASSES[case]
    d = deployment()
    break_it(d)
    refused = admit(d)
    assert any(message in m for m in refused), refused


@pytest.mark.parametrize("case", ["command-serves-another-bundle", "init-neutralised-with-true", "key-flag-to-another-volume",
                                  "image-by-tag", "bundle-tag-beside-digest"])
def test_the_same_bypass_is_refused_on_the_pod_itself(case: str) -> None:
    """Whatever made the pod (a kind of workload not listed, an operator), the Pod is checked."""
    break_it, message = DEPLOYMENT_BYPASSES[case]
    d = deployment()
    break_it(d)
    assert any(message in m for m in admit(pod_of(d))), admit(pod_of(d))


def test_a_debug_container_cannot_join_a_serving_pod() -> None:
    pod = pod_of(deployment())
    _ephemeral(pod)
    assert any("ephemeral" in m for m in admit(pod))


KINDS = ["Pod", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController", "Job", "CronJob"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_workload_kind_is_checked(kind: str) -> None:
    """The shipped pod template under each kind is admitted; with the entrypoint overridden, it is refused."""
    assert admit(as_kind(deployment(), kind)) == []
    d = deployment()
    _shell(f"exec bundle serve {OTHER} --allow-unsigned")(d)
    refused = admit(as_kind(d, kind))
    assert any(COMMAND in m for m in refused) and any("--allow-unsigned" in m for m in refused), refused


# -- KServe -------------------------------------------------------------------------------------------
def _model(isvc: dict[str, Any]) -> None:
    isvc["spec"]["predictor"] = {"model": {"modelFormat": {"name": "specbundle"}, "runtime": "specbundle",
                                           "storageUri": "bundle://" + OTHER}}


def _transformer(isvc: dict[str, Any]) -> None:
    isvc["spec"]["transformer"] = {"containers": [{"name": "kserve-container", "image": "specbundle@" + DIGEST,
                                                   "command": ["sh", "-c", f"bundle serve {OTHER} --port 8080"]}]}


ISVC_BYPASSES: dict[str, tuple[Break, str]] = {
    "predictor-command": (_shell(f"exec bundle serve {OTHER} --key /elsewhere/k.pub"), COMMAND),
    "predictor-allow-unsigned-in-shell": (_shell("bundle serve --from-dir /mnt/models --allow-unsigned"), "--allow-unsigned"),
    "a-transformer": (_transformer, "only predictor containers"),
    "predictor-model-with-a-serving-runtime": (_model, "only predictor containers"),
    "storage-uri-tag-beside-digest": (lambda i: env(_main(i), "STORAGE_URI").update(
        value="bundle://registry.example.com/models/smollm2-spec:2.0.0@" + DIGEST), "no tag beside it"),
    "predictor-second-container": (_second_container("registry.example.com/tools/runner:1", []), IMAGE),
    "predictor-init-container": (lambda i: i["spec"]["predictor"].update(initContainers=[
        {"name": "seed", "image": "specbundle@" + DIGEST, "args": ["fetch", "bundle://" + OTHER, "/mnt/models"]}]), "storage initializer"),
    "predictor-key-flag": (lambda i: _main(i)["args"].extend(["--key", "/tmp/k.pub"]), KEYS),
    "predictor-image-by-tag": (lambda i: _main(i).update(image="specbundle:0.1.0"), IMAGE),
}


@pytest.mark.parametrize("case", sorted(ISVC_BYPASSES))
def test_an_inferenceservice_bypass_is_refused(case: str) -> None:
    break_it, message = ISVC_BYPASSES[case]
    isvc = inferenceservice()
    break_it(isvc)
    refused = admit(isvc)
    assert any(message in m for m in refused), refused


def test_a_serving_runtime_that_runs_specbundle_is_refused() -> None:
    runtime = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ClusterServingRuntime", "metadata": {"name": "specbundle"},
               "spec": {"supportedModelFormats": [{"name": "specbundle"}],
                        "containers": [{"name": "kserve-container", "image": "specbundle@" + DIGEST,
                                        "args": ["serve", "--from-dir", "/mnt/models", "--allow-unsigned"]}]}}
    assert any("ServingRuntime" in m for m in admit(runtime))
    unrelated = {**runtime, "spec": {"containers": [{"name": "kserve-container", "image": "kserve/sklearnserver:v0.14"}]}}
    assert admit(unrelated) == []


def test_the_pod_kserve_makes_is_admitted() -> None:
    assert admit(kserve_pod()) == []


def _storage_init(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["initContainers"][0]


KSERVE_POD_BYPASSES: dict[str, tuple[Break, str]] = {
    "storage-initializer-neutralised": (lambda p: _storage_init(p).update(command=["true"]), COMMAND),
    "storage-initializer-removed": (lambda p: p["spec"].pop("initContainers"), "storage initializer"),
    "storage-initializer-fetches-another-bundle": (lambda p: _storage_init(p).update(args=["bundle://" + OTHER, "/mnt/models"]), "storage initializer"),
    "an-init-container-before-it": (lambda p: p["spec"]["initContainers"].insert(0, {"name": "seed", "image": "busybox@" + DIGEST,
                                                                                      "args": ["cp", "-r", "/x", "/mnt/models"]}), IMAGE),
    "queue-proxy-of-another-image": (lambda p: p["spec"]["containers"][1].update(image="registry.example.com/q:1"), IMAGE),
    "serve-command": (_shell(f"exec bundle serve {OTHER}"), COMMAND),
}


@pytest.mark.parametrize("case", sorted(KSERVE_POD_BYPASSES))
def test_a_kserve_pod_bypass_is_refused(case: str) -> None:
    break_it, message = KSERVE_POD_BYPASSES[case]
    pod = kserve_pod()
    break_it(pod)
    refused = admit(pod)
    assert any(message in m for m in refused), refused


# -- what stays out of scope ------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["bundle", "exec", "puma"], ["nginx", "-g", "daemon off;"]], ids=["ruby-bundler", "nginx"])
def test_pods_that_name_no_bundle_are_left_alone(command: list[str]) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
           "spec": {"containers": [{"name": "web", "image": "ruby:3.3", "command": command, "args": ["--ca-bundle", "/etc/ssl"]}]}}
    assert admit(pod) == []


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) is not installed")
@pytest.mark.parametrize("directory", ["deploy/kubernetes/base", "deploy/kubernetes/overlays/gguf",
                                       "deploy/kubernetes/overlays/bundle-ref", "deploy/kubernetes/overlays/allow-rollback",
                                       "deploy/kserve"])
def test_what_kustomize_renders_is_admitted(directory: str) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(ROOT / directory)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    objects = [o for o in yaml.safe_load_all(out.stdout) if o]
    workloads = [o for o in objects if o["kind"] in ("Deployment", "InferenceService")]
    assert workloads
    for obj in workloads:
        assert admit(obj) == [], obj["kind"]
        if obj["kind"] == "Deployment":
            assert admit(pod_of(obj)) == []
