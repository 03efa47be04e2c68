"""A tokenizer read into the parts that decide token ids (`TokenizerSpec`), from tokenizer.json or a SentencePiece
tokenizer.model, with the bos/eos/pad/unk tokens its config names.

Parsed once per content in a process (`load_spec`): the gate, the config check and the runner each ask for the
same directory. Reads JSON (and the SentencePiece protobuf) only; nothing here loads a model.
"""

from __future__ import annotations

__all__ = [
    "CONVERT_HINT", "SPECIAL_NAMES", "TOKENIZER_FILES", "TokenizerSpec", "is_sentencepiece_only",
    "load_sentencepiece_spec", "load_spec",
]

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from core.errors import BundleError

SPECIAL_NAMES = ("bos", "eos", "pad", "unk")
# Settings of an added token that change how text is split around it.
ADDED_TOKEN_KEYS = ("id", "content", "special", "single_word", "lstrip", "rstrip", "normalized")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class TokenizerSpec:
    """The parts of a tokenizer that decide token ids, in canonical form."""

    raw: bytes  # tokenizer.json as stored, for the probe encode
    model_type: str
    vocab: list  # id -> token (None for a gap)
    merges: list  # [left, right] pairs in rank order
    model_settings: dict  # the rest of the model section (unk_token, byte_fallback, ...)
    normalizer: object
    pre_tokenizer: object
    post_processor: object
    added_tokens: dict  # id -> added token settings
    special: dict  # "bos"/"eos"/... -> {"id", "content"}

    def canonical(self) -> dict:
        return {
            "model_type": self.model_type,
            "vocab": self.vocab,
            "merges": self.merges,
            "model_settings": self.model_settings,
            "normalizer": self.normalizer,
            "pre_tokenizer": self.pre_tokenizer,
            "post_processor": self.post_processor,
            "added_tokens": [self.added_tokens[i] for i in sorted(self.added_tokens)],
            "special": self.special,
        }

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce: model vocabulary and added tokens."""
        return max([len(self.vocab) - 1, *self.added_tokens]) + 1

    def token(self, token_id: int) -> str | None:
        if token_id in self.added_tokens:
            return self.added_tokens[token_id]["content"]
        return self.vocab[token_id] if 0 <= token_id < len(self.vocab) else None


def _tokenizer_json(path: Path) -> Path:
    path = Path(path)
    return path / "tokenizer.json" if path.is_dir() else path


def _special_names(directory: Path) -> dict[str, str]:
    """bos/eos/pad/unk token texts from tokenizer_config.json, else special_tokens_map.json."""
    names: dict[str, str] = {}
    for filename in ("special_tokens_map.json", "tokenizer_config.json"):  # the second wins
        path = directory / filename
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BundleError("invalid-bundle", f"{path} is not valid JSON: {e}") from None
        for name in SPECIAL_NAMES:
            value = data.get(f"{name}_token")
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) or (value is None and f"{name}_token" in data):
                names[name] = value
    return {k: v for k, v in names.items() if v is not None}


SENTENCEPIECE_FILE = "tokenizer.model"
# TrainerSpec fields that change how a SentencePiece model splits text into ids.
SENTENCEPIECE_SETTINGS = (
    "model_type", "byte_fallback", "split_digits", "split_by_whitespace", "split_by_unicode_script", "split_by_number",
    "treat_whitespace_as_suffix", "allow_whitespace_only_pieces", "max_sentencepiece_length", "unk_id", "bos_id",
    "eos_id", "pad_id", "unk_piece", "bos_piece", "eos_piece", "pad_piece", "control_symbols", "user_defined_symbols",
)
CONVERT_HINT = (
    "convert it to tokenizer.json with transformers: "
    "python -c \"from transformers import AutoTokenizer as T; T.from_pretrained('DIR').save_pretrained('DIR')\""
)


def is_sentencepiece_only(directory: Path) -> bool:
    """A tokenizer that comes as a SentencePiece tokenizer.model without tokenizer.json."""
    directory = Path(directory)
    return directory.is_dir() and (directory / SENTENCEPIECE_FILE).is_file() and not (directory / "tokenizer.json").is_file()


def _spec_dict(message) -> dict:
    """A protobuf message's set fields as plain JSON values (bytes as their sha256)."""
    out: dict = {}
    for field, value in message.ListFields():
        if isinstance(value, bytes):
            value = "sha256:" + hashlib.sha256(value).hexdigest()
        elif hasattr(value, "ListFields"):
            value = _spec_dict(value)
        elif not isinstance(value, (str, int, float, bool)):
            value = list(value)
        out[field.name] = value
    return out


def load_sentencepiece_spec(directory: Path) -> TokenizerSpec:
    """A SentencePiece tokenizer.model's id-deciding parts: every piece with its score and type, the model
    type and the trainer settings that split text, the normalizer and denormalizer (their rules and
    precompiled character maps, hashed). Needs the `sentencepiece` package (its model protobuf)."""
    path = Path(directory) / SENTENCEPIECE_FILE
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:
        raise BundleError("tokenizer-mismatch", f"{path}: comparing SentencePiece tokenizers needs the sentencepiece package; or {CONVERT_HINT}") from None
    raw = path.read_bytes()
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(raw)
    except Exception as e:  # protobuf raises DecodeError (not exported uniformly across versions)
        raise BundleError("invalid-bundle", f"{path} is not a SentencePiece model: {e}") from None
    if not proto.pieces:
        raise BundleError("invalid-bundle", f"{path} is not a SentencePiece model: no pieces")
    vocab = [[p.piece, p.score, sentencepiece_model_pb2.ModelProto.SentencePiece.Type.Name(p.type)] for p in proto.pieces]
    trainer = _spec_dict(proto.trainer_spec)
    settings = {k: trainer[k] for k in SENTENCEPIECE_SETTINGS if k in trainer}
    model_type = "SentencePiece-" + sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)
    text_to_id: dict[str, int] = {}
    for token_id, (piece, _score, _type) in enumerate(vocab):
        text_to_id.setdefault(piece, token_id)
    special = {name: {"content": content, "id": text_to_id.get(content)} for name, content in _special_names(Path(directory)).items()}
    return TokenizerSpec(
        raw=raw, model_type=model_type, vocab=vocab, merges=[], model_settings=settings,
        normalizer=_spec_dict(proto.normalizer_spec), pre_tokenizer=None,
        post_processor=_spec_dict(proto.denormalizer_spec) or None, added_tokens={}, special=special,
    )


_SPECS: dict[tuple, TokenizerSpec] = {}  # load_spec's results, by the files they were read from (see there)
_SPECS_KEPT = 8  # a run asks for 3 directories at most; a long-lived process (tests, serve) keeps the newest


def load_spec(tokenizer_dir_or_json: Path) -> TokenizerSpec:
    """Reads a tokenizer directory (or a tokenizer.json path) into its canonical parts; a directory with only
    a SentencePiece tokenizer.model is read by `load_sentencepiece_spec`.

    Parsed once per content in a process: the gate, the config check and the runner each ask for the same
    directory, and parsing a large tokenizer.json costs a hundred times hashing it (docs/benchmarks.md). The
    key is the sha256 of every file a spec is read from, so a changed file is read again however quickly it changed. Callers treat a spec as read-only."""
    path = Path(tokenizer_dir_or_json)
    directory = path if path.is_dir() else path.parent
    sources = [path] if path.is_file() else []
    sources += [directory / name for name in TOKENIZER_FILES if (directory / name).is_file()]
    try:
        key = (str(path.resolve()), tuple((str(f), hashlib.sha256(f.read_bytes()).hexdigest()) for f in sources))
    except OSError:
        return _load_spec(path)
    if key not in _SPECS:
        if len(_SPECS) >= _SPECS_KEPT:
            del _SPECS[next(iter(_SPECS))]  # the oldest
        _SPECS[key] = _load_spec(path)
    return _SPECS[key]


def _load_spec(tokenizer_dir_or_json: Path) -> TokenizerSpec:
    if is_sentencepiece_only(Path(tokenizer_dir_or_json)):
        return load_sentencepiece_spec(Path(tokenizer_dir_or_json))
    path = _tokenizer_json(tokenizer_dir_or_json)
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
    except FileNotFoundError:
        raise BundleError("invalid-bundle", f"{path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError("invalid-bundle", f"{path} is not valid JSON: {e}") from None
    model = dict(data.get("model") or {})
    model_type = model.pop("type", None) or ("BPE" if "merges" in model else "unknown")
    vocab_field = model.pop("vocab", {})
    if isinstance(vocab_field, dict):  # BPE, WordPiece, WordLevel: token -> id
        vocab: list = [None] * (max(vocab_field.values(), default=-1) + 1)
        for token, token_id in vocab_field.items():
            vocab[token_id] = token
    else:  # Unigram: [token, score] in id order; the scores decide ids too
        vocab = [list(entry) for entry in vocab_field]
    merges = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in model.pop("merges", [])]
    added = {
        t["id"]: {k: t[k] for k in ADDED_TOKEN_KEYS if k in t} for t in data.get("added_tokens") or []
    }
    text_to_id = {t["content"]: i for i, t in added.items()}
    for token_id, token in enumerate(vocab):
        if isinstance(token, str):
            text_to_id.setdefault(token, token_id)
        elif isinstance(token, list):
            text_to_id.setdefault(token[0], token_id)
    directory = path.parent
    special = {
        name: {"content": content, "id": text_to_id.get(content)}
        for name, content in _special_names(directory).items()
    }
    return TokenizerSpec(
        raw=raw,
        model_type=model_type,
        vocab=vocab,
        merges=merges,
        model_settings=model,
        normalizer=data.get("normalizer"),
        pre_tokenizer=data.get("pre_tokenizer"),
        post_processor=data.get("post_processor"),
        added_tokens=added,
        special=special,
    )
