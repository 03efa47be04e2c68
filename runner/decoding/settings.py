"""What decoding takes from a bundle, read in one place: the Kitfile's `speculative` parameters as the loop's
settings, the llama.cpp threads, and the cache room a generation needs. Torch-free: the loaders size their
caches with it before torch is imported."""

from __future__ import annotations

__all__ = ["DecodingSettings", "cache_tokens", "draft_length", "thread_count"]

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_DRAFT_TOKENS = 5  # k when neither the command line nor the bundle names one


def draft_length(params: Mapping[str, Any], override: int | None = None) -> int:
    """k, the first draft length: the command line's (`--draft-tokens`), else the bundle's, else 5."""
    return int(override or params.get("draft_tokens", DEFAULT_DRAFT_TOKENS))


def thread_count(params: Mapping[str, Any]) -> int:
    """Threads of the llama.cpp engine: the bundle's `threads`, else one per CPU."""
    return int(params.get("threads") or os.cpu_count() or 1)


def cache_tokens(prompt_tokens: int, max_new_tokens: int, draft_tokens: int) -> int:
    """The positions one generation may write to each model's cache: the prompt and the new tokens, plus the
    look-ahead of a verify pass, which writes the last kept token and up to 2 * draft_tokens drafts (adaptive
    drafts grow to twice draft_tokens) in one call before the rejected ones are cropped: k + 1 positions."""
    return prompt_tokens + max_new_tokens + 2 * max(draft_tokens, 1) + 1


@dataclass(frozen=True)
class DecodingSettings:
    """The decoding loop's settings from the Kitfile's model.parameters["speculative"]: the keyword arguments
    runner.decoding.speculative.generate_speculative and runner.decoding.batching.BatchedGenerator take."""

    draft_tokens: int = DEFAULT_DRAFT_TOKENS
    adaptive: bool = True  # draft lengths follow acceptance, within 1..2 * draft_tokens
    draft_confidence: float = 0.0  # a draft stops early below this probability of its whole proposal
    min_acceptance: float = 0.0  # the guard falls back below this per-token acceptance
    guard: bool = True  # fall back to plain decoding when the draft does not pay

    @classmethod
    def from_params(cls, params: Mapping[str, Any], override: int | None = None) -> DecodingSettings:
        """params: the Kitfile's speculative parameters (bundler.verbs.run.runner_params); override: --draft-tokens.
        A number left empty (null) is its default."""
        return cls(
            draft_tokens=draft_length(params, override),
            adaptive=bool(params.get("adaptive", True)),
            draft_confidence=float(params.get("draft_confidence") or 0.0),
            min_acceptance=float(params.get("min_acceptance") or 0.0),
            guard=bool(params.get("guard", True)),
        )

    def loop_args(self) -> dict[str, Any]:
        """The settings as keyword arguments of the decoding loop."""
        return asdict(self)
