"""A draft whose output head covers only part of the vocabulary: the tokens the target actually writes.

A small draft spends most of a step in its vocabulary-wide output head (SmolLM2's 49152 x 256 is ~60% of
a 2-layer, 256-wide draft's step). The bundle may name a list of token ids (`speculative.draft_vocab`, a
JSON file in the draft's directory); the draft then scores only those, and every other id gets -inf.
Decoding stays lossless: a token the draft cannot propose is still produced by the target, and in
sampling the draft's distribution q is simply 0 there.
"""

from __future__ import annotations

__all__ = ["SubsetHeadDraft", "full_vocab_logits", "head_rows", "read_draft_vocab"]

import json
from pathlib import Path
from types import SimpleNamespace

import torch

from core.errors import BundleError


def read_draft_vocab(path: Path, vocab_size: int) -> list[int]:
    """The ids in a draft vocabulary file ({"ids": [...]}), checked: unique, in range, not empty."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BundleError("invalid-bundle", f"draft vocabulary {path.name}: cannot read it ({err})") from None
    ids = data.get("ids") if isinstance(data, dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BundleError("invalid-bundle", f"draft vocabulary {path.name}: expected {{\"ids\": [token ids]}}")
    if len(set(ids)) != len(ids):
        raise BundleError("invalid-bundle", f"draft vocabulary {path.name}: an id is listed twice")
    outside = [i for i in ids if not 0 <= i < vocab_size]
    if outside:
        raise BundleError("tokenizer-mismatch", f"draft vocabulary {path.name}: id {outside[0]} is outside the tokenizer's {vocab_size} tokens")
    return ids


def head_rows(weight: torch.Tensor, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ids as an index tensor, and the output head's rows for them (a contiguous copy)."""
    index = torch.tensor(ids, dtype=torch.long, device=weight.device)
    return index, weight[index].detach().contiguous()


def full_vocab_logits(scores: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Scores for the ids in `index` spread over the full vocabulary, -inf elsewhere. In float32: the loop's
    argmax and softmax over the full vocabulary are several times faster in it than in bfloat16."""
    logits = scores.new_full((*scores.shape[:-1], size), float("-inf"), dtype=torch.float32)
    logits[..., index] = scores.float()
    return logits


class SubsetHeadDraft(torch.nn.Module):
    """Wraps a causal LM (a `.model` body and an `.lm_head`) so its logits are computed for `ids` only."""

    def __init__(self, model: torch.nn.Module, ids: list[int]) -> None:
        super().__init__()
        if not hasattr(model, "model") or not isinstance(getattr(model, "lm_head", None), torch.nn.Linear):
            raise BundleError("invalid-bundle", "a draft vocabulary needs a model with a linear lm_head")
        self.inner = model
        self.config = model.config
        index, head = head_rows(model.lm_head.weight, ids)
        self.register_buffer("ids", index, persistent=False)
        self.register_buffer("head", head, persistent=False)
        bias = model.lm_head.bias
        self.register_buffer("bias", None if bias is None else bias[index].detach().contiguous(), persistent=False)
        self.full_size = model.lm_head.out_features

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def forward(self, input_ids: torch.Tensor, logits_to_keep: int = 0, **kwargs) -> SimpleNamespace:
        hidden = self.inner.model(input_ids=input_ids, **kwargs).last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        scores = torch.nn.functional.linear(hidden, self.head, self.bias)
        return SimpleNamespace(logits=full_vocab_logits(scores, self.ids, self.full_size))
