"""Engines: what the one decoding loop (runner.decoding.speculative) needs from a model, and nothing more.

An engine holds one model and its KV cache. `reset` empties the cache (room for so many tokens),
`forward` runs token ids on top of the cache and returns their logits (every position's, or the last
one's: a prefill, one decode step, or a verify pass of k + 1 tokens in one call), `crop` drops the last
tokens from the cache (a rejected draft), `length` is how many tokens the cache holds. One module per
engine: runner.engines.torch_engine (transformers / our compact forward), runner.engines.llamacpp (GGUF
files through llama-cpp-python).
"""

from __future__ import annotations

from typing import Protocol

import torch


class Engine(Protocol):
    """One model and its KV cache, as the decoding loop drives it."""

    name: str  # "torch" or "llama.cpp": run --json's "engine"
    device: torch.device  # where forward's logits live
    vocab_size: int  # rows of the output layer (may exceed the tokenizer's vocabulary)
    parameters: int  # parameter count: the clock-free cost model's unit

    def reset(self, room: int) -> None:
        """Empties the cache, with room for `room` tokens."""

    def forward(self, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        """Runs `ids` (1-D) on top of the cache; (len(ids), V) logits, or (1, V) when last_only."""

    def crop(self, n: int) -> None:
        """Drops the last n tokens from the cache."""

    def length(self) -> int:
        """Tokens in the cache."""


def as_engine(model) -> Engine:
    """An engine as is; a torch model (transformers or runner.models.compact_llama) wrapped in the torch engine."""
    if not isinstance(model, torch.nn.Module):
        return model
    from runner.engines.torch_engine import TorchEngine

    return TorchEngine(model)
