"""What decoding takes from a bundle, read in one place: the Kitfile's `speculative` parameters as the loop's
settings, the llama.cpp threads, and the cache room a generation needs. Torch-free: the loaders size their
caches with it before torch is imported."""

from __future__ import annotations

__all__ = ["DRIVER_DEFAULTS", "DecodingSettings", "cache_tokens", "draft_length", "longest_draft", "thread_count"]

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from runner.checks.cpus import usable_cpus
from runner.decoding.methods import ALL_METHODS, DRAFT, default_methods
from runner.decoding.ngram import DEFAULT_MAX_N, DEFAULT_MIN_N, DEFAULT_NGRAM_TOKENS

DEFAULT_DRAFT_TOKENS = 5  # k when neither the command line nor the bundle names one


def longest_draft(draft_tokens: int) -> int:
    """max k: adaptive drafts grow to twice the first draft length (written here once)."""
    return 2 * max(draft_tokens, 1)


def draft_length(params: Mapping[str, Any], override: int | None = None) -> int:
    """k, the first draft length: the command line's (`--draft-tokens`), else the bundle's, else 5."""
    return int(override or params.get("draft_tokens", DEFAULT_DRAFT_TOKENS))


def thread_count(params: Mapping[str, Any]) -> int:
    """Threads of either engine: the bundle's `threads`, else one per CPU the process may use (runner.checks.cpus)."""
    return int(params.get("threads") or usable_cpus())


def cache_tokens(prompt_tokens: int, max_new_tokens: int, draft_tokens: int, ngram_tokens: int = 0) -> int:
    """The positions one generation may write to each model's cache: the prompt and the new tokens, plus the
    look-ahead of a verify pass, which writes the last kept token and up to 2 * draft_tokens drafts (adaptive
    drafts grow to twice draft_tokens), or ngram_tokens of a prompt lookup, in one call before the rejected ones
    are cropped: k + 1 positions."""
    return prompt_tokens + max_new_tokens + max(longest_draft(draft_tokens), ngram_tokens) + 1


@dataclass(frozen=True)
class DecodingSettings:
    """The decoding loop's settings from the Kitfile's model.parameters["speculative"], the one value
    runner.decoding.speculative.generate_speculative and runner.decoding.batching.BatchedGenerator take."""

    draft_tokens: int = DEFAULT_DRAFT_TOKENS
    adaptive: bool = True  # draft lengths follow acceptance, within 1..2 * draft_tokens
    draft_confidence: float = 0.0  # a draft stops early below this probability of its whole proposal
    min_acceptance: float = 0.0  # the guard falls back below this per-token acceptance
    guard: bool = True  # fall back to plain decoding when the draft does not pay
    methods: tuple[str, ...] = ALL_METHODS  # the methods' names (runner.decoding.methods) the policy may choose among
    ngram_min: int = DEFAULT_MIN_N  # prompt lookup matches suffixes of ngram_min..ngram_max tokens
    ngram_max: int = DEFAULT_MAX_N
    ngram_tokens: int = DEFAULT_NGRAM_TOKENS  # k of a prompt-lookup proposal

    @classmethod
    def from_params(cls, params: Mapping[str, Any], override: int | None = None, *,
                    has_draft: bool = True) -> DecodingSettings:
        """params: the Kitfile's speculative parameters (bundler.verbs.run.runner_params); override: --draft-tokens.
        A number left empty (null) is its default; methods left out are every method the parts allow
        (has_draft: the bundle has a draft model). The Kitfile check has validated the values."""
        ngram = params.get("ngram") or {}
        return cls(
            draft_tokens=draft_length(params, override),
            adaptive=bool(params.get("adaptive", True)),
            draft_confidence=float(params.get("draft_confidence") or 0.0),
            min_acceptance=float(params.get("min_acceptance") or 0.0),
            guard=bool(params.get("guard", True)),
            methods=tuple(params.get("methods") or default_methods(has_draft)),
            ngram_min=int(ngram.get("min_n") or DEFAULT_MIN_N),
            ngram_max=int(ngram.get("max_n") or DEFAULT_MAX_N),
            ngram_tokens=int(ngram.get("draft_tokens") or DEFAULT_NGRAM_TOKENS),
        )

    @property
    def max_k(self) -> int:
        """The longest draft (runner.decoding.settings.longest_draft)."""
        return longest_draft(self.draft_tokens)

    def updated(self, **fields: Any) -> DecodingSettings:
        """These settings with some fields replaced (a driver's keyword arguments: draft_tokens=4, guard=False);
        TypeError for a name that is not a field."""
        if "methods" in fields:
            fields["methods"] = tuple(fields["methods"])
        return replace(self, **fields)

    def without_proposals(self) -> DecodingSettings:
        """These settings with no proposing method: plain decoding (serve --no-draft)."""
        return replace(self, methods=())


# What the drivers (generate_speculative, BatchedGenerator) decode with when given no settings: the draft model
# alone; a bundle's settings come from its Kitfile (DecodingSettings.from_params: every method its parts allow).
DRIVER_DEFAULTS = DecodingSettings(methods=(DRAFT.name,))
