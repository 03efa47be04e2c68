"""When to propose: the policy's first job (runner.decoding.policy), and when to fall back to plain decoding, and why.

The policy asks `Guard.drafting` before each step of a sequence; each speculative iteration is reported to
`Guard.observe`. The guard keeps its verdicts in the generation's Stats (`fallback`, `model_dropped`,
`predicted_speedup`).
"""

from __future__ import annotations

__all__ = [
    "Guard", "LOSS_BUDGET", "LOSS_FLOOR", "PATIENCE", "RETRY_AFTER", "TRIAL_ITERATIONS", "WARMUP_ITERATIONS",
]

import math

from runner.decoding.methods import DRAFT
from runner.decoding.stats import Stats, best_predicted_speedup

WARMUP_ITERATIONS = 6  # speculative iterations before the guard judges
PROBE_STEPS = 2  # single target steps timed early on: the cost of plain decoding, for the prediction
PROBE_EVERY = 16  # then one more timed plain step every this many speculative iterations
PATIENCE = 3  # consecutive predictions below 1 before falling back
DECAY = 0.9  # the guard judges a recent window: its sums decay by this per speculative iteration
RETRY_AFTER = 16  # after a fallback, plain tokens before a trial of speculation; doubles per failed trial
RETRY_AFTER_MAX = 256
TRIAL_ITERATIONS = 4  # speculative iterations a trial lasts before it is judged
# What speculation may cost, measured by the clock: its iterations' time beyond what plain decoding would
# have taken for the tokens they produced may not exceed LOSS_FLOOR target steps plus LOSS_BUDGET of the
# plain time of all tokens so far. An iteration starts only where the budget has room for what one has
# cost so far, and beyond it the guard falls back at once; a trial starts only once the run is back within
# budget: a draft that does not pay costs about the floor, on any CPU. The floor is one losing iteration:
# on a CPU where a verify pass costs 2-3 steps (AVX2), what a useless draft costs is a step or two per answer.
LOSS_FLOOR = 1.0
LOSS_BUDGET = 0.005


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
                 lookup_allowed: bool = False) -> None:
        self.stats, self.max_k, self.min_acceptance, self.costs = stats, max_k, min_acceptance, costs
        self.lookup_allowed = lookup_allowed  # prompt lookup may propose without the draft model
        self.window = [0.0, 0.0, 0.0, 0.0]  # accepted, rejections, seconds, tokens
        self.iterations = self.below = 0
        self.plain_until: float | None = None  # while fallen back: the token count at which a trial starts
        self.trial = False
        self.retry_after = RETRY_AFTER
        self.k_cap = max_k  # drafts per iteration at most: lowered when only shorter drafts pay
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
        """Without the draft model from the first token (runner.decoding.run_history's advice, or the cost
        table's verdict), with its reason: prompt lookup alone where the methods allow it, else plain decoding
        and no trial."""
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
        if (self.model_dropped or self.stats.fallback is not None or not self.stats.by_method.get(DRAFT.name)
                or not self.lookup_allowed):
            return False
        self.model_dropped = True
        self.stats.model_dropped = {"at_token": produced, "reason": reason}
        self.forgiven += self.lost_steps() or 0.0
        self.window, self.iterations, self.below, self.k_cap = [0.0] * 4, 0, 0, self.max_k
        return True

    def observe(self, drafted: int, accepted: int, seconds: float, produced: int) -> None:
        """One speculative iteration; then the verdict, which may switch to plain decoding."""
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
        if cost is None and DRAFT.name not in stats.by_method:  # n-gram proposals only: no model step to pay for
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
