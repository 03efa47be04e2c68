"""How much of a prompt-lookup match to verify: the policy's third job (runner.decoding.policy), and the
process's memory of what verify passes cost, which it reads.

A match of more tokens is a copy more often (a 4-token match rarely repeats by chance, a 2-token one may be
"the" and a comma), so acceptance is kept per matched suffix length; a verify pass's cost per number of
proposed tokens comes from a cost model, this generation's timed passes, or earlier generations' (PassMemory).
"""

from __future__ import annotations

__all__ = ["MEMORY_WEIGHT", "MatchLength", "NGRAM_MATCH_LENGTHS", "NGRAM_MATCH_PRIOR", "PassMemory", "UNTIMED_VERIFY_SLOPE",
           "pass_memory"]

import weakref

from runner.decoding.stats import Stats, expected_tokens

DECAY = 0.9  # per observed match: acceptance follows the text
# An n-gram match's per-token acceptance before any was verified, as pseudo-counts [accepted, rejections]
# (a = 0.5), kept per matched suffix length up to NGRAM_MATCH_LENGTHS.
NGRAM_MATCH_PRIOR = (1.0, 1.0)
NGRAM_MATCH_LENGTHS = 4
# What each proposed token adds to a verify pass, in target steps, before any pass was timed: the dear end of
# what was measured (llama.cpp and bf16 on AVX2, two cores: docs/benchmarks.md), so the first proposals are
# short, and timed; where passes turn out cheap, the timed costs lengthen them.
UNTIMED_VERIFY_SLOPE = 0.5
MEMORY_WEIGHT = 8.0  # earlier generations' n-gram acceptance counts as this many observations, at most


class PassMemory:
    """What a process has learned of one target over its generations, so that the next generation's policy starts
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


class MatchLength:
    """How many tokens of a match pay for their verify pass, learned per matched length. `costs` (draft step,
    verify pass, in target steps) replaces timed costs when given; `memory` is the process's, none with costs
    (a seeded sample never depends on earlier runs)."""

    def __init__(self, stats: Stats, costs: tuple[float, float] | None, memory: PassMemory | None = None) -> None:
        self.stats, self.costs = stats, costs
        self.memory = memory if costs is None else None
        # n-gram acceptance per matched suffix length, decaying: from earlier generations' (weighed as a few matches)
        self.by_match: dict[int, tuple[float, float]] = {}
        for key, (a, r) in (self.memory.by_match.items() if self.memory else ()):
            weight = min(1.0, MEMORY_WEIGHT / (a + r)) if a + r else 0.0
            self.by_match[key] = (NGRAM_MATCH_PRIOR[0] + a * weight, NGRAM_MATCH_PRIOR[1] + r * weight)

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
