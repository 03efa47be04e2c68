"""Which allowed method proposes next: the policy's second job (runner.decoding.policy).

Each kind of proposal (the draft model's, prompt lookup's) is tried TRY_EACH times, then the method with the
best predicted speed-up proposes: a lookup's from its own acceptance at no proposing cost, a draft model's
from its acceptance and the draft's cost, weighed by how often lookup finds a match (where it finds none,
"ngram" takes a plain step and "ngram+draft" lets the draft model propose).
"""

from __future__ import annotations

__all__ = ["DECAY", "MethodChoice", "TRY_EACH"]

import math

from runner.decoding.methods import DRAFT, NGRAM, Method
from runner.decoding.stats import Stats, best_predicted_speedup

TRY_EACH = 3  # speculative iterations of each allowed proposing method before the choice compares them
DECAY = 0.9  # per speculative iteration: the choice judges a recent window


class MethodChoice:
    """Chooses among `methods` (their order breaks ties) from decaying per-kind acceptance and the lookups'
    hit rate. `costs` (draft step, verify pass, in target steps) replaces the measured ones when given."""

    def __init__(self, stats: Stats, methods: tuple[Method, ...], max_k: int, costs: tuple[float, float] | None) -> None:
        self.stats, self.methods, self.max_k, self.costs = stats, methods, max_k, costs
        self.by_kind: dict[Method, list[float]] = {}  # per kind of proposal (DRAFT, NGRAM): a decaying [accepted, rejections]
        self.lookups = [0.0, 0.0]  # n-gram lookups: a decaying [proposed, looked]
        self._kinds, self._kinds_at = (math.inf, math.inf), (-1, -1)  # the kinds' predicted speed-ups, and when

    def choose(self, model_dropped: bool) -> Method:
        """The method that proposes next; prompt lookup alone once the draft model was dropped."""
        methods = self.methods
        if model_dropped:
            return NGRAM
        if len(methods) == 1:
            return methods[0]
        seen = (self.stats.speculative_iterations, self.stats.steps_timed)  # what the predictions depend on
        if self._kinds_at != seen:
            self._kinds, self._kinds_at = (self._kind_speedup(NGRAM), self._kind_speedup(DRAFT)), seen
        ngram, draft = self._kinds
        matched, looked = self.lookups
        m = matched / looked if looked else 0.5

        def score(method: Method) -> float:
            if not method.uses_lookup:
                return draft
            otherwise = draft if method.uses_draft else 1.0  # no match: the draft model, or a plain step
            return (m * ngram if m else 0.0) + ((1 - m) * otherwise if m < 1 else 0.0)  # no 0 * inf

        return max(methods, key=score)  # first among equals: the order the settings give

    def looked_up(self, matched: bool) -> None:
        """One n-gram lookup, and whether it proposed (found a match worth a verify pass)."""
        self.lookups = [self.lookups[0] * DECAY + matched, self.lookups[1] * DECAY + 1]

    def observe(self, kind: Method, proposed: int, accepted: int) -> None:
        """One speculative iteration whose tokens `kind` proposed."""
        a, r = self.by_kind.get(kind, (0.0, 0.0))
        self.by_kind[kind] = [a * DECAY + accepted, r * DECAY + (accepted < proposed)]

    def _kind_speedup(self, kind: Method) -> float:
        """The predicted speed-up of one kind of proposal; inf until tried TRY_EACH times."""
        window = self.by_kind.get(kind)
        cost, verify = self.costs or (self.stats.cost_ratio, self.stats.verify_cost_ratio)
        cost = cost if kind.uses_draft else 0.0
        if window is None or self.stats.by_method.get(kind.name, [0])[0] < TRY_EACH or cost is None or verify is None:
            return math.inf
        accepted, rejections = window
        acceptance = accepted / (accepted + rejections) if accepted + rejections else 0.0
        return best_predicted_speedup(acceptance, cost, verify, self.max_k)[0]
