"""The prompt cache in host memory: copies of finished sequences' cache cells, so that a request whose prompt
an earlier request began with (the same question again, the next turn of a conversation, a long shared
preamble) skips its prefill even after that request's sequence id has been given to another one.

Why: with `cache_prompts` a finished request's cells stay in its sequence id only until the next request takes
that id; at 8 busy sequences that is at once, so a conversation's next turn found its history gone and
prefilled all of it again, while llama-server (`--cache-ram`, on by default, 8 GiB) restores it from a copy
in memory. What the copy saves is the prefill, which on a CPU costs nearly what decoding costs per token
(docs/benchmarks.md).

How (after llama-server's policy, read, not copied: tools/server's `prompt_save`/`prompt_load`): when a new
request takes an id whose cells it would mostly discard (it keeps less than half of them), those cells are
copied here first; then the entry sharing the longest prefix with the new prompt, if it shares more than the
id holds already, is copied into the id. Unlike llama-server, whose entry leaves its cache for the slot (and
which therefore takes an entry only where the prompt keeps a quarter of it, so as not to lose a long
conversation for its preamble), the entry stays here: a question asked again after a 128-token answer
(a 42-token prompt keeps a quarter of no such entry) is found all the same. Entries are dropped least
recently used first beyond the byte limit. Each entry holds the target's cells and the draft's (llama.cpp:
`llama_state_seq_get_data`; torch: the cache tensors' slices) with the tokens each holds: restored cells are
the very numbers a prefill computed, so outputs do not change.
"""

from __future__ import annotations

__all__ = ["HEAD", "CacheEntry", "PromptCache"]

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runner.engines.cells import common_prefix

KEEP_AT_LEAST = 0.5  # an id's cells are copied here when a new request would keep less than this share of them
HEAD = 256  # tokens of each entry compared with a prompt in one array operation


@dataclass
class CacheEntry:
    """One sequence's cells, copied: the tokens each model's cells hold and their state (engine-specific)."""

    tokens: list[int]
    state: Any
    draft_tokens: list[int]
    draft_state: Any
    size: int  # bytes
    head: np.ndarray = field(init=False, repr=False)  # the first HEAD tokens, padded with -1 (no token's id)

    def __post_init__(self) -> None:
        self.head = np.full(HEAD, -1, dtype=np.int32)
        n = min(len(self.tokens), HEAD)
        self.head[:n] = self.tokens[:n]


class PromptCache:
    """Entries, least recently used first, within `limit` bytes (0: nothing is kept).

    Every request compares its prompt with every entry (three times: is the id's content held already, which
    entries a new copy contains, which entry to restore), and at the default size a small model's cache holds
    thousands (8 GiB of 3.7 MiB copies), too slow one entry at a time in the worker between two passes. So the entries' first HEAD tokens are kept as rows of one array and compared
    with the prompt at once; only entries that share all HEAD tokens are compared further, one by one."""

    def __init__(self, limit: int) -> None:
        self.limit = max(int(limit), 0)
        self.entries: list[CacheEntry] = []
        self.size = 0  # bytes held
        self.saved = self.restored = 0  # entries added and found (read by tests)
        self._heads = np.zeros((0, HEAD), dtype=np.int32)  # the entries' heads, a row each, in the entries' order
        self._lengths = np.zeros(0, dtype=np.int64)  # the entries' token counts
        self._sizes = np.zeros(0, dtype=np.int64)  # and bytes

    def _prefixes(self, tokens: list[int]) -> np.ndarray:
        """How many first tokens each entry shares with `tokens`."""
        m = min(len(tokens), HEAD)
        differ = self._heads[:, :m] != np.asarray(tokens[:m], dtype=np.int32)
        n = np.where(differ.any(axis=1), differ.argmax(axis=1), m)
        for i in np.flatnonzero(n == HEAD):  # the whole head in common: the rest, one by one
            n[i] = common_prefix(self.entries[i].tokens, tokens)
        return n

    def _keep(self, rows: np.ndarray, entry: CacheEntry | None = None) -> None:
        """The entries at `rows` (in that order), then `entry` if given, as the cache's entries."""
        entries = [self.entries[i] for i in rows] + ([entry] if entry is not None else [])
        heads, lengths, sizes = self._heads[rows], self._lengths[rows], self._sizes[rows]
        if entry is not None:
            heads = np.concatenate((heads, entry.head[None]))
            lengths, sizes = np.append(lengths, len(entry.tokens)), np.append(sizes, entry.size)
        self.entries, self._heads, self._lengths, self._sizes = entries, heads, lengths, sizes
        self.size = int(sizes.sum())

    def should_save(self, held: list[int], kept: int) -> bool:
        """Whether an id's cells (`held`) are worth copying before a new prompt keeps only `kept` of them: it
        would discard most of them, they fit, and no entry holds them already."""
        if not self.limit or not held or kept >= KEEP_AT_LEAST * len(held):
            return False
        return not bool((self._prefixes(held) >= len(held)).any())

    def add(self, entry: CacheEntry) -> None:
        """Keeps an entry (entries it contains are dropped, then the least recently used while over the limit)."""
        if entry.size > self.limit:
            return
        rows = np.flatnonzero(self._prefixes(entry.tokens) < self._lengths)  # not contained in the new entry
        sizes = np.append(self._sizes[rows], entry.size)
        # drop the oldest while over the limit: the first rows whose sizes, with all after them, do not fit
        over = np.flatnonzero(np.cumsum(sizes[::-1])[::-1] > self.limit)
        first = int(over[-1]) + 1 if len(over) else 0
        self._keep(rows[first:], entry)
        self.saved += 1

    def find(self, prompt: list[int], have: int) -> CacheEntry | None:
        """The entry sharing the longest prefix with the prompt, if longer than `have` (what the id holds of it
        already); it becomes the most recently used."""
        prefixes = self._prefixes(prompt)
        if not len(prefixes) or prefixes.max() <= have:
            return None
        best = int(prefixes.argmax())  # the first of equals: the least recently used
        entry = self.entries[best]
        self._keep(np.delete(np.arange(len(self.entries)), best), entry)
        self.restored += 1
        return entry
