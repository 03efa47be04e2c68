"""runner.models.loading: the weights in memory once, from the bytes that were hashed; sharded checkpoints, tied and
untied embeddings, bf16/fp16/fp32 on disk and at run time, the same model transformers' from_pretrained builds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from core.errors import BundleError
from runner.models.loading import load_model
from runner.checks.modelinfo import FileRange, read_safetensors_header
from tests.tinymodels import tiny_llama

IDS = torch.tensor([[3, 17, 42, 99, 5, 250]])


def _digests(model_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in model_dir.iterdir() if p.is_file()}


def _save(model, directory: Path, **options) -> Path:
    model.save_pretrained(directory, safe_serialization=True, **options)
    return directory


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_parameters_are_views_of_the_hashed_file_bytes(tmp_path: Path) -> None:
    directory = _save(tiny_llama(320), tmp_path / "m")
    model = load_model(directory, "float32", "cpu", expected_sha256=_digests(directory))
    header = read_safetensors_header(directory / "model.safetensors")
    params = dict(model.named_parameters())
    base = params["model.embed_tokens.weight"].data_ptr() - header["model.embed_tokens.weight"]["data_offsets"][0]
    # every weight lies where the file holds it, in the one buffer the file was read into and hashed from:
    # no copy, no random initialisation
    assert {name: p.data_ptr() - base for name, p in params.items()} == {
        name: header[name]["data_offsets"][0] for name in params
    }


def test_a_file_changed_between_verification_and_loading_is_refused(tmp_path: Path) -> None:
    directory = _save(tiny_llama(320), tmp_path / "m")
    signed = _digests(directory)
    path = directory / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 1  # one weight bit, after the digests were taken
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError) as err:
        load_model(directory, "float32", "cpu", expected_sha256=signed)
    assert err.value.code == "digest-mismatch"


def _in_a_blob(directory: Path, blob: Path) -> dict[Path, FileRange]:
    """Moves the directory's safetensors files into one blob, between other bytes (as a tar layer holds
    them), and returns where each now lies."""
    ranges, data = {}, bytearray(b"\x07" * 1000)
    for path in sorted(directory.glob("*.safetensors")):
        content = path.read_bytes()
        ranges[path] = FileRange(blob, len(data), len(content))
        data += content + b"\x00" * 700
        path.unlink()
    blob.write_bytes(bytes(data))
    return ranges


def test_weights_load_from_their_byte_range_of_a_blob(tmp_path: Path) -> None:
    model = tiny_llama(320, hidden=64, layers=3)
    directory = _save(model, tmp_path / "m", max_shard_size="40KB")
    signed = _digests(directory)
    ranges = _in_a_blob(directory, tmp_path / "blob")
    assert not list(directory.glob("*.safetensors")) and len(ranges) > 2
    loaded = load_model(directory, "float32", "cpu", expected_sha256=signed, ranges=ranges)
    assert torch.equal(_logits(loaded), _logits(model))


def test_a_blob_changed_between_verification_and_loading_is_refused(tmp_path: Path) -> None:
    directory = _save(tiny_llama(320), tmp_path / "m")
    signed = _digests(directory)
    ranges = _in_a_blob(directory, tmp_path / "blob")
    where = ranges[directory / "model.safetensors"]
    data = bytearray(where.path.read_bytes())
    data[where.offset + where.length - 3] ^= 1  # one weight bit inside the file's range, after the digests were taken
    where.path.write_bytes(bytes(data))
    with pytest.raises(BundleError) as err:
        load_model(directory, "float32", "cpu", expected_sha256=signed, ranges=ranges)
    assert err.value.code == "digest-mismatch" and "model.safetensors" in err.value.message


def test_a_changed_config_is_refused_too(tmp_path: Path) -> None:
    directory = _save(tiny_llama(320), tmp_path / "m")
    signed = _digests(directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 0.5}))
    with pytest.raises(BundleError) as err:
        load_model(directory, "float32", "cpu", expected_sha256=signed)
    assert err.value.code == "digest-mismatch"


def test_a_sharded_checkpoint_loads_as_one_model(tmp_path: Path) -> None:
    model = tiny_llama(320, hidden=64, layers=3)
    directory = _save(model, tmp_path / "m", max_shard_size="40KB")
    shards = sorted(directory.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and (directory / "model.safetensors.index.json").is_file()
    loaded = load_model(directory, "float32", "cpu", expected_sha256=_digests(directory))
    assert torch.equal(_logits(loaded), _logits(model))


def test_a_shard_missing_from_the_index_is_refused(tmp_path: Path) -> None:
    directory = _save(tiny_llama(320, layers=3), tmp_path / "m", max_shard_size="40KB")
    sorted(directory.glob("model-*-of-*.safetensors"))[-1].unlink()
    with pytest.raises(BundleError) as err:
        load_model(directory, "float32", "cpu")
    assert err.value.code == "invalid-bundle"


@pytest.mark.parametrize("disk", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("run", ["float32", "bfloat16"])
def test_dtypes_on_disk_and_at_run_time_give_transformers_own_model(tmp_path: Path, disk: str, run: str) -> None:
    directory = _save(tiny_llama(320, dtype=getattr(torch, disk)), tmp_path / "m")
    ours = load_model(directory, run, "cpu", expected_sha256=_digests(directory))
    theirs = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, run)).eval()
    assert all(p.dtype == getattr(torch, run) for p in ours.parameters())
    assert torch.equal(_logits(ours), _logits(theirs))


def test_untied_embeddings_keep_their_own_head(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = tiny_llama(320)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight))
    directory = _save(model, tmp_path / "m")
    loaded = load_model(directory, "float32", "cpu", expected_sha256=_digests(directory))
    assert loaded.lm_head.weight.data_ptr() != loaded.model.embed_tokens.weight.data_ptr()
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert torch.equal(_logits(loaded), _logits(model))


def test_weights_that_do_not_fit_the_config_are_refused(tmp_path: Path) -> None:
    directory = _save(tiny_llama(320), tmp_path / "m")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "intermediate_size": 256}))
    with pytest.raises(BundleError) as err:
        load_model(directory, "float32", "cpu")
    assert err.value.code == "invalid-bundle"


@pytest.mark.parametrize("text,has", [
    ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", False),
    ("cuda: Optional[str] = '12.4'\nhip: Optional[str] = None\n", True),
    ("cuda = None\nhip = '6.1'\n", True),
    ("__version__ = '2.13.0'\n", True),  # unreadable: assume it may use a GPU (and import torch to know)
])
def test_a_cpu_build_of_torch_is_known_without_importing_it(monkeypatch, tmp_path: Path, text: str, has: bool) -> None:
    import importlib.util
    import types

    from runner import run

    (tmp_path / "version.py").write_text(text)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: types.SimpleNamespace(submodule_search_locations=[str(tmp_path)]))
    assert run._torch_has_cuda() is has
    if not has:
        assert run.resolve_device(None) == "cpu"
    assert run.resolve_device("cpu") == "cpu"


def _in_a_fresh_process(code: str) -> float:
    """What `code` prints, run by a new Python without torch imported (this repository on its path)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                         cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    return float(out.stdout.split()[-1])


def test_what_importing_torch_adds_is_measured_beside_the_read_without_the_weights(tmp_path: Path) -> None:
    """A CPU build imports torch while the weights are read (the predicted peak counts it, runner.run.load_pair):
    the measure is what importing torch alone adds, the bytes read meanwhile (here about 100 MB) taken off."""
    from runner.checks.modelinfo import rss_bytes

    if not rss_bytes():
        pytest.skip("no /proc/self/statm here")
    directory = _save(tiny_llama(320, hidden=1024, layers=3, heads=8, kv_heads=2), tmp_path / "m")
    measured = _in_a_fresh_process(
        "from pathlib import Path\nfrom runner.models import loading\n"
        f"loading.load_models([loading.ModelFiles(Path({str(directory)!r}), 'target')], 'float32', 'cpu', compact=True)\n"
        "print(loading.torch_import_bytes())")
    alone = _in_a_fresh_process(
        "from runner.checks.modelinfo import rss_bytes\nbefore = rss_bytes()\nimport torch\nprint(rss_bytes() - before)")
    assert abs(measured - alone) < 0.25 * alone, (measured, alone)
