"""Hostile GGUF files (issue #24 item 4): any malformed header, and any file llama.cpp refuses or aborts on,
is `[invalid-bundle]` (exit 6) with a message, never `[internal]`; the header reader's memory is of the
order of what it keeps; `inspect` shows the tokenizer fingerprint `run` uses."""

from __future__ import annotations

import json
import shutil
import struct
import tracemalloc
from pathlib import Path

import pytest

from core.errors import BundleError
from conftest import run_bundle
from runner.checks import gguf_header, gguf_model, gguf_tokenizer_gate
from runner.run import run_unpacked
from tests.tinygguf import tokenizer_fields, write_gguf
from tests.tinymodels import make_pair

ROLES = {"target": "target", "draft": "draft"}
SMALL = dict(hidden=32, layers=1, heads=2, kv_heads=1)
UINT8, INT32, STRING, ARRAY = 0, 5, 8, 9


# --- a GGUF header written byte by byte (what a hostile tool could write; the gguf package refuses to) -------

def _str(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, kind: int, payload: bytes) -> bytes:
    """One metadata entry: key, value type, the value's bytes as given."""
    return _str(key) + struct.pack("<I", kind) + payload


def array(item: int, count: int, body: bytes) -> bytes:
    return struct.pack("<IQ", item, count) + body


def header(entries: list[bytes], n_kv: int | None = None, tensors: list[bytes] = (), n_tensors: int | None = None) -> bytes:
    n_kv = len(entries) if n_kv is None else n_kv
    n_tensors = len(tensors) if n_tensors is None else n_tensors
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + b"".join(entries) + b"".join(tensors)


def tensor(name: str, shape: tuple[int, ...], kind: int = 0, offset: int = 0) -> bytes:
    return _str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape) + struct.pack("<IQ", kind, offset)


def _refused(tmp_path: Path, data: bytes, expect: str) -> None:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    with pytest.raises(BundleError) as err:
        gguf_header.read_header(path)
    assert err.value.code == "invalid-bundle" and "hostile.gguf is not a readable GGUF file" in err.value.message
    assert expect in err.value.message, err.value.message


NESTED = kv("a", ARRAY, array(ARRAY, 1, array(UINT8, 0, b"")))
DEEP = kv("a", ARRAY, b"".join(array(ARRAY, 1, b"") for _ in range(100_000)))  # 100,000 levels deep
MALFORMED = {
    "an array of arrays": (header([NESTED]), "nested arrays"),
    "arrays nested 100,000 deep": (header([DEEP]), "nested arrays"),
    "an array count of 2^60": (header([kv("evil", ARRAY, array(UINT8, 1 << 60, b""))]), "longer than the file"),
    "a kept array count of 2^60": (header([kv("tokenizer.ggml.tokens", ARRAY, array(STRING, 1 << 60, b""))]), "longer than the file"),
    "a string length of 2^63": (header([kv("general.name", STRING, struct.pack("<Q", 1 << 63))]), "truncated"),
    "a key of 2^40 bytes": (header([struct.pack("<Q", 1 << 40)]), "at most 65,535"),
    "an unknown value type": (header([kv("a", 13, b"")]), "unknown metadata value type 13"),
    "an unknown array element type": (header([kv("a", ARRAY, array(77, 0, b""))]), "unknown array element type 77"),
    "a key twice": (header([kv("a", UINT8, b"\1"), kv("a", UINT8, b"\2")]), "appears twice"),
    "2^64-1 entries": (header([], n_kv=(1 << 64) - 1), "truncated"),
    "2^40 tensors": (header([], n_tensors=1 << 40), "tensors (at most"),
    "a tensor twice": (header([], tensors=[tensor("t", (32,)), tensor("t", (32,))]), "appears twice"),
    "a tensor of 5 dimensions": (header([], tensors=[tensor("t", (1, 1, 1, 1, 1))]), "5 dimensions"),
    "a tensor of 2^32-1 dimensions": (header([], tensors=[_str("t") + struct.pack("<I", 2**32 - 1)]), "dimensions"),
    "a tensor of an unknown type": (header([], tensors=[tensor("t", (32,), kind=999)]), "unknown ggml type 999"),
    "a tensor shape overflowing int64": (header([], tensors=[tensor("t", (1 << 40, 1 << 40))]), "impossible shape"),
    "a row not a multiple of its block": (header([], tensors=[tensor("t", (33,), kind=2)]), "impossible shape"),
    "a tensor name of 64 bytes": (header([], tensors=[tensor("n" * 64, (32,))]), "at most 63"),
    "no magic": (b"GGUG" + bytes(20), "no GGUF magic"),
    "version 1": (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
    "an empty file": (b"", "empty"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_header_is_refused_as_invalid_with_its_fault(tmp_path: Path, case: str) -> None:
    data, expect = MALFORMED[case]
    _refused(tmp_path, data, expect)


def test_a_header_cut_anywhere_is_refused_as_invalid(tmp_path: Path) -> None:
    data = write_gguf(tmp_path / "m.gguf", **SMALL).read_bytes()
    end = data.index(b"output.weight") + 40  # past the last tensor info
    for cut in range(0, end, 5):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(BundleError) as err:
            gguf_header.read_header(tmp_path / "cut.gguf")
        assert err.value.code == "invalid-bundle", cut


def test_a_kept_array_longer_than_any_vocabulary_is_refused(tmp_path: Path) -> None:
    count = gguf_header.MAX_ARRAY + 1
    _refused(tmp_path, header([kv("tokenizer.ggml.token_type", ARRAY, array(UINT8, count, bytes(count)))]),
             f"an array of {count:,} elements (at most {gguf_header.MAX_ARRAY:,} are read)")


# --- memory: of the order of what the reader keeps ----------------------------------------------------------

def _peak_reading(path: Path) -> tuple[int, dict]:
    tracemalloc.start()
    try:
        got = gguf_header.read_header(path)
        return tracemalloc.get_traced_memory()[1], got
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("item,size", [(UINT8, 1), (INT32, 4)])
def test_an_array_the_reader_does_not_keep_costs_no_memory(tmp_path: Path, item: int, size: int) -> None:
    """An 8 MiB array under a key nothing reads (the old reader built a tuple and a list of it: ~17x its bytes)."""
    count = (8 << 20) // size
    path = tmp_path / "big.gguf"
    path.write_bytes(header([kv("general.name", STRING, _str("x")), kv("hostile.array", ARRAY, array(item, count, bytes(count * size)))]))
    peak, got = _peak_reading(path)
    assert "hostile.array" not in got["metadata"] and got["metadata"]["general.name"] == "x"
    assert peak < 256 << 10, f"{peak:,} bytes at the peak reading an {count * size:,}-byte array"


def test_a_string_array_the_reader_does_not_keep_costs_no_memory(tmp_path: Path) -> None:
    count = 500_000
    path = tmp_path / "big.gguf"
    path.write_bytes(header([kv("tokenizer.ggml.scores_as_text", ARRAY, array(STRING, count, _str("ab") * count))]))
    peak, got = _peak_reading(path)
    assert got["metadata"] == {} and peak < 256 << 10, f"{peak:,} bytes"


def test_the_kept_tokenizer_arrays_cost_about_what_is_kept(tmp_path: Path) -> None:
    """A 100,000-token vocabulary with its token types: the peak is within 1.3x of the lists returned."""
    count = 100_000
    tokens = [f"t{i}" for i in range(count)]
    path = tmp_path / "vocab.gguf"
    path.write_bytes(header([
        kv("tokenizer.ggml.tokens", ARRAY, array(STRING, count, b"".join(_str(t) for t in tokens))),
        kv("tokenizer.ggml.token_type", ARRAY, array(INT32, count, struct.pack(f"<{count}i", *range(count)))),
    ]))
    tracemalloc.start()
    try:
        got = gguf_header.read_header(path)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got["metadata"]["tokenizer.ggml.tokens"] == tokens
    assert got["metadata"]["tokenizer.ggml.token_type"] == list(range(count))
    assert peak <= 1.3 * kept, f"peak {peak:,} bytes for {kept:,} kept"


# --- what llama.cpp refuses, or aborts on, after a header that reads --------------------------------------

def _pair(root: Path, target_tokenizer: dict | None = None, **target) -> Path:
    for role in ("target", "draft"):
        (root / role).mkdir(parents=True, exist_ok=True)
    write_gguf(root / "target" / "model.gguf", seed=0, tokenizer=target_tokenizer, **{"hidden": 128, "layers": 2, **target})
    write_gguf(root / "draft" / "model.gguf", seed=1, tokenizer=target_tokenizer, **SMALL)
    return root


def test_a_vocabulary_llama_cpp_aborts_on_is_refused_not_a_dead_process(tmp_path: Path) -> None:
    """Two equal tokens: llama.cpp's vocabulary loader fails a GGML_ASSERT (abort) on them."""
    tokens = tokenizer_fields()["tokens"]
    root = _pair(tmp_path, {"tokens": tokens[:-1] + [tokens[5]]})
    with pytest.raises(BundleError) as err:
        run_unpacked(root, ROLES, {"min_size_ratio": 1}, "hello", max_new_tokens=2, raw=True)
    assert err.value.code == "invalid-bundle"
    assert "llama.cpp crashed reading the vocabulary of model.gguf (SIGABRT: llama-vocab.cpp:" in err.value.message
    assert "GGML_ASSERT(id_to_token.size() == token_to_id.size()) failed" in err.value.message, err.value.message


def test_an_architecture_llama_cpp_does_not_know_is_refused_with_its_reason(tmp_path: Path) -> None:
    root = _pair(tmp_path)
    for role in ("target", "draft"):
        path = root / role / "model.gguf"
        data = path.read_bytes()
        key = _str("general.architecture") + struct.pack("<I", STRING) + _str("llama")
        path.write_bytes(data.replace(key, _str("general.architecture") + struct.pack("<I", STRING) + _str("lla.a"), 1))
    with pytest.raises(BundleError) as err:
        run_unpacked(root, ROLES, {"min_size_ratio": 1}, "hello", max_new_tokens=2, raw=True)
    assert err.value.code == "invalid-bundle"
    assert "llama.cpp cannot load model.gguf: " in err.value.message and "lla.a" in err.value.message, err.value.message


def test_weights_llama_cpp_refuses_at_load_are_refused_with_its_reason(tmp_path: Path) -> None:
    """The header and vocabulary read, a tensor's data is cut off: only the weight load finds it."""
    root = _pair(tmp_path)
    path = root / "target" / "model.gguf"
    path.write_bytes(path.read_bytes()[:-4096])
    with pytest.raises(BundleError) as err:
        run_unpacked(root, ROLES, {"min_size_ratio": 1}, "hello", max_new_tokens=2, raw=True)
    assert err.value.code == "invalid-bundle"
    assert "llama.cpp cannot load model.gguf: " in err.value.message, err.value.message


@pytest.mark.parametrize("field,value", [("eos_token_id", "two"), ("tokens", [1, 2, 3]), ("add_bos_token", 1)])
def test_tokenizer_metadata_of_the_wrong_type_is_refused(tmp_path: Path, field: str, value) -> None:
    root = _pair(tmp_path)
    headers = {role: gguf_header.read_header(root / role / "model.gguf") for role in ROLES}
    headers["draft"]["metadata"][f"tokenizer.ggml.{field}"] = value
    files = {role: root / role / "model.gguf" for role in ROLES}
    with pytest.raises(BundleError) as err:
        gguf_tokenizer_gate.check_tokenizers(files, headers)
    assert err.value.code == "invalid-bundle" and f"tokenizer.ggml.{field} is" in err.value.message


def test_sizes_of_the_wrong_type_are_refused_by_the_memory_estimate(tmp_path: Path) -> None:
    header_ = gguf_header.read_header(write_gguf(tmp_path / "m.gguf", **SMALL))
    header_["metadata"]["llama.block_count"] = "many"
    with pytest.raises(BundleError) as err:
        gguf_model.estimate_memory({"target": header_}, 64)
    assert err.value.code == "invalid-bundle" and "llama.block_count" in err.value.message


# --- through the CLI: one line, exit 6 --------------------------------------------------------------------

def _gguf_context(tmp_path: Path) -> Path:
    ctx = make_pair(tmp_path / "ctx")["root"]
    for role in ("target", "draft"):
        shutil.rmtree(ctx / role)
    return _pair(ctx)


def test_pack_refuses_a_hostile_gguf_with_one_line_and_exit_6(tmp_path: Path) -> None:
    ctx = _gguf_context(tmp_path)
    (ctx / "draft" / "model.gguf").write_bytes(header([DEEP]))
    result = run_bundle("pack", str(ctx), "-t", "hostile-gguf:1", "--store", str(tmp_path / "store"))
    assert result.code == 6, result.err
    assert result.err.startswith("error: [invalid-bundle] model.gguf is not a readable GGUF file: ")
    assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err


def test_inspect_shows_the_tokenizer_fingerprint_run_uses_on_a_gguf_bundle(tmp_path: Path, keypair) -> None:
    """The GGUF files' own tokenizer (what llama.cpp tokenizes with), not the `tokenizer` role's files."""
    from runner.checks import tokenizer_gate

    ctx = _gguf_context(tmp_path)
    store, ref = str(tmp_path / "store"), "gguf-inspect:1"
    run_bundle("pack", str(ctx), "-t", ref, "--key", str(keypair[0]), "--store", store, check=True)
    info = json.loads(run_bundle("inspect", ref, "--json", "--key", str(keypair[1]), "--store", store, check=True).out)
    target = gguf_header.read_header(ctx / "target" / "model.gguf")
    uses = run_unpacked(ctx, ROLES, {"min_size_ratio": 1}, "hi", max_new_tokens=1, raw=True)["tokenizer"]["fingerprint"]
    assert info["tokenizer"]["fingerprint"] == uses == gguf_tokenizer_gate.fingerprint(gguf_tokenizer_gate.tokenizer_metadata(target))
    assert info["tokenizer"]["fingerprint"] != tokenizer_gate.fingerprint(ctx / "tokenizer")
    assert info["models"]["target"]["parameters"] == gguf_model.parameters(target)
    shown = run_bundle("inspect", ref, "--key", str(keypair[1]), "--store", store, check=True).out
    assert f"tokenizer: {uses}" in shown


def test_run_refuses_a_signed_gguf_whose_weights_llama_cpp_refuses_with_exit_6(tmp_path: Path, keypair) -> None:
    """A tensor renamed in the header: the header, the vocabulary and pack's checks pass, llama.cpp's weight
    load finds the tensor missing; `run` says so in one line, exit 6."""
    ctx = _gguf_context(tmp_path)
    path = ctx / "target" / "model.gguf"
    path.write_bytes(path.read_bytes().replace(b"blk.1.ffn_up.weight", b"blk.1.ffn_up.wfight", 1))
    store, ref = str(tmp_path / "store"), "tiny-spec:1.0.0"  # the Kitfile's name and version
    run_bundle("pack", str(ctx), "-t", ref, "--key", str(keypair[0]), "--store", store, check=True)
    result = run_bundle("run", ref, "--prompt", "hi", "--max-new-tokens", "2", "--key", str(keypair[1]), "--store", store)
    assert result.code == 6, result.err
    assert result.err.strip().splitlines() == [result.err.strip()] and "Traceback" not in result.err
    assert result.err.startswith("error: [invalid-bundle] llama.cpp cannot load model.gguf: ")
    assert "blk.1.ffn_up.weight" in result.err, result.err
