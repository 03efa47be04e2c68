"""Continuous batching: many generations share one context per model, one sequence id each, and every step
decodes one batch holding each active sequence's next token (or its last token and its proposed tokens, to
verify), plus a chunk of a joining sequence's prompt (runner.decoding.prefill). Each engine builds its context of
many sequences (runner.engines.BatchContext: llama.cpp's SharedContext, the compact torch forward's TorchSharedContext).

The step is runner.decoding.step's, the one `generate_speculative` runs for a single sequence: each sequence
keeps its own sampler, draft length, statistics and policy (runner.decoding.policy, built by the one call
`generate_speculative` makes too: Policy.for_sequence); its guard judges with
the costs of the batched passes actually run, each pass's time shared among its sequences by the tokens each
put in it. So a sequence's speculation pays only when its drafted tokens cost less, inside the batch, than the
tokens they save: with many sequences in a batch a token's share approaches its full cost and the guards
stop drafting by themselves (docs/serving.md). How llama-server's slots do the same was read, not copied:
one shared context, a sequence id per slot, the prompt chunked into the same batch as the decoding tokens.

A request joins at the next step (`add`) and leaves when done, stopped or cancelled: its sequence id is free
for the next one. Its cache cells are removed from both contexts at once, or, with `cache_prompts` (as
llama-server's `cache_prompt`), kept as a prefix: the next request takes the free id whose cells share the
longest prefix with its prompt, and prefills only the rest (a chat template's system preamble, an earlier turn).
With a prompt cache (`prompt_cache_bytes`), cells an id is about to lose are first copied to host memory, from
where a later request with the same start gets them back in any id (runner.decoding.prompt_cache).
"""

from __future__ import annotations

__all__ = ["BatchedGenerator", "Sequence", "batchable", "default_sequences", "shared_context"]

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from runner.decoding.ngram import NgramProposer
from runner.decoding.policy import PairFacts, Policy, is_seeded
from runner.decoding.prefill import PromptState, chunks, prefilled, start
from runner.decoding.prompt_cache import CacheEntry, PromptCache
from runner.decoding.sampling import Sampler
from runner.decoding.settings import DRIVER_DEFAULTS, DecodingSettings, cache_tokens
from runner.decoding.stats import Stats
from runner.decoding.step import Step, Verdict
from runner.engines import BatchContext, as_engine
from runner.engines.cells import Row

SEQUENCES_CAP = 8  # the default number of sequences, at most (fewer where their KV caches do not fit)


def default_sequences(kv_bytes_per_sequence: int, available_bytes: int, cap: int = SEQUENCES_CAP) -> int:
    """How many sequences to serve at once: as many KV caches (at the full context length) as fit in the
    memory left, between 1 and cap."""
    if kv_bytes_per_sequence <= 0:
        return cap
    return max(1, min(cap, available_bytes // kv_bytes_per_sequence))


def batchable(model) -> bool:
    """Whether a model can decode in a batch: a GGUF file on llama.cpp, or a torch model that runs our compact
    forward (a model that runs through transformers decodes one request at a time)."""
    return as_engine(model).batches


def shared_context(model, sequences: int, n_ctx_seq: int) -> BatchContext:
    """The context of many sequences the model's engine builds (see `batchable`)."""
    return as_engine(model).batch_context(sequences, n_ctx_seq)


@dataclass(kw_only=True)
class Sequence(PromptState):
    """One generation in the batch: runner.decoding.step's state of one sequence id, its prompt's progress
    (runner.decoding.prefill: `cached`, what an earlier request's cells held already with cache_prompts)."""

    done: bool = False
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None


class BatchedGenerator:
    """The decoding loop over many sequences: `add` a generation, `step` until none is active.

    target, draft: the pair's llama.cpp engines or compact torch models (see `batchable`; draft None: plain
    decoding). sequences: how many may be
    active at once; n_ctx_seq: the tokens one sequence may hold (prompt, new tokens and a draft's look-ahead).
    cache_prompts: a finished sequence's cells stay as a prefix the next request may reuse (see the module);
    prompt_cache_bytes: with cache_prompts, host memory for copies of cells an id is about to lose (0: none).
    before_pass: called right before each step's first pass (a server hands its clients their tokens there, while
    the pass runs without the GIL). prior: the cost table's reason the draft model cannot pay
    (runner.pair.LoadedPair.prior). settings (and keywords overriding its fields) as generate_speculative's, for
    every sequence alike.
    """

    def __init__(self, target, draft, *, sequences: int, n_ctx_seq: int, settings: DecodingSettings | None = None,
                 eos_ids: Iterable[int] = (), vocab_size: int | None = None, cache_prompts: bool = False,
                 prompt_cache_bytes: int = 0, before_pass: Callable[[], None] | None = None, prior: str | None = None,
                 **fields: Any) -> None:
        self.target = shared_context(target, sequences, n_ctx_seq)
        self.draft = shared_context(draft, sequences, n_ctx_seq) if draft is not None else None
        sizes = [self.target.vocab_size] + ([self.draft.vocab_size] if self.draft is not None else [])
        self.vocab_size = vocab_size or min(sizes)
        self.settings = (settings or DRIVER_DEFAULTS).updated(**fields)  # every sequence's alike
        self.pair = PairFacts(target, draft, prior)  # what every sequence's policy knows of the pair
        self.stepper = Step(self.target, self.draft, draft_confidence=self.settings.draft_confidence, eos=set(eos_ids))
        self.slots: list[Sequence | None] = [None] * sequences
        self.cache_prompts, self.before_pass = cache_prompts, before_pass
        self.prompt_cache = PromptCache(prompt_cache_bytes) if cache_prompts and prompt_cache_bytes > 0 else None
        self._left = [0] * sequences  # when each id was last given back (a count of leavings): the oldest goes first
        self.batch_sizes: list[int] = []  # sequences in each step's target pass (a caller may drain it)

    # -- joining and leaving -------------------------------------------------------------------------
    def free(self) -> int:
        """Sequence ids free for a new generation."""
        return sum(s is None for s in self.slots)

    def active(self) -> list[Sequence]:
        return [s for s in self.slots if s is not None]

    def add(self, prompt_ids: list[int], max_new_tokens: int, *, temperature: float = 0.0, top_p: float = 1.0,
            seed: int | None = None, on_tokens: Callable[[list[int]], bool | None] | None = None,
            start_plain: str | None = None) -> Sequence:
        """A generation joins at the next step (its prompt is prefilled in chunks among the others' tokens)."""
        if not prompt_ids:
            raise ValueError("the prompt has no tokens")
        stats, settings = Stats(), self.settings
        policy = Policy.for_sequence(settings, stats, self.pair, seeded=is_seeded(temperature, seed), advice=start_plain)
        room = cache_tokens(len(prompt_ids), max_new_tokens, settings.draft_tokens, settings.ngram_tokens if policy.looks_up else 0)
        if room > self.target.n_ctx_seq:
            raise ValueError(f"{room} tokens exceed a sequence's context ({self.target.n_ctx_seq})")
        seq = self._seat(prompt_ids)
        if self.prompt_cache is not None:
            self._recall(seq, prompt_ids)
        sampler = Sampler(temperature, top_p, seed, torch.device("cpu"), self.vocab_size)
        proposer = NgramProposer(settings.ngram_min, settings.ngram_max) if policy.looks_up else None
        s = Sequence(seq=seq, prompt=list(prompt_ids), max_new_tokens=max_new_tokens, sampler=sampler, on_tokens=on_tokens,
                     k=max(settings.draft_tokens, 1), policy=policy, proposer=proposer, stats=stats)
        # the one prefill (runner.decoding.prefill): what the id's cells hold of the prompt stays (nothing without
        # cache_prompts), the rest is prefilled in chunks among the other sequences' rows
        start(self.stepper, s, self.target.common_prefix(seq, s.prompt),
              self.draft.common_prefix(seq, s.prompt) if self.draft is not None else 0)
        self.slots[seq] = s
        if max_new_tokens <= 0:
            self._leave(s)
        return s

    def _seat(self, prompt: list[int]) -> int:
        """The free id for a new prompt: the one that keeps the active ids closest together; among those, with
        cache_prompts, the one whose cells share the longest prefix with the prompt; then the one given back
        longest ago (its cells are the least likely to be asked for again). ValueError when none is free: the
        caller checks free() first.

        Why closeness first: llama.cpp (kv_unified off) runs a batch's attention over every sequence between
        the lowest and the highest id in it, idle ones too, so 4 requests on ids 0, 2, 5 and 7 of 8 cost a
        step more than on ids 0-3 (docs/benchmarks.md). A
        cached prefix saves its prefill once; a wider batch costs at every step of the request."""
        active = [seq for seq, s in enumerate(self.slots) if s is not None]
        free = [seq for seq, s in enumerate(self.slots) if s is None]

        def span(seq: int) -> int:
            return max(active + [seq]) - min(active + [seq])

        def prefix(seq: int) -> int:
            return self.target.common_prefix(seq, prompt) if self.cache_prompts else 0

        return min(free, key=lambda seq: (span(seq), -prefix(seq), self._left[seq]))

    def _recall(self, seq: int, prompt: list[int]) -> None:
        """The prompt cache's part in seating a prompt on an id: the id's cells copied there if the prompt would
        discard most of them, then the copy sharing the longest prefix with the prompt (if longer than what the
        id holds) put into the id (runner.decoding.prompt_cache)."""
        cache, held = self.prompt_cache, self.target.contents[seq]
        have = self.target.common_prefix(seq, prompt)
        if cache.should_save(held, have):
            state, size = self.target.state(seq)
            # the draft's cells, where it has any (a request that decoded plainly never ran the draft)
            drafted = self.draft is not None and self.draft.length(seq) > 0
            draft_state, draft_size = self.draft.state(seq) if drafted else (None, 0)
            if size and (draft_size or not drafted):  # 0: llama.cpp could not copy them
                draft_tokens = list(self.draft.contents[seq]) if drafted else []
                cache.add(CacheEntry(list(held), state, draft_tokens, draft_state, size + draft_size))
        entry = cache.find(prompt, have)
        if entry is None:
            return
        # Each context's cells stay what its `contents` say, restored or not (a failed restore empties the
        # sequence), so the prefix each model keeps below is right either way.
        self.target.restore(seq, entry.state, entry.tokens)
        if self.draft is not None and entry.draft_state is not None:
            self.draft.restore(seq, entry.draft_state, entry.draft_tokens)

    def _leave(self, s: Sequence, keep_cells: bool = True) -> None:
        s.done = True
        s.stats.new_tokens, s.stats.elapsed_s, s.stats.draft_tokens_final = len(s.tokens), time.perf_counter() - s.started, s.k
        if not (self.cache_prompts and keep_cells):
            self.target.keep(s.seq, 0)
            if self.draft:
                self.draft.keep(s.seq, 0)
        self._left[s.seq] = max(self._left) + 1
        self.slots[s.seq] = None

    def cancel(self, s: Sequence) -> None:
        """Ends a generation now (its client went away, or a step failed): its cells are removed, its id is free."""
        if not s.done:
            self._leave(s, keep_cells=False)

    # -- one step ------------------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """One step of every active sequence (runner.decoding.step): the drafts of those whose guard says to
        draft, then one batched target pass (prompt chunks, single steps and verify passes together). Returns
        the sequences that finished in it."""
        # Not under torch.inference_mode() as a whole: torch's passes enter it themselves (TorchSharedContext.decode),
        # and the rest (sampling, verifying) works on tensors made from logits, which need no grad.
        decoding = [s for s in self.active() if not s.prefilling]
        waiting = [s for s in self.active() if s.prefilling]  # prompts fill the rest of the batch, oldest first
        taken: list[tuple[Sequence, list[int]]] = []

        def fill(room: int) -> list[Row]:
            taken.extend(chunks(waiting, room))
            return [(s.seq, chunk, False) for s, chunk in taken]

        result = self.stepper.run(decoding, fill, self.before_pass)
        if not result.verdicts and not taken:
            return []
        self.batch_sizes.append(len(decoding) + len(taken))
        finished = [s for s, verdict in zip(decoding, result.verdicts) if self._emit(s, verdict)]
        for (s, chunk), out in zip(taken, result.filled_logits):
            first = prefilled(self.stepper, s, chunk, out)  # the first new token comes with the prompt's last chunk
            if first is not None and self._emit(s, first):
                finished.append(s)
        return finished

    def _emit(self, s: Sequence, verdict: Verdict) -> bool:
        """Hands a sequence its new tokens; it leaves when done or when its caller asks to stop."""
        if s.first_token_at is None:
            s.first_token_at = time.perf_counter()
        done = self.stepper.finish(s, verdict)
        if done:
            self._leave(s)
        return done

    def run(self, requests: list[dict], on_step: Callable[[], None] | None = None) -> list[Sequence]:
        """All requests (add's keyword arguments, with prompt_ids) through the batch, joining as ids free up;
        returns their sequences in order. For tests and benchmarks; a server calls add/step itself."""
        waiting, all_seqs = list(requests), []
        while waiting or self.active():
            while waiting and self.free():
                all_seqs.append(self.add(**waiting.pop(0)))
            self.step()
            if on_step:
                on_step()
        return all_seqs
