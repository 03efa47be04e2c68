"""The torch engine: a transformers model (or runner.models.compact_llama's forward) and its KV cache; for a
model that runs our compact forward, a context of many sequences (TorchSharedContext: continuous batching)."""

from __future__ import annotations

__all__ = ["TorchEngine", "TorchSharedContext", "model_logits", "new_cache"]

import numpy as np
import torch

from runner.engines.cells import Row, SequenceCells


def new_cache(model, tokens: int = 0):
    """The model's own cache when it brings one (runner.models.compact_llama; room for `tokens` reserved at once),
    else transformers' DynamicCache."""
    if hasattr(model, "new_cache"):
        return model.new_cache(tokens)
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    # Sliding-window layers (Gemma 2/3, Mistral v0.1) drop states past the window unless told to keep them
    # until the next crop: a rejected draft must be cropped off even after the window is full.
    cache.activate_past_recording()
    return cache


def model_logits(model, ids: torch.Tensor, cache, last_only: bool) -> torch.Tensor:
    """Runs `ids` (1-D) through the model on top of its cache; (len or 1, V) logits."""
    out = model(input_ids=ids.view(1, -1), cache=cache, use_cache=True, logits_to_keep=1 if last_only else 0)
    return out.logits[0]


class TorchEngine:
    """A torch model behind the engine interface (runner.engines.Engine)."""

    name = "torch"

    def __init__(self, model) -> None:
        self.model = model
        self.device = model.device
        self.vocab_size = model.config.get_text_config().vocab_size
        self.cache = None
        # a model that runs runner.models.compact_llama's forward decodes many sequences in one pass
        self.batches = hasattr(model, "forward_rows")

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def reset(self, room: int) -> None:
        self.cache = new_cache(self.model, room)

    def forward(self, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        return model_logits(self.model, ids, self.cache, last_only)

    def crop(self, n: int) -> None:
        self.cache.crop(-n)

    def length(self) -> int:
        return self.cache.get_seq_length()

    def batch_context(self, sequences: int, n_ctx_seq: int) -> TorchSharedContext:
        """A KV cache of many sequences over this engine's model (compact forward only)."""
        if not self.batches:
            raise ValueError(f"{type(self.model).__name__} does not decode in a batch (only the compact torch forward does)")
        return TorchSharedContext(self.model, sequences, n_ctx_seq)


class TorchSharedContext(SequenceCells):
    """runner.engines.BatchContext over a torch model that runs runner.models.compact_llama's forward: a KV
    cache of many sequences (`new_batched_cache`) and one forward over all rows' tokens per pass
    (`forward_rows`). The weights are the model's own. A sequence cut back keeps its old cells, unread:
    attention reads a sequence's cells only up to its own length."""

    def __init__(self, model, sequences: int, n_ctx_seq: int) -> None:
        super().__init__(sequences, n_ctx_seq, model.full_size)
        self.model = model
        self.cache = model.new_batched_cache(sequences, n_ctx_seq)

    def close(self) -> None:
        self.cache = None

    def decode(self, rows: list[Row]) -> list[np.ndarray]:
        """Each row's logits, (len(tokens), V) or (1, V) for its last, float32 (runner.engines.BatchContext)."""
        self.check(rows)
        used, outputs, index = [], [], 0
        for seq, tokens, all_logits in rows:
            if tokens:
                used.append((seq, self.length(seq), tokens))
                outputs += range(index, index + len(tokens)) if all_logits else [index + len(tokens) - 1]
                index += len(tokens)
        with torch.inference_mode():  # the cache's tensors are made and written in it, whoever calls
            block = self.model.forward_rows(self.cache, used, outputs).cpu().numpy() if used else None
        return self.appended(rows, block)

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
