"""Speculative decoding of one sequence over an engine pair (runner.engines: torch or llama.cpp), lossless, with a policy.

`generate_speculative` runs runner.decoding.step's one step over a single sequence: per step its policy
(runner.decoding.policy) says whether to propose and how; the draft model (or an n-gram of the text so far,
runner.decoding.ngram) proposes up to k tokens, the target scores all of them in one pass, the longest agreeing prefix is kept plus one token of the
target's own, and both caches are cropped back to what was kept. Greedy output is the target's greedy output
token for token; sampled output follows the target's distribution exactly (runner.decoding.sampling).
`generate_plain` is the reference it must match: the target alone, one token per pass.
"""

from __future__ import annotations

__all__ = ["GenerationResult", "generate_plain", "generate_speculative"]

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from runner.decoding.ngram import NgramProposer
from runner.decoding.policy import PairFacts, Policy, is_seeded
from runner.decoding.sampling import Sampler
from runner.decoding.settings import DRIVER_DEFAULTS, DecodingSettings, cache_tokens
from runner.decoding.stats import Stats
from runner.decoding.step import EngineRows, SequenceState, Step, finish_tokens
from runner.engines import Engine, as_engine


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids, prompt excluded
    stats: Stats


def _prefill(engine: Engine, ids: torch.Tensor, stats: Stats) -> torch.Tensor:
    """Puts all but the last prompt token in the engine's cache; returns the last one (1 element), still to be run."""
    if len(ids) > 1:
        stats.target_calls.append((0, len(ids) - 1))
        engine.forward(ids[:-1], last_only=True)
        stats.target_passes += 1
    return ids[-1:]


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


@torch.inference_mode()
def generate_speculative(
    target,
    draft,
    input_ids,
    max_new_tokens: int,
    *,
    settings: DecodingSettings | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_ids: Iterable[int] = (),
    vocab_size: int | None = None,
    on_tokens: Callable[[list[int]], bool | None] | None = None,
    start_plain: str | None = None,
    prior: str | None = None,
    **fields: Any,
) -> GenerationResult:
    """Speculative decoding of `target` with `draft`; the output is distributed exactly as the target's.

    settings: the decoding settings as one value (runner.decoding.settings.DecodingSettings; default
    DRIVER_DEFAULTS, the draft model alone), any of whose fields a keyword overrides (draft_tokens=4,
    guard=False, methods=("ngram",)). They and what is known of the pair decide through the sequence's policy (runner.decoding.policy.Policy.for_sequence, the
    one call `bundle serve`'s batch makes too): draft_tokens is the first draft length k (adaptive: kept
    within 1..2*draft_tokens); draft_confidence stops a draft early once its probability of the whole proposal
    falls below it; guard: fall back to plain decoding when speculation does not pay (stats.fallback);
    methods: how tokens are proposed (runner.decoding.methods; "ngram" needs no draft: draft may be None).
    start_plain: the run history's advice, a reason to leave the draft model out from the first token;
    prior: the cost table's reason the draft model cannot pay (runner.pair.LoadedPair.prior). vocab_size:
    compare the models on ids below it (default: the smaller embedding). on_tokens receives each batch of new
    tokens; returning True from it stops the generation after that batch.
    target, draft: engines (runner.engines) or torch models (run on the torch engine).
    """
    settings = (settings or DRIVER_DEFAULTS).updated(**fields)
    pair = PairFacts(target, draft, prior)  # the models as given: the process's memory is kept per that object
    target, draft = as_engine(target), as_engine(draft) if draft is not None else None
    engines = [target] + ([draft] if draft is not None else [])
    ids = _as_ids(input_ids, target.device)
    sampler = Sampler(temperature, top_p, seed, target.device, _vocab_size(engines, vocab_size))
    stats = Stats()
    policy = Policy.for_sequence(settings, stats, pair, seeded=is_seeded(temperature, seed), advice=start_plain)
    proposer = NgramProposer(settings.ngram_min, settings.ngram_max) if policy.looks_up else None
    s = SequenceState(seq=0, sampler=sampler, max_new_tokens=max_new_tokens, k=max(settings.draft_tokens, 1),
                      policy=policy, proposer=proposer, on_tokens=on_tokens, stats=stats)
    step = Step(EngineRows(target), EngineRows(draft) if draft is not None else None,
                draft_confidence=settings.draft_confidence, eos=set(eos_ids))
    start = time.perf_counter()
    room = cache_tokens(len(ids), max_new_tokens, settings.draft_tokens, settings.ngram_tokens if proposer is not None else 0)
    for engine in engines:
        engine.reset(room)
    s.last = int(_prefill(target, ids, stats))
    s.behind = ids.tolist() if draft is not None else []  # the draft's prefill of the prompt comes with its first step
    if s.proposer is not None:
        s.proposer.extend(ids.tolist())
    done = max_new_tokens <= 0
    while not done:
        [verdict] = step.run([s]).verdicts
        done = step.finish(s, verdict)
    stats.new_tokens, stats.elapsed_s, stats.draft_tokens_final = len(s.tokens), time.perf_counter() - start, s.k
    return GenerationResult(s.tokens, stats)
