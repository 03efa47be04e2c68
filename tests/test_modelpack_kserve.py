"""deploy/kserve/modelpack/: KServe's two paths without a ClusterStorageContainer. The manifests validate against
KServe 0.20's CRD schemas (tests/data/kserve/SOURCE.md) and Kubernetes' own pod schema, name the bundle pinned by
one digest in the forms the admission policy and `serve` read, and the layout the image-volume path serves (the
artefact's models/ directory mounted at /mnt/models, served from /mnt) checks against fetched evidence."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from bundler.store.layout import Store
from bundler.store.modelkit import load_modelkit
from bundler.store.refs import parse_ref
from bundler.trust.keys import key_id, load_private_key, load_public_key
from bundler.trust.sign import sign_modelkit
from bundler.verbs.fetch import fetch
from bundler.verbs.fromdir import checked_dir, parse_expected
from bundler.verbs.pack import pack_checked
from conftest import run_bundle
from registry_server import Registry, registry  # noqa: F401  (fixture)
from tests.fleet import ROOT
from tests.modelpackbuild import runtime_mount
from tests.test_manifests import KUBERNETES_VERSION, _strict
from tests.tinymodels import make_pair

DEPLOY = ROOT / "deploy" / "kserve" / "modelpack"
DATA = Path(__file__).parent / "data" / "kserve"
SCHEMAS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): DATA / "inferenceservice-v1beta1.schema.json.gz",
    ("serving.kserve.io/v1alpha2", "LLMInferenceService"): DATA / "llminferenceservice-v1alpha2.schema.json.gz",
}
# The admission policy's form of a pinned reference (deploy/admission/validatingadmissionpolicy.yaml).
PINNED_URI = re.compile(r"^(bundle|kit)://[a-z0-9][^@ ]*@sha256:[0-9a-f]{64}$")
PINNED_REF = re.compile(r"^[a-z0-9][^@ :]*(:[0-9]+)?[^@ ]*@sha256:[0-9a-f]{64}$")


def _objects() -> list[dict[str, Any]]:
    names = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    return [d for name in names for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _by_kind(kind: str) -> dict[str, Any]:
    return next(o for o in _objects() if o["kind"] == kind)


def _env(container: dict[str, Any], name: str) -> dict[str, Any]:
    return next(e for e in container["env"] if e["name"] == name)


@pytest.mark.parametrize("obj", _objects(), ids=lambda o: o["kind"])
def test_each_object_is_valid_against_kserves_crd_schema(obj: dict[str, Any]) -> None:
    data = json.loads(gzip.decompress(SCHEMAS[(obj["apiVersion"], obj["kind"])].read_bytes()))
    schema = _strict(data["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    jsonschema.validate(obj, schema, cls=jsonschema.Draft4Validator)
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}, KUBERNETES_VERSION, strict=True)


def test_the_pods_they_describe_are_valid_kubernetes_pods() -> None:
    llm = _by_kind("LLMInferenceService")["spec"]["template"]
    predictor = _by_kind("InferenceService")["spec"]["predictor"]
    pod_fields = ("initContainers", "containers", "volumes", "automountServiceAccountToken")
    for spec in (llm, {k: predictor[k] for k in pod_fields if k in predictor}):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}, KUBERNETES_VERSION, strict=True)


def test_the_llm_path_turns_kserves_initializer_off_and_fetches_the_pinned_bundle_itself() -> None:
    llm = _by_kind("LLMInferenceService")["spec"]
    assert llm["storageInitializer"] == {"enabled": False}
    init, main = llm["template"]["initContainers"][0], llm["template"]["containers"][0]
    uri = _env(init, "STORAGE_URI")["value"]
    assert PINNED_URI.match(uri) and llm["model"]["uri"] == uri == _env(main, "STORAGE_URI")["value"]
    assert init["args"] == ["fetch", "$(STORAGE_URI)", "/mnt/models"]
    assert main["args"][:3] == ["serve", "--from-dir", "/mnt/models"] and _env(main, "BUNDLE_EXPECT")["value"] == "$(STORAGE_URI)"


def test_the_image_volume_path_names_one_digest_for_kserve_and_for_the_checks() -> None:
    isvc = _by_kind("InferenceService")
    predictor = isvc["spec"]["predictor"]
    ref = predictor["annotations"]["specbundle.bundle-ref"]
    serve, init = predictor["containers"][0], predictor["initContainers"][0]
    assert PINNED_REF.match(ref)
    assert _env(serve, "STORAGE_URI")["value"] == "oci+native://" + ref
    for container in (serve, init):
        held = _env(container, "BUNDLE_EXPECT" if container is serve else "BUNDLE_REF")
        assert held["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['specbundle.bundle-ref']"
    assert init["args"] == ["fetch", "--evidence-only", "$(BUNDLE_REF)", "/evidence"]
    assert serve["args"][:5] == ["serve", "--from-dir", "/mnt", "--evidence", "/evidence"]
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"


def _models_kitfile(root: Path) -> None:
    """The Kitfile of make_pair with every entry under models/ (KServe's subPath of an image volume)."""
    text = (root / "Kitfile").read_text()
    for entry in ("target/", "draft/", "tokenizer/", "README.md"):
        text = text.replace(f"path: {entry}", f"path: models/{entry}")
    (root / "models").mkdir()
    for entry in ("target", "draft", "tokenizer", "README.md"):
        (root / entry).rename(root / "models" / entry)
    (root / "Kitfile").write_text(text)


def test_a_modelpack_under_models_checks_from_the_parent_of_kserves_mount(
        tmp_path: Path, keypair: tuple[Path, Path], registry: Registry) -> None:  # noqa: F811
    make_pair(tmp_path / "ctx")
    _models_kitfile(tmp_path / "ctx")
    ref = f"{registry.host}/kserve/tiny-spec:1.0.0"
    store = Store(tmp_path / "store")
    result, _ = pack_checked(tmp_path / "ctx", parse_ref(ref), store, fmt="modelpack")
    sign_modelkit(store, load_modelkit(store, parse_ref(ref)), load_private_key(keypair[0]),
                  {f.path: f.sha256 for f in result.files}, {f.path: f.role for f in result.files}, 30)
    (tmp_path / "docker").mkdir()
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "store"), check=True,
               env={"DOCKER_CONFIG": str(tmp_path / "docker"), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""})
    trusted = {key_id(load_public_key(keypair[1])): load_public_key(keypair[1])}
    fetch(Store(tmp_path / "fetch-store"), ref, tmp_path / "evidence", trusted, plain_http=True, evidence_only=True)
    volume = runtime_mount(tmp_path / "store", ref, tmp_path / "volume")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    volume.chmod(0o755)
    (volume / "models").rename(mnt / "models")  # KServe mounts the volume's models/ at /mnt/models; /mnt holds nothing else
    checked = checked_dir(mnt, trusted, expect=parse_expected(ref), evidence=tmp_path / "evidence")
    assert checked.digest == result.digest and set(checked.files) == {f.path for f in result.files}
    assert all(p.startswith("models/") for p in checked.files)
