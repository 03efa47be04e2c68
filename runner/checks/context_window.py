"""A prompt against the model's own context window, before any weights load and in time linear in the prompt.

The window is the target's: `max_position_embeddings` of its config.json, or `<architecture>.context_length`
of its GGUF header. A prompt and the tokens asked of it must fit it together. Two steps, cheapest first:

1. By length alone, before tokenizing: a byte-level BPE token (SmolLM, Llama 3, Qwen) covers at most its own
   length in bytes, so a prompt of more than (longest token x tokens left) bytes cannot fit whatever it says,
   and is refused untokenized (a 5 MB line is never tokenized, nor a pair sized for it). A tokenizer that
   drops text (normalizers, whitespace splitting) might fit such a prompt: refused all the same, by policy.
2. The prompt's ids (the chat template included) counted exactly.

Either refusal is a usage error (exit 2) at the command line; serve answers 400 context_length_exceeded.
"""

from __future__ import annotations

__all__ = ["PromptContext", "check_window", "fitting_ids", "gguf_window", "longest_token_bytes", "model_window",
           "prompt_byte_limit"]

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import BundleError
from runner.checks.modelinfo import read_config

MAX_WINDOW = 1 << 30  # modelinfo's bound on max_position_embeddings


@dataclass(frozen=True)
class PromptContext:
    """What a run sizes its caches for: these prompts (each checked against the window, then tokenized) and
    `new_tokens` after the longest. load_pair takes it where it would take (prompt tokens, new tokens)."""

    prompts: Sequence[str]
    new_tokens: int
    raw: bool = False


def _window_value(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_WINDOW else None


def model_window(target_dir: Path) -> int | None:
    """The target's context window from its config.json (max_position_embeddings); None where it names none."""
    config = read_config(target_dir)
    return _window_value(config.get("max_position_embeddings"))


def gguf_window(metadata: Mapping[str, Any]) -> int | None:
    """The context window a GGUF header declares (`<general.architecture>.context_length`); None without one."""
    arch = metadata.get("general.architecture")
    return _window_value(metadata.get(f"{arch}.context_length")) if isinstance(arch, str) else None


def longest_token_bytes(tokenizer: Any) -> int | None:
    """The UTF-8 length of the tokenizer's longest token (its vocabulary as written), or None when the
    tokenizer does not show its vocabulary."""
    backend = getattr(tokenizer, "backend", None) or getattr(tokenizer, "backend_tokenizer", None)
    tokens: Any = None
    if backend is not None and hasattr(backend, "get_vocab"):
        tokens = backend.get_vocab(with_added_tokens=True)
    elif isinstance(getattr(tokenizer, "metadata", None), Mapping):  # a GGUF file's tokenizer (runner.gguf_run)
        tokens = tokenizer.metadata.get("tokenizer.ggml.tokens")
    elif hasattr(tokenizer, "get_vocab"):
        tokens = tokenizer.get_vocab()
    if not tokens:
        return None
    return max(len(str(t).encode("utf-8", "replace")) for t in tokens)


def prompt_byte_limit(tokenizer: Any, max_prompt_tokens: int) -> int | None:
    """Bytes past which a prompt cannot be `max_prompt_tokens` tokens or fewer (see the module docstring), or
    None when the vocabulary cannot be read."""
    longest = longest_token_bytes(tokenizer)
    return None if longest is None else longest * max(max_prompt_tokens, 0)


def check_window(prompt_tokens: int, new_tokens: int, window: int | None) -> None:
    """A usage error when a prompt of `prompt_tokens` and `new_tokens` more do not fit the window."""
    if window is not None and prompt_tokens + new_tokens > window:
        raise BundleError("usage", f"the prompt is {prompt_tokens} tokens and {new_tokens} new tokens are asked: "
                                   f"more than the model's context window of {window} tokens (shorten the prompt or "
                                   f"lower --max-new-tokens)")


def fitting_ids(prompts: Sequence[str], new_tokens: int, window: int | None, tokenizer: Any,
                to_ids: Callable[[str], list[int]]) -> list[list[int]]:
    """Each prompt's ids (`to_ids`), each prompt first refused by its length alone where it cannot fit the
    window with `new_tokens` after it, then by its ids counted; a usage error names the first that does not fit."""
    if window is not None:
        check_window(0, new_tokens, window)
        limit = prompt_byte_limit(tokenizer, window - new_tokens)
        for prompt in prompts:
            size = len(prompt.encode("utf-8", "surrogatepass"))
            if limit is not None and size > limit:
                raise BundleError("usage", f"the prompt is {size} bytes: more than the {window - new_tokens} tokens the "
                                           f"model's context window of {window} leaves beside {new_tokens} new tokens, "
                                           f"whatever it says (at most {limit} bytes are tokenized)")
    out = []
    for prompt in prompts:
        ids = to_ids(prompt)
        check_window(len(ids), new_tokens, window)
        out.append(ids)
    return out
