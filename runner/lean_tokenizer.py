"""The bundle's tokenizer without transformers, where that gives transformers' own ids and text.

Why: importing transformers' AutoTokenizer costs about 1.6 s on this CPU (2 s more with its config
classes), before `bundle run` can size its memory preflight by the prompt. A tokenizer.json that
transformers' generic fast tokenizer (`PreTrainedTokenizerFast`, `TokenizersBackend`) uses exactly as it is
written runs here on the `tokenizers` library, transformers' own backend, with the chat template rendered the
way transformers renders it (runner.chat_template: transformers' sandboxed environment, bounded; the named
special tokens as variables; the result encoded without special tokens added).

`load_tokenizer` returns transformers' AutoTokenizer for anything where transformers would change the
tokenizer while loading it: another tokenizer class, add_bos_token/add_eos_token, special or added tokens the
file does not hold, truncation or padding written in the file, split special tokens, a chat template in a
file of its own, special_tokens_map.json naming other tokens, cleanup of spaces on a non-BPE model.
tests/test_lean_tokenizer.py checks ids, chat ids and decoded text against AutoTokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner import chat_template

GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "additional_chat_templates")


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
    if config is None or config.get("tokenizer_class") not in GENERIC_CLASSES:
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
    added = {token.content: (token_id, token.special) for token_id, token in backend.get_added_tokens_decoder().items()}
    named = {name: _content(config.get(name)) for name in NAMED_SPECIAL}
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    wanted = [t for t in named.values() if t is not None] + [_content(t) for t in (extra.values() if isinstance(extra, dict) else extra)]
    if any(t is None or t not in added or not added[t][1] for t in wanted):
        return None
    for token_id, token in (config.get("added_tokens_decoder") or {}).items():
        have = added.get(_content(token))
        if have is None or str(have[0]) != str(token_id) or have[1] != bool(token.get("special")):
            return None
    side = _read(directory / "special_tokens_map.json")
    if side is not None and any(_content(side.get(name)) not in (None, named[name]) for name in NAMED_SPECIAL):
        return None
    return backend, config


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
        rendered by the bounded renderer (runner.chat_template)."""
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

    return AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
