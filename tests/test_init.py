"""`bundle init`: a bundle context from two downloaded model directories, checked as `run` checks a pair.

Each test lays out real tiny models the way a Hugging Face download looks (config.json, *.safetensors and,
in the target's directory, tokenizer.json + tokenizer_config.json) and runs the command as a user would.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import run_bundle, tree_digest
from tinymodels import make_pair, tiny_model, train_tokenizer, write_tokenizer

from bundler.verbs import init as init_module
from bundler.verbs.init import init_context, sanitise_name

TOKENIZER_NAMES = ["tokenizer.json", "tokenizer_config.json"]


def _downloads(root: Path, *, target_name: str = "Tiny-Target-Instruct", tokenizer_in_target: bool = True) -> dict[str, Path]:
    """Two model directories as downloaded: models/<target_name> (with its tokenizer) and models/tiny-draft."""
    pair = make_pair(root / "made")
    models = root / "models"
    models.mkdir()
    target, draft = models / target_name, models / "tiny-draft"
    shutil.move(pair["target"], target)
    shutil.move(pair["draft"], draft)
    if tokenizer_in_target:
        for name in TOKENIZER_NAMES:
            shutil.copyfile(pair["tokenizer"] / name, target / name)
    return {"target": target, "draft": draft, "tokenizer": pair["tokenizer"], "root": root}


@pytest.fixture
def downloads(tmp_path: Path) -> dict[str, Path]:
    return _downloads(tmp_path)


def _init(d: dict[str, Path], out: Path, *extra: str):
    return run_bundle("init", "--target", str(d["target"]), "--draft", str(d["draft"]), "-o", str(out), *extra,
                      env={"BUNDLE_HOME": str(d["root"] / "store")})


def _kitfile(context: Path) -> dict:
    return yaml.safe_load((context / "Kitfile").read_text())


def _refused(result, exit_code: int, code: str, out: Path) -> None:
    """The one-line error with its code and exit, and nothing left: no CONTEXT, no hidden temp dir beside it."""
    assert result.code == exit_code, result.err
    assert result.err.startswith(f"error: [{code}] ") and len(result.err.strip().splitlines()) == 1, result.err
    assert not out.exists()
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.init-")]


def test_init_lays_out_the_three_roles_and_a_kitfile(downloads: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    result = _init(downloads, out)
    assert result.code == 0, result.err
    assert sorted(p.name for p in out.iterdir()) == ["Kitfile", "draft", "target", "tokenizer"]
    assert sorted(p.name for p in (out / "tokenizer").iterdir()) == TOKENIZER_NAMES
    for role in ("target", "draft"):  # the whole download, as it was
        assert sorted(p.name for p in (out / role).iterdir()) == sorted(p.name for p in downloads[role].iterdir())
    kitfile = _kitfile(out)
    assert kitfile["package"]["name"] == "tiny-target-instruct"  # from the directory name, lower-cased
    assert kitfile["package"]["version"] == "1.0.0"
    assert kitfile["model"]["path"] == "target/"
    assert kitfile["model"]["parts"] == [{"name": "draft", "path": "draft/", "type": "draft"},
                                         {"name": "tokenizer", "path": "tokenizer/", "type": "tokenizer"}]
    assert kitfile["model"]["parameters"]["speculative"] == {
        "draft_tokens": 4, "adaptive": False, "draft_confidence": 0.3, "min_acceptance": 0.1, "min_size_ratio": 4}
    assert f"next: bundle pack {out} -t tiny-target-instruct:1.0.0 --key" in result.out


def test_the_context_packs_and_verifies(downloads: dict[str, Path], tmp_path: Path, keypair) -> None:
    out, store = tmp_path / "ctx", tmp_path / "store"
    assert _init(downloads, out).code == 0
    key, pub = keypair
    run_bundle("pack", str(out), "-t", "tiny-target-instruct:1.0.0", "--key", str(key), "--store", str(store), check=True)
    run_bundle("verify", "tiny-target-instruct:1.0.0", "--key", str(pub), "--store", str(store), check=True)


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_dtype_comes_from_the_targets_config(downloads: dict[str, Path], tmp_path: Path, key: str) -> None:
    config_path = downloads["target"] / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    config[key] = "bfloat16"
    config_path.write_text(json.dumps(config))
    assert _init(downloads, tmp_path / "ctx").code == 0
    assert _kitfile(tmp_path / "ctx")["model"]["parameters"]["dtype"] == "bfloat16"


def test_files_are_hard_links_to_the_downloads(downloads: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    assert _init(downloads, out).code == 0
    for role in ("target", "draft"):
        for src in downloads[role].iterdir():
            assert os.path.samefile(src, out / role / src.name)
    assert os.path.samefile(downloads["target"] / "tokenizer.json", out / "tokenizer" / "tokenizer.json")


def test_files_are_copied_where_a_link_is_refused(downloads: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    def cross_device(src, dst, *args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(init_module.os, "link", cross_device)
    result = init_context(downloads["target"], downloads["draft"], tmp_path / "ctx")
    assert all(r.linked == 0 and r.copied == r.files for r in result.roles)
    weights = tmp_path / "ctx" / "target" / "model.safetensors"
    assert not os.path.samefile(downloads["target"] / "model.safetensors", weights)
    assert weights.read_bytes() == (downloads["target"] / "model.safetensors").read_bytes()


def test_tokenizer_flag_takes_the_tokenizer_files_from_that_directory(tmp_path: Path) -> None:
    d = _downloads(tmp_path, tokenizer_in_target=False)
    out = tmp_path / "ctx"
    result = _init(d, out, "--tokenizer", str(d["tokenizer"]))
    assert result.code == 0, result.err
    for name in TOKENIZER_NAMES:
        assert os.path.samefile(d["tokenizer"] / name, out / "tokenizer" / name)


def test_a_target_without_tokenizer_needs_the_tokenizer_flag(tmp_path: Path) -> None:
    d = _downloads(tmp_path, tokenizer_in_target=False)
    result = _init(d, tmp_path / "ctx")
    _refused(result, 2, "missing-input", tmp_path / "ctx")
    assert "--tokenizer" in result.err


def test_name_and_version_flags(downloads: dict[str, Path], tmp_path: Path) -> None:
    assert _init(downloads, tmp_path / "ctx", "--name", "my-spec", "--version", "2.1.0-rc.1").code == 0
    package = _kitfile(tmp_path / "ctx")["package"]
    assert (package["name"], package["version"]) == ("my-spec", "2.1.0-rc.1")


@pytest.mark.parametrize("raw, name", [("SmolLM2-135M-Instruct", "smollm2-135m-instruct"), ("Qwen2.5-0.5B", "qwen2.5-0.5b"),
                                       ("models--Org--Model_v1", "models-org-model_v1"), ("My Model (fp16)", "my-model-fp16")])
def test_the_default_name_is_the_directory_name_made_to_fit_the_schema(raw: str, name: str) -> None:
    assert sanitise_name(raw) == name


@pytest.mark.parametrize("flag, value", [("--name", "My Spec"), ("--version", "one")])
def test_a_name_or_version_the_schema_refuses_is_a_usage_error(downloads: dict[str, Path], tmp_path: Path, flag: str, value: str) -> None:
    _refused(_init(downloads, tmp_path / "ctx", flag, value), 2, "usage", tmp_path / "ctx")


def test_draft_vocab_is_named_only_when_the_draft_has_one(downloads: dict[str, Path], tmp_path: Path) -> None:
    assert _init(downloads, tmp_path / "plain").code == 0
    assert "draft_vocab" not in _kitfile(tmp_path / "plain")["model"]["parameters"]["speculative"]
    (downloads["draft"] / "draft_vocab.json").write_text(json.dumps({"ids": list(range(64))}))
    assert _init(downloads, tmp_path / "ctx").code == 0
    assert _kitfile(tmp_path / "ctx")["model"]["parameters"]["speculative"]["draft_vocab"] == "draft_vocab.json"


def test_an_empty_context_directory_is_filled_in_place(downloads: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    out.mkdir()
    inode = out.stat().st_ino
    result = run_bundle("init", "--target", str(downloads["target"]), "--draft", str(downloads["draft"]), "-o", ".", cwd=out)
    assert result.code == 0, result.err
    assert out.stat().st_ino == inode  # the same directory (a shell sitting in it still sees the context)
    assert sorted(p.name for p in out.iterdir()) == ["Kitfile", "draft", "target", "tokenizer"]


def test_a_non_empty_context_is_refused_and_left_as_it_was(downloads: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = tree_digest(out)
    result = _init(downloads, out)
    assert result.code == 2 and result.err.startswith("error: [usage] "), result.err
    assert tree_digest(out) == before


@pytest.mark.parametrize("flag", ["--target", "--draft", "--tokenizer"])
def test_a_missing_directory_is_refused(downloads: dict[str, Path], tmp_path: Path, flag: str) -> None:
    args = {"--target": str(downloads["target"]), "--draft": str(downloads["draft"]), "--tokenizer": str(downloads["tokenizer"])}
    args[flag] = str(tmp_path / "nowhere")
    result = run_bundle("init", *[x for kv in args.items() for x in kv], "-o", str(tmp_path / "ctx"))
    _refused(result, 2, "missing-input", tmp_path / "ctx")


def test_pickle_weights_are_refused(downloads: dict[str, Path], tmp_path: Path) -> None:
    (downloads["draft"] / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    result = _init(downloads, tmp_path / "ctx")
    _refused(result, 4, "pickle-weights", tmp_path / "ctx")
    assert "pytorch_model.bin" in result.err


def test_a_draft_with_another_tokenizer_is_refused(downloads: dict[str, Path], tmp_path: Path) -> None:
    write_tokenizer(downloads["draft"], train_tokenizer(300))  # the draft's own download carries a different one
    result = _init(downloads, tmp_path / "ctx")
    _refused(result, 4, "tokenizer-mismatch", tmp_path / "ctx")


def test_a_draft_as_large_as_the_target_is_refused(downloads: dict[str, Path], tmp_path: Path) -> None:
    shutil.rmtree(downloads["draft"])
    shutil.copytree(downloads["target"], downloads["draft"])
    result = _init(downloads, tmp_path / "ctx")
    _refused(result, 4, "size-ratio", tmp_path / "ctx")


def test_a_draft_of_another_family_is_refused(downloads: dict[str, Path], tmp_path: Path) -> None:
    vocab = json.loads((downloads["draft"] / "config.json").read_text())["vocab_size"]
    shutil.rmtree(downloads["draft"])
    tiny_model("qwen2", vocab, hidden=16, layers=1, heads=2, kv_heads=1).save_pretrained(downloads["draft"], safe_serialization=True)
    result = _init(downloads, tmp_path / "ctx")
    _refused(result, 4, "model-family", tmp_path / "ctx")


def test_hidden_entries_are_left_out_and_links_followed(downloads: dict[str, Path], tmp_path: Path) -> None:
    # A Hugging Face cache snapshot: every file a relative symlink into the repository's blobs/ (as the hub
    # writes them); `hf download --local-dir` adds .cache/.
    repo = tmp_path / "hub" / "models--org--tiny-target"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for src in downloads["target"].iterdir():
        shutil.copyfile(src, repo / "blobs" / f"blob-{src.name}")
        (snapshot / src.name).symlink_to(Path("..", "..", "blobs", f"blob-{src.name}"))
    (snapshot / ".cache" / "huggingface").mkdir(parents=True)
    (snapshot / ".cache" / "huggingface" / "model.safetensors.lock").write_text("")
    (snapshot / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    out = tmp_path / "ctx"
    result = run_bundle("init", "--target", str(snapshot), "--draft", str(downloads["draft"]), "-o", str(out), "--name", "tiny")
    assert result.code == 0, result.err
    names = sorted(p.name for p in (out / "target").iterdir())
    assert names == sorted(p.name for p in downloads["target"].iterdir())
    assert not any(p.is_symlink() for p in (out / "target").iterdir())
