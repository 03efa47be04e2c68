"""How well the draft is doing: counters kept by the decoding loop, and the speed-up they predict.

The prediction is Leviathan et al.'s (2023, "Fast Inference from Transformers via Speculative
Decoding"): with per-token acceptance a, k drafted tokens and a draft step costing c target steps, one
iteration yields (1 - a^(k+1)) / (1 - a) tokens for k*c + 1 target steps. We measure the verify pass
too (v target steps, about 1 on a GPU, more on a CPU), so the denominator is k*c + v.
"""

from __future__ import annotations

__all__ = ["Stats", "best_predicted_speedup", "expected_tokens", "predicted_speedup"]

from dataclasses import dataclass, field

from runner.decoding.methods import DRAFT, METHODS, Method


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one speculative iteration yields on average: accepted drafts plus the target's own token."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def predicted_speedup(acceptance: float, k: int, cost_ratio: float, verify_ratio: float = 1.0) -> float:
    """Leviathan's speed-up over plain decoding: (1 - a^(k+1)) / ((1 - a)(k c + v))."""
    return expected_tokens(acceptance, k) / (k * cost_ratio + verify_ratio)


def best_predicted_speedup(
    acceptance: float, cost_ratio: float, verify_ratio: float, max_k: int, verify_slope: float | None = None
) -> tuple[float, int]:
    """The best predicted speed-up over draft lengths 1..max_k, and the k that gives it.

    verify_slope: when given, a verify pass over k drafts costs 1 + verify_slope * k target steps (it
    grows with its length on CPUs without fast batched bf16 kernels); else verify_ratio for every k."""
    def verify(k: int) -> float:
        return verify_ratio if verify_slope is None else 1.0 + verify_slope * k
    return max((predicted_speedup(acceptance, k, cost_ratio, verify(k)), k) for k in range(1, max(max_k, 1) + 1))


def _mean(total: float, count: int) -> float | None:
    return total / count if count else None


@dataclass
class Stats:
    """Counters of one generation. The loop updates them where things happen; properties derive the rest."""

    new_tokens: int = 0
    drafted: int = 0  # draft tokens proposed to the target
    accepted: int = 0  # of those, accepted
    rejections: int = 0  # speculative iterations that ended on a rejected draft token
    speculative_iterations: int = 0  # target verify passes over >= 1 draft token
    target_passes: int = 0  # every target forward: prefill, verify passes, single steps
    plain_steps: int = 0  # single-token target steps: guard probes, the last token, after a fallback
    draft_passes: int = 0
    drafted_at: list[int] = field(default_factory=list)  # per draft position (1-based in the output)
    accepted_at: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0  # timed draft steps (draft prefill excluded)
    draft_steps_timed: int = 0
    draft_prefill_s: float = 0.0  # the draft's first step, which also ran the prompt
    verify_time_s: float = 0.0  # timed verify passes
    verifies_timed: int = 0
    verify_time_by_k: dict[int, float] = field(default_factory=dict)  # the same, per number of drafts in the pass
    verifies_by_k: dict[int, int] = field(default_factory=dict)
    step_time_s: float = 0.0  # timed single-token target steps: what plain decoding costs per token
    steps_timed: int = 0
    spec_time_s: float = 0.0  # wall time of speculative iterations (draft steps + verify pass)
    spec_tokens: int = 0  # tokens they produced (accepted drafts + the target's own)
    elapsed_s: float = 0.0
    draft_tokens_final: int | None = None
    predicted_speedup: float | None = None  # the guard's last prediction (best k)
    fallback: dict | None = None  # {"at_token", "reason"} once the guard switched to plain decoding
    model_dropped: dict | None = None  # {"at_token", "reason"} once the guard dropped the draft model for prompt lookup
    # (cache length before, tokens in) of every target forward, in order: how the target computed each
    # position, so a difference from plain decoding can be replayed in the same numerics (runner.bench.torch_bench).
    target_calls: list[tuple[int, int]] = field(default_factory=list)
    # per proposing method ("draft", "ngram"): [speculative iterations, drafted, accepted]
    by_method: dict[str, list[int]] = field(default_factory=dict)

    def record_verify(self, k: int, n: int) -> None:
        """One verify pass over k drafted tokens, of which the first n were accepted."""
        self.speculative_iterations += 1
        self.drafted += k
        self.accepted += n
        self.rejections += n < k
        while len(self.drafted_at) < k:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(k):
            self.drafted_at[i] += 1
        for i in range(n):
            self.accepted_at[i] += 1

    def record_step(self, seconds: float) -> None:
        """One timed single-token target step: a guard probe, the last token, or plain decoding."""
        self.step_time_s += seconds
        self.target_passes += 1
        self.plain_steps += 1
        self.steps_timed += 1

    def record_iteration(self, k: int, n: int, draft_s: float, verify_s: float, catch_up: bool,
                         method: str | Method = DRAFT) -> None:
        """One speculative iteration: k tokens proposed in draft_s (by the draft model's k steps, or by an
        n-gram lookup: method "ngram"), n of them accepted by a verify pass taking verify_s. catch_up: the first
        draft step also ran tokens the draft's cache lacked (the prompt, or the tokens of a plain stretch or of
        accepted n-grams), so its time is not a draft step's cost."""
        method = METHODS[method] if isinstance(method, str) else method
        counts = self.by_method.setdefault(method.name, [0, 0, 0])
        counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + k, counts[2] + n
        self.target_passes += 1
        self.record_verify(k, n)
        if method.uses_draft:
            with_prompt = not self.draft_passes  # the draft's first step also ran the prompt
            self.draft_passes += k
            if not catch_up:
                self.draft_time_s += draft_s
                self.draft_steps_timed += k
            elif with_prompt:  # else a catch-up over the tokens of a plain stretch, counted as the trial's cost
                self.draft_prefill_s += draft_s
        self.verify_time_s += verify_s
        self.verifies_timed += 1
        self.verify_time_by_k[k] = self.verify_time_by_k.get(k, 0.0) + verify_s
        self.verifies_by_k[k] = self.verifies_by_k.get(k, 0) + 1
        self.spec_time_s += draft_s + verify_s
        self.spec_tokens += n + 1

    def method_acceptance(self, method: str) -> float | None:
        """Accepted / proposed of one proposing method's iterations."""
        counts = self.by_method.get(method)
        return _mean(counts[2], counts[1]) if counts else None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted."""
        return _mean(self.accepted, self.drafted)

    @property
    def acceptance(self) -> float | None:
        """Per-token acceptance a of Leviathan's model (maximum likelihood: drafts stop at the first rejection)."""
        return _mean(self.accepted, self.accepted + self.rejections)

    @property
    def mean_accepted_length(self) -> float | None:
        """Draft tokens accepted per verify pass (each pass adds one more token of the target's own)."""
        return _mean(self.accepted, self.speculative_iterations)

    @property
    def per_position_acceptance(self) -> list[float]:
        """For draft position i: accepted there / drafted there."""
        return [a / d for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def step_time(self) -> float | None:
        """Mean time of a single-token target step. A verify pass does a step's work and more, so a
        step timed slower than the mean verify pass was noise (a busy machine): the verify time bounds it."""
        step, verify = _mean(self.step_time_s, self.steps_timed), _mean(self.verify_time_s, self.verifies_timed)
        return min(step, verify) if step is not None and verify is not None else step

    @property
    def cost_ratio(self) -> float | None:
        """One draft step's time over one single-token target step's time."""
        draft, step = _mean(self.draft_time_s, self.draft_steps_timed), self.step_time
        return draft / step if draft is not None and step else None

    @property
    def verify_cost_ratio(self) -> float | None:
        """One verify pass's time over one single-token target step's time (>= 1)."""
        verify, step = _mean(self.verify_time_s, self.verifies_timed), self.step_time
        return verify / step if verify is not None and step else None

    @property
    def verify_slope(self) -> float | None:
        """What each drafted token adds to a verify pass, in target steps: the least-squares slope of
        (verify cost - 1) over the number of drafts, through (0, 1) (a pass over no draft is one step).
        About 0 where batched passes are as cheap as one step (a GPU, AMX), ~0.5 for bf16 on AVX2."""
        step = self.step_time
        if not step or not self.verifies_by_k:
            return None
        num = sum(n * k * (self.verify_time_by_k[k] / n / step - 1.0) for k, n in self.verifies_by_k.items())
        den = sum(n * k * k for k, n in self.verifies_by_k.items())
        return max(num / den, 0.0) if den else None

    def verify_steps(self, k: int, samples: int = 2, fit: bool = True) -> float | None:
        """What a verify pass over k drafts costs, in target steps: the mean of the passes of that length where
        `samples` were timed (llama.cpp's kernels make some lengths cheaper than their neighbours), else (fit)
        the linear fit (verify_slope); None before a step and a pass were timed."""
        step = self.step_time
        if not step:
            return None
        timed = self.verifies_by_k.get(k, 0)
        if timed >= samples:
            return max(self.verify_time_by_k[k] / timed / step, 1.0)
        if not fit:
            return None
        slope = self.verify_slope
        return None if slope is None else 1.0 + slope * k

    @property
    def realized_speedup(self) -> float | None:
        """Tokens/s of the speculative iterations so far over tokens/s of the timed plain steps."""
        spec, step = _mean(self.spec_time_s, self.spec_tokens), _mean(self.step_time_s, self.steps_timed)
        return step / spec if spec and step else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else None

    def as_dict(self) -> dict:
        """The `stats` object of CONTRACT.md's `run --json`, with the extra figures after the contract's."""
        return {
            "new_tokens": self.new_tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "target_passes": self.target_passes,
            "tokens_per_second": self.tokens_per_second,
            "fallback": self.fallback,
            "per_position_acceptance": self.per_position_acceptance,
            "draft_passes": self.draft_passes,
            "plain_steps": self.plain_steps,
            "speculative_iterations": self.speculative_iterations,
            "elapsed_s": self.elapsed_s,
            "cost_ratio": self.cost_ratio,
            "verify_cost_ratio": self.verify_cost_ratio,
            "verify_slope": self.verify_slope,
            "predicted_speedup": self.predicted_speedup,
            "realized_speedup": self.realized_speedup,
            "draft_tokens_final": self.draft_tokens_final,
            "methods": {m: {"iterations": c[0], "drafted": c[1], "accepted": c[2]} for m, c in self.by_method.items()},
            "draft_model_dropped": self.model_dropped,
        }
