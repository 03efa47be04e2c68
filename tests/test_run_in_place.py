"""`bundle run` reads safetensors weights straight from their verified layer blobs: no weight file is written,
each is one byte range of its (uncompressed tar) blob, hashed at load time against the signature, so a blob
changed after verification is refused; small files and the preflight work as they do on a directory."""

from __future__ import annotations

from pathlib import Path

import pytest

import bundler.verbs.run
import runner.run
from core.errors import BundleError
from bundler.trust.keys import key_id, load_public_key
from bundler.store.refs import parse_ref
from bundler.verbs.run import run_bundle as run_in_process, verified_view
from bundler.store.layout import Store
from bundler.verbs.unpack import unpack
from conftest import copy_store, run_bundle
from runner.checks.modelinfo import FileRange, estimate_memory
from runner.run import run_unpacked
from tests.tinymodels import make_pair

REF = "tiny-spec:1.0.0"


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict[str, Path]:
    """A packed, signed tiny pair whose target is sharded; tests copy its store before changing anything."""
    base = tmp_path_factory.mktemp("inplace")
    make_pair(base / "ctx", max_shard_size="40KB")
    store = base / "store"
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(store), check=True)
    return {"base": base, "ctx": base / "ctx", "store": store}


def _trusted(pub: Path) -> dict:
    key = load_public_key(pub)
    return {key_id(key): key}


def test_the_checkout_holds_no_weight_file_only_ranges_of_the_verified_blobs(signed, keypair) -> None:
    store = Store(signed["store"])
    with verified_view(store, parse_ref(REF), _trusted(keypair[1])) as checkout:
        on_disk = sorted(p.relative_to(checkout.root).as_posix() for p in checkout.root.rglob("*") if p.is_file())
        signed_files = checkout.report.claims.files
        weights = {p for p in signed_files if p.endswith(".safetensors")}
        assert not any(p.endswith(".safetensors") for p in on_disk)
        assert set(checkout.weights) == weights and len([p for p in weights if p.startswith("target/")]) > 2
        assert set(on_disk) | weights == set(signed_files)
        blobs = {store.blob_path(desc.digest) for _, desc in checkout.report.modelkit.layers}
        for path, where in checkout.weights.items():
            assert where.path in blobs
            # the range is the file itself: its bytes are exactly what the packed context holds
            assert where.read(0, where.length) == (signed["ctx"] / path).read_bytes()


def test_run_from_the_blobs_gives_what_run_from_an_unpacked_directory_gives(signed, keypair, tmp_path) -> None:
    store, trusted = Store(signed["store"]), _trusted(keypair[1])
    ours = run_in_process(store, parse_ref(REF), trusted, "hello there", max_new_tokens=10)
    result = unpack(store, parse_ref(REF), tmp_path / "unpacked", trusted)
    mk = result.report.modelkit
    theirs = run_unpacked(tmp_path / "unpacked", mk.kitfile.role_paths(), bundler.verbs.run.runner_params(mk.kitfile.parameters),
                          "hello there", max_new_tokens=10, verified_files=result.report.claims.files)
    assert ours["tokens"] == theirs["tokens"] and ours["text"] == theirs["text"]
    assert ours["pairing"] == theirs["pairing"]  # parameters counted from the headers in the blobs
    same = lambda memory: {k: v for k, v in memory.items() if k != "predicted_peak_bytes"}  # noqa: E731 (it adds the RSS now)
    assert same(ours["memory"]) == same(theirs["memory"])  # the memory preflight read the same headers


def test_the_memory_preflight_reads_headers_from_the_ranges(signed, keypair) -> None:
    with verified_view(Store(signed["store"]), parse_ref(REF), _trusted(keypair[1])) as checkout:
        ranges = {checkout.root / p: r for p, r in checkout.weights.items()}
        estimate = estimate_memory(checkout.root / "target", checkout.root / "draft", "float32", 64, ranges=ranges)
    assert estimate["weights_bytes"] > 0 and estimate["target_parameters"] > 4 * estimate["draft_parameters"]


def test_a_blob_changed_between_verification_and_loading_is_refused(signed, keypair, tmp_path, monkeypatch) -> None:
    store = copy_store(signed["store"], tmp_path)
    real_load_pair = runner.run.load_pair
    flipped: list[str] = []

    def flip_then_load(root, *args, weight_ranges: dict[str, FileRange], **kwargs):
        # after verification and extraction, before any weight is read: one bit of the target's last shard
        path = max(p for p in weight_ranges if p.startswith("target/"))
        where = weight_ranges[path]
        where.path.chmod(0o644)
        with open(where.path, "r+b") as f:
            f.seek(where.offset + where.length - 3)
            byte = f.read(1)[0]
            f.seek(-1, 1)
            f.write(bytes([byte ^ 1]))
        flipped.append(path)
        return real_load_pair(root, *args, weight_ranges=weight_ranges, **kwargs)

    monkeypatch.setattr(runner.run, "load_pair", flip_then_load)
    with pytest.raises(BundleError) as err:
        run_in_process(Store(store), parse_ref(REF), _trusted(keypair[1]), "hello", max_new_tokens=4)
    assert flipped and err.value.code == "digest-mismatch"
    assert flipped[0] in err.value.message, err.value.line()


def test_a_blob_changed_before_run_is_refused_by_verify_with_exit_3(signed, keypair, tmp_path) -> None:
    store = copy_store(signed["store"], tmp_path)
    with verified_view(Store(store), parse_ref(REF), _trusted(keypair[1])) as checkout:
        where = next(r for p, r in checkout.weights.items() if p.startswith("target/"))
    data = bytearray(where.path.read_bytes())
    data[where.offset + 100] ^= 1
    where.path.write_bytes(bytes(data))
    result = run_bundle("run", REF, "--prompt", "hi", "--max-new-tokens", "2", "--key", str(keypair[1]), "--store", str(store))
    assert result.code == 3 and "digest-mismatch" in result.err
