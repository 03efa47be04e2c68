"""Tokenizer copies in model roles are judged by meaning (the tokenizer gate), not by bytes."""

from __future__ import annotations

import json
from pathlib import Path

from bundletree import make_tree, tokenizer_json
from conftest import run_bundle
from tests.unchecked_pack import pack_unchecked


def _pack_and_verify(tree: Path, store: Path):
    # Built with the library: `bundle pack` refuses a changed copy itself (tests/test_pack_checks.py); this is verify's judgement.
    pack_unchecked(tree, "tiny-spec:1.0.0", store)
    return run_bundle("verify", "tiny-spec:1.0.0", "--allow-unsigned", "--store", str(store))


def test_a_draft_copy_with_another_chat_template_passes(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "ctx")
    (tree / "draft" / "tokenizer.json").write_text(json.dumps(json.loads(tokenizer_json()), indent=4))  # other bytes, same meaning
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": "{{ messages[0]['content'] }}"}
    (tree / "draft" / "tokenizer_config.json").write_text(json.dumps(config))
    r = _pack_and_verify(tree, tmp_path / "store")
    assert r.code == 0, r.err
    assert "tokenize identically" in r.out


def test_a_draft_copy_that_changes_an_id_is_refused_field_by_field(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "ctx")
    vocab = ["<unk>", "<s>", "</s>", "hello", "world", "spec", "bundle", "draft", "target", "tokens"]
    (tree / "draft" / "tokenizer.json").write_text(tokenizer_json(vocab))
    r = _pack_and_verify(tree, tmp_path / "store")
    assert r.code == 4
    assert r.err.startswith("error: [tokenizer-mismatch] token 9 differs: ") and "'token'" in r.err and "'tokens'" in r.err
