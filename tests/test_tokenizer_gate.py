"""The tokenizer gate refuses any difference that changes token ids, naming the first one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import runner.models.loading
from core.errors import BundleError
from runner.run import run_unpacked
from runner.checks.tokenizer_gate import check_config_agrees, check_tokenizers, fingerprint
from tests.tinymodels import make_pair, tiny_llama_config, train_tokenizer, truncate_weights_to_header, write_tokenizer

ROLES = {"target": "target/", "draft": "draft/", "tokenizer": "tokenizer/"}


@pytest.fixture(scope="module")
def trained():
    return train_tokenizer(320)


@pytest.fixture
def pair(tmp_path, trained):
    """target/ and draft/ directories carrying the same tokenizer files."""
    write_tokenizer(tmp_path / "target", trained)
    write_tokenizer(tmp_path / "draft", trained)
    return {"target": tmp_path / "target", "draft": tmp_path / "draft"}


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, ensure_ascii=False))


def refusal(dirs) -> str:
    with pytest.raises(BundleError) as caught:
        check_tokenizers(dirs)
    assert caught.value.code == "tokenizer-mismatch"
    assert caught.value.exit_code == 4
    return caught.value.message


def test_identical_tokenizers_pass_with_one_fingerprint(pair):
    assert check_tokenizers(pair) == fingerprint(pair["target"]) == fingerprint(pair["draft"] / "tokenizer.json")
    assert fingerprint(pair["target"]).startswith("sha256:") and len(fingerprint(pair["target"])) == 71


def test_formatting_and_decoder_do_not_change_the_fingerprint(pair):
    def reformat(data):
        data["decoder"] = None  # decoding text back does not decide ids

    edit_json(pair["draft"] / "tokenizer.json", reformat)
    assert check_tokenizers(pair) == fingerprint(pair["target"])


def test_different_vocabulary_is_refused(tmp_path, pair):
    write_tokenizer(pair["draft"], train_tokenizer(300))
    assert refusal(pair) == "vocabulary size differs: target 320 draft 300"


def test_one_token_changed_in_a_same_size_vocabulary_is_refused(pair):
    vocab = json.loads((pair["target"] / "tokenizer.json").read_text())["model"]["vocab"]
    token, token_id = max(vocab.items(), key=lambda item: item[1])

    def rename(data):
        del data["model"]["vocab"][token]
        data["model"]["vocab"]["zzz"] = token_id

    edit_json(pair["draft"] / "tokenizer.json", rename)
    assert refusal(pair) == f"token {token_id} differs: target {token!r} draft 'zzz'"


def test_changed_normalizer_is_refused(pair):
    edit_json(pair["draft"] / "tokenizer.json", lambda data: data.update(normalizer={"type": "NFKC"}))
    assert refusal(pair) == 'normalizer differs: target null draft {"type":"NFKC"}'


def test_changed_pre_tokenizer_is_refused(pair):
    edit_json(pair["draft"] / "tokenizer.json", lambda data: data["pre_tokenizer"].update(add_prefix_space=True))
    assert refusal(pair).startswith('pre-tokenizer differs: target {"add_prefix_space":false')


def test_changed_eos_token_is_refused(pair):
    edit_json(pair["draft"] / "tokenizer_config.json", lambda data: data.update(eos_token="<|endoftext|>"))
    assert refusal(pair) == "eos token differs: target 2 '<|im_end|>' draft 0 '<|endoftext|>'"


def test_added_special_token_is_refused(pair):
    def add(data):
        data["added_tokens"].append(
            {"id": 320, "content": "<|tool|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
        )

    edit_json(pair["draft"] / "tokenizer.json", add)
    assert refusal(pair) == "special token '<|tool|>' (id 320) only in draft"


def test_tokenizer_role_is_compared_with_the_models_tokenizers(tmp_path, pair, trained):
    write_tokenizer(tmp_path / "tokenizer", trained)
    edit_json(tmp_path / "tokenizer" / "tokenizer.json", lambda data: data.update(normalizer={"type": "NFC"}))
    message = refusal({**pair, "tokenizer": tmp_path / "tokenizer"})
    assert message.startswith("normalizer differs: target null tokenizer ")


def test_roles_without_tokenizer_files_are_skipped(tmp_path, pair):
    (tmp_path / "bare").mkdir()
    assert check_tokenizers({"target": pair["target"], "draft": tmp_path / "bare"}) == fingerprint(pair["target"])


def test_model_config_eos_id_disagreeing_with_the_tokenizer_is_refused(tmp_path, pair):
    config = tiny_llama_config(320)
    config.eos_token_id = 5
    config.save_pretrained(tmp_path / "model")
    with pytest.raises(BundleError) as caught:
        check_config_agrees(tmp_path / "model", pair["target"], "draft")
    assert caught.value.code == "tokenizer-mismatch"
    assert caught.value.message == "eos token differs: draft config.json eos_token_id 5 tokenizer '<|im_end|>' is id 2"


def test_padded_embedding_is_accepted(tmp_path, pair):
    tiny_llama_config(320 + 64).save_pretrained(tmp_path / "padded")
    check_config_agrees(tmp_path / "padded", pair["target"], "target")


def test_embedding_smaller_than_the_vocabulary_is_refused(tmp_path, pair):
    tiny_llama_config(300).save_pretrained(tmp_path / "small")
    with pytest.raises(BundleError) as caught:
        check_config_agrees(tmp_path / "small", pair["target"], "target")
    assert caught.value.code == "tokenizer-mismatch"
    assert "vocab_size 300 is smaller than the tokenizer's 320 tokens" in caught.value.message


def test_run_refuses_mismatched_tokenizers_before_loading_any_weights(tmp_path):
    paths = make_pair(tmp_path, tokenizer_in_models=True)
    edit_json(paths["draft"] / "tokenizer.json", lambda data: data.update(normalizer={"type": "Lowercase"}))
    truncate_weights_to_header(paths["target"])
    truncate_weights_to_header(paths["draft"])
    loads = runner.models.loading.LOADS
    with pytest.raises(BundleError) as caught:
        run_unpacked(tmp_path, ROLES, {}, "hello", max_new_tokens=4)
    assert caught.value.code == "tokenizer-mismatch"
    assert caught.value.message.startswith("normalizer differs: target null draft")
    assert runner.models.loading.LOADS == loads


def test_probe_set_catches_an_encoding_difference_the_fields_do_not_name(pair):
    # Truncation is not among the fingerprinted fields, yet it changes the ids of a long text.
    truncate = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
    edit_json(pair["draft"] / "tokenizer.json", lambda data: data.update(truncation=truncate))
    assert refusal(pair).startswith("probe 'Hello, world! The quick brown fox.' encodes differently: target [")
