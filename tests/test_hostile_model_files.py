"""Hostile model directories given to `init` and `pack`: links to system or private files, links upwards or between
cached repositories (real Hugging Face cache layouts), and metadata (tokenizer, config.json, safetensors headers)
that is huge, nested, of the wrong type or fuzzed: refused with one line and exit 6 before trust, nothing left
behind, no secret echoed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bundletree import make_tree
from conftest import run_bundle, tree_digest


SECRET = "registry-password-0123456789"


def _models(root: Path) -> dict[str, Path]:
    """Two model directories as downloaded (config.json, model.safetensors), and a tokenizer directory."""
    tree = make_tree(root / "made")
    return {"target": tree / "target", "draft": tree / "draft", "tokenizer": tree / "tokenizer", "root": root}


def _init(models: dict[str, Path], out: Path, target: Path | None = None, tokenizer: Path | None = None):
    return run_bundle("init", "--target", str(target or models["target"]), "--draft", str(models["draft"]),
                      "--tokenizer", str(tokenizer or models["tokenizer"]), "-o", str(out), "--name", "tiny",
                      env={"BUNDLE_HOME": str(models["root"] / "store")})


def _refused_link(result, out: Path, link: Path) -> None:
    """Exit 6, one line naming the link, nothing left at CONTEXT nor beside it, the secret nowhere."""
    assert result.code == 6, result.err
    assert result.err.startswith("error: [invalid-bundle] ") and len(result.err.strip().splitlines()) == 1, result.err
    assert str(link) in result.err and "outside" in result.err, result.err
    assert SECRET not in result.err + result.out
    assert not out.exists()
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.init-")]


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    return _models(tmp_path)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """A file outside every model directory, like ~/.docker/config.json."""
    path = tmp_path / "home" / ".docker" / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"auths": {"registry.example": {"auth": SECRET}}}))
    return path


@pytest.mark.parametrize("where", ["/proc/self/environ", "/etc/passwd", "/dev/zero", "/sys/kernel/mm/transparent_hugepage/enabled"])
def test_init_refuses_a_link_to_a_system_file(models: dict[str, Path], tmp_path: Path, where: str) -> None:
    link = models["target"] / "generation_config.json"
    link.symlink_to(where)
    out = tmp_path / "ctx"
    result = run_bundle("init", "--target", str(models["target"]), "--draft", str(models["draft"]),
                        "--tokenizer", str(models["tokenizer"]), "-o", str(out), "--name", "tiny",
                        env={"BUNDLE_HOME": str(tmp_path / "store"), "REGISTRY_PASSWORD": SECRET})
    _refused_link(result, out, link)
    assert where in result.err  # where the link leads, as written


def test_init_refuses_an_absolute_link_to_a_private_file(models: dict[str, Path], secret_file: Path, tmp_path: Path) -> None:
    link = models["target"] / "special_tokens_map.json"
    link.symlink_to(secret_file)
    _refused_link(_init(models, tmp_path / "ctx"), tmp_path / "ctx", link)


def test_init_refuses_a_link_upwards(models: dict[str, Path], secret_file: Path, tmp_path: Path) -> None:
    link = models["draft"] / "notes.json"
    link.symlink_to(os.path.relpath(secret_file, models["draft"]))
    _refused_link(_init(models, tmp_path / "ctx"), tmp_path / "ctx", link)


def test_init_refuses_a_link_in_the_tokenizer_directory(models: dict[str, Path], secret_file: Path, tmp_path: Path) -> None:
    link = models["tokenizer"] / "special_tokens_map.json"
    link.symlink_to(secret_file)
    _refused_link(_init(models, tmp_path / "ctx"), tmp_path / "ctx", link)


def test_init_never_walks_a_directory_link_leaving_the_tree(models: dict[str, Path], secret_file: Path, tmp_path: Path) -> None:
    link = models["target"] / "extra"
    link.symlink_to(secret_file.parent)  # a directory: its files would otherwise become target/extra/*
    _refused_link(_init(models, tmp_path / "ctx"), tmp_path / "ctx", link)


def test_init_follows_links_that_stay_inside(models: dict[str, Path], tmp_path: Path) -> None:
    (models["target"] / "weights").mkdir()
    os.rename(models["target"] / "model.safetensors", models["target"] / "weights" / "model.safetensors")
    (models["target"] / "model.safetensors").symlink_to(Path("weights", "model.safetensors"))
    (models["target"] / "same").symlink_to("weights")  # a directory link inside the tree
    out = tmp_path / "ctx"
    result = _init(models, out)
    assert result.code == 0, result.err
    assert (out / "target" / "model.safetensors").is_file() and not (out / "target" / "model.safetensors").is_symlink()
    assert (out / "target" / "same" / "model.safetensors").is_file()


def _cache_repo(hub: Path, name: str, source: Path) -> Path:
    """A Hugging Face hub cache repository as the hub writes it: blobs/<hash> and snapshots/<rev>/<file> links
    (relative, `../../blobs/<hash>`, one more `..` per subdirectory). Returns the snapshot directory."""
    repo = hub / f"models--org--{name}"
    snapshot = repo / "snapshots" / ("a1" * 20)
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a1" * 20)
    for i, src in enumerate(sorted(p for p in source.rglob("*") if p.is_file())):
        rel = src.relative_to(source)
        blob = repo / "blobs" / f"{i:064x}"
        shutil.copyfile(src, blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(*[".."] * (len(rel.parts) + 1), "blobs", blob.name))
    return snapshot


def test_init_reads_real_hugging_face_cache_snapshots(models: dict[str, Path], tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    (models["target"] / "sub").mkdir()
    (models["target"] / "sub" / "extra.json").write_text("{}")  # a file one directory down: ../../../blobs/
    target = _cache_repo(hub, "tiny-target", models["target"])
    tokenizer = _cache_repo(hub, "tiny-tokenizer", models["tokenizer"])
    out = tmp_path / "ctx"
    result = _init(models, out, target=target, tokenizer=tokenizer)
    assert result.code == 0, result.err
    assert (out / "target" / "sub" / "extra.json").read_text() == "{}"
    assert (out / "target" / "model.safetensors").read_bytes() == (models["target"] / "model.safetensors").read_bytes()
    assert not any(p.is_symlink() for p in out.rglob("*"))


def test_init_names_a_cache_snapshot_after_its_repository(models: dict[str, Path], tmp_path: Path) -> None:
    import yaml

    target = _cache_repo(tmp_path / "hub", "Tiny-Target", models["target"])
    out = tmp_path / "ctx"
    result = run_bundle("init", "--target", str(target), "--draft", str(models["draft"]), "--tokenizer", str(models["tokenizer"]),
                        "-o", str(out), env={"BUNDLE_HOME": str(tmp_path / "store")})
    assert result.code == 0, result.err
    kitfile = yaml.safe_load((out / "Kitfile").read_text())
    assert kitfile["package"]["name"] == "tiny-target" and kitfile["model"]["name"] == "tiny-target"  # not the revision hash


def test_init_refuses_a_cache_link_into_another_cached_repository(models: dict[str, Path], tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    target = _cache_repo(hub, "tiny-target", models["target"])
    other = _cache_repo(hub, "someone-else", models["draft"])
    stolen = next((other.parent.parent / "blobs").iterdir())
    link = target / "stolen.json"
    link.symlink_to(Path("..", "..", "..", other.parent.parent.name, "blobs", stolen.name))
    _refused_link(_init(models, tmp_path / "ctx", target=target), tmp_path / "ctx", link)


def test_init_refuses_a_cache_snapshot_link_to_a_system_file(models: dict[str, Path], tmp_path: Path) -> None:
    target = _cache_repo(tmp_path / "hub", "tiny-target", models["target"])
    link = target / "config.json"
    link.unlink()
    link.symlink_to("/proc/self/environ")
    _refused_link(_init(models, tmp_path / "ctx", target=target), tmp_path / "ctx", link)


def test_pack_refuses_a_kitfile_linked_from_outside_the_context(tmp_path: Path, secret_file: Path) -> None:
    tree = make_tree(tmp_path / "ctx")
    outside = tmp_path / "elsewhere" / "Kitfile"
    outside.parent.mkdir()
    os.rename(tree / "Kitfile", outside)
    (tree / "Kitfile").symlink_to(outside)
    store = tmp_path / "store"
    result = run_bundle("pack", str(tree), "-t", "tiny:1", "--store", str(store))
    assert result.code == 6, result.err
    assert result.err.startswith("error: [invalid-kitfile] ") and str(tree / "Kitfile") in result.err, result.err
    assert tree_digest(store / "blobs") == "absent"


def test_pack_refuses_a_linked_file_in_a_layer(tmp_path: Path, secret_file: Path) -> None:
    tree = make_tree(tmp_path / "ctx")
    (tree / "draft" / "generation_config.json").symlink_to(secret_file)
    store = tmp_path / "store"
    result = run_bundle("pack", str(tree), "-t", "tiny:1", "--store", str(store))
    assert result.code == 6, result.err
    assert "symlink" in result.err and SECRET not in result.err
    assert tree_digest(store / "blobs") == "absent"


def _hostile_context(root: Path, role: str, name: str, content: bytes) -> Path:
    tree = make_tree(root)
    (tree / role / name).write_bytes(content)
    return tree


def _tokenizer_with(change) -> bytes:
    from bundletree import tokenizer_json

    data = json.loads(tokenizer_json())
    change(data)
    return json.dumps(data).encode()


def _safetensors(header: bytes) -> bytes:
    import struct

    return struct.pack("<Q", len(header)) + header


HOSTILE_METADATA = {
    "huge-token-id": ("tokenizer", "tokenizer.json", _tokenizer_with(lambda d: d["model"]["vocab"].update(big=2 ** 40))),
    "negative-token-id": ("tokenizer", "tokenizer.json", _tokenizer_with(lambda d: d["model"]["vocab"].update(neg=-5))),
    "string-token-id": ("tokenizer", "tokenizer.json", _tokenizer_with(lambda d: d["model"]["vocab"].update(s="7"))),
    "added-token-huge-id": ("tokenizer", "tokenizer.json", _tokenizer_with(lambda d: d.update(added_tokens=[{"id": 2 ** 62, "content": "x"}]))),
    "tokenizer-nesting-bomb": ("tokenizer", "tokenizer.json", b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "tokenizer-deep-nesting": ("tokenizer", "tokenizer.json", b'{"normalizer": ' + b'{"a": ' * 200 + b"1" + b"}" * 200 + b"}"),
    "tokenizer-a-list": ("tokenizer", "tokenizer.json", b"[1, 2, 3]"),
    "model-a-string": ("tokenizer", "tokenizer.json", b'{"model": "BPE"}'),
    "merges-of-numbers": ("tokenizer", "tokenizer.json", _tokenizer_with(lambda d: d["model"].update(merges=[[1, 2]]))),
    "special-token-a-list": ("tokenizer", "tokenizer_config.json", b'{"bos_token": ["<s>"]}'),
    "tokenizer-config-a-list": ("tokenizer", "tokenizer_config.json", b"[]"),
    "config-a-list": ("target", "config.json", b"[]"),
    "config-hidden-size-a-string": ("draft", "config.json", json.dumps({"model_type": "llama", "hidden_size": "64", "vocab_size": 10,
                                                                         "num_hidden_layers": 1, "num_attention_heads": 2}).encode()),
    "config-text-config-a-list": ("target", "config.json", json.dumps({"model_type": "llama", "text_config": [1]}).encode()),
    "safetensors-header-a-list": ("target", "model.safetensors", _safetensors(b"[]")),
    "safetensors-shape-a-string": ("target", "model.safetensors", _safetensors(b'{"w": {"dtype": "F32", "shape": "64,64", "data_offsets": [0, 0]}}')),
    "safetensors-tensor-a-number": ("draft", "model.safetensors", _safetensors(b'{"w": 5}')),
    "safetensors-header-nesting-bomb": ("draft", "model.safetensors", _safetensors(b"{\"w\": " + b"[" * 50_000 + b"]" * 50_000 + b"}")),
    "safetensors-huge-header": ("target", "model.safetensors", (2 ** 40).to_bytes(8, "little") + b"{}"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_METADATA))
def test_inspect_of_an_unsigned_bundle_refuses_hostile_metadata_with_exit_6(tmp_path: Path, case: str) -> None:
    from unchecked_pack import pack_unchecked

    role, name, content = HOSTILE_METADATA[case]
    store = tmp_path / "store"
    pack_unchecked(_hostile_context(tmp_path / "ctx", role, name, content), "tiny-spec:1.0.0", store)
    result = run_bundle("inspect", "tiny-spec:1.0.0", "--store", str(store))
    assert result.code == 6, result.out + result.err
    assert result.err.startswith("error: [invalid-bundle] ") and len(result.err.strip().splitlines()) == 1, result.err
    assert name in result.err
    as_json = run_bundle("inspect", "tiny-spec:1.0.0", "--json", "--store", str(store))
    assert as_json.code == 6 and json.loads(as_json.out)["error"]["code"] == "invalid-bundle"


@pytest.mark.parametrize("case", ["huge-token-id", "tokenizer-nesting-bomb", "config-hidden-size-a-string", "safetensors-shape-a-string"])
def test_pack_refuses_hostile_metadata_in_a_model_directory(tmp_path: Path, case: str) -> None:
    role, name, content = HOSTILE_METADATA[case]
    store = tmp_path / "store"
    result = run_bundle("pack", str(_hostile_context(tmp_path / "ctx", role, name, content)), "-t", "tiny-spec:1.0.0", "--store", str(store))
    assert result.code == 6 and result.err.startswith("error: [invalid-bundle] "), result.err
    assert tree_digest(store / "blobs") == "absent"


def test_verify_bounds_a_hostile_tokenizer_copy_before_the_signature(tmp_path: Path) -> None:
    from unchecked_pack import pack_unchecked

    tree = make_tree(tmp_path / "ctx")
    (tree / "target" / "tokenizer.json").write_bytes(HOSTILE_METADATA["huge-token-id"][2])  # a copy that differs
    store = tmp_path / "store"
    pack_unchecked(tree, "tiny-spec:1.0.0", store)
    result = run_bundle("verify", "tiny-spec:1.0.0", "--allow-unsigned", "--store", str(store))
    assert result.code == 6 and "[invalid-bundle]" in result.err and "tokenizer.json" in result.err, result.err


# A value of another JSON type put anywhere in a real file: what metadatacheck lets through, the runner's
# readers must take without an exception other than BundleError.
REPLACEMENTS = ([], {}, "7", 2 ** 40, -1, None, True, 1.5, [[["x"]]], {"content": 3}, ["a", "b"], [0, 0])


def _mutate(value, rng, depth: int = 0):
    """`value` with one node, chosen at random along a random path, replaced by a value of another type."""
    import copy

    value = copy.deepcopy(value)
    if not isinstance(value, (dict, list)) or not value or rng.random() < 0.15 * depth:
        return rng.choice(REPLACEMENTS)
    keys = list(value) if isinstance(value, dict) else list(range(len(value)))
    key = rng.choice(keys[:50])
    value[key] = _mutate(value[key], rng, depth + 1)
    return value


def test_mutated_metadata_is_refused_or_read_cleanly(tmp_path: Path) -> None:
    import random
    import struct

    from core.errors import BundleError
    from bundler.format.metadatacheck import check_roles
    from runner.checks import modelinfo, tokenizer_gate

    tree = make_tree(tmp_path / "ctx")
    originals = {
        ("tokenizer", "tokenizer.json"): json.loads((tree / "tokenizer" / "tokenizer.json").read_text()),
        ("tokenizer", "tokenizer_config.json"): json.loads((tree / "tokenizer" / "tokenizer_config.json").read_text()),
        ("target", "config.json"): json.loads((tree / "target" / "config.json").read_text()),
    }
    weights = (tree / "draft" / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", weights[:8])
    header = json.loads(weights[8:8 + n])
    rng = random.Random(24)
    outcomes = {"refused": 0, "read": 0}
    for case in range(300):
        work = tmp_path / f"case{case}"
        shutil.copytree(tree, work)
        which = rng.randrange(len(originals) + 1)
        if which == len(originals):
            body = json.dumps(_mutate(header, rng)).encode()
            (work / "draft" / "model.safetensors").write_bytes(struct.pack("<Q", len(body)) + body + weights[8 + n:])
        else:
            (role, name), original = list(originals.items())[which]
            (work / role / name).write_text(json.dumps(_mutate(original, rng)))
        try:
            check_roles(work, {"target": "target", "draft": "draft", "tokenizer": "tokenizer"})
        except BundleError:
            outcomes["refused"] += 1
            shutil.rmtree(work)
            continue
        try:
            tokenizer_gate.fingerprint(work / "tokenizer")
            modelinfo.count_parameters(work / "draft")
            modelinfo.estimate_memory(work / "target", work / "draft", "float32", 64)
            outcomes["read"] += 1
        except BundleError:
            outcomes["read"] += 1  # a clean refusal of the runner's own
        shutil.rmtree(work)
    assert outcomes["refused"] > 50 and outcomes["read"] > 50, outcomes
