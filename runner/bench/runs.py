"""Timed runs of a decoding method over prompts, interleaved rounds, and what the bundle's counters say:
the parts of `bundle bench` that do not depend on the engine (runner.bench.torch_bench for torch, runner.bench.gguf_bench
for llama.cpp)."""

from __future__ import annotations

__all__ = ["Run", "break_even_acceptance", "by_category", "chosen_method", "interleaved_rounds", "pooled", "speculation_figures",
           "timed"]

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from runner.decoding.settings import longest_draft
from runner.decoding.stats import best_predicted_speedup, predicted_speedup


@dataclass
class Run:
    """One method over all prompts: the tokens per prompt and the time they took."""

    tokens: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0
    stats: list[Any] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds per prompt, in the order of tokens

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"tokens_per_second": round(self.tokens_per_second, 2), "new_tokens": self.new_tokens, "seconds": round(self.seconds, 3)}


def timed(prompts: Sequence[list[int]], generate: Callable[[list[int]], tuple[list[int], Any]], into: Run | None = None) -> Run:
    run = into or Run()
    for ids in prompts:
        start = time.perf_counter()
        tokens, stats = generate(ids)
        elapsed = time.perf_counter() - start
        run.seconds += elapsed
        run.times.append(elapsed)
        run.tokens.append(tokens)
        run.stats.append(stats)
    return run


def interleaved_rounds(methods: Mapping[str, Callable[[list[int]], tuple[list[int], Any]]], ids: Sequence[list[int]],
                       repeat: int, say: Callable[[str], None]) -> list[dict[str, Run]]:
    """`repeat` rounds over the prompts, prompt by prompt, every method in turn (the order rotating): a
    machine that speeds up or slows down during the bench (other load, clocks) then moves every method
    alike, and the ratios stay fair."""
    names = list(methods)
    rounds: list[dict[str, Run]] = []
    for r in range(max(repeat, 1)):
        runs = {name: Run() for name in names}
        for i, x in enumerate(ids):
            say(f"round {r + 1}/{max(repeat, 1)}, prompt {i + 1}/{len(ids)}")
            turn = (i + r) % len(names)
            for name in names[turn:] + names[:turn]:
                timed([x], methods[name], into=runs[name])
        rounds.append(runs)
    return rounds


def pooled(runs: Sequence[Run]) -> Run:
    """Several rounds of one method as one run: every prompt of every round."""
    return Run([t for r in runs for t in r.tokens], sum(r.seconds for r in runs), [s for r in runs for s in r.stats],
               [t for r in runs for t in r.times])


def chosen_method(stats: Any) -> str:
    """The method a generation proposed with (Stats.by_method; "ngram+draft" where both proposed), ", then
    ngram" where the guard dropped the draft model, ", then plain" where it fell back after proposing, "plain"
    where it never proposed."""
    counts = {m for m, c in (getattr(stats, "by_method", None) or {}).items() if c[0]}
    used = "ngram+draft" if len(counts) > 1 else next(iter(counts), "draft" if stats.spec_tokens else "")
    if not used:
        return "plain"
    dropped = getattr(stats, "model_dropped", None)
    if dropped and not dropped["at_token"]:
        used = "ngram (draft model left out)" if used == "ngram" else used  # the run history's advice
    elif dropped:
        used += ", then ngram"
    return f"{used}, then plain" if stats.fallback else used


def by_category(rounds: Sequence[Mapping[str, Run]], categories: Sequence[str], reference: str,
                peers: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Per prompt category, over every round: tokens/s of the bundle, of `reference` (our plain decoding)
    and of each peer present, the bundle's speed-up over each, and how often the guard chose each method."""
    out: dict[str, dict[str, Any]] = {}
    for category in dict.fromkeys(categories):
        picks = [i for i, c in enumerate(categories) if c == category]

        def tps(name: str) -> float:
            tokens = sum(len(rnd[name].tokens[i]) for rnd in rounds for i in picks)
            seconds = sum(rnd[name].times[i] for rnd in rounds for i in picks)
            return tokens / seconds if seconds else 0.0

        names = ["bundle", reference, *(p for p in peers if p in rounds[0])]
        speeds = {name: tps(name) for name in names}
        methods: dict[str, int] = {}
        for i in picks:
            method = chosen_method(rounds[0]["bundle"].stats[i])
            methods[method] = methods.get(method, 0) + 1
        out[category] = {
            "prompts": len(picks),
            "tokens_per_second": {name: round(v, 2) for name, v in speeds.items()},
            **{f"speedup_vs_{name}": round(speeds["bundle"] / speeds[name], 3) if speeds[name] else None for name in names[1:]},
            "methods": methods,
        }
    return out


def break_even_acceptance(cost_ratio: float, verify_ratio: float, max_k: int) -> float:
    """The lowest per-token acceptance at which the best draft length predicts a speed-up of 1."""
    lo, hi = 0.0, 0.999
    if best_predicted_speedup(hi, cost_ratio, verify_ratio, max_k)[0] < 1.0:
        return 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if best_predicted_speedup(mid, cost_ratio, verify_ratio, max_k)[0] < 1.0 else (lo, mid)
    return hi


def speculation_figures(runs: Mapping[str, Run], k: int) -> dict[str, Any]:
    """What the bundle runs' counters say (all rounds pooled): acceptance, the draft's cost and the verify
    pass's relative to a step of our plain decoding (`runner_plain`), and the speed-up Leviathan's formula
    predicts from them (`draft_only`: the draft decoding alone, for its cost)."""
    stats = runs["bundle"].stats
    accepted, drafted = sum(s.accepted for s in stats), sum(s.drafted for s in stats)
    rejections, iterations = sum(s.rejections for s in stats), sum(s.speculative_iterations for s in stats)
    alpha = accepted / (accepted + rejections) if accepted + rejections else 0.0
    # Costs relative to a step of the target as the loop runs it (our plain decoding's step): the theory
    # then predicts what speculation alone gains, and the efficiency compares it with speedup_vs_runner_plain.
    step_s = runs["runner_plain"].seconds / max(runs["runner_plain"].new_tokens, 1)
    cost = (runs["draft_only"].seconds / max(runs["draft_only"].new_tokens, 1)) / step_s
    verifies = sum(s.verifies_timed for s in stats)
    verify_ratio = (sum(s.verify_time_s for s in stats) / verifies / step_s) if verifies else 1.0
    mean_k = drafted / iterations if iterations else float(k)
    per_iteration = predicted_speedup(alpha, max(1, round(mean_k)), cost, verify_ratio) if iterations else 1.0
    # The prediction holds for the speculative iterations; tokens the guard made plain decoding produce
    # cost one target step each, as they should. The whole run's theoretical speed-up mixes the two.
    spec_tokens = sum(s.spec_tokens for s in stats)
    plain_tokens = max(runs["bundle"].new_tokens - spec_tokens, 0)  # spec_tokens counts a cut last batch whole
    theoretical = (spec_tokens + plain_tokens) / (spec_tokens / per_iteration + plain_tokens) if spec_tokens + plain_tokens else 1.0
    return {
        "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        "per_token_acceptance": round(alpha, 4),
        "mean_accepted_length": round(accepted / iterations, 3) if iterations else 0.0,
        "cost_ratio": round(cost, 4),
        "verify_cost_ratio": round(verify_ratio, 4),
        "mean_draft_tokens": round(mean_k, 2),
        "theoretical_speedup": round(theoretical, 3),
        "theoretical_speedup_speculating": round(per_iteration, 3),
        "speculative_share": round(spec_tokens / max(runs["bundle"].new_tokens, 1), 3),
        "break_even_acceptance": round(break_even_acceptance(cost, verify_ratio, longest_draft(k)), 3),
    }
