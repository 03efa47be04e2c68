"""The one place that decides how a sequence speculates: per step, whether to propose, by which method, and
how much; per sequence, which methods it may use at all.

`Policy.for_sequence` is the one call both drivers make (runner.decoding.speculative for `bundle run`,
runner.decoding.batching for `bundle serve`), so run and serve decide alike. It applies, in order:
- guard off: `Unguarded`, the first allowed method at every step (no verdicts, no fallback);
- no method allowed (`--no-draft`, a Kitfile without one the pair can run): plain decoding, nothing reported;
- the cost table rules the draft model out (`PairFacts.prior`): prompt lookup alone where allowed, else plain
  decoding from the first token, the table's reason reported as the fallback (stats.fallback, counted by
  `run --json`, serve's stats and /metrics alike);
- the run history's advice (runner.decoding.run_history): the draft model left out from the first token;
- a seeded sample (`is_seeded`) decides on the clock-free cost model, so its output never depends on timings.

Per step the step (runner.decoding.step) asks `plan(state) -> Plan` and reports `learn(state, outcome, new)`
with the pass's `Outcome`. Inside, the three jobs are separate parts: when to propose and when to fall back
(runner.decoding.guard.Guard), which method (runner.decoding.choice.MethodChoice), how much of a lookup's match
(runner.decoding.match_length.MatchLength).
"""

from __future__ import annotations

__all__ = ["Outcome", "PRIOR_ACCEPTANCE", "PairFacts", "Plan", "Policy", "SequenceView", "Unguarded", "adapt_draft_length", "is_seeded",
           "parameter_costs", "prior_verdict"]

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from runner.decoding import cost_prior
from runner.decoding.choice import MethodChoice
from runner.decoding.guard import Guard
from runner.decoding.match_length import MatchLength, PassMemory, pass_memory
from runner.decoding.methods import DRAFT, NGRAM, Method, methods_named
from runner.decoding.ngram import DEFAULT_NGRAM_TOKENS
from runner.decoding.stats import Stats
from runner.engines import as_engine

if TYPE_CHECKING:
    from runner.decoding.ngram import NgramProposer
    from runner.decoding.sampling import Sampler
    from runner.decoding.settings import DecodingSettings

# The acceptance the prior grants a draft model before it has drafted: about the best a well-matched draft
# reaches on real text. A pair the measured cost table says cannot pay even at it never drafts with the model.
PRIOR_ACCEPTANCE = 0.9
GREEDY_BELOW = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny: runner.decoding.sampling.Sampler's greedy


def is_seeded(temperature: float, seed: int | None) -> bool:
    """A seeded sample: its output must depend on neither the clock nor earlier runs (greedy needs no seed)."""
    return seed is not None and temperature >= GREEDY_BELOW


def parameter_costs(target, draft) -> tuple[float, float]:
    """A cost model that needs no clock: a draft step costs its share of the parameters (nothing without a
    draft model: n-gram proposals), a verify pass one step."""
    if draft is None:
        return 0.0, 1.0
    return as_engine(draft).parameters / as_engine(target).parameters, 1.0


def prior_verdict(engine: str, dtype: str, target, draft, max_k: int, table: dict | None = None) -> str | None:
    """Why the draft model cannot pay on this CPU, from the measured cost table (runner.decoding.cost_prior)
    alone, before any step is timed: no k up to max_k reaches a speed-up of 1 even at PRIOR_ACCEPTANCE. None
    where it may pay, or where no table covers the pair's engine, dtype and sizes (the guard then times it)."""
    if draft is None:
        return None
    target_params, draft_params = as_engine(target).parameters, as_engine(draft).parameters
    best = cost_prior.best_prior_speedup(engine, dtype, target_params, draft_params, PRIOR_ACCEPTANCE, max_k, table)
    if best is None or best[0] >= 1.0:
        return None
    return (f"the cost table of this CPU says the draft model cannot pay: at best {best[0]:.2f}x at acceptance "
            f"{PRIOR_ACCEPTANCE:g} (k={best[1]}, {engine} {cost_prior.quant_name(dtype)}, target {target_params / 1e6:.0f}M, "
            f"draft {draft_params / 1e6:.0f}M parameters)")


def adapt_draft_length(k: int, drafted: int, n: int, max_k: int) -> int:
    """Longer drafts after a full-length draft was accepted, shorter after an early rejection."""
    if n == drafted == k:
        return min(k + 1, max_k)
    if n < drafted // 2:
        return max(k - 1, 1)
    return k


class SequenceView(Protocol):
    """What a policy reads of a sequence's loop state (runner.decoding.step.SequenceState) and writes (`k`)."""

    seq: int
    sampler: Sampler
    max_new_tokens: int
    k: int  # the draft model's next draft length: the policy adapts it
    proposer: NgramProposer | None
    tokens: list[int]


@dataclass(frozen=True, slots=True)
class Plan:
    """What one sequence does in a step: a plain target step (`source` None), the draft model proposing up to
    `budget` tokens (source DRAFT), or prompt lookup's `proposal`, found before any pass (source NGRAM)."""

    seq: int
    source: Method | None = None
    budget: int = 0
    proposal: tuple[int, ...] = ()


@dataclass(slots=True)
class Outcome:
    """The target's verdict on one proposal: `accepted` of the `proposed` tokens `source` made (the plan's
    `budget` asked for), `seconds` the proposing and the verify pass took, of them `verify_seconds` the pass."""

    source: Method
    proposed: int
    accepted: int
    seconds: float
    verify_seconds: float
    budget: int


class PairFacts:
    """What a sequence's policy knows of its pair, found once per driver: the models (the target as the caller
    holds it: the process's PassMemory is kept per that object), and `prior`, the cost table's reason the
    draft model cannot pay (runner.pair.LoadedPair.prior; None: it may, or no table covers the pair)."""

    def __init__(self, target, draft, prior: str | None = None) -> None:
        self.target, self.draft, self.prior = target, draft, prior
        self.has_draft = draft is not None

    @functools.cached_property
    def costs(self) -> tuple[float, float]:
        return parameter_costs(self.target, self.draft)

    @functools.cached_property
    def memory(self) -> PassMemory:
        return pass_memory(self.target)


class Unguarded:
    """guard: off, and plain decoding: the first allowed method proposes at every step, the whole match,
    drafts of the adaptive length up to max_k; no verdicts. Without methods, plain decoding; `reason`: why
    (reported as a fallback at the first token, with no trial)."""

    def __init__(self, stats: Stats, methods: tuple[Method, ...], *, max_k: int, ngram_tokens: int = DEFAULT_NGRAM_TOKENS,
                 has_draft: bool = True, adaptive: bool = True, reason: str | None = None) -> None:
        self.stats, self.methods, self.max_k, self.ngram_tokens = stats, methods, max_k, ngram_tokens
        self.has_draft, self.adaptive = has_draft, adaptive
        self.looks_up = any(m.uses_lookup for m in methods)  # the sequence keeps an n-gram index
        if reason:
            stats.fallback = {"at_token": 0, "reason": reason, "retries": 0, "resumed": 0}

    def plan(self, s: SequenceView) -> Plan:
        """What the sequence does this step."""
        return self._propose(s, self.methods[0], self.max_k) if self.methods else Plan(s.seq)

    def _propose(self, s: SequenceView, method: Method, cap: int) -> Plan:
        """A proposal by `method`: lookup's match where it finds one worth its pass, else the draft model's
        (cap: its length at most; the caches have room for max_k + 1 at once), else a plain step."""
        remaining = s.max_new_tokens - len(s.tokens) - 1
        if method.uses_lookup and s.proposer is not None:
            longest = min(self.ngram_tokens, remaining)
            proposal, matched = s.proposer.propose_match(longest) if longest > 0 else ([], 0)
            vocab = s.sampler.vocab_size
            proposal = proposal[: next((i for i, t in enumerate(proposal) if t >= vocab), len(proposal))]
            if longest > 0:
                proposal = self._judge_match(matched, proposal)
            if proposal:
                return Plan(s.seq, NGRAM, len(proposal), tuple(proposal))
            if not method.uses_draft:
                return Plan(s.seq)
        budget = min(s.k, cap, remaining)
        return Plan(s.seq, DRAFT, budget) if budget > 0 and self.has_draft else Plan(s.seq)

    def _judge_match(self, matched: int, proposal: list[int]) -> list[int]:
        """How much of a match of `matched` tokens to verify: all of it."""
        return proposal

    def learn(self, s: SequenceView, outcome: Outcome | None, new: list[int]) -> None:
        """After the sequence took its new tokens: the draft length follows acceptance (a length the caps or
        the end cut says nothing). outcome None: a plain step."""
        if self.adaptive and outcome is not None and outcome.source is DRAFT and outcome.budget == s.k:
            s.k = adapt_draft_length(s.k, outcome.proposed, outcome.accepted, self.max_k)


class Policy(Unguarded):
    """The guarded policy of one sequence: the guard says when to propose (and falls back), the choice which
    method, the match length how much of a lookup's match. `costs` (draft step, verify pass, in target steps)
    replaces timed costs when given; `memory`: the process's PassMemory of the target."""

    def __init__(self, stats: Stats, methods: tuple[Method, ...], *, max_k: int, min_acceptance: float = 0.0,
                 costs: tuple[float, float] | None = None, memory: PassMemory | None = None, **rest: Any) -> None:
        super().__init__(stats, methods, max_k=max_k, **rest)
        self.guard = Guard(stats, max_k, min_acceptance, costs, self.looks_up)
        self.choice = MethodChoice(stats, methods, max_k, costs)
        self.lengths = MatchLength(stats, costs, memory)
        self.lookup: tuple[int, int] | None = None  # this step's match: its length and first token

    @classmethod
    def for_sequence(cls, settings: DecodingSettings, stats: Stats, pair: PairFacts, *, seeded: bool,
                     advice: str | None = None) -> Unguarded:
        """A new sequence's policy (the rules in the module's docstring), writing into its `stats`."""
        methods = methods_named(settings.methods, pair.has_draft)
        common = {"max_k": settings.max_k, "ngram_tokens": settings.ngram_tokens,
                  "has_draft": pair.has_draft, "adaptive": settings.adaptive}
        if not settings.guard or not methods:
            return Unguarded(stats, methods, **common)
        if pair.prior:  # the cost table rules the draft model out
            methods = tuple(dict.fromkeys(NGRAM for m in methods if m.uses_lookup))
            if not methods:
                return Unguarded(stats, (), reason=advice or pair.prior, **common)
        policy = cls(stats, methods, min_acceptance=settings.min_acceptance, costs=pair.costs if seeded else None,
                     memory=pair.memory, **common)
        if advice:
            policy.start_plain(advice)
        return policy

    def start_plain(self, reason: str) -> None:
        """Without the draft model from the first token (the run history's advice), with its reason."""
        self.guard.start_plain(reason)

    def method(self) -> Method:
        """Which allowed method proposes next."""
        return self.choice.choose(self.guard.model_dropped)

    def plan(self, s: SequenceView) -> Plan:
        if not self.guard.drafting(len(s.tokens)):
            return Plan(s.seq)
        return self._propose(s, self.method(), self.guard.k_cap)

    def _judge_match(self, matched: int, proposal: list[int]) -> list[int]:
        """As much of the match as is worth a verify pass (MatchLength); each lookup teaches the choice."""
        if proposal:
            self.lookup = (matched, proposal[0])
            proposal = proposal[: self.lengths.ngram_length(matched, len(proposal))]
        self.choice.looked_up(bool(proposal))
        return proposal

    def observe(self, kind: Method, proposed: int, accepted: int, seconds: float, produced: int) -> None:
        """One speculative iteration whose tokens `kind` proposed, `produced` tokens into the sequence."""
        self.choice.observe(kind, proposed, accepted)
        self.guard.observe(proposed, accepted, seconds, produced)

    def learn(self, s: SequenceView, outcome: Outcome | None, new: list[int]) -> None:
        if outcome is not None:
            self.lengths.timed_pass(outcome.proposed, outcome.verify_seconds)
            super().learn(s, outcome, new)
            self.observe(outcome.source, outcome.proposed, outcome.accepted, outcome.seconds, len(s.tokens))
        if self.lookup is not None and new:
            matched, first = self.lookup
            if outcome is not None and outcome.source is NGRAM:
                self.lengths.ngram_observed(matched, outcome.proposed, outcome.accepted)
            else:  # not verified: its first token against the target's own
                self.lengths.ngram_observed(matched, 1, int(new[0] == first))
        self.lookup = None
