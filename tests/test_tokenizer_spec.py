"""A tokenizer read into the parts that decide ids (runner.checks.tokenizer_spec): parsed once per content in a
process, read again when a file it came from changes. The gate that compares specs: tests/test_tokenizer_gate.py
and tests/test_sentencepiece_gate.py."""

from __future__ import annotations

import json
from pathlib import Path

from runner.checks.tokenizer_spec import load_spec
from tests.tinymodels import EOS, train_tokenizer, write_tokenizer


def test_a_spec_names_its_vocabulary_and_special_tokens(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(320)
    directory = write_tokenizer(tmp_path / "tok", tokenizer)
    spec = load_spec(directory)
    assert spec.model_type == "BPE" and spec.vocab_size == tokenizer.get_vocab_size(with_added_tokens=True)
    assert spec.special["eos"] == {"content": EOS, "id": tokenizer.token_to_id(EOS)}
    assert load_spec(directory / "tokenizer.json").canonical() == spec.canonical()  # the file or its directory


def test_the_same_content_is_parsed_once_and_a_changed_file_again(tmp_path: Path) -> None:
    directory = write_tokenizer(tmp_path / "tok", train_tokenizer(320))
    first = load_spec(directory)
    assert load_spec(directory) is first  # the same bytes: the spec already read
    data = json.loads((directory / "tokenizer.json").read_text())
    token = next(t for t, i in data["model"]["vocab"].items() if i == 300)
    data["model"]["vocab"][token + "x"] = data["model"]["vocab"].pop(token)
    (directory / "tokenizer.json").write_text(json.dumps(data))
    changed = load_spec(directory)
    assert changed is not first and changed.token(300) == token + "x" and first.token(300) == token
