"""The guard of the speculative step: when to propose, with which method, when to fall back to plain decoding, and why.

runner.decoding.step's plan asks `Guard.drafting` before each step of a sequence (and `Guard.method` which
allowed method proposes); each speculative iteration is reported to `Guard.observe`. The guard keeps its
verdicts in the generation's Stats (`fallback`, `predicted_speedup`).
"""

from __future__ import annotations

__all__ = [
    "Guard", "LOSS_BUDGET", "LOSS_FLOOR", "PATIENCE", "RETRY_AFTER", "TRIAL_ITERATIONS", "TRY_EACH", "WARMUP_ITERATIONS",
    "NGRAM_MATCH_PRIOR", "PRIOR_ACCEPTANCE", "PassMemory", "parameter_costs", "pass_memory", "prior_verdict",
]

import math
import weakref

from runner.decoding import cost_prior
from runner.decoding.stats import Stats, best_predicted_speedup, expected_tokens
from runner.engines import as_engine

WARMUP_ITERATIONS = 6  # speculative iterations before the guard judges
PROBE_STEPS = 2  # single target steps timed early on: the cost of plain decoding, for the prediction
PROBE_EVERY = 16  # then one more timed plain step every this many speculative iterations
PATIENCE = 3  # consecutive predictions below 1 before falling back
DECAY = 0.9  # the guard judges a recent window: its sums decay by this per speculative iteration
RETRY_AFTER = 16  # after a fallback, plain tokens before a trial of speculation; doubles per failed trial
RETRY_AFTER_MAX = 256
TRIAL_ITERATIONS = 4  # speculative iterations a trial lasts before it is judged
TRY_EACH = 3  # speculative iterations of each allowed proposing method before the guard compares them
# What speculation may cost, measured by the clock: its iterations' time beyond what plain decoding would
# have taken for the tokens they produced may not exceed LOSS_FLOOR target steps plus LOSS_BUDGET of the
# plain time of all tokens so far. An iteration starts only where the budget has room for what one has
# cost so far, and beyond it the guard falls back at once; a trial starts only once the run is back within
# budget: a draft that does not pay costs about the floor, on any CPU. The floor is one losing iteration:
# on a CPU where a verify pass costs 2-3 steps (AVX2), what a useless draft costs is a step or two per answer.
LOSS_FLOOR = 1.0
LOSS_BUDGET = 0.005


# An n-gram match's per-token acceptance before any was verified, as pseudo-counts [accepted, rejections]
# (a = 0.5), kept per matched suffix length up to NGRAM_MATCH_LENGTHS: a 4-token match is a copy far more
# often than a 2-token one, which may be a chance repeat of "the" and a comma.
NGRAM_MATCH_PRIOR = (1.0, 1.0)
NGRAM_MATCH_LENGTHS = 4
# What each proposed token adds to a verify pass, in target steps, before any pass was timed: the dear end of
# what was measured (llama.cpp and bf16 on AVX2, two cores: docs/benchmarks.md), so the first proposals are
# short, and timed; where passes turn out cheap, the timed costs lengthen them.
UNTIMED_VERIFY_SLOPE = 0.5
MEMORY_WEIGHT = 8.0  # earlier generations' n-gram acceptance counts as this many observations, at most


class PassMemory:
    """What a process has learned of one target over its generations, so that the next generation's guard starts
    from it instead of from guesses: the cost of a verify pass per number of proposed tokens, in target steps, and
    the acceptance of n-gram matches per matched suffix length (decaying, so it follows a workload that changes).
    `bundle bench` and `serve` run many generations in one process; `bundle run` one."""

    KEPT = 32  # passes of one length the mean covers, at most
    DECAY = 0.98  # per observed match, across generations

    def __init__(self) -> None:
        self.verify: dict[int, list[float]] = {}  # k -> [sum of target steps, passes]
        self.by_match: dict[int, tuple[float, float]] = {}

    def timed_pass(self, k: int, steps: float) -> None:
        total = self.verify.setdefault(k, [0.0, 0.0])
        if total[1] >= self.KEPT:
            total[0], total[1] = total[0] * (self.KEPT - 1) / self.KEPT, self.KEPT - 1
        total[0], total[1] = total[0] + steps, total[1] + 1

    def verify_steps(self, k: int) -> float | None:
        total = self.verify.get(k)
        return max(total[0] / total[1], 1.0) if total and total[1] >= 2 else None

    def matched(self, key: int, proposed: int, accepted: int) -> None:
        a, r = self.by_match.get(key, (0.0, 0.0))
        self.by_match[key] = (a * self.DECAY + accepted, r * self.DECAY + (accepted < proposed))


_MEMORIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pass_memory(target) -> PassMemory:
    """The process's PassMemory of a target (an engine or a torch model), kept while the target lives."""
    memory = _MEMORIES.get(target)
    if memory is None:
        memory = _MEMORIES[target] = PassMemory()
    return memory


def parameter_costs(target, draft) -> tuple[float, float]:
    """A cost model that needs no clock: a draft step costs its share of the parameters (nothing without a
    draft model: n-gram proposals), a verify pass one step."""
    if draft is None:
        return 0.0, 1.0
    return as_engine(draft).parameters / as_engine(target).parameters, 1.0


# The acceptance the prior grants a draft model before it has drafted: about the best a well-matched draft
# reaches on real text. A pair the measured cost table says cannot pay even at it never drafts with the model.
PRIOR_ACCEPTANCE = 0.9


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


class Guard:
    """Decides before each iteration whether to draft, and records why it stopped.

    It times a few plain target steps (probes: the baseline), then judges every speculative iteration on a
    recent window (sums that decay by DECAY per iteration): Leviathan's prediction from the window's
    acceptance and the measured costs, or the speed-up the loop realized in the window, whichever is
    higher. Below 1 (or acceptance below min_acceptance) PATIENCE times in a row: plain decoding, then a
    short trial of speculation after RETRY_AFTER tokens, the wait doubling after each failed trial. Drafts
    often agree better later in an answer (code after its introduction) than at its start, and a failed
    trial of a useless draft costs a few draft steps. Besides, what speculation has cost so far, by the
    clock, is kept within a budget (LOSS_FLOOR, LOSS_BUDGET): over it, plain decoding at once, and no trial
    until the run is within it again. Where only a shorter draft is predicted to pay (a verify pass that
    grows with its length), drafts are capped to that length. `costs` (draft step, verify pass, in target
    steps) replaces the timed ones when given: the decisions then depend on no clock.
    """

    def __init__(self, stats: Stats, max_k: int, min_acceptance: float, costs: tuple[float, float] | None,
                 memory: PassMemory | None = None, methods: tuple[str, ...] = ()) -> None:
        self.stats, self.max_k, self.min_acceptance, self.costs = stats, max_k, min_acceptance, costs
        self.lookup_allowed = any(m != "draft" for m in methods)  # prompt lookup may propose without the draft model
        # the process's memory of the target; not with a cost model (a seeded sample never depends on earlier runs)
        self.memory = memory if costs is None else None
        self.window = [0.0, 0.0, 0.0, 0.0]  # accepted, rejections, seconds, tokens
        self.iterations = self.below = 0
        self.plain_until: float | None = None  # while fallen back: the token count at which a trial starts
        self.trial = False
        self.retry_after = RETRY_AFTER
        self.k_cap = max_k  # drafts per iteration at most: lowered when only shorter drafts pay
        self.by_method: dict[str, list[float]] = {}  # per kind of proposal: a decaying [accepted, rejections]
        self.lookups = [0.0, 0.0]  # n-gram lookups: a decaying [proposed, looked]
        # n-gram acceptance per matched suffix length, decaying: from earlier generations' (weighed as a few matches)
        self.by_match: dict[int, tuple[float, float]] = {}
        for key, (a, r) in (self.memory.by_match.items() if self.memory else ()):
            weight = min(1.0, MEMORY_WEIGHT / (a + r)) if a + r else 0.0
            self.by_match[key] = (NGRAM_MATCH_PRIOR[0] + a * weight, NGRAM_MATCH_PRIOR[1] + r * weight)
        self._kinds, self._kinds_at = (math.inf, math.inf), (-1, -1)  # the kinds' predicted speed-ups, and when
        self.model_dropped = False  # the draft model was dropped: prompt lookup proposes alone
        self.forgiven = 0.0  # target steps the dropped draft model lost, not charged to prompt lookup's budget

    def drafting(self, produced: int) -> bool:
        """Whether this iteration drafts; False: one timed plain step (a probe or plain decoding)."""
        stats = self.stats
        if self.plain_until is not None:
            if produced < self.plain_until or not self._affordable(produced):
                return False
            self.plain_until, self.trial, self.window, self.iterations, self.below = None, True, [0.0] * 4, 0, 0
            stats.fallback["retries"] += 1
        elif stats.speculative_iterations and not self._affordable(produced):
            self._fall_back(produced, f"speculation cost {self.lost_steps():.1f} target steps more than plain decoding; "
                                      f"another iteration would pass the budget ({LOSS_FLOOR:g} + {LOSS_BUDGET:.1%} of the tokens)")
            return False
        return stats.speculative_iterations == 0 or not (
            stats.steps_timed < PROBE_STEPS or stats.speculative_iterations >= PROBE_EVERY * stats.steps_timed
        )  # a few plain steps early, then one now and then: the baseline follows the context's growth

    def start_plain(self, reason: str) -> None:
        """Without the draft model from the first token (runner.decoding.run_history's advice), with its reason:
        prompt lookup alone where the methods allow it, else plain decoding and no trial."""
        if self.lookup_allowed:
            self.model_dropped = True
            self.stats.model_dropped = {"at_token": 0, "reason": reason}
            return
        self.stats.fallback = {"at_token": 0, "reason": reason, "retries": 0, "resumed": 0}
        self.plain_until = math.inf

    def lost_steps(self) -> float | None:
        """Target steps the speculative iterations took beyond plain decoding of the tokens they produced
        (negative: gained); None without a clock (a cost model) or before a plain step was timed."""
        step = self.stats.step_time
        if self.costs or not step:
            return None
        # The draft's prefill of the prompt is not counted (plain decoding of the target has a prefill too, and
        # the draft's is a small share of it); its catch-up over the tokens of a plain run is: a trial's cost.
        stats = self.stats
        return (stats.spec_time_s - stats.draft_prefill_s - stats.spec_tokens * step) / step - self.forgiven

    def _affordable(self, produced: int) -> bool:
        """Another iteration (or a trial) only where the budget leaves room for what one has cost so far."""
        lost = self.lost_steps()
        if lost is None:
            return True
        per_iteration = max(lost, 0.0) / max(self.stats.speculative_iterations, 1)
        return lost + per_iteration <= LOSS_FLOOR + LOSS_BUDGET * produced

    def _over_budget(self, produced: int) -> bool:
        lost = self.lost_steps()
        return lost is not None and lost > LOSS_FLOOR + LOSS_BUDGET * produced

    def _fall_back(self, produced: int, reason: str) -> None:
        if self._drop_model(produced, reason):
            return
        if self.stats.fallback is None:
            self.stats.fallback = {"at_token": produced, "reason": reason, "retries": 0, "resumed": 0}
        self.plain_until, self.trial = produced + self.retry_after, False
        self.retry_after = min(2 * self.retry_after, RETRY_AFTER_MAX)

    def _drop_model(self, produced: int, reason: str) -> bool:
        """Where prompt lookup may go on, a draft model that does not pay is dropped instead of all speculation:
        lookup checks each match's worth before its pass (ngram_length), so it costs little where it does not
        pay and gains where the text copies. What the model lost is left out of the budget lookup then gets;
        the next verdict against speculation falls back to plain decoding as before. Once per sequence."""
        if (self.model_dropped or self.stats.fallback is not None or not self.stats.by_method.get("draft")
                or not self.lookup_allowed):
            return False
        self.model_dropped = True
        self.stats.model_dropped = {"at_token": produced, "reason": reason}
        self.forgiven += self.lost_steps() or 0.0
        self.window, self.iterations, self.below, self.k_cap = [0.0] * 4, 0, 0, self.max_k
        return True

    def method(self, methods: tuple[str, ...]) -> str:
        """Which allowed method proposes next (runner.decoding.step.METHODS): each kind of proposal is tried
        TRY_EACH times, then the method with the best predicted speed-up: an n-gram iteration's from its own
        acceptance at no proposing cost, a draft model iteration's from its acceptance and the draft's cost,
        weighed by how often the n-gram finds a match (where it finds none, "ngram" takes a plain step and
        "ngram+draft" lets the draft model propose). Once the draft model is dropped, "ngram" alone."""
        if self.model_dropped:
            return "ngram"
        if len(methods) == 1:
            return methods[0]
        seen = (self.stats.speculative_iterations, self.stats.steps_timed)  # what the predictions depend on
        if self._kinds_at != seen:
            self._kinds, self._kinds_at = (self._kind_speedup("ngram"), self._kind_speedup("draft")), seen
        ngram, draft = self._kinds
        matched, looked = self.lookups
        m = matched / looked if looked else 0.5
        def mix(when_matched: float, otherwise: float) -> float:  # no 0 * inf
            return (m * when_matched if m else 0.0) + ((1 - m) * otherwise if m < 1 else 0.0)

        scores = {"draft": draft, "ngram": mix(ngram, 1.0), "ngram+draft": mix(ngram, draft)}
        return max(methods, key=lambda name: scores[name])  # first among equals: the order the settings give

    def looked_up(self, matched: bool) -> None:
        """One n-gram lookup, and whether it proposed (found a match worth a verify pass)."""
        self.lookups = [self.lookups[0] * DECAY + matched, self.lookups[1] * DECAY + 1]

    def ngram_length(self, matched: int, longest: int) -> int:
        """How many of the `longest` tokens an n-gram match of `matched` tokens proposes to verify; 0: a plain
        step instead. The length whose expected tokens (Leviathan's, at this match length's acceptance so far)
        per target step of its verify pass is highest, where that beats the one token of a plain step. A pass
        that costs 1.7 steps for two tokens (llama.cpp on a small model, two cores) only pays for a copy that
        runs on; where a pass costs one step whatever its length (torch bf16 with AVX-512 BF16), every match does."""
        accepted, rejections = self.by_match.get(min(matched, NGRAM_MATCH_LENGTHS), NGRAM_MATCH_PRIOR)
        acceptance = accepted / (accepted + rejections)
        best, length = 1.0, 0
        for m in range(1, longest + 1):
            value = expected_tokens(acceptance, m) / self.verify_steps(m)
            if value > best:
                best, length = value, m
        return length

    def verify_steps(self, k: int) -> float:
        """A verify pass over k proposed tokens, in target steps: the cost model's when given, else as timed so
        far: this generation's passes of that length, else the process's (PassMemory), else this generation's
        linear fit (runner.decoding.stats.Stats.verify_steps), else UNTIMED_VERIFY_SLOPE's guess."""
        if self.costs:
            return self.costs[1]
        for timed in (self.stats.verify_steps(k, fit=False), self.memory and self.memory.verify_steps(k),
                      self.stats.verify_steps(k)):
            if timed:
                return timed
        return 1.0 + UNTIMED_VERIFY_SLOPE * k

    def timed_pass(self, k: int, seconds: float) -> None:
        """A verify pass over k proposed tokens took `seconds` (its share of the pass): into the process's memory."""
        step = self.stats.step_time
        if self.memory is not None and step:
            self.memory.timed_pass(k, seconds / step)

    def ngram_observed(self, matched: int, proposed: int, accepted: int) -> None:
        """The verdict on an n-gram match of `matched` tokens: `accepted` of its first `proposed` tokens. A match
        not verified counts by its first token against the one a plain step made (proposed 1): its later tokens
        are unknown, which the rejection count leaves out."""
        key = min(matched, NGRAM_MATCH_LENGTHS)
        a, r = self.by_match.get(key, NGRAM_MATCH_PRIOR)
        self.by_match[key] = (a * DECAY + accepted, r * DECAY + (accepted < proposed))
        if self.memory is not None:
            self.memory.matched(key, proposed, accepted)

    def _kind_speedup(self, kind: str) -> float:
        """The predicted speed-up of one kind of proposal ("draft", "ngram"); inf until tried TRY_EACH times."""
        window = self.by_method.get(kind)
        cost, verify = self.costs or (self.stats.cost_ratio, self.stats.verify_cost_ratio)
        cost = 0.0 if kind == "ngram" else cost
        if window is None or self.stats.by_method.get(kind, [0])[0] < TRY_EACH or cost is None or verify is None:
            return math.inf
        accepted, rejections = window
        acceptance = accepted / (accepted + rejections) if accepted + rejections else 0.0
        return best_predicted_speedup(acceptance, cost, verify, self.max_k)[0]

    def observe(self, drafted: int, accepted: int, seconds: float, produced: int, method: str = "draft") -> None:
        """One speculative iteration (its proposals by `method`); then the verdict, which may switch to plain decoding."""
        a, r = self.by_method.get(method, (0.0, 0.0))
        self.by_method[method] = [a * DECAY + accepted, r * DECAY + (accepted < drafted)]
        w = self.window
        self.window = [w[0] * DECAY + accepted, w[1] * DECAY + (accepted < drafted), w[2] * DECAY + seconds,
                       w[3] * DECAY + accepted + 1]
        self.iterations += 1
        stats = self.stats
        if self._over_budget(produced):
            self._fall_back(produced, f"speculation cost {self.lost_steps():.1f} target steps more than plain decoding "
                                      f"(budget {LOSS_FLOOR:g} + {LOSS_BUDGET:.1%} of the tokens)")
            return
        cost, verify = self.costs or (stats.cost_ratio, stats.verify_cost_ratio)
        if cost is None and "draft" not in stats.by_method:  # n-gram proposals only: no model step to pay for
            cost = 0.0
        if self.iterations < (TRIAL_ITERATIONS if self.trial else WARMUP_ITERATIONS) or cost is None or verify is None:
            return
        accepted_w, rejections_w, seconds_w, tokens_w = self.window
        acceptance = accepted_w / (accepted_w + rejections_w) if accepted_w + rejections_w else 0.0
        slope = None if self.costs else stats.verify_slope
        speedup, best_k = best_predicted_speedup(acceptance, cost, verify, self.max_k, slope)
        # Acceptance comes in runs (boilerplate, repeated code), which the i.i.d. model under-rates: the
        # speed-up the loop actually achieved counts too (not with a clock-free cost model).
        step = stats.step_time
        realized = step * tokens_w / seconds_w if not self.costs and step and seconds_w else 0.0
        mean_k = stats.drafted / max(stats.speculative_iterations, 1)
        if slope is not None and best_k < mean_k and realized < 1.0 <= speedup:
            # Where a verify pass grows with its length (bf16 on a CPU without AMX or AVX-512 BF16), only a
            # shorter draft may pay: draft that long instead of falling back.
            self.k_cap = best_k
        speedup = max(speedup, realized)
        stats.predicted_speedup = speedup
        if speedup >= 1.0 and acceptance >= self.min_acceptance:
            if self.trial:
                stats.fallback["resumed"] += 1
                self.trial, self.retry_after = False, RETRY_AFTER
            self.below = 0
            return
        self.below += 1
        if not self.trial and self.below < PATIENCE:
            return
        self._fall_back(produced, f"predicted speed-up {speedup:.2f} < 1 (acceptance {acceptance:.2f}, cost ratio {cost:.2f})"
                        if speedup < 1.0 else f"acceptance {acceptance:.2f} < min_acceptance {self.min_acceptance:g}")
