"""The tokenizer gate on SentencePiece tokenizers (tokenizer.model without tokenizer.json): fingerprinted and
compared piece by piece (piece, score, type), by settings and normalizer, then on probes; a tokenizer.model
against a tokenizer.json is refused with a message that says how to convert."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from core.errors import BundleError
from runner.checks.tokenizer_gate import check_tokenizers, fingerprint
from tests.tinymodels import CORPUS, train_tokenizer, write_tokenizer


def _sentencepiece(directory: Path, vocab_size: int = 120, model_type: str = "unigram") -> Path:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=vocab_size,
                                   model_type=model_type, minloglevel=2, hard_vocab_limit=False)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.model").write_bytes(model.getvalue())
    return directory


def _edit(directory: Path, change) -> None:
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((directory / "tokenizer.model").read_bytes())
    change(proto)
    (directory / "tokenizer.model").write_bytes(proto.SerializeToString())


@pytest.fixture
def pair(tmp_path: Path) -> dict[str, Path]:
    target = _sentencepiece(tmp_path / "target")
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "tokenizer.model").write_bytes((target / "tokenizer.model").read_bytes())
    return {"target": target, "draft": draft}


def test_the_same_sentencepiece_model_passes_with_one_fingerprint(pair: dict[str, Path]) -> None:
    assert check_tokenizers(pair) == fingerprint(pair["target"]) == fingerprint(pair["draft"])
    assert fingerprint(pair["target"]).startswith("sha256:")


def test_a_piece_score_differs_and_is_named(pair: dict[str, Path]) -> None:
    def change(proto):
        proto.pieces[10].score += 0.5

    _edit(pair["draft"], change)
    with pytest.raises(BundleError) as err:
        check_tokenizers(pair)
    assert err.value.code == "tokenizer-mismatch" and "token 10 differs" in err.value.message


def test_a_normalizer_difference_is_refused(pair: dict[str, Path]) -> None:
    def change(proto):
        proto.normalizer_spec.add_dummy_prefix = not proto.normalizer_spec.add_dummy_prefix

    _edit(pair["draft"], change)
    with pytest.raises(BundleError) as err:
        check_tokenizers(pair)
    assert err.value.code == "tokenizer-mismatch" and "normalizer differs" in err.value.message
    assert fingerprint(pair["target"]) != fingerprint(pair["draft"])


def test_another_sentencepiece_model_is_refused(pair: dict[str, Path], tmp_path: Path) -> None:
    _sentencepiece(tmp_path / "other", model_type="bpe")
    with pytest.raises(BundleError) as err:
        check_tokenizers({"target": pair["target"], "draft": tmp_path / "other"})
    assert err.value.code == "tokenizer-mismatch"


def test_a_tokenizer_model_against_a_tokenizer_json_is_refused_with_how_to_convert(pair: dict[str, Path], tmp_path: Path) -> None:
    fast = write_tokenizer(tmp_path / "fast", train_tokenizer(320))
    with pytest.raises(BundleError) as err:
        check_tokenizers({"target": fast, "draft": pair["draft"]})
    assert err.value.code == "tokenizer-mismatch"
    assert "tokenizer.model" in err.value.message and "save_pretrained" in err.value.message
