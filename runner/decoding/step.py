"""One speculative step, for one sequence or many: plan -> passes -> accept.

Each sequence keeps its loop state (`SequenceState`: its sampler, draft length k, the token `last` not yet in
the target's cache, the tokens `behind` that the draft model's cache lacks, its policy, n-gram index and
statistics). The step is mechanism only; what to do is its sequences' policies' (runner.decoding.policy). A step:

1. plan: per sequence, its policy's `Plan`, a value: one plain target step, or up to `budget` tokens proposed by
   the draft model, or an n-gram of the text so far (runner.decoding.ngram).
2. passes: the draft model's passes (one per draft position, every drafting sequence in each), then one
   target pass over each sequence's `last` and its proposal, plus whatever the caller fills the pass with
   (prompt chunks of joining sequences).
3. accept: per sequence, the verify rule (runner.decoding.sampling), both caches cut back to what was kept and
   the statistics: one `Verdict` (new tokens and the proposal's `Outcome`) per sequence, in a `StepResult`;
   `finish` then applies the token limit, eos and the caller's stop, and the policy learns from the verdict.

runner.decoding.speculative runs it over one sequence (its engines wrapped as one-sequence contexts,
`EngineRows`); runner.decoding.batching over many, in the engines' batch contexts. Invariant between steps:
the target's cache holds every token but `last`; the draft model's every token but those in `behind`.
"""

from __future__ import annotations

__all__ = ["EngineRows", "Proposal", "SequenceState", "Step", "StepResult", "Verdict", "finish_tokens"]

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from runner.decoding.ngram import NgramProposer
from runner.decoding.policy import Outcome, Plan, Unguarded
from runner.decoding.sampling import Sampler, greedy_choices, one_hot, verify_greedy, verify_sampled
from runner.decoding.stats import Stats
from runner.engines import BatchContext, Engine
from runner.engines.cells import Row


def finish_tokens(tokens: list[int], new: list[int], max_new_tokens: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cuts the new tokens at the length limit and after the first eos; says whether generation is done."""
    new = new[: max_new_tokens - len(tokens)]
    for i, token in enumerate(new):
        if token in eos:
            return new[: i + 1], True
    return new, len(tokens) + len(new) >= max_new_tokens


@dataclass(slots=True)
class Verdict:
    """One sequence's part of a step: its new tokens, and the target's verdict on its proposal (None: a plain step)."""

    new: list[int]
    outcome: Outcome | None


@dataclass(slots=True)
class StepResult:
    """A step: a Verdict per sequence stepped (in order), then the logits and time shares of the rows the
    caller filled the target pass with (prompt chunks)."""

    verdicts: list[Verdict]
    filled_logits: list
    filled_seconds: list[float]


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
    k: int  # the draft model's next draft length (the policy adapts it)
    policy: Unguarded  # decides each step (runner.decoding.policy)
    proposer: NgramProposer | None = None  # the n-gram index of the prompt and the tokens so far
    on_tokens: Callable[[list[int]], bool | None] | None = None
    stats: Stats = field(default_factory=Stats)
    tokens: list[int] = field(default_factory=list)
    last: int | None = None  # the newest token, not yet in the target's cache
    behind: list[int] = field(default_factory=list)  # tokens the draft model's cache lacks


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
    """The step over a target context and a draft model's (None: no draft model), for the sequences given:
    each sequence's policy plans, the step runs the passes and verifies. draft_confidence: the draft model's
    drafting stops once its own probability of the whole proposal falls below this."""

    def __init__(self, target: BatchContext | EngineRows, draft: BatchContext | EngineRows | None, *,
                 draft_confidence: float, eos: set[int]) -> None:
        self.target, self.draft = target, draft
        self.draft_confidence, self.eos = draft_confidence, eos

    def run(self, states: list[SequenceState], fill: Callable[[int], list[Row]] | None = None,
            before_pass: Callable[[], None] | None = None) -> StepResult:
        """One step of `states`: each one's Verdict; then the logits and time shares of the rows `fill(room)`
        added to the target pass (room: tokens left)."""
        plans = [s.policy.plan(s) for s in states]
        drafting = [(s, p) for s, p in zip(states, plans) if p.source is not None and p.source.uses_draft]
        if drafting and before_pass:
            before_pass()  # the step's first pass is a draft pass
        proposals = self._draft_all(drafting)
        proposals.update({p.seq: Proposal(list(p.proposal)) for p in plans if p.proposal})
        rows = [(s.seq, [s.last, *proposals[s.seq].tokens], True) if s.seq in proposals else (s.seq, [s.last], False)
                for s in states]
        rows += fill(self.target.max_tokens - sum(len(t) for _, t, _ in rows)) if fill else []
        if not rows:
            return StepResult([], [], [])
        if not drafting and before_pass:
            before_pass()
        t0 = time.perf_counter()
        logits = self.target.decode(rows)
        shares = _share(time.perf_counter() - t0, rows)
        n = len(states)
        verdicts = [self.accept(s, p, proposals.get(s.seq), out, share)
                    for s, p, out, share in zip(states, plans, logits, shares)]
        return StepResult(verdicts, logits[n:], shares[n:])

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

    def accept(self, s: SequenceState, plan: Plan, proposal: Proposal | None, logits, seconds: float) -> Verdict:
        """The target pass's verdict on one sequence: its new tokens, both caches cut back to what was kept."""
        stats = s.stats
        if proposal is None:  # one target step: a guard probe, the last token, or plain decoding
            token, _ = self.pick(s, logits)
            stats.target_calls.append((self.target.length(s.seq) - 1, 1))
            stats.record_step(seconds)
            s.last = token
            if self.draft is not None:
                s.behind.append(token)  # the draft catches up when it drafts again
            return Verdict([token], None)
        drafted, k = proposal.tokens, len(proposal.tokens)
        if s.sampler.greedy:
            n, token, new = verify_greedy(logits, drafted, s.sampler.vocab_size)
        else:
            logits = torch.as_tensor(logits)
            q = proposal.q if proposal.q is not None else one_hot(drafted, s.sampler.vocab_size, logits.device)
            n, last, new = verify_sampled(logits, torch.tensor(drafted, dtype=torch.long, device=logits.device), q, s.sampler)
            token = int(last)
        source = plan.source
        before = self.target.length(s.seq) - k - 1
        stats.target_calls.append((before, k + 1))
        stats.record_iteration(k, n, proposal.seconds, seconds, catch_up=proposal.catch_up, method=source.name)
        if n < k:
            self.target.keep(s.seq, before + 1 + n)
        self._keep_draft(s, source.uses_draft, drafted, n, token)
        s.last = token
        return Verdict(new, Outcome(source, k, n, proposal.seconds + seconds, seconds, plan.budget))

    def _keep_draft(self, s: SequenceState, drafted_by_model: bool, drafted: list[int], n: int, token: int) -> None:
        """The draft model's cache after a verify pass: cut back to the kept drafts it ran; what it lacks in `behind`."""
        if self.draft is None:
            return
        if not drafted_by_model:  # a lookup's tokens never ran through the draft model: it catches up on what was kept
            s.behind += drafted[:n] + [token]
            return
        k = len(drafted)
        if n < k:
            if k - 1 - n:
                self.draft.keep(s.seq, self.draft.length(s.seq) - (k - 1 - n))
            s.behind = [token]
        else:  # all accepted: the draft has not run its own last token yet
            s.behind = [drafted[-1], token]

    def finish(self, s: SequenceState, verdict: Verdict) -> bool:
        """Hands a sequence its new tokens (cut at the limit and eos); whether it is done, by them or by its
        caller (on_tokens returned True); then its policy learns from the step."""
        new, done = finish_tokens(s.tokens, verdict.new, s.max_new_tokens, self.eos)
        s.tokens += new
        if s.proposer is not None:
            s.proposer.extend(new)
        if s.on_tokens and s.on_tokens(new):  # the caller asks to stop here (a client gone, a stop string)
            done = True
        s.policy.learn(s, verdict.outcome, new)
        return done
