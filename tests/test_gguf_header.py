"""The GGUF header reader (runner.checks.gguf_header) against the gguf package's own reader, and on headers cut
short or lying about their sizes (tests/test_hostile_gguf.py has the hostile headers in full)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import BundleError

def _their_header(path: Path) -> dict:
    """What gguf.GGUFReader reads from the same header (the way read_header used it before)."""
    import gguf

    reader = gguf.GGUFReader(str(path), "r")

    def value(field):
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            if field.types[-1] == gguf.GGUFValueType.STRING:
                return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
            return [field.parts[i].tolist()[0] for i in field.data]
        if field.types[0] == gguf.GGUFValueType.STRING:
            return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
        return field.parts[field.data[0]].tolist()[0]

    metadata = {k: value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.") and k != "tokenizer.chat_template"}
    return {"metadata": metadata, "tensors": {t.name: (tuple(int(d) for d in t.shape), int(t.n_bytes)) for t in reader.tensors}}


def test_the_header_reader_reads_what_the_gguf_package_reads(tmp_path: Path) -> None:
    from runner.checks.gguf_header import read_header
    from tests.tinygguf import write_gguf

    path = write_gguf(tmp_path / "m.gguf", tokenizer={"add_bos_token": True})
    ours = read_header(path)
    assert {key: ours[key] for key in ("metadata", "tensors")} == _their_header(path)
    assert ours["other_metadata"][0] > 0  # the reader's own figure: what llama.cpp would hold besides the vocabulary
    assert ours["metadata"]["tokenizer.ggml.add_bos_token"] is True and isinstance(ours["metadata"]["tokenizer.ggml.tokens"], list)


@pytest.mark.parametrize("cut", [3, 10, 30, 200, -100])
def test_a_truncated_or_garbled_header_is_refused_as_invalid(tmp_path: Path, cut: int) -> None:
    from runner.checks.gguf_header import read_header
    from tests.tinygguf import write_gguf

    data = write_gguf(tmp_path / "m.gguf").read_bytes()
    header_end = data.index(b"token_embd.weight") + 200  # inside the tensor infos
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:cut] if cut > 0 else data[: header_end + cut // 10])
    with pytest.raises(BundleError) as err:
        read_header(bad)
    assert err.value.code == "invalid-bundle" and "not a readable GGUF file" in err.value.message


def test_a_huge_array_count_is_refused_without_reading_it(tmp_path: Path) -> None:
    import struct

    from runner.checks.gguf_header import read_header

    key = b"tokenizer.ggml.tokens"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, 1 << 60)
    path = tmp_path / "huge.gguf"
    path.write_bytes(data)
    with pytest.raises(BundleError) as err:
        read_header(path)
    assert err.value.code == "invalid-bundle" and "longer than the file" in err.value.message
