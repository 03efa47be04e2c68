"""The GGUF vocabulary probe's memory follows the vocabulary, not whatever else the metadata holds.

llama.cpp's gguf reader keeps every metadata value it reads, a std::string per element of a string array
(about 32 bytes each, plus the bytes), so a 48 MiB array of one-byte strings under a key nothing needs cost
the forked probe some 250 MB. The header reader (runner/checks/gguf_header.py) now refuses metadata besides the
vocabulary arrays past MAX_OTHER_METADATA before llama.cpp sees the file. Measured here on real processes: the
peak resident size (ru_maxrss) of `bundle pack` and everything it forks, with and without such an array.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import BundleError
from runner.checks import gguf_header
from tests.fleet import ROOT
from tests.tinygguf import write_gguf
from tests.tinymodels import make_pair

SMALL = dict(hidden=32, layers=1, heads=2, kv_heads=1)
STRING, ARRAY, UINT8 = 8, 9, 0


def _gguf_string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _with_array(path: Path, key: str, item: int, count: int, element: bytes) -> None:
    """Insert one metadata array into a GGUF file written by `gguf`, and a string beside it that keeps the
    tensor data at its 32-byte alignment."""
    data = path.read_bytes()
    n_kv_at = 4 + 4 + 8  # magic, version, tensor count
    (n_kv,) = struct.unpack_from("<Q", data, n_kv_at)
    entry = _gguf_string(key.encode()) + struct.pack("<II", ARRAY, item) + struct.pack("<Q", count) + element * count
    filler_key = _gguf_string(b"test.alignment_filler") + struct.pack("<I", STRING)
    pad = (-(len(entry) + len(filler_key) + 8)) % 32
    entry += filler_key + _gguf_string(b"f" * pad)
    assert len(entry) % 32 == 0
    start = n_kv_at + 8
    path.write_bytes(data[:n_kv_at] + struct.pack("<Q", n_kv + 2) + entry + data[start:])


def _context(root: Path) -> Path:
    ctx = make_pair(root / "ctx")["root"]
    for role, seed in (("target", 0), ("draft", 1)):
        shutil.rmtree(ctx / role)
        (ctx / role).mkdir()
        write_gguf(ctx / role / "model.gguf", seed=seed, **({"hidden": 128, "layers": 2} if role == "target" else SMALL))
    return ctx


_MEASURE = """
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stdout.write(f"{proc.returncode}\\n{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n")
sys.stdout.write(proc.stderr)
"""


def _pack_peak(ctx: Path, store: Path, extra_env: dict[str, str] | None = None) -> tuple[int, int, str]:
    """(exit code, peak kB of `bundle pack` and all it forked, stderr), `bundle pack` a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", **(extra_env or {})}
    argv = [sys.executable, "-c", _MEASURE, sys.executable, "-m", "bundler", "pack", str(ctx), "-t", "probe-mem:1.0.0", "--store", str(store)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600).stdout.split("\n", 2)
    return int(out[0]), int(out[1]), out[2]


def test_a_48_mib_metadata_array_is_refused_before_the_probe_and_costs_no_memory(tmp_path: Path) -> None:
    clean = _context(tmp_path / "clean")
    code, clean_peak, err = _pack_peak(clean, tmp_path / "s1")
    assert code == 0, err
    hostile = _context(tmp_path / "hostile")
    count = (48 << 20) // 9  # one-byte strings: 9 bytes each in the file, a std::string each in llama.cpp
    _with_array(hostile / "draft" / "model.gguf", "general.padding", STRING, count, _gguf_string(b"x"))
    code, hostile_peak, err = _pack_peak(hostile, tmp_path / "s2")
    assert code == 6, err
    assert err.startswith("error: [invalid-bundle] model.gguf: metadata besides the vocabulary takes "), err
    assert "(the most at 'general.padding'), more than 8 MiB" in err
    assert "refused before llama.cpp reads it" in err and len(err.strip().splitlines()) == 1
    # the file is read through a map and the array stepped over: the peak is the clean pack's, not +250 MB
    assert hostile_peak <= clean_peak + 32 * 1024, f"peak {hostile_peak} kB against {clean_peak} kB for a clean pack"


def test_metadata_under_the_bound_still_packs(tmp_path: Path) -> None:
    """A sentencepiece charsmap sized array (a real file's largest non-vocabulary metadata) is fine."""
    ctx = _context(tmp_path)
    _with_array(ctx / "target" / "model.gguf", "tokenizer.ggml.precompiled_charsmap", UINT8, 300_000, b"\x00")
    code, _, err = _pack_peak(ctx, tmp_path / "s")
    assert code == 0, err


def test_a_scores_array_longer_than_any_vocabulary_is_refused_by_the_header_reader(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_gguf(path, **SMALL)
    _with_array(path, "tokenizer.ggml.scores", UINT8, gguf_header.MAX_ARRAY + 1, b"\x00")
    with pytest.raises(BundleError) as err:
        gguf_header.read_header(path)
    assert err.value.code == "invalid-bundle" and "at most 2,097,152 are read" in err.value.message


def test_the_header_reader_measures_what_llama_cpp_would_hold_of_the_rest(tmp_path: Path) -> None:
    """Bytes in the file plus a std::string per string element, for every string and array but the vocabulary's."""
    path = tmp_path / "m.gguf"
    write_gguf(path, **SMALL)
    base, _ = gguf_header.read_header(path)["other_metadata"]
    _with_array(path, "general.padding", STRING, 1000, _gguf_string(b"x"))
    cost, key = gguf_header.read_header(path)["other_metadata"]
    assert key == "general.padding"
    array = 4 + 8 + 1000 * (9 + gguf_header.STRING_COST)  # type, count, elements: the string the key is not counted
    assert cost - base >= array
