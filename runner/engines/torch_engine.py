"""The torch engine: a transformers model (or runner.models.compact_llama's forward) and its KV cache."""

from __future__ import annotations

__all__ = ["TorchEngine", "model_logits", "new_cache"]

import torch


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
