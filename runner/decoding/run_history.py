"""The guard's memory across runs: a draft that has stopped paying for a bundle on this machine is not tried
again on every run.

Why: where a verify pass costs nearly a target step per token (no acceptance rate can pay), the guard finds out on
every run that the draft does not pay, and finding out costs the draft's prefill of the prompt and one
speculative iteration a run (the figures: docs/benchmarks.md). A run of a bundle whose last UNPAID_RUNS runs on this machine all fell back for good
(the guard switched to plain decoding and no trial resumed speculation) decodes plainly from the first
token, with no trial, and says so in its `fallback`; now and then a run speculates as usual (explores), so a
draft that pays again (other prompts, another machine under the same name, a new engine) is found: every
EXPLORE_EVERY-th run at first, every other time more rarely after each exploring run that did not pay either
(the 8th, 16th, 32nd, 64th run, then every EXPLORE_MAX-th), as an exploring run pays what finding out costs.

What is remembered is keyed by the bundle's digest, the CPU model and its core count; it holds counts only
(no prompt, no output). Greedy output is the same either way (the decoding is lossless); seeded sampling is
neither advised nor recorded, so a seed's output never depends on earlier runs. The runner keeps no files:
the caller (bundler.verbs.run: `bundle run` and `bench`, not `serve`) reads the counts and gets them back
through `save`.
"""

from __future__ import annotations

__all__ = ["EXPLORE_EVERY", "EXPLORE_MAX", "RunHistory", "UNPAID_RUNS", "machine_key", "with_history"]

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runner.decoding.policy import is_seeded

UNPAID_RUNS = 3  # runs in a row in which the draft did not pay, before runs start plain
EXPLORE_EVERY = 8  # then every this many runs speculates as usual; twice as rarely after each one that did not pay
EXPLORE_MAX = 64  # but at least every this many runs


def machine_key(bundle_digest: str) -> str:
    """The bundle on this machine: its digest, the CPU model and its core count."""
    from runner.engines.cpu import cpu_info

    cpu = cpu_info()
    return f"{bundle_digest}|{cpu['model']}|{cpu['cores']}"


@dataclass
class RunHistory:
    """Counts for one key: `runs` (runs recorded) and `unpaid` (the latest of them in a row that fell back
    for good). `save` receives the counts after each recorded run."""

    runs: int = 0
    unpaid: int = 0
    save: Callable[[dict[str, int]], None] | None = field(default=None, repr=False)

    @classmethod
    def from_counts(cls, counts: Mapping[str, Any] | None, save: Callable[[dict[str, int]], None] | None = None) -> "RunHistory":
        """From stored counts; anything that is not a pair of counts starts afresh (it is only an economy)."""
        counts = counts if isinstance(counts, Mapping) else {}
        runs, unpaid = counts.get("runs"), counts.get("unpaid")
        valid = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (runs, unpaid))
        return cls(runs, unpaid, save) if valid else cls(save=save)

    def counts(self) -> dict[str, int]:
        return {"runs": self.runs, "unpaid": self.unpaid}

    def explore_every(self) -> int:
        """Every how many runs one speculates while the draft does not pay: the interval doubles with each
        exploring run that did not pay (each counts as one more unpaid run), up to EXPLORE_MAX."""
        return min(EXPLORE_EVERY << max(self.unpaid - UNPAID_RUNS, 0), EXPLORE_MAX)

    def advice(self, seeded: bool) -> str | None:
        """Why this run should decode plainly from its first token, or None: speculate as usual."""
        if seeded or self.unpaid < UNPAID_RUNS or (self.runs + 1) % self.explore_every() == 0:
            return None
        return (f"the draft did not pay in the last {self.unpaid} runs of this bundle on this machine: the draft model left "
                f"out from the first token (every {self.explore_every()}th run tries it)")

    def record(self, stats: Mapping[str, Any], advised: bool, seeded: bool) -> None:
        """One finished run: whether its speculation fell back for good (a run that did not speculate, advised
        or too short, says nothing about the draft)."""
        if seeded:
            return
        self.runs += 1
        if not advised and stats.get("speculative_iterations"):
            fallback = stats.get("fallback")
            dropped = stats.get("draft_model_dropped")  # the draft model did not pay; prompt lookup went on
            self.unpaid = self.unpaid + 1 if dropped or (fallback and not fallback.get("resumed")) else 0
        if self.save is not None:
            self.save(self.counts())


def with_history(history: RunHistory | None, guard: bool, temperature: float, seed: int | None,
                 run: Callable[[str | None], Any]) -> Any:
    """One run under the history: `run(start_plain)` gets the advice (None: speculate as usual; always None
    without a history or without the guard) and returns a GenerationResult, whose stats are then recorded."""
    seeded = is_seeded(temperature, seed)
    if history is None or not guard:
        return run(None)
    advice = history.advice(seeded)
    result = run(advice)
    history.record(result.stats.as_dict(), advised=advice is not None, seeded=seeded)
    return result
