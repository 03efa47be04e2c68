"""One speculative step, for one sequence or many: plan -> passes -> accept.

Each sequence keeps its loop state (`SequenceState`: its sampler, draft length k, the token `last` not yet in
the target's cache, the tokens `behind` that the draft model's cache lacks, its guard, n-gram index and
statistics). A step:

1. plan: per sequence a `Plan`, a value: one plain target step, or up to `budget` tokens proposed by the
   draft model or by an n-gram of the text so far (runner.decoding.ngram). The guard says whether to propose.
2. passes: the draft model's passes (one per draft position, every drafting sequence in each), then one
   target pass over each sequence's `last` and its proposal, plus whatever the caller fills the pass with
   (prompt chunks of joining sequences).
3. accept: per sequence, the verify rule (runner.decoding.sampling), both caches cut back to what was kept,
   adaptive k and the statistics; `finish` then applies the token limit, eos, the caller's stop and the
   guard's verdict.

runner.decoding.speculative runs it over one sequence (its engines wrapped as one-sequence contexts,
`EngineRows`); runner.decoding.batching over many, in the engines' batch contexts. Invariant between steps:
the target's cache holds every token but `last`; the draft model's every token but those in `behind`.
"""

from __future__ import annotations

__all__ = ["EngineRows", "METHODS", "Plan", "Proposal", "SequenceState", "Step", "adapt_draft_length", "allowed_methods",
           "finish_tokens"]

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from runner.decoding.guard import Guard
from runner.decoding.ngram import NgramProposer
from runner.decoding.sampling import Sampler, greedy_choices, one_hot, verify_greedy, verify_sampled
from runner.decoding.stats import Stats
from runner.engines import BatchContext, Engine
from runner.engines.cells import Row

# How a sequence's proposals are made: the draft model; an n-gram of the prompt and the text so far (no model
# pass); the n-gram where it finds a match, else the draft model.
METHODS = ("draft", "ngram", "ngram+draft")


def allowed_methods(methods: tuple[str, ...] | list[str], has_draft: bool) -> tuple[str, ...]:
    """The methods a pair can run: those needing the draft model only where it has one ("ngram+draft" is then
    "ngram"); ValueError for an unknown name."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown drafting method {unknown[0]!r} (known: {', '.join(METHODS)})")
    out = [m if has_draft or m == "ngram" else "ngram" for m in methods if has_draft or m != "draft"]
    return tuple(dict.fromkeys(out))


def finish_tokens(tokens: list[int], new: list[int], max_new_tokens: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cuts the new tokens at the length limit and after the first eos; says whether generation is done."""
    new = new[: max_new_tokens - len(tokens)]
    for i, token in enumerate(new):
        if token in eos:
            return new[: i + 1], True
    return new, len(tokens) + len(new) >= max_new_tokens


def adapt_draft_length(k: int, drafted: int, n: int, max_k: int) -> int:
    """Longer drafts after a full-length draft was accepted, shorter after an early rejection."""
    if n == drafted == k:
        return min(k + 1, max_k)
    if n < drafted // 2:
        return max(k - 1, 1)
    return k


@dataclass(frozen=True)
class Plan:
    """What one sequence does in a step: "plain" (one target step), "draft" (the draft model proposes up to
    `budget` tokens) or "ngram" (`proposal`, found before any pass)."""

    seq: int
    method: str = "plain"
    budget: int = 0
    proposal: tuple[int, ...] = ()


@dataclass
class Proposal:
    """Tokens proposed for one verify pass, their distributions (a sampled draft model's; None: greedy, or
    a deterministic n-gram), the proposing time attributed to the sequence, and whether it ran a catch-up."""

    tokens: list[int]
    q: torch.Tensor | None = None
    seconds: float = 0.0
    catch_up: bool = False


@dataclass(kw_only=True)
class SequenceState:
    """One generation's loop state, for one sequence id."""

    seq: int
    sampler: Sampler
    max_new_tokens: int
    k: int  # the draft model's next draft length (adaptive)
    max_k: int
    methods: tuple[str, ...] = ()  # allowed proposing methods (none: plain decoding)
    guard: Guard | None = None
    proposer: NgramProposer | None = None  # the n-gram index of the prompt and the tokens so far
    on_tokens: Callable[[list[int]], bool | None] | None = None
    stats: Stats = field(default_factory=Stats)
    tokens: list[int] = field(default_factory=list)
    last: int | None = None  # the newest token, not yet in the target's cache
    behind: list[int] = field(default_factory=list)  # tokens the draft model's cache lacks
    lookup: tuple[int, int] | None = None  # this step's n-gram match: its length and first token, for the guard


def _share(seconds: float, rows: list[Row]) -> list[float]:
    """A pass's time split among its rows by the tokens each put in it."""
    total = sum(len(t) for _, t, _ in rows) or 1
    return [seconds * len(t) / total for _, t, _ in rows]


class EngineRows:
    """An engine as a batch context of one sequence (id 0): the step runs a single generation through it."""

    max_tokens = sys.maxsize  # the engine cuts a long row into its own chunks

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.vocab_size = engine.vocab_size
        self._sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)  # timings cover the work

    def length(self, seq: int) -> int:
        return self.engine.length()

    def decode(self, rows: list[Row]) -> list[torch.Tensor]:
        out = [self.engine.forward(torch.tensor(tokens, dtype=torch.long, device=self.engine.device), last_only=not every)
               for _, tokens, every in rows]
        self._sync()
        return out

    def keep(self, seq: int, n: int) -> None:
        if self.engine.length() > n:
            self.engine.crop(self.engine.length() - n)


class Step:
    """The step over a target context and a draft model's (None: no draft model), for the sequences given.

    adaptive: the draft model's length follows acceptance; draft_confidence: its drafting stops once its own
    probability of the whole proposal falls below this; ngram_tokens: the longest n-gram proposal (at most
    the look-ahead the caches are sized for with it: runner.decoding.settings.cache_tokens)."""

    def __init__(self, target: BatchContext | EngineRows, draft: BatchContext | EngineRows | None, *, adaptive: bool,
                 draft_confidence: float, eos: set[int], ngram_tokens: int) -> None:
        self.target, self.draft = target, draft
        self.adaptive, self.draft_confidence, self.eos, self.ngram_tokens = adaptive, draft_confidence, eos, ngram_tokens

    def plan(self, s: SequenceState) -> Plan:
        """What the sequence does this step: the guard says whether to propose, the allowed methods how."""
        if not s.methods or (s.guard is not None and not s.guard.drafting(len(s.tokens))):
            return Plan(s.seq)
        remaining = s.max_new_tokens - len(s.tokens) - 1
        cap = s.guard.k_cap if s.guard is not None else s.max_k  # the caches have room for max_k + 1 at once
        method = s.guard.method(s.methods) if s.guard is not None else s.methods[0]
        if method != "draft" and s.proposer is not None:
            longest = min(self.ngram_tokens, remaining)  # the guard then says how much of the match pays
            proposal, matched = s.proposer.propose_match(longest) if longest > 0 else ([], 0)
            proposal = proposal[: next((i for i, t in enumerate(proposal) if t >= s.sampler.vocab_size), len(proposal))]
            if s.guard is not None and longest > 0:
                if proposal:  # the guard says how much of the match is worth a verify pass, and learns from each
                    s.lookup = (matched, proposal[0])
                    proposal = proposal[: s.guard.ngram_length(matched, len(proposal))]
                s.guard.looked_up(bool(proposal))
            if proposal:
                return Plan(s.seq, "ngram", len(proposal), tuple(proposal))
            if method == "ngram":
                return Plan(s.seq)
        budget = min(s.k, cap, remaining)
        return Plan(s.seq, "draft", budget) if budget > 0 and self.draft is not None else Plan(s.seq)

    def run(self, states: list[SequenceState], fill: Callable[[int], list[Row]] | None = None,
            before_pass: Callable[[], None] | None = None) -> tuple[list[tuple[list[int], tuple | None]], list, list[float]]:
        """One step of `states`: each one's new tokens and what its guard observes (None for a plain step);
        then the logits and time shares of the rows `fill(room)` added to the target pass (room: tokens left)."""
        plans = [self.plan(s) for s in states]
        drafting = [(s, p) for s, p in zip(states, plans) if p.method == "draft"]
        if drafting and before_pass:
            before_pass()  # the step's first pass is a draft pass
        proposals = self._draft_all(drafting)
        proposals.update({p.seq: Proposal(list(p.proposal)) for p in plans if p.method == "ngram"})
        rows = [(s.seq, [s.last, *proposals[s.seq].tokens], True) if s.seq in proposals else (s.seq, [s.last], False)
                for s in states]
        rows += fill(self.target.max_tokens - sum(len(t) for _, t, _ in rows)) if fill else []
        if not rows:
            return [], [], []
        if not drafting and before_pass:
            before_pass()
        t0 = time.perf_counter()
        logits = self.target.decode(rows)
        shares = _share(time.perf_counter() - t0, rows)
        n = len(states)
        accepted = [self.accept(s, p, proposals.get(s.seq), out, share)
                    for s, p, out, share in zip(states, plans, logits, shares)]
        return accepted, logits[n:], shares[n:]

    def pick(self, s: SequenceState, logits) -> tuple[int, torch.Tensor | None]:
        """The next token from a row's last logits, and its distribution (None when greedy)."""
        if s.sampler.greedy:
            return greedy_choices(logits[-1:], s.sampler.vocab_size)[0], None
        token, q = s.sampler.pick(torch.as_tensor(logits[-1:]))
        return int(token), q

    def _draft_all(self, drafting: list[tuple[SequenceState, Plan]]) -> dict[int, Proposal]:
        """Up to each plan's budget of draft tokens per drafting sequence, one draft model pass per position
        (the first also runs what each draft cache lacks)."""
        out = {s.seq: Proposal([], None, 0.0, len(s.behind) > 2) for s, _ in drafting}
        qs: dict[int, list[torch.Tensor]] = {s.seq: [] for s, _ in drafting}
        sure = {s.seq: 1.0 for s, _ in drafting}
        going, first = [s for s, _ in drafting], True
        budget = {s.seq: p.budget for s, p in drafting}
        while going:
            rows = [(s.seq, s.behind if first else [out[s.seq].tokens[-1]], False) for s in going]
            outs, shares = self._draft_pass(rows)
            for s, logits, share in zip(going, outs, shares):
                proposal = out[s.seq]
                proposal.seconds += share
                token, q = self.pick(s, logits)
                proposal.tokens.append(token)
                if q is not None:
                    qs[s.seq].append(q)
                if self.draft_confidence > 0.0:
                    vocab = s.sampler.vocab_size
                    p = q[0, token] if q is not None else torch.softmax(torch.as_tensor(logits[-1, :vocab]).float(), -1).max()
                    sure[s.seq] *= float(p)
            if first:
                for s in going:
                    s.behind = []
                first = False
            going = [s for s in going if len(out[s.seq].tokens) < budget[s.seq] and sure[s.seq] >= self.draft_confidence]
        for seq, q in qs.items():
            if q:
                out[seq].q = torch.cat(q)
        return out

    def _draft_pass(self, rows: list[Row]) -> tuple[list, list[float]]:
        """One draft model pass over rows; long catch-ups beyond one batch run one sequence at a time, in chunks."""
        draft = self.draft
        if sum(len(t) for _, t, _ in rows) <= draft.max_tokens:
            t0 = time.perf_counter()
            outs = draft.decode(rows)
            return outs, _share(time.perf_counter() - t0, rows)
        outs, shares = [], []
        for seq, tokens, _ in rows:
            t0 = time.perf_counter()
            for i in range(0, len(tokens), draft.max_tokens):
                last = draft.decode([(seq, tokens[i : i + draft.max_tokens], False)])[0]
            outs.append(last.copy())  # the next row's passes reuse the buffer
            shares.append(time.perf_counter() - t0)
        return outs, shares

    def accept(self, s: SequenceState, plan: Plan, proposal: Proposal | None, logits, seconds: float) -> tuple[list[int], tuple | None]:
        """The target pass's verdict on one sequence: its new tokens, both caches cut back to what was kept;
        and what its guard observes (proposed, accepted, seconds, method; None for a plain step)."""
        stats = s.stats
        if proposal is None:  # one target step: a guard probe, the last token, or plain decoding
            token, _ = self.pick(s, logits)
            stats.target_calls.append((self.target.length(s.seq) - 1, 1))
            stats.record_step(seconds)
            s.last = token
            if self.draft is not None:
                s.behind.append(token)  # the draft catches up when it drafts again
            return [token], None
        drafted, k = proposal.tokens, len(proposal.tokens)
        if s.sampler.greedy:
            n, token, new = verify_greedy(logits, drafted, s.sampler.vocab_size)
        else:
            logits = torch.as_tensor(logits)
            q = proposal.q if proposal.q is not None else one_hot(drafted, s.sampler.vocab_size, logits.device)
            n, last, new = verify_sampled(logits, torch.tensor(drafted, dtype=torch.long, device=logits.device), q, s.sampler)
            token = int(last)
        method = "draft" if plan.method == "draft" else "ngram"
        before = self.target.length(s.seq) - k - 1
        stats.target_calls.append((before, k + 1))
        stats.record_iteration(k, n, proposal.seconds, seconds, catch_up=proposal.catch_up, method=method)
        if s.guard is not None:
            s.guard.timed_pass(k, seconds)
        if n < k:
            self.target.keep(s.seq, before + 1 + n)
        self._keep_draft(s, method, drafted, n, token)
        s.last = token
        if self.adaptive and method == "draft" and plan.budget == s.k:  # a length cut by the guard or the end says nothing
            s.k = adapt_draft_length(s.k, k, n, s.max_k)
        return new, (k, n, proposal.seconds + seconds, method)

    def _keep_draft(self, s: SequenceState, method: str, drafted: list[int], n: int, token: int) -> None:
        """The draft model's cache after a verify pass: cut back to the kept drafts it ran; what it lacks in `behind`."""
        if self.draft is None:
            return
        if method != "draft":  # an n-gram's tokens never ran through the draft model: it catches up on what was kept
            s.behind += drafted[:n] + [token]
            return
        k = len(drafted)
        if n < k:
            if k - 1 - n:
                self.draft.keep(s.seq, self.draft.length(s.seq) - (k - 1 - n))
            s.behind = [token]
        else:  # all accepted: the draft has not run its own last token yet
            s.behind = [drafted[-1], token]

    def finish(self, s: SequenceState, new: list[int], observed: tuple | None) -> bool:
        """Hands a sequence its new tokens (cut at the limit and eos); whether it is done, by them or by its
        caller (on_tokens returned True); then its guard observes the iteration."""
        new, done = finish_tokens(s.tokens, new, s.max_new_tokens, self.eos)
        s.tokens += new
        if s.proposer is not None:
            s.proposer.extend(new)
        if s.on_tokens and s.on_tokens(new):  # the caller asks to stop here (a client gone, a stop string)
            done = True
        if observed and s.guard:
            drafted, accepted, seconds, method = observed
            s.guard.observe(drafted, accepted, seconds, len(s.tokens), method)
        if s.lookup is not None and s.guard and new:
            matched, first = s.lookup
            if observed and observed[3] == "ngram":
                s.guard.ngram_observed(matched, observed[0], observed[1])
            else:  # not verified: its first token against the target's own
                s.guard.ngram_observed(matched, 1, int(new[0] == first))
        s.lookup = None
        return done
