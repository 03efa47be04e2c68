"""Draft-free proposals: prompt lookup over the text so far. The sequence's last n tokens (the longest n in
min_n..max_n that occurred before) are looked up in an index of every earlier n-gram, and the tokens that
followed its latest earlier occurrence are the proposal. No weights, no model call: a dict lookup a step.

The rule is llama.cpp's `ngram-simple` and vLLM's ngram proposer (longest suffix n-gram first, copy what
followed it), kept incrementally: each accepted token adds max_n - min_n + 1 index entries, so a proposal
costs O(max_n) whatever the length. The latest occurrence wins over the most frequent (llama.cpp's
`ngram-map-k`): in edits and rewrites the text being copied is the one most recently quoted."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_N", "DEFAULT_MIN_N", "DEFAULT_NGRAM_TOKENS", "NgramProposer"]

from collections.abc import Sequence

DEFAULT_MIN_N = 2  # a 1-gram match follows common tokens (spaces, commas) anywhere and rarely continues
DEFAULT_MAX_N = 4  # past 4 tokens a match is almost always a copy already found by its 4-token suffix
DEFAULT_NGRAM_TOKENS = 10  # a copied span runs long once found (transformers' prompt_lookup_num_tokens: 10 too)


class NgramProposer:
    """Prompt-lookup proposer of one sequence. Feed it the prompt and then each accepted token with extend;
    propose(k) returns up to k tokens (empty when the last n tokens never occurred before, for every n)."""

    def __init__(self, min_n: int = DEFAULT_MIN_N, max_n: int = DEFAULT_MAX_N) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self._tokens: list[int] = []
        # n-gram -> the position right after its latest occurrence that has a known next token
        self._index: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> Sequence[int]:
        """The sequence so far (prompt and accepted tokens), read-only by convention."""
        return self._tokens

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens (the prompt, then the accepted ones) and index the n-grams they complete."""
        seq = self._tokens
        index = self._index
        for token in tokens:
            end = len(seq)  # n-grams ending here are indexed now that the token after them is known
            seq.append(int(token))
            for n in range(self.min_n, min(self.max_n, end) + 1):
                index[tuple(seq[end - n : end])] = end

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix n-gram.
        A match that runs into the sequence's end continues with its own proposal (a repeating pattern keeps
        repeating), so a match always yields k tokens."""
        return self.propose_match(k)[0]

    def propose_match(self, k: int) -> tuple[list[int], int]:
        """propose(k), and the length n of the suffix that matched (0: none). A longer match is copied text
        more often than a chance repeat, so the guard weighs proposals by it (runner.decoding.guard)."""
        seq = self._tokens
        length = len(seq)
        if k <= 0:
            return [], 0
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            start = self._index.get(tuple(seq[length - n :]))
            if start is not None:
                return self._continuation(start, k), n
        return [], 0

    def _continuation(self, start: int, k: int) -> list[int]:
        seq = self._tokens
        length = len(seq)
        out = seq[start : start + k]
        period = length - start  # the match's end is `period` tokens behind, so past the end it repeats
        while len(out) < k:
            out.append(out[len(out) - period])
        return out
