"""The tokenizer gate: draft and target must map text to the same token ids, or nothing runs.

Stricter than llama.cpp, transformers and vLLM, which compare the vocabulary size or token texts only:
every part of tokenizer.json that decides ids is fingerprinted and, where two roles carry different
files, compared field by field (first difference reported, llama.cpp style) and then on a probe set.
The files are read into their id-deciding parts by `tokenizer_spec.py`; nothing here loads a model.
"""

from __future__ import annotations

__all__ = ["check_config_agrees", "check_tokenizers", "fingerprint", "has_tokenizer_files"]

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from core.errors import BundleError
from runner.checks.modelinfo import read_config
from runner.checks.tokenizer_spec import (
    CONVERT_HINT, SPECIAL_NAMES, TOKENIZER_FILES, TokenizerSpec, is_sentencepiece_only, load_spec,
)

ROLE_ORDER = ("target", "draft", "tokenizer")
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
