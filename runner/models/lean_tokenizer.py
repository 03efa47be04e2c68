"""The bundle's tokenizer without transformers, where that gives transformers' own ids and text.

Why: importing transformers' AutoTokenizer costs about 1.6 s on this CPU (2 s more with its config
classes), before `bundle run` can size its memory preflight by the prompt. A tokenizer.json that
transformers' generic fast tokenizer (`PreTrainedTokenizerFast`, `TokenizersBackend`) uses exactly as it is
written runs here on the `tokenizers` library, transformers' own backend, with the chat template rendered the
way transformers renders it (runner.models.chat_template: transformers' sandboxed environment, bounded; the named
special tokens as variables; the result encoded without special tokens added).

`load_tokenizer` returns transformers' AutoTokenizer for anything where transformers would change the
tokenizer while loading it: another tokenizer class, any tokenizer_config.json key outside CONFIG_KEYS
(add_bos_token/add_eos_token, model-specific `*_token`s, ...), special or added tokens the file does not
hold or holds with other flags than transformers gives them (rstrip, lstrip, single_word, normalized,
special: `_tokens_unchanged`), special tokens written as dicts, truncation or padding written in the file,
split special tokens, a chat template or added_tokens.json in a file of its own, a special_tokens_map.json
that says more than the config, cleanup of spaces on a non-BPE model. The rules follow the transformers
this project installs (5.x). tests/test_lean_tokenizer.py checks ids, chat ids and decoded text against
AutoTokenizer; tests/test_lean_tokenizer_differential.py does so on seeded random tokenizer directories.
A directory transformers itself cannot load is BundleError("invalid-bundle"), not a traceback.
"""

from __future__ import annotations

__all__ = ["LeanTokenizer", "load_tokenizer"]

import json
from pathlib import Path
from typing import Any

from runner.models import chat_template
from core.errors import BundleError

GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "additional_chat_templates", "added_tokens.json")
# tokenizer_config.json keys the lean path applies (the special tokens, the template) or that change no ids
# and no text for a generic fast tokenizer (transformers keeps them as attributes). Any other key (a
# model-specific `image_token`, `add_prefix_space`, `do_lower_case`, `legacy`, ...) sends the directory to
# AutoTokenizer: the lean path is transformers, or it is not used.
CONFIG_KEYS = frozenset(NAMED_SPECIAL) | {
    "tokenizer_class", "chat_template", "added_tokens_decoder", "additional_special_tokens", "extra_special_tokens",
    "clean_up_tokenization_spaces", "model_max_length", "padding_side", "truncation_side", "model_input_names",
    "name_or_path", "backend", "is_local", "local_files_only", "processor_class", "split_special_tokens",
    "add_prefix_space", "vocab_size",
}
# An added token's fields that change how text splits around it (tokenizers.AddedToken)
TOKEN_FLAGS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _exact(directory: Path):
    """The parsed tokenizer.json (a `tokenizers.Tokenizer`) and tokenizer_config.json when transformers would
    use the first as it is; else None. The checks read the parsed tokenizer: the file is parsed once."""
    config = _read(directory / "tokenizer_config.json")
    if config is None or config.get("tokenizer_class") not in GENERIC_CLASSES or not CONFIG_KEYS.issuperset(config):
        return None
    if any((directory / name).exists() for name in TEMPLATE_FILES) or not isinstance(config.get("chat_template", ""), str):
        return None
    if "add_bos_token" in config or "add_eos_token" in config or config.get("split_special_tokens"):
        return None
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
    except Exception:  # noqa: BLE001 - AutoTokenizer then loads it, or says what is wrong with it
        return None
    if backend.truncation is not None or backend.padding is not None:
        return None
    if config.get("clean_up_tokenization_spaces") and type(backend.model).__name__ != "BPE":
        return None
    if backend.get_vocab_size(with_added_tokens=False) > 100_000:  # transformers may patch a Mistral regex there
        return None
    if not _tokens_unchanged(backend, config, _read(directory / "special_tokens_map.json")):
        return None
    return backend, config


def _flags(token) -> dict:
    """An added token's TOKEN_FLAGS, from a tokenizers.AddedToken or a tokenizer_config.json dict (with
    tokenizers' defaults for the fields a dict leaves out)."""
    if isinstance(token, dict):
        special = bool(token.get("special", False))
        defaults = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": not special, "special": special}
        return {name: token.get(name, defaults.get(name)) for name in TOKEN_FLAGS}
    return {name: getattr(token, name) for name in TOKEN_FLAGS}


def _tokens_unchanged(backend, config: dict, side: dict | None) -> bool:
    """Whether transformers would leave the file's added tokens as they are: it re-adds every entry of
    added_tokens_decoder that differs from the file's (any flag), and then every named and extra special
    token with the flags it gives them (a config entry's, or special and not normalized), and adding a token
    again replaces its flags. So each must already be in the file, special, with exactly those flags.
    Special tokens written as dicts, extra tokens by name (a dict), or a special_tokens_map.json that says
    more than the config are not followed here: AutoTokenizer then."""
    added = {token.content: (token_id, _flags(token)) for token_id, token in backend.get_added_tokens_decoder().items()}
    decoder = config.get("added_tokens_decoder")
    if decoder is not None and not isinstance(decoder, dict):
        return False
    configured = {}
    for token_id, token in (decoder or {}).items():
        have = added.get(_content(token)) if isinstance(token, dict) else None
        if have is None or str(have[0]) != str(token_id) or have[1] != _flags(token):
            return False
        configured[have[1]["content"]] = have[1]
    named = [config.get(name) for name in NAMED_SPECIAL if config.get(name) is not None]
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    if not isinstance(extra, list) or not all(isinstance(t, str) for t in named + extra):
        return False
    if side is not None:  # transformers reads it only without added_tokens_decoder; then it overrides the config
        said = {k: v for k, v in side.items() if v is not None}
        if any(k not in NAMED_SPECIAL or said[k] != config.get(k) for k in said):
            return False
    plain = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    for token in named + extra:
        have = added.get(token)
        if have is None or not have[1]["special"]:
            return False
        if token in named and decoder is None:
            continue  # mapped to the file's own added token: unchanged
        want = configured.get(token, {"content": token, **plain}) if token in named else {"content": token, **plain}
        if have[1] != want:
            return False
    return True


class LeanTokenizer:
    """The calls runner.run makes of a tokenizer: `tokenizer(text)`, `apply_chat_template`, `decode`,
    `chat_template`, `eos_token_id`."""

    def __init__(self, backend, config: dict) -> None:
        self.backend = backend  # a tokenizers.Tokenizer
        self.chat_template: str | None = config.get("chat_template") or None
        self.special_tokens_map = {name: value for name in NAMED_SPECIAL if (value := _content(config.get(name))) is not None}
        eos = self.special_tokens_map.get("eos_token")
        self.eos_token_id = None if eos is None else self.backend.token_to_id(eos)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.backend.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False, tokenize: bool = True):
        """As transformers' apply_chat_template(messages, add_generation_prompt=..., tokenize=...) on one chat,
        rendered by the bounded renderer (runner.models.chat_template)."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        text = chat_template.render(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                                    variables=self.special_tokens_map)
        return self(text, add_special_tokens=False) if tokenize else text


def load_tokenizer(directory: Path):
    """A LeanTokenizer where it gives transformers' results (see the module docstring), else AutoTokenizer."""
    exact = _exact(Path(directory))
    if exact is not None:
        return LeanTokenizer(*exact)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - whatever transformers raises on these files, it is about the files
        raise BundleError("invalid-bundle", f"transformers cannot load the tokenizer in {Path(directory).name}/: "
                          f"{type(err).__name__}: {str(err)[:300]}") from None
