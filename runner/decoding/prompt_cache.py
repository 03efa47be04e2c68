"""The prompt cache in host memory: copies of finished sequences' cache cells, so that a request whose prompt
an earlier request began with (the same question again, the next turn of a conversation, a long shared
preamble) skips its prefill even after that request's sequence id has been given to another one.

Why: with `cache_prompts` a finished request's cells stay in its sequence id only until the next request takes
that id; at 8 busy sequences that is at once, so a conversation's next turn found its history gone and
prefilled all of it again, while llama-server (`--cache-ram`, on by default, 8 GiB) restores it from a copy
in memory. What the copy saves is the prefill, which on a CPU costs nearly what decoding costs per token
(the Q4_1 GGUF demo on a 2-core AVX2 EPYC: 3.5 ms a prompt token at 8 sequences, 4.9 ms a decoded one).

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

__all__ = ["CacheEntry", "PromptCache", "common_prefix"]

from collections.abc import Sequence as Tokens
from dataclasses import dataclass
from typing import Any

import numpy as np

KEEP_AT_LEAST = 0.5  # an id's cells are copied here when a new request would keep less than this share of them


def common_prefix(a: Tokens[int], b: Tokens[int]) -> int:
    """How many first tokens two token lists share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    same = np.asarray(a[:n], dtype=np.int64) == np.asarray(b[:n], dtype=np.int64)
    return n if same.all() else int(np.argmin(same))


@dataclass
class CacheEntry:
    """One sequence's cells, copied: the tokens each model's cells hold and their state (engine-specific)."""

    tokens: list[int]
    state: Any
    draft_tokens: list[int]
    draft_state: Any
    size: int  # bytes


class PromptCache:
    """Entries, least recently used first, within `limit` bytes (0: nothing is kept)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(int(limit), 0)
        self.entries: list[CacheEntry] = []
        self.saved = self.restored = 0  # counts, for the metrics

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    def should_save(self, held: list[int], kept: int) -> bool:
        """Whether an id's cells (`held`) are worth copying before a new prompt keeps only `kept` of them: it
        would discard most of them, they fit, and no entry holds them already."""
        if not self.limit or not held or kept >= KEEP_AT_LEAST * len(held):
            return False
        return not any(common_prefix(e.tokens, held) == len(held) for e in self.entries)

    def add(self, entry: CacheEntry) -> None:
        """Keeps an entry (entries it contains are dropped, then the least recently used while over the limit)."""
        if entry.size > self.limit:
            return
        self.entries = [e for e in self.entries if common_prefix(e.tokens, entry.tokens) < len(e.tokens)]
        self.entries.append(entry)
        while self.size > self.limit:
            self.entries.pop(0)
        self.saved += 1

    def find(self, prompt: list[int], have: int) -> CacheEntry | None:
        """The entry sharing the longest prefix with the prompt, if longer than `have` (what the id holds of it
        already); it becomes the most recently used."""
        best, best_n = None, have
        for entry in self.entries:
            n = common_prefix(entry.tokens, prompt)
            if n > best_n:
                best, best_n = entry, n
        if best is not None:
            self.entries.remove(best)
            self.entries.append(best)
            self.restored += 1
        return best
