"""Speculative decoding over an engine pair (runner.engines: torch or llama.cpp), lossless, with a guard.

The loop (`generate_speculative`): the draft proposes k tokens one step at a time, the target scores
all of them in one pass, the longest agreeing prefix is kept plus one token of the target's own, and
both caches are cropped back to what was kept. Greedy output is the target's greedy output token for
token; sampled output follows the target's distribution exactly (accept with min(1, p/q), else resample
from max(p - q, 0) normalised). Invariant between iterations: the target's cache holds every token but
`last`; the draft's cache holds every token but those in `behind`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from runner.engines import Engine, as_engine
from runner.decoding.settings import cache_tokens
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


def parameter_costs(target, draft) -> tuple[float, float]:
    """A cost model that needs no clock: a draft step costs its share of the parameters, a verify pass one step."""
    return as_engine(draft).parameters / as_engine(target).parameters, 1.0


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

    def __init__(self, stats: Stats, max_k: int, min_acceptance: float, costs: tuple[float, float] | None) -> None:
        self.stats, self.max_k, self.min_acceptance, self.costs = stats, max_k, min_acceptance, costs
        self.window = [0.0, 0.0, 0.0, 0.0]  # accepted, rejections, seconds, tokens
        self.iterations = self.below = 0
        self.plain_until: float | None = None  # while fallen back: the token count at which a trial starts
        self.trial = False
        self.retry_after = RETRY_AFTER
        self.k_cap = max_k  # drafts per iteration at most: lowered when only shorter drafts pay

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
        """Plain decoding from the first token and no trial (runner.decoding.run_history's advice), with its reason."""
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
        return (stats.spec_time_s - stats.draft_prefill_s - stats.spec_tokens * step) / step

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
        if self.stats.fallback is None:
            self.stats.fallback = {"at_token": produced, "reason": reason, "retries": 0, "resumed": 0}
        self.plain_until, self.trial = produced + self.retry_after, False
        self.retry_after = min(2 * self.retry_after, RETRY_AFTER_MAX)

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
    acceptance below `min_acceptance`), with trials of speculation now and then (see Guard); the first
    fallback is recorded in stats.fallback. vocab_size: compare the
    models on ids below it (default: the smaller embedding). on_tokens receives each batch of new tokens;
    returning True from it stops the generation after that batch. start_plain: a reason to decode plainly
    from the first token, with no trial (runner.decoding.run_history: the draft did not pay in the last runs); it
    becomes stats.fallback; ignored without the guard.
    target, draft: engines (runner.engines) or torch models (run on the torch engine).
    """
    target, draft = as_engine(target), as_engine(draft)
    device = target.device
    ids = _as_ids(input_ids, device)
    sampler = Sampler(temperature, top_p, seed, device, _vocab_size([target, draft], vocab_size))
    verify = verify_greedy if sampler.greedy else verify_sampled
    sync, eos, stats, tokens = _synchronizer(device), set(eos_ids), Stats(), []
    k, max_k = max(draft_tokens, 1), 2 * max(draft_tokens, 1)
    # A seeded sample must not depend on the clock: when to fall back is then decided without timings.
    costs = parameter_costs(target, draft) if seed is not None and not sampler.greedy else None
    judge = Guard(stats, max_k, min_acceptance, costs) if guard else None
    if judge and start_plain:
        judge.start_plain(start_plain)
    start = time.perf_counter()
    room = cache_tokens(len(ids), max_new_tokens, draft_tokens)
    target.reset(room)
    draft.reset(room)
    last = _prefill(target, ids, stats)
    behind = [ids]  # what the draft's cache lacks: the prompt (its prefill comes with its first step)
    done = max_new_tokens <= 0
    while not done:
        budget = min(k, judge.k_cap if judge else k, max_new_tokens - len(tokens) - 1) if judge is None or judge.drafting(len(tokens)) else 0
        kk = 0
        if budget <= 0:  # one target step: a guard probe, the last token, or plain decoding after a fallback
            t1 = time.perf_counter()
            stats.target_calls.append((target.length(), 1))
            last, _ = sampler.pick(target.forward(last, last_only=True))
            new = last.tolist()
            stats.step_time_s += time.perf_counter() - t1
            stats.target_passes += 1
            stats.plain_steps += 1
            stats.steps_timed += 1
            behind.append(last)  # the draft catches up when it drafts again
        else:
            pending = behind[0] if len(behind) == 1 else torch.cat(behind)
            with_prompt = not stats.speculative_iterations  # the draft's first step also runs the prompt
            t0 = time.perf_counter()
            drafts, q = _draft(draft, pending, budget, sampler, draft_confidence)
            kk = len(drafts)
            sync()
            t1 = time.perf_counter()
            stats.target_calls.append((target.length(), kk + 1))
            logits = target.forward(torch.cat([last, drafts]), last_only=False)
            n, last, new = verify(logits, drafts, q, sampler)
            t2 = time.perf_counter()
            stats.target_passes += 1
            stats.record_verify(kk, n)
            stats.draft_passes += kk
            if len(pending) <= 2:  # a step that also ran the prompt or a catch-up is not a draft step's cost
                stats.draft_time_s += t1 - t0
                stats.draft_steps_timed += kk
            elif with_prompt:  # else a catch-up over the tokens of a plain run, counted as the trial's cost
                stats.draft_prefill_s += t1 - t0
            stats.verify_time_s += t2 - t1
            stats.verifies_timed += 1
            stats.verify_time_by_k[kk] = stats.verify_time_by_k.get(kk, 0.0) + t2 - t1
            stats.verifies_by_k[kk] = stats.verifies_by_k.get(kk, 0) + 1
            stats.spec_time_s += t2 - t0
            stats.spec_tokens += n + 1
            if n < kk:  # roll both caches back to the accepted prefix
                target.crop(kk - n)
                if kk - 1 - n:
                    draft.crop(kk - 1 - n)
                behind = [last]
            else:  # all accepted: the draft has not run its own last token yet
                behind = [drafts[-1:], last]
        new, done = finish_tokens(tokens, new, max_new_tokens, eos)
        tokens += new
        if on_tokens and on_tokens(new):  # the caller asks to stop here (a client gone, a stop string)
            done = True
        if kk and adaptive and budget == k:
            k = adapt_draft_length(k, kk, n, max_k)
        if kk and judge:
            judge.observe(kk, n, t2 - t0, len(tokens))
    stats.new_tokens, stats.elapsed_s, stats.draft_tokens_final = len(tokens), time.perf_counter() - start, k
    return GenerationResult(tokens, stats)
