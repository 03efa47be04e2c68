"""A checked, loaded pair ready to generate, whatever its engine: which engine a bundle's weights take
(`gguf_dirs`), and what `runner.run.load_pair` returns (torch, or llama.cpp through
`runner.gguf_run.load_gguf_pair`) and generation, serve and bench take."""

from __future__ import annotations

__all__ = ["LoadedPair", "TextStream", "context_tokens", "gguf_dirs", "prompt_ids"]

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.checks.context_window import PromptContext, fitting_ids
from runner.checks.gguf_model import bundle_format
from runner.decoding.guard import prior_verdict
from runner.decoding.settings import DecodingSettings
from runner.models import chat_template

if TYPE_CHECKING:
    import torch

    from runner.decoding.run_history import RunHistory
    from runner.engines import Engine


def gguf_dirs(root: Path, roles: Mapping[str, str]) -> dict[str, Path] | None:
    """The target and draft directories when the bundle pairs two GGUF files (the llama.cpp engine,
    runner.gguf_run), else None (safetensors on the torch engine, runner.run). The one place run, serve, bench
    and the content checks choose by; a pair that mixes the two is refused (exit 6)."""
    dirs = {role: Path(root) / path for role, path in roles.items() if role in ("target", "draft")}
    # a target without a draft: a bundle for draft-free speculation
    if "target" in dirs and all(d.is_dir() for d in dirs.values()) and bundle_format(dirs) == "gguf":
        return dirs
    return None


def prompt_ids(tokenizer, prompt: str, raw: bool) -> list[int]:
    """The prompt as ids: through the chat template when the tokenizer has one and raw is off."""
    if hasattr(tokenizer, "prompt_ids"):  # a GGUF file's own tokenizer (runner.gguf_run)
        return tokenizer.prompt_ids(prompt, raw)
    if not raw and getattr(tokenizer, "chat_template", None):
        return chat_template.chat_ids(tokenizer, [{"role": "user", "content": prompt}])
    ids = tokenizer(prompt)
    if isinstance(ids, Mapping) or hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def context_tokens(context: Any, tokenizer: Any, window: int | None) -> tuple[int, int]:
    """(prompt tokens, new tokens) the caches must hold: a PromptContext's prompts each checked against the
    model's window (by length, then by ids: runner.checks.context_window) and the longest counted; a tuple as
    given; a function of the tokenizer as it answers."""
    if isinstance(context, PromptContext):
        ids = fitting_ids(context.prompts, context.new_tokens, window, tokenizer,
                          lambda prompt: prompt_ids(tokenizer, prompt, context.raw))
        return max((len(i) for i in ids), default=0), context.new_tokens
    return context(tokenizer) if callable(context) else context


class TextStream:
    """Turns new token ids into new text, holding back an incomplete UTF-8 character."""

    def __init__(self, tokenizer, on_text: Callable[[str], None]):
        self.tokenizer, self.on_text, self.tokens, self.shown = tokenizer, on_text, [], 0

    def __call__(self, new: list[int]) -> None:
        self.tokens += new
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        if len(text) > self.shown:
            self.on_text(text[self.shown :])
        self.shown = len(text)


def forward_path(model) -> str:
    """Which forward a model runs through: "compact" (runner.models.compact_llama) or "transformers"."""
    from runner.models import compact_llama

    return "compact" if isinstance(model, compact_llama.CompactLlama) else "transformers"


@dataclass
class LoadedPair:
    """A checked, loaded pair, ready to generate: what `load_pair` returns and `generate` takes."""

    tokenizer: Any  # transformers', ours (runner.models.lean_tokenizer) or a GGUF file's (runner.gguf_run)
    target: Engine | torch.nn.Module  # a llama.cpp engine, or a torch model the torch engine wraps (runner.engines.as_engine)
    draft: Engine | torch.nn.Module | None  # None: a pair without a draft model (draft-free methods only)
    params: Mapping
    fingerprint: str
    eos_ids: set[int]
    vocab_size: int | None
    device: str
    dtype: str
    draft_tokens: int
    pairing: dict
    memory: dict
    context_tokens: int  # the tokens (prompt + new + look-ahead) the memory preflight sized the caches for
    load_s: float = 0.0
    engine: str = "torch"
    extra: dict = field(default_factory=dict)
    history: RunHistory | None = None  # whether the draft paid in this bundle's last runs on this machine
    context_window: int | None = None  # the target's own window (runner.checks.context_window); None: it names none

    @property
    def settings(self) -> DecodingSettings:
        """The decoding loop's settings: the bundle's, with the draft length this pair was loaded for; without
        the draft model's methods where the cost table says it cannot pay (`prior`)."""
        settings = DecodingSettings.from_params(self.params, self.draft_tokens)
        if self.prior and settings.guard:
            return replace(settings, methods=tuple(dict.fromkeys("ngram" for m in settings.methods if m != "draft")))
        return settings

    @functools.cached_property
    def prior(self) -> str | None:
        """Why the draft model cannot pay on this CPU, read off the measured cost table before any step
        (runner.decoding.guard.prior_verdict); None where it may, or where no table covers the pair."""
        return prior_verdict(self.engine, self.dtype, self.target, self.draft, 2 * self.draft_tokens)

    @property
    def plain_reason(self) -> str | None:
        """Why generation decodes plainly from its first token with no trial: the prior ruled the draft model
        out and no draft-free method is allowed."""
        return self.prior if self.prior and not self.settings.methods else None

    def prompt_ids(self, prompt: str, raw: bool = False) -> list[int]:
        """The prompt as ids: through the chat template when the tokenizer has one and raw is off."""
        return prompt_ids(self.tokenizer, prompt, raw)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """A chat (OpenAI-style messages) as ids, through the tokenizer's chat template; without one, the
        contents joined by newlines."""
        if hasattr(self.tokenizer, "chat_ids"):  # a GGUF file's own tokenizer (runner.gguf_run)
            return self.tokenizer.chat_ids(messages)
        if getattr(self.tokenizer, "chat_template", None):
            return chat_template.chat_ids(self.tokenizer, messages)
        return prompt_ids(self.tokenizer, "\n".join(m.get("content", "") for m in messages), raw=True)

    def engine_fields(self) -> dict[str, Any]:
        """`run --json`'s engine, device and dtype (the llama.cpp engine adds its version and threads)."""
        if "engine_fields" in self.extra:
            return dict(self.extra["engine_fields"])
        return {"engine": self.engine, "device": self.device, "dtype": self.dtype}

    def forward(self) -> dict[str, str]:
        """Which forward each model runs through."""
        if "forward" in self.extra:
            return dict(self.extra["forward"])
        return {"target": forward_path(self.target), "draft": forward_path(self.draft) if self.draft is not None else None}
