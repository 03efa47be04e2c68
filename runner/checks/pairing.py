"""Pairing policy: a shared model family and a minimum size gap (memory: runner.checks.memory).

All of it is decided from config.json and safetensors headers, before any weight is read.
"""

from __future__ import annotations

__all__ = ["PairingPolicy", "check_pairing"]

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.errors import BundleError
from runner.checks.modelinfo import Ranges, count_parameters, read_config

DEFAULT_MIN_SIZE_RATIO = 4.0
# model_type variants that share a family (and so, usually, a tokenizer and training data).
FAMILY_ALIASES = {
    "qwen2_moe": "qwen2",
    "qwen3_moe": "qwen3",
    "mixtral": "mistral",
    "gemma2": "gemma",
    "gemma3_text": "gemma",
    "gemma3": "gemma",
    "llama4_text": "llama4",
    "phi3small": "phi3",
}


@dataclass(frozen=True)
class PairingPolicy:
    """The pairing parameters of the Kitfile's model.parameters["speculative"], read here for both pair checks:
    this module's (safetensors) and runner.checks.gguf_model's (GGUF)."""

    allow_cross_family: bool = False  # target and draft may come from different model families
    min_size_ratio: float = DEFAULT_MIN_SIZE_RATIO  # target parameters / draft parameters, at least

    @classmethod
    def from_params(cls, params: Mapping) -> PairingPolicy:
        """params: the Kitfile's speculative parameters; a key left out is its default."""
        return cls(
            allow_cross_family=bool(params.get("allow_cross_family", False)),
            min_size_ratio=float(params.get("min_size_ratio", DEFAULT_MIN_SIZE_RATIO)),
        )


def model_family(model_type: str) -> str:
    return FAMILY_ALIASES.get(model_type, model_type)


def check_pairing(target_dir: Path, draft_dir: Path, params: Mapping, ranges: Ranges | None = None) -> dict:
    """Target and draft share a model family (unless params["allow_cross_family"]) and the target has at
    least params["min_size_ratio"] (default 4) times the draft's parameters (`ranges`: weight files left in
    layer blobs, see runner.checks.modelinfo).

    Returns {"target_family", "draft_family", "target_parameters", "draft_parameters", "size_ratio"};
    raises BundleError "model-family" or "size-ratio".
    """
    target_type = read_config(target_dir).get("model_type", "unknown")
    draft_type = read_config(draft_dir).get("model_type", "unknown")
    target_family, draft_family = model_family(target_type), model_family(draft_type)
    policy = PairingPolicy.from_params(params)
    if target_family != draft_family and not policy.allow_cross_family:
        raise BundleError(
            "model-family",
            f"target is {target_type}, draft is {draft_type}: different model families "
            "(set speculative.allow_cross_family in the Kitfile to allow)",
        )
    target_params, draft_params = count_parameters(target_dir, ranges), count_parameters(draft_dir, ranges)
    ratio = target_params / max(draft_params, 1)
    min_ratio = policy.min_size_ratio
    if ratio < min_ratio:
        raise BundleError(
            "size-ratio",
            f"target has {target_params:,} parameters, draft {draft_params:,}: ratio {ratio:.2f} < {min_ratio:g} "
            "(a draft this large costs more than it saves)",
        )
    return {
        "target_family": target_family,
        "draft_family": draft_family,
        "target_parameters": target_params,
        "draft_parameters": draft_params,
        "size_ratio": ratio,
    }
