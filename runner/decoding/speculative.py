"""Speculative decoding over an engine pair (runner.engines: torch or llama.cpp), lossless, with a guard.

The loop (`generate_speculative`), one `Speculation` step per iteration: the draft proposes k tokens one
step at a time, the target scores all of them in one pass, the longest agreeing prefix is kept plus one
token of the target's own, and both caches are cropped back to what was kept. Greedy output is the
target's greedy output token for token; sampled output follows the target's distribution exactly (accept
with min(1, p/q), else resample from max(p - q, 0) normalised). Before each iteration the guard
(runner.decoding.guard) says whether to draft or to take one plain target step.
"""

from __future__ import annotations

__all__ = [
    "Sampler", "adapt_draft_length", "finish_tokens", "generate_plain", "generate_speculative",
    "verify_sampled",
]

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from runner.decoding.guard import Guard, parameter_costs
from runner.decoding.stats import Stats
from runner.engines import Engine, as_engine
from runner.decoding.settings import cache_tokens


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids, prompt excluded
    stats: Stats


class Sampler:
    """Turns logits into tokens: argmax at temperature 0, else seeded sampling with temperature and top-p.

    Logits are cut to the first `vocab_size` ids, so models whose embeddings are padded past the
    tokenizer's vocabulary are compared on the ids the tokenizer can produce.
    """

    def __init__(self, temperature: float, top_p: float, seed: int | None, device: torch.device, vocab_size: int):
        # A temperature below float32's smallest normal number divides the float32 logits by (nearly) 0: take its
        # limit, argmax, rather than NaNs.
        self.greedy = temperature < torch.finfo(torch.float32).tiny
        self.temperature, self.top_p, self.vocab_size = temperature, top_p, vocab_size
        self.generator = torch.Generator(device=device)
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(n, V) logits -> (n, vocab_size) float32 probabilities after temperature and top-p."""
        logits = logits[..., : self.vocab_size].float()
        # Shifted by the row's max before dividing (softmax is the same): a tiny temperature such as 1e-300 then
        # gives -inf for every other token, a one-hot row, where logits / t would be inf - inf = NaN.
        probs = torch.softmax((logits - logits.amax(-1, keepdim=True)) / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            keep = (sorted_p.cumsum(-1) - sorted_p) < self.top_p
            keep[..., 0] = True  # the top token always (a top_p of 5e-324 is 0 in float32)
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=self.generator).view(-1)

    def pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One token per row, and the distribution it was drawn from (None when greedy)."""
        if self.greedy:  # argmax over float32 is exact and ~4x faster than over bfloat16 on a CPU
            return logits[..., : self.vocab_size].float().argmax(-1), None
        probs = self.probs(logits)
        return self.sample(probs), probs


def _prefill(engine: Engine, ids: torch.Tensor, stats: Stats) -> torch.Tensor:
    """Puts all but the last prompt token in the engine's cache; returns the last one, still to be run."""
    if len(ids) > 1:
        stats.target_calls.append((0, len(ids) - 1))
        engine.forward(ids[:-1], last_only=True)
        stats.target_passes += 1
    return ids[-1:]


def _synchronizer(device: torch.device) -> Callable[[], None]:
    """Waits for queued GPU work, so a timing covers it; a no-op on the CPU."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _as_ids(input_ids, device: torch.device) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=device).view(-1)
    if len(ids) == 0:
        raise ValueError("the prompt has no tokens")
    return ids


def _vocab_size(engines: Iterable[Engine], vocab_size: int | None) -> int:
    sizes = [e.vocab_size for e in engines]
    if vocab_size is not None and vocab_size > min(sizes):
        raise ValueError(f"vocab_size {vocab_size} exceeds a model's embedding ({min(sizes)})")
    return vocab_size or min(sizes)


def finish_tokens(tokens: list[int], new: list[int], max_new_tokens: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cuts the new tokens at the length limit and after the first eos; says whether generation is done."""
    new = new[: max_new_tokens - len(tokens)]
    for i, token in enumerate(new):
        if token in eos:
            return new[: i + 1], True
    return new, len(tokens) + len(new) >= max_new_tokens


@torch.inference_mode()
def generate_plain(
    model,
    input_ids,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_ids: Iterable[int] = (),
    vocab_size: int | None = None,
    on_tokens: Callable[[list[int]], bool | None] | None = None,
) -> GenerationResult:
    """The target alone, one token per forward pass, with a KV cache: the reference speculation must match.

    model: an engine (runner.engines) or a torch model."""
    engine = as_engine(model)
    device = engine.device
    ids = _as_ids(input_ids, device)
    sampler = Sampler(temperature, top_p, seed, device, _vocab_size([engine], vocab_size))
    stats, eos, tokens = Stats(), set(eos_ids), []
    start = time.perf_counter()
    engine.reset(len(ids) + max_new_tokens)
    last = _prefill(engine, ids, stats)
    done = max_new_tokens <= 0
    while not done:
        stats.target_calls.append((engine.length(), 1))
        last, _ = sampler.pick(engine.forward(last, last_only=True))
        stats.target_passes += 1
        new, done = finish_tokens(tokens, last.tolist(), max_new_tokens, eos)
        tokens += new
        if on_tokens and on_tokens(new):  # the caller asks to stop here (a client gone, a stop string)
            done = True
    stats.new_tokens, stats.elapsed_s = len(tokens), time.perf_counter() - start
    return GenerationResult(tokens, stats)


def _draft(
    draft: Engine, pending: torch.Tensor, k: int, sampler: Sampler, confidence: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Up to k draft tokens, one draft step each (the first step also runs `pending`); their distributions q.

    confidence > 0: stop early once the draft's own probability that the target accepts all of them (the
    product of the probabilities it gave its tokens) falls below it: a further token would rarely be
    kept, and a draft step is not free."""
    tokens, dists, sure = [], [], 1.0
    step_input = pending
    for _ in range(k):
        logits = draft.forward(step_input, last_only=True)
        token, q = sampler.pick(logits)
        tokens.append(token)
        dists.append(q)
        step_input = token
        if confidence > 0.0:
            p = q[0, token] if q is not None else torch.softmax(logits[-1, : sampler.vocab_size].float(), -1).max()
            sure *= float(p)
            if sure < confidence:
                break
    drafts = torch.cat(tokens) if tokens else pending.new_empty(0)
    return drafts, (torch.cat(dists) if dists and not sampler.greedy else None)


def verify_greedy(
    logits: torch.Tensor, drafts: torch.Tensor, q: None, sampler: Sampler
) -> tuple[int, torch.Tensor, list[int]]:
    """Accepts drafts while they equal the target's argmax; the next token is the target's argmax after them.

    Returns n accepted, the next token (a 1-element tensor) and the new tokens: n drafts and the next one."""
    k = len(drafts)
    choice, _ = sampler.pick(logits)  # the target's greedy choice at each of the k + 1 positions
    both = torch.cat([choice, drafts]).tolist()  # the one device sync of the iteration
    target, drafted = both[: k + 1], both[k + 1 :]
    n = 0
    while n < k and drafted[n] == target[n]:
        n += 1
    return n, choice[n : n + 1], drafted[:n] + [target[n]]


def verify_sampled(
    logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None, sampler: Sampler
) -> tuple[int, torch.Tensor, list[int]]:
    """Rejection sampling: accept draft i with min(1, p_i/q_i); at the first rejection resample from
    max(p - q, 0) normalised; after k acceptances take a bonus token from p_{k+1}. Lossless."""
    k = len(drafts)
    p = sampler.probs(logits)  # (k + 1, V)
    rows = p
    accept = drafts.new_empty(0)
    if k:
        position = torch.arange(k, device=drafts.device)
        p_draft, q_draft = p[position, drafts], q[position, drafts]
        uniform = torch.rand(k, generator=sampler.generator, device=p.device)
        accept = (uniform * q_draft < p_draft).long()  # u < p/q without dividing by q
        residual = (p[:k] - q).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p[:k])  # p == q: nothing to correct
        rows = torch.cat([residual, p[k:]])
    # Row i is where the next token comes from when exactly i drafts were accepted; draw all, keep one.
    candidates = sampler.sample(rows)
    flat = torch.cat([accept, candidates, drafts]).tolist()  # the one device sync of the iteration
    accepted, drafted = flat[:k], flat[2 * k + 1 :]
    n = 0
    while n < k and accepted[n]:
        n += 1
    return n, candidates[n : n + 1], drafted[:n] + [flat[k + n]]


def adapt_draft_length(k: int, drafted: int, n: int, max_k: int) -> int:
    """Longer drafts after a full-length draft was accepted, shorter after an early rejection."""
    if n == drafted == k:
        return min(k + 1, max_k)
    if n < drafted // 2:
        return max(k - 1, 1)
    return k


@dataclass
class Iteration:
    """What one speculative iteration did: drafts proposed and accepted, the new tokens, its wall time."""

    drafted: int
    accepted: int
    new: list[int]
    seconds: float


class Speculation:
    """One generation's target and draft, their caches and its statistics: each step of the loop.

    Invariant between iterations: the target's cache holds every token but `last`; the draft's cache holds
    every token but those in `behind`."""

    def __init__(self, target: Engine, draft: Engine, sampler: Sampler, stats: Stats, draft_confidence: float) -> None:
        self.target, self.draft, self.sampler, self.stats = target, draft, sampler, stats
        self.draft_confidence = draft_confidence
        self.verify = verify_greedy if sampler.greedy else verify_sampled
        self.sync = _synchronizer(target.device)
        self.last: torch.Tensor = torch.empty(0, dtype=torch.long)
        self.behind: list[torch.Tensor] = []

    def start(self, ids: torch.Tensor, room: int) -> None:
        """Both caches emptied for `room` tokens; the prompt prefilled in the target's."""
        self.target.reset(room)
        self.draft.reset(room)
        self.last = _prefill(self.target, ids, self.stats)
        self.behind = [ids]  # the draft's prefill of the prompt comes with its first step

    def plain_step(self) -> list[int]:
        """One timed target step: a guard probe, the last token, or plain decoding after a fallback."""
        t0 = time.perf_counter()
        self.stats.target_calls.append((self.target.length(), 1))
        self.last, _ = self.sampler.pick(self.target.forward(self.last, last_only=True))
        new = self.last.tolist()
        self.stats.record_step(time.perf_counter() - t0)
        self.behind.append(self.last)  # the draft catches up when it drafts again
        return new

    def speculate(self, budget: int) -> Iteration:
        """Up to `budget` draft tokens, one target pass over them, both caches cropped to what was kept."""
        pending = self.behind[0] if len(self.behind) == 1 else torch.cat(self.behind)
        t0 = time.perf_counter()
        drafts, q = _draft(self.draft, pending, budget, self.sampler, self.draft_confidence)
        k = len(drafts)
        self.sync()
        t1 = time.perf_counter()
        self.stats.target_calls.append((self.target.length(), k + 1))
        logits = self.target.forward(torch.cat([self.last, drafts]), last_only=False)
        n, self.last, new = self.verify(logits, drafts, q, self.sampler)
        t2 = time.perf_counter()
        self.stats.record_iteration(k, n, t1 - t0, t2 - t1, catch_up=len(pending) > 2)
        self._keep(drafts, n)
        return Iteration(k, n, new, t2 - t0)

    def _keep(self, drafts: torch.Tensor, n: int) -> None:
        """Rolls both caches back to the first n drafts (the target's token after them is `last`)."""
        k = len(drafts)
        if n < k:
            self.target.crop(k - n)
            if k - 1 - n:
                self.draft.crop(k - 1 - n)
            self.behind = [self.last]
        else:  # all accepted: the draft has not run its own last token yet
            self.behind = [drafts[-1:], self.last]


@torch.inference_mode()
def generate_speculative(
    target,
    draft,
    input_ids,
    max_new_tokens: int,
    *,
    draft_tokens: int = 5,
    adaptive: bool = True,
    draft_confidence: float = 0.0,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_ids: Iterable[int] = (),
    min_acceptance: float = 0.0,
    guard: bool = True,
    vocab_size: int | None = None,
    on_tokens: Callable[[list[int]], bool | None] | None = None,
    start_plain: str | None = None,
) -> GenerationResult:
    """Speculative decoding of `target` with `draft`; the output is distributed exactly as the target's.

    draft_tokens: the first draft length k (adaptive: kept within 1..2*draft_tokens). draft_confidence:
    the draft stops early once its probability of the whole proposal falls below this. guard: after a
    warm-up, fall back to plain decoding when the predicted speed-up stays below 1 (or the per-token
    acceptance below `min_acceptance`), with trials of speculation now and then (runner.decoding.guard);
    the first fallback is recorded in stats.fallback. vocab_size: compare the models on ids below it (default: the smaller embedding). on_tokens receives each batch of new tokens;
    returning True from it stops the generation after that batch. start_plain: a reason to decode plainly
    from the first token, with no trial (runner.decoding.run_history: the draft did not pay in the last runs); it
    becomes stats.fallback; ignored without the guard.
    target, draft: engines (runner.engines) or torch models (run on the torch engine).
    """
    target, draft = as_engine(target), as_engine(draft)
    ids = _as_ids(input_ids, target.device)
    sampler = Sampler(temperature, top_p, seed, target.device, _vocab_size([target, draft], vocab_size))
    stats, eos, tokens = Stats(), set(eos_ids), []
    k, max_k = max(draft_tokens, 1), 2 * max(draft_tokens, 1)
    # A seeded sample must not depend on the clock: when to fall back is then decided without timings.
    costs = parameter_costs(target, draft) if seed is not None and not sampler.greedy else None
    judge = Guard(stats, max_k, min_acceptance, costs) if guard else None
    if judge and start_plain:
        judge.start_plain(start_plain)
    spec = Speculation(target, draft, sampler, stats, draft_confidence)
    start = time.perf_counter()
    spec.start(ids, room=cache_tokens(len(ids), max_new_tokens, draft_tokens))
    done = max_new_tokens <= 0
    while not done:
        drafting = judge is None or judge.drafting(len(tokens))
        budget = min(k, judge.k_cap if judge else k, max_new_tokens - len(tokens) - 1) if drafting else 0
        if budget > 0:
            iteration = spec.speculate(budget)
            new = iteration.new
        else:  # one target step: a guard probe, the last token, or plain decoding after a fallback
            iteration, new = None, spec.plain_step()
        new, done = finish_tokens(tokens, new, max_new_tokens, eos)
        tokens += new
        if on_tokens and on_tokens(new):  # the caller asks to stop here (a client gone, a stop string)
            done = True
        if iteration and adaptive and budget == k:  # a draft length cut by the guard or the end says nothing
            k = adapt_draft_length(k, iteration.drafted, iteration.accepted, max_k)
        if iteration and judge:
            judge.observe(iteration.drafted, iteration.accepted, iteration.seconds, len(tokens))
    stats.new_tokens, stats.elapsed_s, stats.draft_tokens_final = len(tokens), time.perf_counter() - start, k
    return GenerationResult(tokens, stats)

