"""`bundle tune`'s measurements: every speculation setting (method x draft length x candidate draft) of a
loaded pair timed on the same prompts in this process, with its acceptance per draft position, against the
target decoding plainly; the fastest setting is the choice, checked again on prompts it was not chosen on.

The methods come from the bundle's DecodingSettings. Each setting runs with the guard and the adaptive
draft length off, so a row measures the method and k themselves, not the guard's reaction to them."""

from __future__ import annotations

__all__ = ["HELD_OUT_TOLERANCE", "Row", "Setting", "TuneResult", "held_out_check", "measure_settings", "settings_grid"]

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from runner.bench.runs import Run, interleaved_rounds, pooled
from runner.decoding.settings import DecodingSettings

HELD_OUT_TOLERANCE = 0.05  # the choice's held-out speed may trail the best setting there by this share
PLAIN = "plain"


@dataclass(frozen=True)
class Setting:
    """One way to decode: a method (plain, or one DecodingSettings method), its proposal length k, and the
    draft model it runs (a name of `drafts`; empty for plain and prompt lookup)."""

    method: str
    k: int = 0
    draft: str = ""

    def label(self) -> str:
        return PLAIN if self.method == PLAIN else f"{self.method} k={self.k}" + (f" ({self.draft})" if self.draft else "")


@dataclass
class Row:
    """A setting as measured: speed over the prompts, and per draft position how often a proposal reached
    it and was accepted there."""

    setting: Setting
    tokens_per_second: float = 0.0
    new_tokens: int = 0
    seconds: float = 0.0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    @property
    def acceptance_at(self) -> list[float]:
        """Accepted / drafted at each draft position (1-based positions as list order)."""
        return [a / d if d else 0.0 for d, a in zip(self.drafted_at, self.accepted_at)]

    @property
    def per_token_acceptance(self) -> float:
        drafted = sum(self.drafted_at)
        return sum(self.accepted_at) / drafted if drafted else 0.0

    def as_dict(self, plain_tps: float) -> dict[str, Any]:
        return {
            "method": self.setting.method, "k": self.setting.k, "draft": self.setting.draft or None,
            "tokens_per_second": round(self.tokens_per_second, 2), "new_tokens": self.new_tokens, "seconds": round(self.seconds, 3),
            "speedup_vs_plain": round(self.tokens_per_second / plain_tps, 3) if plain_tps else None,
            "per_token_acceptance": round(self.per_token_acceptance, 4),
            "acceptance_at": [round(a, 4) for a in self.acceptance_at],
        }


@dataclass
class TuneResult:
    """Every row measured on one prompt set, the plain row first."""

    rows: list[Row]

    @property
    def plain(self) -> Row:
        return next(r for r in self.rows if r.setting.method == PLAIN)

    def best(self, speculative_only: bool = False) -> Row:
        """The fastest row (speculative_only: leaving plain out)."""
        rows = [r for r in self.rows if not (speculative_only and r.setting.method == PLAIN)]
        return max(rows, key=lambda r: r.tokens_per_second)

    def find(self, setting: Setting) -> Row:
        return next(r for r in self.rows if r.setting == setting)


def settings_grid(methods: Sequence[str], ks: Sequence[int], drafts: Sequence[str]) -> list[Setting]:
    """Plain, then every method x k, the draft-using methods once per candidate draft."""
    grid = [Setting(PLAIN)]
    for method in methods:
        for k in ks:
            grid += [Setting(method, k, d) for d in drafts] if "draft" in method else [Setting(method, k)]
    return grid


def _loop_settings(base: DecodingSettings, setting: Setting) -> DecodingSettings:
    """The bundle's settings narrowed to one setting: its method alone, its k, no guard, no adaptive k."""
    uses_draft, uses_ngram = "draft" in setting.method, "ngram" in setting.method
    return replace(base, methods=(setting.method,), adaptive=False, guard=False,
                   draft_tokens=setting.k if uses_draft else base.draft_tokens,
                   ngram_tokens=setting.k if uses_ngram else base.ngram_tokens)


def _generator(target, drafts: Mapping[str, Any], base: DecodingSettings, setting: Setting, eos: set[int], vocab: int | None,
               max_new_tokens: int) -> Callable[[list[int]], tuple[list[int], Any]]:
    from runner.decoding.speculative import generate_plain, generate_speculative

    if setting.method == PLAIN:
        return lambda ids: (lambda r: (r.tokens, r.stats))(generate_plain(target, ids, max_new_tokens, eos_ids=eos, vocab_size=vocab))
    settings = _loop_settings(base, setting)
    draft = drafts[setting.draft] if "draft" in setting.method else None  # prompt lookup alone runs no draft model
    return lambda ids: (lambda r: (r.tokens, r.stats))(generate_speculative(
        target, draft, ids, max_new_tokens, settings=settings, eos_ids=eos, vocab_size=vocab))


def _row(setting: Setting, run: Run) -> Row:
    width = max((len(s.drafted_at) for s in run.stats), default=0)
    drafted, accepted = [0] * width, [0] * width
    for stats in run.stats:
        for i, (d, a) in enumerate(zip(stats.drafted_at, stats.accepted_at)):
            drafted[i] += d
            accepted[i] += a
    return Row(setting, run.tokens_per_second, run.new_tokens, run.seconds, drafted, accepted)


def measure_settings(target, drafts: Mapping[str, Any], base: DecodingSettings, grid: Sequence[Setting], ids: Sequence[list[int]],
                     *, eos: set[int], vocab: int | None, max_new_tokens: int, repeat: int = 1,
                     progress: Callable[[str], None] | None = None) -> TuneResult:
    """Every setting of `grid` on every prompt, prompt by prompt with the settings' order rotating
    (runner.bench.runs.interleaved_rounds: a machine that speeds up or slows down moves every setting
    alike), `repeat` rounds pooled, after a warm-up of each model. drafts: name -> loaded draft model
    (empty for a draft-free pair)."""
    say = progress or (lambda _msg: None)
    for model in (target, *drafts.values()):
        _generator(model, {}, base, Setting(PLAIN), eos, vocab, 8)(list(ids[0]))
    generators = {s.label(): _generator(target, drafts, base, s, eos, vocab, max_new_tokens) for s in grid}
    rounds = interleaved_rounds(generators, ids, repeat, say)
    return TuneResult([_row(s, pooled([rnd[s.label()] for rnd in rounds])) for s in grid])


def held_out_check(held_out: TuneResult, choice: Setting) -> dict[str, Any]:
    """The choice's speed on the held-out prompts against the best setting measured there."""
    best = held_out.best()
    mine = held_out.find(choice)
    share = mine.tokens_per_second / best.tokens_per_second if best.tokens_per_second else 0.0
    return {
        "choice": choice.label(), "choice_tokens_per_second": round(mine.tokens_per_second, 2),
        "best": best.setting.label(), "best_tokens_per_second": round(best.tokens_per_second, 2),
        "share_of_best": round(share, 4), "within_tolerance": share >= 1.0 - HELD_OUT_TOLERANCE,
        "tolerance": HELD_OUT_TOLERANCE,
    }
