"""Continuous batching: many generations share one context per model, one sequence id each, and every step
decodes one batch holding each active sequence's next token (or its last token and its drafted tokens, to
verify), plus a chunk of a joining sequence's prompt. On llama.cpp (a GGUF pair) the context is a llama.cpp
context over the loaded model (SharedContext); on torch, a KV cache of many sequences that our compact forward
runs all rows through at once (TorchSharedContext, runner.models.compact_llama.CompactLlama.forward_rows).

The loop is runner.decoding.speculative's, cut into steps and run for several sequences at once: each sequence keeps
its own sampler, draft length, statistics and guard (runner.decoding.guard.Guard); the guard judges with the
costs of the batched passes actually run, each pass's time shared among its sequences by the tokens each put
in it. So a sequence's speculation pays only when its drafted tokens cost less, inside the batch, than the
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

__all__ = ["BatchedGenerator", "Sequence", "SequenceCells", "SharedContext", "TorchSharedContext", "batchable",
           "default_sequences", "shared_context"]

import ctypes
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from runner.engines.llamacpp import N_BATCH, LlamaCppEngine, LogitsBuffer
from runner.models.compact_llama import CompactLlama
from runner.decoding.settings import cache_tokens
from runner.decoding.stats import Stats
from runner.decoding.guard import Guard, parameter_costs
from runner.decoding.prompt_cache import CacheEntry, PromptCache, common_prefix
from runner.decoding.speculative import Sampler, adapt_draft_length, finish_tokens, verify_sampled

SEQUENCES_CAP = 8  # the default number of sequences, at most (fewer where their KV caches do not fit)


def default_sequences(kv_bytes_per_sequence: int, available_bytes: int, cap: int = SEQUENCES_CAP) -> int:
    """How many sequences to serve at once: as many KV caches (at the full context length) as fit in the
    memory left, between 1 and cap."""
    if kv_bytes_per_sequence <= 0:
        return cap
    return max(1, min(cap, available_bytes // kv_bytes_per_sequence))


class SequenceCells:
    """What a context of many sequences keeps beside their cache cells: the tokens each sequence's cells hold.
    Its engines' contexts (SharedContext: llama.cpp, TorchSharedContext: torch) add `decode` (rows of
    (sequence, tokens, all_logits) appended to their sequences in one pass; each row's logits back), `keep` (a
    sequence cut to its first n tokens), and `state`/`restore` (a copy of a sequence's cells, put back into
    any sequence: the prompt cache, runner.decoding.prompt_cache)."""

    def __init__(self, sequences: int, n_ctx_seq: int, vocab_size: int) -> None:
        self.sequences, self.n_ctx_seq, self.vocab_size = sequences, n_ctx_seq, vocab_size
        self.contents: list[list[int]] = [[] for _ in range(sequences)]  # the tokens in each sequence's cache

    def length(self, seq: int) -> int:
        """Tokens in a sequence's cache."""
        return len(self.contents[seq])

    @property
    def lengths(self) -> list[int]:
        """Tokens in each sequence's cache."""
        return [len(held) for held in self.contents]

    def common_prefix(self, seq: int, tokens: list[int]) -> int:
        """How many first tokens of `tokens` the sequence's cache holds already."""
        return common_prefix(self.contents[seq], tokens)

    def _appended(self, rows: list[tuple[int, list[int], bool]], block: np.ndarray | None) -> list[np.ndarray]:
        """After a pass: each row's tokens counted in its sequence, and its logits cut from the pass's block (the
        rows' kept outputs in order): (len(tokens), V) with all_logits, else (1, V); (0, V) for a row of none."""
        out, row = [], 0
        for seq, tokens, all_logits in rows:
            self.contents[seq] += tokens
            n = (len(tokens) if all_logits else 1) if tokens else 0
            out.append(block[row : row + n] if n else np.empty((0, self.vocab_size), np.float32))
            row += n
        return out

    def _check(self, rows: list[tuple[int, list[int], bool]]) -> None:
        for seq, tokens, _ in rows:
            if self.length(seq) + len(tokens) > self.n_ctx_seq:
                raise ValueError(f"{self.length(seq) + len(tokens)} tokens exceed a sequence's context ({self.n_ctx_seq})")
        total = sum(len(tokens) for _, tokens, _ in rows)
        if total > N_BATCH:
            raise ValueError(f"{total} tokens in one batch; at most {N_BATCH}")


class SharedContext(SequenceCells):
    """One llama.cpp context over an engine's loaded model, holding up to `sequences` sequences of
    `n_ctx_seq` tokens each (a KV cache of its own per sequence: kv_unified off, as the sequences share no
    cells). The weights are the engine's: nothing is loaded twice."""

    def __init__(self, engine: LlamaCppEngine, sequences: int, n_ctx_seq: int) -> None:
        import llama_cpp
        from llama_cpp._utils import suppress_stdout_stderr

        super().__init__(sequences, n_ctx_seq, engine.vocab_size)
        self._lib = llama_cpp
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = sequences * n_ctx_seq
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = sequences
        params.n_threads = params.n_threads_batch = engine.threads
        params.kv_unified = False
        params.no_perf = True
        self._engine = engine  # the model must outlive this context
        with suppress_stdout_stderr(disable=False):  # llama.cpp's start-up log, as the engine's Llama(verbose=False)
            self.ctx = llama_cpp.llama_init_from_model(engine.llm.model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {sequences} sequences of {n_ctx_seq} tokens")
        self._memory = llama_cpp.llama_get_memory(self.ctx)
        self._batch = llama_cpp.llama_batch_init(N_BATCH, 0, 1)
        self._logits = LogitsBuffer(llama_cpp, self.ctx, self.vocab_size)

    def close(self) -> None:
        if self._batch is not None:
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self.ctx)
            self._batch = self.ctx = None

    def __del__(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self.close()

    def decode(self, rows: list[tuple[int, list[int], bool]]) -> list[np.ndarray]:
        """One llama_decode of rows (sequence, tokens, all_logits) appended to their sequences' caches (at
        most N_BATCH tokens in all); returns each row's logits: (len(tokens), V), or (1, V) for its last.
        The arrays are views of the context's buffer, valid until its next decode (a copy of a verify pass's
        rows would cost more than their argmax): use them before decoding again."""
        self._check(rows)
        batch, lib = self._batch, self._lib
        i = 0
        for seq, tokens, all_logits in rows:
            start = self.length(seq)
            for j, token in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + j, 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = all_logits or j == len(tokens) - 1
                i += 1
        batch.n_tokens = i
        if i and lib.llama_decode(self.ctx, batch) != 0:
            raise RuntimeError("llama_decode failed (the KV cache is full?)")
        outputs = sum(len(t) if a else 1 for _, t, a in rows if t)
        return self._appended(rows, self._logits.rows(outputs) if outputs else None)

    def keep(self, seq: int, n: int) -> None:
        """Keeps the first n tokens of a sequence's cache (0: frees the sequence)."""
        self._lib.llama_memory_seq_rm(self._memory, seq, n, -1)
        del self.contents[seq][n:]

    def state(self, seq: int) -> tuple[ctypes.Array, int]:
        """A copy of a sequence's cells (llama.cpp's own serialisation) and its size in bytes."""
        size = self._lib.llama_state_seq_get_size(self.ctx, seq)
        buffer = (ctypes.c_uint8 * size)()
        return buffer, self._lib.llama_state_seq_get_data(self.ctx, buffer, size, seq)

    def restore(self, seq: int, state: ctypes.Array, tokens: list[int]) -> None:
        """A sequence's cells replaced by a copy `state` made, which holds `tokens`; the sequence emptied where
        llama.cpp cannot place it."""
        if not self._lib.llama_state_seq_set_data(self.ctx, state, len(state), seq):
            self.keep(seq, 0)
            return
        self.contents[seq] = list(tokens)


class TorchSharedContext(SequenceCells):
    """The same over a torch model that runs runner.models.compact_llama's forward: a KV cache of many
    sequences (CompactLlama.new_batched_cache) and one forward over all rows' tokens per pass (forward_rows).
    The weights are the model's own. A sequence cut back keeps its old cells, unread: attention reads a
    sequence's cells only up to its own length."""

    def __init__(self, model: CompactLlama, sequences: int, n_ctx_seq: int) -> None:
        super().__init__(sequences, n_ctx_seq, model.full_size)
        self.model = model
        self.cache = model.new_batched_cache(sequences, n_ctx_seq)

    def close(self) -> None:
        self.cache = None

    def decode(self, rows: list[tuple[int, list[int], bool]]) -> list[np.ndarray]:
        """As SharedContext.decode: each row's logits, (len(tokens), V) or (1, V) for its last, float32."""
        self._check(rows)
        used, outputs, index = [], [], 0
        for seq, tokens, all_logits in rows:
            if tokens:
                used.append((seq, self.length(seq), tokens))
                outputs += range(index, index + len(tokens)) if all_logits else [index + len(tokens) - 1]
                index += len(tokens)
        with torch.inference_mode():  # the cache's tensors are made and written in it, whoever calls
            block = self.model.forward_rows(self.cache, used, outputs).cpu().numpy() if used else None
        return self._appended(rows, block)

    def keep(self, seq: int, n: int) -> None:
        """Keeps the first n tokens of a sequence's cache (0: frees the sequence)."""
        del self.contents[seq][n:]

    @torch.inference_mode()
    def state(self, seq: int) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
        """A copy of a sequence's cells (its keys and values) and its size in bytes."""
        n = self.length(seq)
        keys, values = self.cache.keys[:, seq, :, :n].clone(), self.cache.values[:, seq, :, :n].clone()
        return (keys, values), 2 * keys.numel() * keys.element_size()

    @torch.inference_mode()
    def restore(self, seq: int, state: tuple[torch.Tensor, torch.Tensor], tokens: list[int]) -> None:
        """A sequence's cells replaced by a copy `state` made, which holds `tokens`."""
        keys, values = state
        n = keys.shape[2]
        self.cache.reserve(n)
        self.cache.keys[:, seq, :, :n] = keys
        self.cache.values[:, seq, :, :n] = values
        self.contents[seq] = list(tokens)


def batchable(model) -> bool:
    """Whether a model can decode in a batch: a GGUF file on llama.cpp, or a torch model that runs our compact
    forward (a model that runs through transformers decodes one request at a time)."""
    return isinstance(model, (LlamaCppEngine, CompactLlama))


def shared_context(model, sequences: int, n_ctx_seq: int) -> SharedContext | TorchSharedContext:
    """The context of many sequences for a model of either engine (see `batchable`)."""
    if isinstance(model, LlamaCppEngine):
        return SharedContext(model, sequences, n_ctx_seq)
    if isinstance(model, CompactLlama):
        return TorchSharedContext(model, sequences, n_ctx_seq)
    raise ValueError(f"{type(model).__name__} does not decode in a batch (only llama.cpp and the compact torch forward do)")


@dataclass
class Sequence:
    """One generation in the batch: runner.decoding.speculative's loop state, for one sequence id."""

    seq: int
    prompt: list[int]
    max_new_tokens: int
    sampler: Sampler
    on_tokens: Callable[[list[int]], bool | None] | None
    guard: Guard | None
    stats: Stats = field(default_factory=Stats)
    tokens: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens in the target's cache
    cached: int = 0  # of them, those an earlier request's cells held already (cache_prompts)
    draft_cached: int = 0  # prompt tokens the draft's cache held already
    last: int | None = None  # the newest token, not yet in the target's cache
    behind: list[int] = field(default_factory=list)  # tokens the draft's cache lacks
    k: int = 1
    done: bool = False
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    # per step: the time attributed to this sequence, by its share of each batched pass
    _draft_s: float = 0.0
    _draft_catch_up: bool = False
    _observe: tuple[int, int, float] | None = None  # this step's speculative iteration, for the guard
    _budget: int = 0  # drafts planned this step


def _share(seconds: float, rows: list[tuple[int, list[int], bool]]) -> list[float]:
    """A pass's time split among its rows by the tokens each put in it."""
    total = sum(len(t) for _, t, _ in rows) or 1
    return [seconds * len(t) / total for _, t, _ in rows]


class BatchedGenerator:
    """The decoding loop over many sequences: `add` a generation, `step` until none is active.

    target, draft: the pair's llama.cpp engines or compact torch models (see `batchable`; draft None: plain
    decoding). sequences: how many may be
    active at once; n_ctx_seq: the tokens one sequence may hold (prompt, new tokens and a draft's look-ahead).
    cache_prompts: a finished sequence's cells stay as a prefix the next request may reuse (see the module);
    prompt_cache_bytes: with cache_prompts, host memory for copies of cells an id is about to lose (0: none).
    before_pass: called right before each step's first pass (a server hands its clients their tokens there, while
    the pass runs without the GIL).
    The other settings are generate_speculative's, for every sequence alike.
    """

    def __init__(self, target: LlamaCppEngine | CompactLlama, draft: LlamaCppEngine | CompactLlama | None, *, sequences: int, n_ctx_seq: int,
                 draft_tokens: int = 5, adaptive: bool = True, draft_confidence: float = 0.0,
                 eos_ids: Iterable[int] = (), min_acceptance: float = 0.0, guard: bool = True,
                 vocab_size: int | None = None, cache_prompts: bool = False, prompt_cache_bytes: int = 0,
                 before_pass: Callable[[], None] | None = None) -> None:
        self.target = shared_context(target, sequences, n_ctx_seq)
        self.draft = shared_context(draft, sequences, n_ctx_seq) if draft is not None else None
        sizes = [self.target.vocab_size] + ([self.draft.vocab_size] if self.draft is not None else [])
        self.vocab_size = vocab_size or min(sizes)
        self.costs = parameter_costs(target, draft) if draft is not None else None
        self.draft_tokens, self.adaptive, self.draft_confidence = max(draft_tokens, 1), adaptive, draft_confidence
        self.eos, self.min_acceptance, self.use_guard = set(eos_ids), min_acceptance, guard
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
        room = cache_tokens(len(prompt_ids), max_new_tokens, self.draft_tokens)
        if room > self.target.n_ctx_seq:
            raise ValueError(f"{room} tokens exceed a sequence's context ({self.target.n_ctx_seq})")
        seq = self._seat(prompt_ids)
        if self.prompt_cache is not None:
            self._recall(seq, prompt_ids)
        sampler = Sampler(temperature, top_p, seed, torch.device("cpu"), self.vocab_size)
        stats = Stats()
        # A seeded sample must not depend on the clock (nor on the batch): its guard decides on a cost model.
        costs = self.costs if seed is not None and not sampler.greedy else None
        guard = Guard(stats, 2 * self.draft_tokens, self.min_acceptance, costs) if self.use_guard and self.draft else None
        if guard and start_plain:
            guard.start_plain(start_plain)
        s = Sequence(seq, list(prompt_ids), max_new_tokens, sampler, on_tokens, guard, stats, k=self.draft_tokens)
        # What the id's cells hold of the prompt stays (nothing without cache_prompts); the target runs at least
        # the prompt's last token, for the logits of the first new one.
        s.prefilled = s.cached = min(self.target.common_prefix(seq, s.prompt), len(s.prompt) - 1)
        self.target.keep(seq, s.cached)
        if self.draft:
            s.draft_cached = self.draft.common_prefix(seq, s.prompt)
            self.draft.keep(seq, s.draft_cached)
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
        step 1.5x what they cost on ids 0-3 (77 against 51 ms, the GGUF demo, AVX2 EPYC; docs/serving.md). A
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
    def _pick(self, s: Sequence, logits: np.ndarray) -> tuple[int, torch.Tensor | None]:
        if s.sampler.greedy:  # numpy's argmax: no torch thread pool beside llama.cpp's threads
            return int(logits[-1, : self.vocab_size].argmax()), None
        token, q = s.sampler.pick(torch.from_numpy(logits[-1:]))
        return int(token), q

    def step(self) -> list[Sequence]:
        """One step of every active sequence: the drafts of those whose guard says to draft (one batched
        draft pass per draft position), then one batched target pass (prompt chunks, single steps and verify
        passes together). Returns the sequences that finished in it."""
        # Not under torch.inference_mode() as a whole: torch's passes enter it themselves
        # (TorchSharedContext.decode), and the rest (sampling, verifying) works on tensors made from logits,
        # which need no grad. The decorator made and entered a context a step: 16% of a step's Python
        # besides the pass (py-spy, one streaming client, GGUF demo, 2-core AVX2 EPYC).
        decoding = [s for s in self.active() if s.last is not None]
        prefilling = [s for s in self.active() if s.last is None]
        plan: dict[int, int] = {}
        for s in decoding:
            judge = s.guard
            remaining = s.max_new_tokens - len(s.tokens) - 1
            wants = self.draft is not None and (judge is None or judge.drafting(len(s.tokens)))
            plan[s.seq] = s._budget = min(s.k, judge.k_cap if judge else s.k, remaining) if wants else 0
        drafting = [s for s in decoding if plan[s.seq] > 0]
        if drafting and self.before_pass:
            self.before_pass()  # the step's first pass is a draft pass
        drafts, qs = self._draft_all(drafting, plan)

        rows: list[tuple[int, list[int], bool]] = []
        for s in decoding:
            d = drafts.get(s.seq, [])
            rows.append((s.seq, [s.last, *d], bool(d)))
        room = N_BATCH - sum(len(t) for _, t, _ in rows)
        chunks: dict[int, list[int]] = {}
        for s in prefilling:  # prompts fill the rest of the batch, oldest first
            if room <= 0:
                break
            chunk = s.prompt[s.prefilled : s.prefilled + room]
            chunks[s.seq] = chunk
            rows.append((s.seq, chunk, False))
            room -= len(chunk)
        if not rows:
            return []
        if not drafting and self.before_pass:
            self.before_pass()
        t0 = time.perf_counter()
        logits = self.target.decode(rows)
        seconds = time.perf_counter() - t0
        self.batch_sizes.append(len(rows))
        finished = []
        for (seq, tokens, _), out, share in zip(rows, logits, _share(seconds, rows)):
            s = self.slots[seq]
            if seq in chunks:
                new = self._prefilled(s, tokens, out, share)
            elif drafts.get(seq):
                new = self._verified(s, drafts[seq], qs.get(seq), out, share)
            else:
                new = self._stepped(s, out, share)
            if new is not None and self._emit(s, new):
                finished.append(s)
        return finished

    def _draft_all(self, drafting: list[Sequence], plan: dict[int, int]) -> tuple[dict[int, list[int]], dict]:
        """Up to plan[seq] draft tokens per drafting sequence, one batched draft pass per position (the first
        also runs what each draft cache lacks)."""
        drafts: dict[int, list[int]] = {s.seq: [] for s in drafting}
        qs: dict[int, list[torch.Tensor]] = {s.seq: [] for s in drafting}
        sure = {s.seq: 1.0 for s in drafting}
        for s in drafting:
            s._draft_s, s._draft_catch_up = 0.0, len(s.behind) > 2
        going = list(drafting)
        first = True
        while going:
            rows = [(s.seq, s.behind if first else [drafts[s.seq][-1]], False) for s in going]
            if sum(len(t) for _, t, _ in rows) > N_BATCH:  # long catch-ups: one sequence per pass
                outs, shares = [], []
                for row in rows:
                    t0 = time.perf_counter()
                    outs += self._decode_long(self.draft, row)
                    shares.append(time.perf_counter() - t0)
            else:
                t0 = time.perf_counter()
                outs = self.draft.decode(rows)
                shares = _share(time.perf_counter() - t0, rows)
            for s, out, share in zip(going, outs, shares):
                s._draft_s += share
                token, q = self._pick(s, out)
                drafts[s.seq].append(token)
                if q is not None:
                    qs[s.seq].append(q)
                if self.draft_confidence > 0.0:
                    p = q[0, token] if q is not None else torch.softmax(torch.from_numpy(out[-1, : self.vocab_size]), -1).max()
                    sure[s.seq] *= float(p)
            if first:
                for s in going:
                    s.behind = []
                first = False
            going = [s for s in going if len(drafts[s.seq]) < plan[s.seq] and sure[s.seq] >= self.draft_confidence]
        return drafts, {seq: torch.cat(q) for seq, q in qs.items() if q}

    @staticmethod
    def _decode_long(ctx: SharedContext | TorchSharedContext, row: tuple[int, list[int], bool]) -> list[np.ndarray]:
        seq, tokens, _ = row
        out = None
        for i in range(0, len(tokens), N_BATCH):
            out = ctx.decode([(seq, tokens[i : i + N_BATCH], False)])[0]
        return [out.copy()]  # the next row's passes reuse the buffer

    def _prefilled(self, s: Sequence, chunk: list[int], out: np.ndarray, seconds: float) -> list[int] | None:
        s.prefilled += len(chunk)
        s.stats.target_passes += 1
        s.stats.target_calls.append((s.prefilled - len(chunk), len(chunk)))
        if s.prefilled < len(s.prompt):
            return None
        token, _ = self._pick(s, out)  # the first new token comes with the prompt's last chunk
        s.last, s.behind = token, [*s.prompt[s.draft_cached :], token]
        return [token]

    def _stepped(self, s: Sequence, out: np.ndarray, seconds: float) -> list[int]:
        stats = s.stats
        token, _ = self._pick(s, out)
        stats.target_calls.append((self.target.length(s.seq) - 1, 1))
        stats.record_step(seconds)
        s.last = token
        s.behind.append(token)
        return [token]

    def _verified(self, s: Sequence, drafted: list[int], q: torch.Tensor | None, out: np.ndarray, seconds: float) -> list[int]:
        stats, kk = s.stats, len(drafted)
        drafts = torch.tensor(drafted, dtype=torch.long)
        if s.sampler.greedy:
            choice = out[:, : self.vocab_size].argmax(-1).tolist()
            n = 0
            while n < kk and drafted[n] == choice[n]:
                n += 1
            token, new = choice[n], drafted[:n] + [choice[n]]
        else:
            n, last, new = verify_sampled(torch.from_numpy(out), drafts, q, s.sampler)
            token = int(last)
        before = self.target.length(s.seq) - kk - 1
        stats.target_calls.append((before, kk + 1))
        stats.record_iteration(kk, n, s._draft_s, seconds, catch_up=s._draft_catch_up)
        if n < kk:  # roll both caches back to the accepted prefix
            self.target.keep(s.seq, before + 1 + n)
            self.draft.keep(s.seq, self.draft.length(s.seq) - (kk - 1 - n))
            s.behind = [token]
        else:  # all accepted: the draft has not run its own last token yet
            s.behind = [drafted[-1], token]
        s.last = token
        if self.adaptive and s._budget == s.k:  # a draft length cut by the guard or the end says nothing
            s.k = adapt_draft_length(s.k, kk, n, 2 * self.draft_tokens)
        s._observe = (kk, n, s._draft_s + seconds)
        return new

    def _emit(self, s: Sequence, new: list[int]) -> bool:
        """Hands a sequence its new tokens; it leaves when done or when its caller asks to stop."""
        new, done = finish_tokens(s.tokens, new, s.max_new_tokens, self.eos)
        s.tokens += new
        if s.first_token_at is None:
            s.first_token_at = time.perf_counter()
        if s.on_tokens and s.on_tokens(new):
            done = True
        if s._observe and s.guard:
            s.guard.observe(*s._observe, len(s.tokens))
        s._observe = None
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
