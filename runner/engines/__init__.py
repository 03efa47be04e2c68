"""Engines: what the decoding loop (runner.decoding.step) needs from a model, and nothing more.

An engine holds one model and its KV cache. `reset` empties the cache (room for so many tokens),
`forward` runs token ids on top of the cache and returns their logits (every position's, or the last
one's: a prefill, one decode step, or a verify pass of k + 1 tokens in one call), `crop` drops the last
tokens from the cache (a rejected draft), `length` is how many tokens the cache holds. An engine that
decodes many sequences at once builds a `BatchContext` over its loaded model (`batch_context`). One module
per engine: runner.engines.torch_engine (transformers / our compact forward), runner.engines.llamacpp (GGUF
files through llama-cpp-python); runner.engines.cells holds what both batch contexts keep beside their cells.
"""

from __future__ import annotations

__all__ = ["BatchContext", "Engine", "as_engine"]

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from runner.engines.cells import Row


class BatchContext(Protocol):
    """Many sequences in one context over an engine's loaded model (a KV cache per sequence id), decoded
    together: continuous batching (runner.decoding.batching). The weights are the engine's own."""

    sequences: int  # sequence ids 0..sequences-1
    n_ctx_seq: int  # tokens one sequence may hold
    vocab_size: int  # columns of the logits
    max_tokens: int  # tokens one decode takes at most, all rows together
    contents: list[list[int]]  # the tokens each sequence's cells hold

    def decode(self, rows: list[Row]) -> list[np.ndarray]:
        """One pass of rows appended to their sequences; each row's float32 logits back: (len(tokens), V), or
        (1, V) for its last token, (0, V) for a row of none. Valid until the next decode."""

    def keep(self, seq: int, n: int) -> None:
        """Keeps the first n tokens of a sequence's cells (0: frees the sequence)."""

    def state(self, seq: int) -> tuple[Any, int]:
        """A copy of a sequence's cells and its size in bytes (0: it could not be copied)."""

    def restore(self, seq: int, state: Any, tokens: list[int]) -> None:
        """A sequence's cells replaced by a copy `state` made, which holds `tokens` (emptied where that fails)."""

    def length(self, seq: int) -> int:
        """Tokens in a sequence's cells."""

    def common_prefix(self, seq: int, tokens: list[int]) -> int:
        """How many first tokens of `tokens` the sequence's cells hold already."""

    def close(self) -> None:
        """Frees the context (its cells; never the weights)."""


class Engine(Protocol):
    """One model and its KV cache, as the decoding loop drives it."""

    name: str  # "torch" or "llama.cpp": run --json's "engine"
    device: torch.device  # where forward's logits live
    vocab_size: int  # rows of the output layer (may exceed the tokenizer's vocabulary)
    parameters: int  # parameter count: the clock-free cost model's unit
    batches: bool  # whether batch_context can build a context of many sequences

    def reset(self, room: int) -> None:
        """Empties the cache, with room for `room` tokens."""

    def forward(self, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        """Runs `ids` (1-D) on top of the cache; (len(ids), V) logits, or (1, V) when last_only."""

    def crop(self, n: int) -> None:
        """Drops the last n tokens from the cache."""

    def length(self) -> int:
        """Tokens in the cache."""

    def batch_context(self, sequences: int, n_ctx_seq: int) -> BatchContext:
        """A context of `sequences` sequences of `n_ctx_seq` tokens over this engine's model; ValueError where
        the engine does not batch (`batches` is False)."""


def as_engine(model) -> Engine:
    """An engine as is; a torch model (transformers or runner.models.compact_llama) wrapped in the torch engine."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return model
    from runner.engines.torch_engine import TorchEngine

    return TorchEngine(model)
