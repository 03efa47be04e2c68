"""vLLM's CPU engine deployed behind `bundle serve --runtime vllm` (issue 49's deploy point): the Deployment overlay
(deploy/kubernetes/overlays/vllm) and the KServe InferenceService (deploy/kserve/vllm) run `serve --from-dir
/mnt/models --runtime vllm --runtime-bin /opt/vllm/bin/python` after `bundle fetch`, with $HOME on an emptyDir and
the startup time vLLM needs; the admission policies, unchanged, admit both, and refuse the overlay's container in
the by-reference shape. Schema validity, Knative's rules for every InferenceService and kustomize builds:
tests/test_manifests.py; the Kyverno image verification of both: tests/test_kyverno_policy.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.admission import DIGEST, KYVERNO_SHAPE, admit, deployment, documents, env, inferenceservice_vllm, kserve_pod, pod_of
from tests.test_admission_policy import _filtered, kyverno_references
from tests.test_manifests import _revision_pod_spec, knative_errors

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = "/opt/vllm/bin/python"
REF = "registry.example.com/models/smollm2-spec@" + DIGEST


def _serves_vllm_from_the_fetched_directory(args: list[str]) -> None:
    assert args[:3] == ["serve", "--from-dir", "/mnt/models"]
    assert args[args.index("--runtime") + 1] == "vllm" and args[args.index("--runtime-bin") + 1] == VLLM_PYTHON


def _home_on_an_empty_dir(container: dict[str, Any], volumes: list[dict[str, Any]]) -> None:
    home = env(container, "HOME")["value"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == home)
    assert "emptyDir" in next(v for v in volumes if v["name"] == mount["name"])
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def _startup_s(container: dict[str, Any]) -> int:
    probe = container["startupProbe"]
    assert probe["httpGet"]["path"] == container["readinessProbe"]["httpGet"]["path"] == "/health"
    return probe["periodSeconds"] * probe["failureThreshold"]


def test_the_deployment_overlay_fetches_then_serves_the_directory_with_vllm() -> None:
    d = deployment("vllm")
    spec = d["spec"]["template"]["spec"]
    (init,), main = spec["initContainers"], spec["containers"][0]
    assert init["args"] == ["fetch", "$(STORAGE_URI)", "/mnt/models"]
    _serves_vllm_from_the_fetched_directory(main["args"])
    uri = env(main, "STORAGE_URI")["value"]
    assert uri == env(init, "STORAGE_URI")["value"] == "bundle://" + REF and env(main, "BUNDLE_EXPECT")["value"] == "$(STORAGE_URI)"
    models = {m["name"]: m for m in main["volumeMounts"]}["models"]
    assert models["mountPath"] == "/mnt/models" and models["readOnly"] is True
    assert {m["mountPath"]: m["name"] for m in init["volumeMounts"]}["/mnt/models"] == "models"
    _home_on_an_empty_dir(main, spec["volumes"])
    assert _startup_s(main) >= 600  # vLLM's 2-3 minutes on 2 cores, after serve's checks
    assert "specbundle.bundle-ref" not in d["spec"]["template"]["metadata"]["annotations"]  # the by-directory shape
    assert all(re.fullmatch(r"specbundle@sha256:[0-9a-f]{64}", c["image"]) for c in [init, main])


def test_the_inferenceservice_serves_the_fetched_directory_with_vllm_under_knatives_rules() -> None:
    isvc = inferenceservice_vllm()
    predictor = isvc["spec"]["predictor"]
    main = predictor["containers"][0]
    _serves_vllm_from_the_fetched_directory(main["args"])
    assert env(main, "BUNDLE_EXPECT")["value"] == "$(STORAGE_URI)" and env(main, "STORAGE_URI")["value"] == "bundle://" + REF
    assert env(main, "BUNDLE_SERVED_MODEL_NAME")["value"] == isvc["metadata"]["name"]
    _home_on_an_empty_dir(main, predictor["volumes"])
    assert _startup_s(main) >= 600
    args = main["args"]
    sequences, queue = int(args[args.index("--sequences") + 1]), int(args[args.index("--max-queue") + 1])
    assert predictor["containerConcurrency"] == sequences + queue and predictor["scaleTarget"] == sequences
    assert knative_errors(_revision_pod_spec(predictor)) == []


def test_the_admission_policies_admit_both_unchanged() -> None:
    shape = documents(KYVERNO_SHAPE)[0]["spec"]
    for obj in (deployment("vllm"), pod_of(deployment("vllm")), inferenceservice_vllm(), kserve_pod(inferenceservice_vllm())):
        assert admit(obj) == [] and admit(obj, spec=shape) == [], obj["kind"]


def test_with_the_annotation_kept_the_overlay_would_be_refused() -> None:
    """The overlay removes the base's annotation on purpose: with it, the pod is in the by-reference shape, where
    serve must serve $(BUNDLE_REF) from the pod's store, not a directory."""
    d = deployment("vllm")
    d["spec"]["template"]["metadata"]["annotations"]["specbundle.bundle-ref"] = REF
    assert any("serve must serve $(BUNDLE_REF)" in m for m in admit(d))


def test_kyvernos_older_clusterpolicy_verifies_the_overlays_bundle_at_its_pods() -> None:
    """Kyverno before 1.18 reads a Deployment's annotation only: the by-directory Deployment's bundle is verified
    where its pods are admitted (every container's STORAGE_URI)."""
    assert _filtered(kyverno_references(deployment("vllm"))) == set()
    pod = pod_of(deployment("vllm"))
    assert _filtered(kyverno_references(pod)) == {REF}


def test_the_manifests_name_the_python_the_image_installs_vllm_with() -> None:
    """`make image VLLM=1` puts vLLM's venv at /opt/vllm (deploy/Containerfile); the default image has none."""
    containerfile = (ROOT / "deploy" / "Containerfile").read_text()
    assert "ARG VLLM=0" in containerfile and "python3 -m venv /opt/vllm" in containerfile
    assert VLLM_PYTHON.startswith("/opt/vllm/")
    assert re.search(r'^VLLM=\$\{VLLM:-0\}', (ROOT / "deploy" / "image.sh").read_text(), re.M)
