"""Interop with another ModelPack implementation, `modelpack-client` (PyPI 0.1.0), through a real registry: it
pulls and validates a bundle we pushed (its pull is a runtime-style layout, which our evidence check accepts),
and a bundle it pushed (no Kitfile: roles from the file paths) pulls, signs, verifies and runs here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundler.store.layout import Store
from bundler.store.modelkit import load_modelkit
from bundler.store.refs import parse_ref
from bundler.trust.keys import key_id, load_public_key
from bundler.verbs.fetch import fetch
from bundler.verbs.fromdir import checked_dir, parse_expected
from conftest import run_bundle
from registry_server import Registry, registry  # noqa: F401  (fixture)
from tests.tinymodels import make_pair

modelpack_client = pytest.importorskip("modelpack_client")  # the test extra (pyproject.toml)

RAW = "application/vnd.cncf.model.{}.v1.raw"


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "docker").mkdir(exist_ok=True)
    return {"DOCKER_CONFIG": str(tmp_path / "docker"), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""}


def test_modelpack_client_pulls_our_bundle_into_a_layout_our_check_accepts(
        tmp_path: Path, keypair: tuple[Path, Path], registry: Registry) -> None:  # noqa: F811
    make_pair(tmp_path / "ctx")
    ref = f"{registry.host}/interop/tiny-spec:1.0.0"
    run_bundle("pack", str(tmp_path / "ctx"), "-t", ref, "--format", "modelpack", "--key", str(keypair[0]), "--store", str(tmp_path / "s"), check=True)
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "s"), env=_env(tmp_path), check=True)
    pulled = modelpack_client.ModelPackClient(insecure=True).pull(ref, tmp_path / "theirs")  # validates manifest and config
    files = sorted(p.relative_to(tmp_path / "theirs").as_posix() for p in pulled.files)
    mk = load_modelkit(Store(tmp_path / "s"), parse_ref(ref))
    assert files == sorted(desc.filepath for _, desc in mk.layers)
    trusted = {key_id(load_public_key(keypair[1])): load_public_key(keypair[1])}
    fetch(Store(tmp_path / "fs"), ref, tmp_path / "evidence", trusted, plain_http=True, evidence_only=True)
    checked = checked_dir(tmp_path / "theirs", trusted, expect=parse_expected(ref), evidence=tmp_path / "evidence")
    assert checked.digest == mk.digest


def test_a_bundle_modelpack_client_pushed_verifies_and_runs_here(
        tmp_path: Path, keypair: tuple[Path, Path], registry: Registry) -> None:  # noqa: F811
    from modelpack_client import ModelDescriptor, ModelLayer, ModelPackConfig

    ctx = tmp_path / "ctx"
    make_pair(ctx)
    layers = []
    for path in sorted(p for p in ctx.rglob("*") if p.is_file() and p.name != "Kitfile"):
        name = path.relative_to(ctx).as_posix()
        kind = "weight" if name.endswith(".safetensors") else "doc" if name == "README.md" else "weight.config"
        layers.append(ModelLayer(path=path, media_type=RAW.format(kind), artifact_path=name))
    ref = f"{registry.host}/theirs/tiny-spec:1.0.0"
    config = ModelPackConfig(descriptor=ModelDescriptor(name="tiny-spec", version="1.0.0"))
    speculative = json.dumps({"draft_tokens": 4, "min_acceptance": 0.0})
    pushed = modelpack_client.ModelPackClient(insecure=True).push(ref, layers, config, annotations={"specbundle.dev/speculative": speculative})
    store = str(tmp_path / "s")
    run_bundle("pull", ref, "--plain-http", "--allow-unsigned", "--store", store, env=_env(tmp_path), check=True)
    run_bundle("sign", ref, "--key", str(keypair[0]), "--store", store, check=True)
    report = json.loads(run_bundle("verify", ref, "--key", str(keypair[1]), "--json", "--store", store, check=True).out)
    assert report["digest"] == pushed.digest
    out = json.loads(run_bundle("run", ref, "--prompt", "the quick brown fox", "--max-new-tokens", "8", "--key", str(keypair[1]),
                                "--store", store, "--json", check=True).out)
    assert out["bundle"]["digest"] == pushed.digest and out["tokens"]
