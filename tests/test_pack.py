"""`bundle pack`, the store, list, inspect and unpack: reproducible, KitOps/OCI-compatible, atomic."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import run_bundle, tree_digest


def _pack(tree: Path, store: Path, ref: str = "tiny-spec:1.0.0", *extra: str) -> str:
    result = run_bundle("pack", str(tree), "-t", ref, "--store", str(store), *extra, check=True)
    return result.out.strip().splitlines()[-1]


def _copy_with(src: Path, dst: Path, umask: int, mtime: int, uid: int) -> None:
    old = os.umask(umask)
    try:
        for path in sorted(src.rglob("*")):
            target = dst / path.relative_to(src)
            if path.is_dir():
                target.mkdir(parents=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as f:  # created under the umask
                    f.write(path.read_bytes())
        for path in [dst, *dst.rglob("*")]:
            os.utime(path, (mtime, mtime))
            if os.geteuid() == 0:
                os.chown(path, uid, uid)
    finally:
        os.umask(old)


def test_same_content_gives_same_digest_whatever_mtime_owner_umask(tree: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _copy_with(tree, a, 0o022, 1_000_000_000, 1234)
    _copy_with(tree, b, 0o077, 1_700_000_000, 4321)
    assert _pack(a, tmp_path / "s1") == _pack(b, tmp_path / "s2")


def test_pack_prints_the_manifest_digest_last_and_tags_it(tree: Path, store_dir: Path) -> None:
    digest = _pack(tree, store_dir)
    assert digest.startswith("sha256:") and len(digest) == 71
    index = json.loads((store_dir / "index.json").read_text())
    [entry] = index["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "tiny-spec:1.0.0"
    assert json.loads((store_dir / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}


def test_manifest_and_config_are_kitops_modelkit(tree: Path, store_dir: Path) -> None:
    digest = _pack(tree, store_dir)
    manifest = json.loads((store_dir / "blobs" / "sha256" / digest[7:]).read_bytes())
    assert manifest["artifactType"] == "application/vnd.kitops.modelkit.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.kitops.modelkit.config.v1+json"
    assert [l["mediaType"].split(".")[-3] for l in manifest["layers"]] == ["model", "modelpart", "modelpart", "docs"]
    config = json.loads((store_dir / "blobs" / "sha256" / manifest["config"]["digest"][7:]).read_bytes())
    assert config["model"]["digest"] == manifest["layers"][0]["digest"] == config["model"]["diffId"]
    assert [p["digest"] for p in config["model"]["parts"]] == [l["digest"] for l in manifest["layers"][1:3]]
    assert config["docs"][0]["digest"] == manifest["layers"][3]["digest"]
    assert config["model"]["parameters"] == {"speculative": {"draft_tokens": 4, "min_acceptance": 0.3}}


def test_packing_twice_stores_nothing_new(tree: Path, store_dir: Path) -> None:
    first = _pack(tree, store_dir)
    before = tree_digest(store_dir)
    assert _pack(tree, store_dir) == first
    assert tree_digest(store_dir) == before


def test_layers_extract_with_tarfile_and_gnu_tar_to_the_packed_files(tree: Path, store_dir: Path, tmp_path: Path) -> None:
    digest = _pack(tree, store_dir)
    manifest = json.loads((store_dir / "blobs" / "sha256" / digest[7:]).read_bytes())
    py_out, gnu_out = tmp_path / "py", tmp_path / "gnu"
    py_out.mkdir(), gnu_out.mkdir()
    for layer in manifest["layers"]:
        blob = store_dir / "blobs" / "sha256" / layer["digest"][7:]
        with tarfile.open(blob) as tf:
            for m in tf.getmembers():
                assert (m.uid, m.gid, m.mtime, m.uname, m.gname) == (1000, 0, 0, "", "")
            tf.extractall(py_out, filter="data")
        subprocess.run(["tar", "-xf", str(blob), "-C", str(gnu_out)], check=True)
    for out in (py_out, gnu_out):
        packed = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
        expected = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file() and p.name != "Kitfile")
        assert packed == expected
        for name in packed:
            assert (out / name).read_bytes() == (tree / name).read_bytes()


@pytest.mark.skipif(shutil.which("skopeo") is None, reason="skopeo not installed (make test installs it)")
def test_skopeo_reads_the_store_as_an_oci_layout(tree: Path, store_dir: Path) -> None:
    digest = _pack(tree, store_dir)
    raw = subprocess.run(["skopeo", "inspect", "--raw", f"oci:{store_dir}:tiny-spec:1.0.0"], capture_output=True, check=True).stdout
    assert raw == (store_dir / "blobs" / "sha256" / digest[7:]).read_bytes()


def test_list_shows_tagged_bundles(tree: Path, store_dir: Path) -> None:
    digest = _pack(tree, store_dir)
    _pack(tree, store_dir, "other/name:v2")
    out = run_bundle("list", "--store", str(store_dir), check=True).out
    lines = out.splitlines()
    assert lines[0].startswith("REF") and len(lines) == 3  # a header, then one row per tag, sorted by ref
    assert [line.split()[:2] for line in lines[1:]] == [["other/name:v2", digest[:19]], ["tiny-spec:1.0.0", digest[:19]]]
    rows = json.loads(run_bundle("list", "--json", "--store", str(store_dir), check=True).out)
    assert [(r["ref"], r["digest"]) for r in rows] == [("other/name:v2", digest), ("tiny-spec:1.0.0", digest)]


def test_inspect_json_reports_layers_roles_and_sizes(tree: Path, store_dir: Path) -> None:
    digest = _pack(tree, store_dir)
    info = json.loads(run_bundle("inspect", "tiny-spec:1.0.0", "--json", "--store", str(store_dir), check=True).out)
    assert info["digest"] == digest
    assert [l["role"] for l in info["layers"]] == ["target", "draft", "tokenizer", "docs"]
    assert info["roles"] == {"target": "target", "draft": "draft", "tokenizer": "tokenizer"}
    assert info["models"]["target"]["parameters"] == 10 * 32 + 4 * 64 * 32
    assert info["models"]["draft"]["parameters"] == 10 * 8 + 16 * 8
    assert info["memory"]["total_bytes"] > 0
    assert info["tokenizer"]["fingerprint"].startswith("sha256:")
    assert info["verification"]["ok"] is False  # unsigned


def test_unpack_allow_unsigned_restores_the_tree(tree: Path, store_dir: Path, tmp_path: Path) -> None:
    _pack(tree, store_dir)
    out = tmp_path / "out"
    result = run_bundle("unpack", "tiny-spec:1.0.0", "-d", str(out), "--allow-unsigned", "--store", str(store_dir), check=True)
    assert "UNSIGNED" in result.out
    for path in tree.rglob("*"):
        if path.is_file() and path.name != "Kitfile":
            assert (out / path.relative_to(tree)).read_bytes() == path.read_bytes()


def test_unpack_refuses_unsigned_without_allow_unsigned_and_writes_nothing(tree: Path, store_dir: Path, tmp_path: Path) -> None:
    _pack(tree, store_dir)
    result = run_bundle("unpack", "tiny-spec:1.0.0", "-d", str(tmp_path / "out"), "--store", str(store_dir))
    assert result.code == 3
    assert result.err.startswith("error: [signature-missing] ")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_unpack_refuses_a_non_empty_directory(tree: Path, store_dir: Path, tmp_path: Path) -> None:
    _pack(tree, store_dir)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = run_bundle("unpack", "tiny-spec:1.0.0", "-d", str(out), "--allow-unsigned", "--store", str(store_dir))
    assert result.code == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_unknown_reference_is_not_found(store_dir: Path) -> None:
    result = run_bundle("inspect", "nothing:here", "--store", str(store_dir))
    assert result.code == 2
    assert result.err.startswith("error: [not-found] ")


def test_interrupted_pack_leaves_the_store_as_it_was(tree: Path, store_dir: Path) -> None:
    from bundler.verbs import pack as packmod
    from bundler.store.refs import parse_ref
    from bundler.store.layout import Store

    _pack(tree, store_dir, "tiny-spec:0.9.0")
    before = tree_digest(store_dir / "blobs"), (store_dir / "index.json").read_bytes()
    (tree / "target" / "extra.safetensors").write_bytes(b"x" * 10)

    def interrupt(path: str, n: int) -> None:
        if path == "tokenizer":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        packmod.pack(tree, parse_ref("tiny-spec:1.0.0"), Store(store_dir), progress=interrupt)
    assert (tree_digest(store_dir / "blobs"), (store_dir / "index.json").read_bytes()) == before
