"""`bundle pack --format modelpack`: one raw file per layer, reproducible, a config the specification's schema
accepts; signed, verified, run (both engines), pushed and pulled as a ModelKit is."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

from bundler.store.layout import Store
from bundler.store.modelkit import load_modelkit
from bundler.store.refs import parse_ref
from conftest import run_bundle
from registry_server import Registry, registry  # noqa: F401  (fixture)
from tests.modelpackbuild import CONFIG_SCHEMA
from tests.test_gguf_bench import gguf_context
from tests.tinymodels import make_pair

REF = "tiny-spec:1.0.0"
FILEPATH, TITLE, METADATA = "org.cncf.model.filepath", "org.opencontainers.image.title", "org.cncf.model.file.metadata+json"


def _pack(context: Path, store: Path, *extra: str, ref: str = REF) -> str:
    return run_bundle("pack", str(context), "-t", ref, "--store", str(store), *extra, check=True).out.strip().splitlines()[-1]


def _manifest(store: Path, digest: str) -> dict:
    return json.loads((store / "blobs" / "sha256" / digest[7:]).read_bytes())


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mp") / "ctx"
    make_pair(root, tokenizer_in_models=True)
    return root


def test_two_packs_of_the_same_context_give_the_same_manifest_digest(pair: Path, tmp_path: Path) -> None:
    first = _pack(pair, tmp_path / "a", "--format", "modelpack")
    copy = shutil.copytree(pair, tmp_path / "elsewhere")
    assert _pack(copy, tmp_path / "b", "--format", "modelpack") == first
    assert _pack(pair, tmp_path / "c") != first  # the ModelKit stays the default, another artefact


def test_each_file_is_one_raw_layer_placed_by_its_path(pair: Path, tmp_path: Path) -> None:
    manifest = _manifest(tmp_path / "s", _pack(pair, tmp_path / "s", "--format", "modelpack"))
    assert manifest["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"
    by_path = {layer["annotations"][FILEPATH]: layer for layer in manifest["layers"]}
    assert by_path["target/model.safetensors"]["mediaType"] == "application/vnd.cncf.model.weight.v1.raw"
    for path in ("target/config.json", "draft/tokenizer.json", "tokenizer/tokenizer.json"):
        assert by_path[path]["mediaType"] == "application/vnd.cncf.model.weight.config.v1.raw"
    assert by_path["README.md"]["mediaType"] == "application/vnd.cncf.model.doc.v1.raw"
    draft = by_path["draft/model.safetensors"]
    assert draft["annotations"][TITLE] == "draft/model.safetensors" and draft["annotations"]["specbundle.dev/role"] == "draft"
    metadata = json.loads(draft["annotations"][METADATA])
    assert metadata == {"name": "draft/model.safetensors", "mode": 0o644, "uid": 1000, "gid": 0, "size": draft["size"],
                        "mtime": "1970-01-01T00:00:00Z", "typeflag": ord("0")}
    assert draft["digest"] == "sha256:" + __import__("hashlib").sha256((pair / "draft" / "model.safetensors").read_bytes()).hexdigest()
    assert json.loads(manifest["annotations"]["specbundle.dev/speculative"]) == {"draft_tokens": 4, "min_acceptance": 0.0}
    assert "ml.kitops.modelkit.kitfile" in manifest["annotations"]


def test_the_config_satisfies_the_specs_schema_and_names_the_model(pair: Path, tmp_path: Path) -> None:
    manifest = _manifest(tmp_path / "s", _pack(pair, tmp_path / "s", "--format", "modelpack"))
    config = json.loads((tmp_path / "s" / "blobs" / "sha256" / manifest["config"]["digest"][7:]).read_bytes())
    jsonschema.validate(config, CONFIG_SCHEMA)
    assert config["descriptor"] == {"authors": ["specbundle tests"], "family": "llama", "name": "tiny-spec", "version": "1.0.0", "licenses": ["Apache-2.0"]}
    assert config["config"]["format"] == "safetensors" and config["config"]["precision"] == "float32"
    assert config["config"]["paramSize"].endswith("K")
    assert config["modelfs"] == {"type": "layers", "diffIds": [layer["digest"] for layer in manifest["layers"]]}


def _greedy(context: Path, tmp_path: Path, keypair: tuple[Path, Path], fmt: str) -> dict:
    store = tmp_path / fmt
    _pack(context, store, "--format", fmt, "--key", str(keypair[0]))
    run_bundle("verify", REF, "--key", str(keypair[1]), "--store", str(store), check=True)
    r = run_bundle("run", REF, "--prompt", "the quick brown fox", "--max-new-tokens", "12", "--raw", "--key", str(keypair[1]),
                   "--store", str(store), "--json", check=True)
    return json.loads(r.out)


def test_a_signed_modelpack_runs_with_the_modelkits_greedy_output(pair: Path, tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    modelpack, modelkit = _greedy(pair, tmp_path, keypair, "modelpack"), _greedy(pair, tmp_path, keypair, "modelkit")
    assert modelpack["engine"] == "torch" and modelpack["tokens"] and modelpack["tokens"] == modelkit["tokens"]
    assert modelpack["bundle"]["digest"] != modelkit["bundle"]["digest"]


def test_a_gguf_modelpack_runs_on_llama_cpp_with_the_modelkits_greedy_output(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    root = gguf_context(tmp_path / "ctx")
    modelpack, modelkit = _greedy(root, tmp_path, keypair, "modelpack"), _greedy(root, tmp_path, keypair, "modelkit")
    assert modelpack["engine"] == "llama.cpp" and modelpack["tokens"] and modelpack["tokens"] == modelkit["tokens"]
    manifest = _manifest(tmp_path / "modelpack", modelpack["bundle"]["digest"])
    config = json.loads((tmp_path / "modelpack" / "blobs" / "sha256" / manifest["config"]["digest"][7:]).read_bytes())
    assert config["config"]["format"] == "gguf" and config["descriptor"]["family"] == "llama"


def test_push_pull_tag_and_gc_carry_a_modelpack_and_skopeo_shows_what_a_runtime_needs(
        pair: Path, tmp_path: Path, keypair: tuple[Path, Path], registry: Registry) -> None:  # noqa: F811
    env = {"DOCKER_CONFIG": str(tmp_path), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""}
    ref = f"{registry.host}/mp/tiny-spec:1.0.0"
    digest = _pack(pair, tmp_path / "s1", "--format", "modelpack", "--key", str(keypair[0]), ref=ref)
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s1"), env=env, check=True)
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"], capture_output=True, check=True).stdout
    assert raw == (tmp_path / "s1" / "blobs" / "sha256" / digest[7:]).read_bytes()
    shown = json.loads(raw)
    assert shown["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    assert all(FILEPATH in layer["annotations"] and TITLE in layer["annotations"] for layer in shown["layers"])
    pulled = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "s2"), env=env, check=True)
    assert pulled.out.strip().splitlines()[-1] == digest
    report = json.loads(run_bundle("verify", ref, "--key", str(keypair[1]), "--json", "--store", str(tmp_path / "s2"), check=True).out)
    assert report["signature_kinds"] == ["cosign", "model-signing"]
    run_bundle("tag", ref, "tiny-spec:1.0.0", "--store", str(tmp_path / "s2"), check=True)
    run_bundle("rm", ref, "--store", str(tmp_path / "s2"), check=True)
    run_bundle("gc", "--store", str(tmp_path / "s2"), check=True)  # the bundle is still tagged: gc keeps every blob it needs
    assert load_modelkit(Store(tmp_path / "s2"), parse_ref(REF)).format == "modelpack"
    run_bundle("verify", REF, "--key", str(keypair[1]), "--store", str(tmp_path / "s2"), "--allow-ref-mismatch", check=True)


def test_a_modelpack_serves_the_modelkits_greedy_completion(pair: Path, tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    from tests.test_serve import Server

    modelkit = _greedy(pair, tmp_path, keypair, "modelkit")
    _pack(pair, tmp_path / "served", "--format", "modelpack", "--key", str(keypair[0]))
    server = Server(tmp_path / "served", keypair[1], "--sequences", "1")
    try:
        completion = server.client().completions.create(model=REF, prompt="the quick brown fox", max_tokens=12, temperature=0)
        digest = load_modelkit(Store(tmp_path / "served"), parse_ref(REF)).digest
        assert server.client().models.list().data[0].model_extra["specbundle"]["digest"] == digest
    finally:
        assert server.stop() == 0
    assert completion.choices[0].text == modelkit["text"]
