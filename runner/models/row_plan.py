"""The layout of a batched pass of the compact forward (runner.models.compact_llama.CompactLlama.forward_rows):
the cache of many sequences, and where each token of a pass sits in it and in the padded per-row layout that
attention runs on."""

from __future__ import annotations

__all__ = ["BatchedCache", "RowPlan", "SHORT_ROW", "attention_parts"]

import torch


class BatchedCache:
    """Keys and values of many sequences (continuous batching, runner.decoding.batching): one tensor each of
    shape (layers, sequences, kv heads, positions, head dim); which positions of a sequence are valid is the
    caller's to know. Cells are zeros until written and keep old values after a sequence is cut back: a
    masked cell must hold a finite number (attention weighs it by zero, and zero times NaN is NaN)."""

    def __init__(self, layers: int, sequences: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, limit: int) -> None:
        self.keys = torch.zeros(layers, sequences, kv_heads, 0, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.limit = limit  # positions per sequence, at most

    def reserve(self, length: int) -> None:
        """Room for `length` positions in every sequence; the room at least doubles when it grows (up to the limit)."""
        capacity = self.keys.shape[3]
        if length <= capacity:
            return
        size = list(self.keys.shape)
        size[3] = min(max(length, 2 * capacity, 64), max(self.limit, length))
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(size)
            new[:, :, :, :capacity] = old
            setattr(self, name, new)


class RowPlan:
    """The index tensors of one batched pass (runner.models.compact_llama.CompactLlama.forward_rows): where each token sits in its
    sequence's cells and in the padded per-row layout attention runs on, and the attention mask."""

    def __init__(self, rows: list[tuple[int, int, list[int]]], device: torch.device, groups: int) -> None:
        self.rows = len(rows)
        self.tokens = sum(len(tokens) for _, _, tokens in rows)
        self.width = max(len(tokens) for _, _, tokens in rows)  # the longest row: every row is padded to it
        self.slots = len(rows) * self.width
        self.end = max(start + len(tokens) for _, start, tokens in rows)  # the cells attention reads, per sequence
        ids, positions, seq_of, slot, last = [], [], [], [], []
        for r, (seq, start, tokens) in enumerate(rows):
            ids += tokens
            positions += range(start, start + len(tokens))
            seq_of += [seq] * len(tokens)
            slot += range(r * self.width, r * self.width + len(tokens))
            last.append(start + len(tokens) - 1)
        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)
        self.ids, self.positions, self.seq_of, self.slot = tensor(ids), tensor(positions), tensor(seq_of), tensor(slot)
        self.padding = self.slots != self.tokens
        # one row is written into its cells as forward writes them (a slice, no index): (sequence, start, end)
        self._span = (rows[0][0], rows[0][1], rows[0][1] + len(rows[0][2])) if len(rows) == 1 else None
        seqs = [seq for seq, _, _ in rows]
        # the rows' sequences: a slice of the cache when they are consecutive ids (no copy), else gathered
        consecutive = seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        self._seqs: slice | torch.Tensor = slice(seqs[0], seqs[0] + len(seqs)) if consecutive else tensor(seqs)
        self.mask, self.causal = self._mask(rows, device, last)
        # Grouped-query attention over several rows: SDPA's enable_gqa takes no batch of masked rows on the CPU
        # (torch 2.13), and repeating the kv heads would copy every row's cells in every layer; instead the
        # query heads sharing a kv head become more query rows of it (heads are kv-head-major, as
        # transformers' repeat_kv orders them), and the mask repeats for them.
        self.grouped = groups if groups > 1 and self.mask is not None else 0
        if self.grouped:
            self.mask = self.mask.repeat(1, 1, groups, 1)

    def _mask(self, rows, device, last) -> tuple[torch.Tensor | None, bool]:
        """One row is masked as forward masks it (its numbers then equal a lone sequence's step): one token
        sees every cell, a prefill of an empty sequence is causal. Several rows: query j of a row sees the
        cells up to its own position; a padding query (past its row's tokens) sees those of the row's last."""
        if len(rows) == 1:
            (_, start, tokens), = rows
            if len(tokens) == 1 or start == 0:
                return None, len(tokens) > 1
        starts = torch.tensor([start for _, start, _ in rows], device=device)
        query = (starts[:, None] + torch.arange(self.width, device=device)[None, :]).minimum(torch.tensor(last, device=device)[:, None])
        return (torch.arange(self.end, device=device)[None, None, :] <= query[:, :, None]).unsqueeze(1), False

    def write(self, cache: torch.Tensor, states: torch.Tensor) -> None:
        """The pass's keys or values, (tokens, kv heads, head dim), into their sequences' cells."""
        if self._span is not None:
            seq, start, end = self._span
            cache[seq, :, start:end] = states.transpose(0, 1)
        else:
            cache[self.seq_of, :, self.positions] = states

    def cells(self, cache: torch.Tensor) -> torch.Tensor:
        """The rows' sequences' cells up to the pass's end: (rows, kv heads, end, head dim)."""
        return cache[self._seqs, :, : self.end]


SHORT_ROW = 16  # tokens: rows up to this long attend together (single steps, verify passes); a longer one alone


def attention_parts(rows: list[tuple[int, int, list[int]]], device: torch.device,
                    groups: int) -> list[tuple[RowPlan, torch.Tensor | slice]] | None:
    """A pass's rows as attention takes them when one plan would pad short rows to a long one: the rows of up to
    SHORT_ROW tokens together, each longer row (a prompt chunk) alone, each part with its tokens' places among
    the pass's tokens; None when the pass needs no split (every row short, or one long row alone). The matrix
    products still run over the whole pass; only attention is split.

    Why: padded to the longest row, a pass of 7 single steps and one 55-token prompt chunk ran attention over 8 x
    55 query slots, 7 in 8 of them padding, with a mask repeated for every query head: 182-202 ms for such a pass,
    152-154 ms split, the chunk alone 152 ms (the demo target in float32, a Xeon without native bf16, 2 threads).
    Served, a prompt joins every few steps at 8 clients: `--no-draft` went from 68-70 to 98-109 tokens/s there
    (docs/benchmarks.md)."""
    long = [r for r, (_, _, tokens) in enumerate(rows) if len(tokens) > SHORT_ROW]
    if not long or len(rows) == 1:
        return None
    offsets, at = [], 0
    for _, _, tokens in rows:
        offsets.append(at)
        at += len(tokens)
    short = [r for r in range(len(rows)) if r not in long]
    parts: list[tuple[RowPlan, torch.Tensor | slice]] = []
    if short:
        places = [i for r in short for i in range(offsets[r], offsets[r] + len(rows[r][2]))]
        parts.append((RowPlan([rows[r] for r in short], device, groups), torch.tensor(places, dtype=torch.long, device=device)))
    for r in long:
        parts.append((RowPlan([rows[r]], device, groups), slice(offsets[r], offsets[r] + len(rows[r][2]))))
    return parts
