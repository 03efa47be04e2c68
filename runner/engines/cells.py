"""What a context of many sequences keeps beside its cache cells, for either engine's BatchContext
(runner.engines.llamacpp.SharedContext, runner.engines.torch_engine.TorchSharedContext): the tokens each
sequence's cells hold, and the checks and bookkeeping of a pass that do not depend on the engine."""

from __future__ import annotations

__all__ = ["BATCH_TOKENS", "Row", "SequenceCells", "common_prefix"]

import numpy as np

# One row of a batched pass: (sequence id, tokens appended to it, whether every token's logits come back or
# only the last one's).
Row = tuple[int, list[int], bool]

BATCH_TOKENS = 512  # tokens one batched pass takes at most (llama.cpp's n_batch; a longer prompt goes in chunks)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many first tokens two token lists share (a cache's cells and a prompt, two cached entries)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


class SequenceCells:
    """The tokens in each sequence's cells; a context adds `decode`, `keep`, `state` and `restore`
    (runner.engines.BatchContext)."""

    max_tokens = BATCH_TOKENS

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

    def appended(self, rows: list[Row], block: np.ndarray | None) -> list[np.ndarray]:
        """After a pass: each row's tokens counted in its sequence, and its logits cut from the pass's block (the
        rows' kept outputs in order): (len(tokens), V) with all_logits, else (1, V); (0, V) for a row of none."""
        out, row = [], 0
        for seq, tokens, all_logits in rows:
            self.contents[seq] += tokens
            n = (len(tokens) if all_logits else 1) if tokens else 0
            out.append(block[row : row + n] if n else np.empty((0, self.vocab_size), np.float32))
            row += n
        return out

    def check(self, rows: list[Row]) -> None:
        """ValueError for a pass that would overfill a sequence or the batch."""
        for seq, tokens, _ in rows:
            if self.length(seq) + len(tokens) > self.n_ctx_seq:
                raise ValueError(f"{self.length(seq) + len(tokens)} tokens exceed a sequence's context ({self.n_ctx_seq})")
        total = sum(len(tokens) for _, tokens, _ in rows)
        if total > self.max_tokens:
            raise ValueError(f"{total} tokens in one batch; at most {self.max_tokens}")
