"""The tokenizer gate: draft and target must map text to the same token ids, or nothing runs.

Stricter than llama.cpp, transformers and vLLM, which compare the vocabulary size or token texts only:
every part of tokenizer.json that decides ids is fingerprinted and, where two roles carry different
files, compared field by field (first difference reported, llama.cpp style) and then on a probe set.
Reads JSON and uses `tokenizers` only; nothing here loads a model.
"""

from __future__ import annotations

__all__ = ["check_config_agrees", "check_tokenizers", "fingerprint", "has_tokenizer_files", "load_spec"]

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.errors import BundleError
from runner.checks.modelinfo import read_config

SPECIAL_NAMES = ("bos", "eos", "pad", "unk")
# Settings of an added token that change how text is split around it.
ADDED_TOKEN_KEYS = ("id", "content", "special", "single_word", "lstrip", "rstrip", "normalized")
ROLE_ORDER = ("target", "draft", "tokenizer")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json")
PROBES = (
    "Hello, world! The quick brown fox.",
    "na\u00efve caf\u00e9 \u00c5ngstr\u00f6m \u6771\u4eac\u90fd \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0639\u0631\u0628\u064a \u0928\u092e\u0938\u094d\u0924\u0947",
    "a  b   c\t\td\n\n\ne \r\n  f\u00a0g\u3000h",
    "def f(x):\n    return {'k': x ** 2}  # square\n\tif x != 0: pass",
    "3.14159 1,000,000 -42 2026-11-30 0x1F 1e-9 007",
    "\U0001f44d\U0001f3fd \U0001f1ef\U0001f1f5 \U0001f468\u200d\U0001f469\u200d\U0001f467 \u2764\ufe0f",
    "<html><body>&amp; \\n \"quoted\" 'single'</body></html>",
    "",
    " ",
)


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


def _fingerprint(spec: TokenizerSpec) -> str:
    canonical = json.dumps(spec.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def fingerprint(tokenizer_dir_or_json: Path) -> str:
    """`sha256:<hex>` over the canonical form of everything that decides token ids.

    Covers model type, vocabulary, merges, model settings, normalizer, pre-tokenizer, post-processor,
    added tokens and the bos/eos/pad/unk tokens; not the decoder, padding, truncation or chat template.
    """
    return _fingerprint(load_spec(tokenizer_dir_or_json))


def _short(value: object, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(token: object) -> str:
    if isinstance(token, list):  # Unigram [token, score]
        return f"{token[0]!r} ({token[1]})"
    return "missing" if token is None else repr(token)


def first_difference(a_name: str, a: TokenizerSpec, b_name: str, b: TokenizerSpec) -> str | None:
    """The first field in which two tokenizers differ, worded like llama.cpp's vocab check; None if equal."""
    if a.model_type != b.model_type:
        return f"tokenizer model differs: {a_name} {a.model_type} {b_name} {b.model_type}"
    if len(a.vocab) != len(b.vocab):
        return f"vocabulary size differs: {a_name} {len(a.vocab)} {b_name} {len(b.vocab)}"
    for token_id, (ta, tb) in enumerate(zip(a.vocab, b.vocab)):
        if ta != tb:
            return f"token {token_id} differs: {a_name} {_show(ta)} {b_name} {_show(tb)}"
    if len(a.merges) != len(b.merges):
        return f"merge count differs: {a_name} {len(a.merges)} {b_name} {len(b.merges)}"
    for rank, (ma, mb) in enumerate(zip(a.merges, b.merges)):
        if ma != mb:
            return f"merge {rank} differs: {a_name} {' '.join(ma)!r} {b_name} {' '.join(mb)!r}"
    for key in sorted(set(a.model_settings) | set(b.model_settings)):
        va, vb = a.model_settings.get(key), b.model_settings.get(key)
        if va != vb:
            return f"tokenizer model setting {key} differs: {a_name} {_short(va)} {b_name} {_short(vb)}"
    for field, label in (("normalizer", "normalizer"), ("pre_tokenizer", "pre-tokenizer"), ("post_processor", "post-processor")):
        va, vb = getattr(a, field), getattr(b, field)
        if va != vb:
            return f"{label} differs: {a_name} {_short(va)} {b_name} {_short(vb)}"
    for token_id in sorted(set(a.added_tokens) | set(b.added_tokens)):
        ta, tb = a.added_tokens.get(token_id), b.added_tokens.get(token_id)
        if ta is None or tb is None:
            present, owner = (ta or tb), (a_name if ta else b_name)
            kind = "special token" if present.get("special") else "added token"
            return f"{kind} {present['content']!r} (id {token_id}) only in {owner}"
        if ta != tb:
            return f"added token {token_id} differs: {a_name} {_short(ta)} {b_name} {_short(tb)}"
    for name in SPECIAL_NAMES:
        sa, sb = a.special.get(name), b.special.get(name)
        if sa != sb:
            show = lambda s: "none" if s is None else f"{s['id']} {s['content']!r}"  # noqa: E731
            return f"{name} token differs: {a_name} {show(sa)} {b_name} {show(sb)}"
    if a.canonical() != b.canonical():  # a field the checks above do not name
        return "tokenizers differ"
    return None


def probe_difference(a_name: str, a: TokenizerSpec, b_name: str, b: TokenizerSpec) -> str | None:
    """Encodes the probe set (and every added token in context) with both; the first differing probe."""
    from tokenizers import Tokenizer

    if a.model_type.startswith("SentencePiece-") or b.model_type.startswith("SentencePiece-"):
        return _sentencepiece_probe_difference(a_name, a, b_name, b)
    try:
        tok_a, tok_b = Tokenizer.from_str(a.raw.decode("utf-8")), Tokenizer.from_str(b.raw.decode("utf-8"))
    except Exception as e:  # tokenizers raises plain Exceptions for malformed files
        raise BundleError("invalid-bundle", f"tokenizer.json cannot be loaded: {e}") from None
    specials = sorted({t["content"] for t in [*a.added_tokens.values(), *b.added_tokens.values()]})
    probes = [*PROBES, *(f"x{s}y {s}" for s in specials)]
    for text in probes:
        ids_a = tok_a.encode(text, add_special_tokens=True).ids
        ids_b = tok_b.encode(text, add_special_tokens=True).ids
        if ids_a != ids_b:
            return f"probe {text[:40]!r} encodes differently: {a_name} {ids_a[:12]} {b_name} {ids_b[:12]}"
    return None


def _sentencepiece_probe_difference(a_name: str, a: TokenizerSpec, b_name: str, b: TokenizerSpec) -> str | None:
    """The probe set encoded by both SentencePiece models; the first differing probe."""
    import sentencepiece

    try:
        sp_a, sp_b = (sentencepiece.SentencePieceProcessor(model_proto=s.raw) for s in (a, b))
    except RuntimeError as e:
        raise BundleError("invalid-bundle", f"tokenizer.model cannot be loaded: {e}") from None
    for text in PROBES:
        ids_a, ids_b = sp_a.encode(text), sp_b.encode(text)
        if ids_a != ids_b:
            return f"probe {text[:40]!r} encodes differently: {a_name} {ids_a[:12]} {b_name} {ids_b[:12]}"
    return None


def has_tokenizer_files(directory: Path) -> bool:
    return any((Path(directory) / name).is_file() for name in TOKENIZER_FILES)


def check_tokenizers(dirs: Mapping[str, Path]) -> str:
    """Requires every role's tokenizer to be the same; returns the shared fingerprint.

    `dirs` maps a role to its directory; roles whose directory carries no tokenizer files are skipped.
    The first role (target, draft, tokenizer, then others) is the reference. Raises
    BundleError("tokenizer-mismatch", "token 1234 differs: target 'ing' draft 'ed'") and the like.
    """
    roles = sorted(dirs, key=lambda r: (ROLE_ORDER.index(r) if r in ROLE_ORDER else len(ROLE_ORDER), r))
    present = [r for r in roles if has_tokenizer_files(dirs[r])]
    if not present:
        raise BundleError("invalid-bundle", "no role carries tokenizer files")
    for role in present:
        if not (Path(dirs[role]) / "tokenizer.json").is_file() and not is_sentencepiece_only(dirs[role]):
            raise BundleError(
                "tokenizer-mismatch", f"{role} carries tokenizer files but no tokenizer.json, so it cannot be compared"
            )
    spm_roles = [r for r in present if is_sentencepiece_only(dirs[r])]
    if spm_roles and len(spm_roles) != len(present):
        # tokenizer.json against tokenizer.model: two formats, no exact comparison between them
        other = next(r for r in present if r not in spm_roles)
        raise BundleError(
            "tokenizer-mismatch",
            f"{spm_roles[0]} has only a SentencePiece tokenizer.model, {other} a tokenizer.json: they cannot be compared; "
            f"{CONVERT_HINT.replace('DIR', spm_roles[0])}",
        )
    specs = {role: load_spec(dirs[role]) for role in present}
    reference = present[0]
    for role in present[1:]:
        a, b = specs[reference], specs[role]
        if a.raw == b.raw and a.special == b.special:
            continue
        difference = first_difference(reference, a, role, b) or probe_difference(reference, a, role, b)
        if difference:
            raise BundleError("tokenizer-mismatch", difference)
    return _fingerprint(specs[reference])


def check_config_agrees(model_dir: Path, tokenizer_dir: Path, role: str) -> None:
    """The model's config.json agrees with the tokenizer: bos/eos/pad ids, and room for every token id.

    An embedding larger than the vocabulary (padded, as Qwen's 152064 for 151936 tokens) passes.
    """
    config = read_config(model_dir)
    spec = load_spec(tokenizer_dir)
    vocab_size = config.get("vocab_size")
    if isinstance(vocab_size, int) and vocab_size < spec.vocab_size:
        raise BundleError(
            "tokenizer-mismatch",
            f"{role} config.json vocab_size {vocab_size} is smaller than the tokenizer's {spec.vocab_size} tokens",
        )
    for name in ("bos", "eos", "pad"):
        config_ids = config.get(f"{name}_token_id")
        special = spec.special.get(name)
        if config_ids is None or special is None:
            continue  # one side does not say: nothing to compare
        ids = config_ids if isinstance(config_ids, list) else [config_ids]
        if special["id"] not in ids:
            raise BundleError(
                "tokenizer-mismatch",
                f"{name} token differs: {role} config.json {name}_token_id {config_ids} "
                f"tokenizer {special['content']!r} is id {special['id']}",
            )
