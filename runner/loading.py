"""Loading only what was verified: safetensors weights, no remote code, no hub, optionally hashed as read.

`LOADS` counts calls to `load_model`, so a test can prove that a refusal came before any weight was read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from bundler.errors import BundleError
from runner.modelinfo import DTYPE_BYTES, safetensors_files

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
LOADS = 0  # calls to load_model in this process


def check_weight_files(model_dir: Path, role: str = "model") -> None:
    """Refuses pickle-based weights anywhere in a model directory (they can run code when loaded)."""
    for path in sorted(Path(model_dir).rglob("*")):
        if path.suffix.lower() in PICKLE_SUFFIXES and path.is_file():
            raise BundleError(
                "pickle-weights",
                f"{role} holds {path.relative_to(model_dir)}: pickle-based weights are refused, use safetensors",
            )
    safetensors_files(model_dir)


def torch_dtype(dtype: str):
    import torch

    if dtype not in DTYPE_BYTES:
        raise BundleError("usage", f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
    return getattr(torch, dtype)


def _read_verified(path: Path, expected: Mapping[str, str], name: str) -> bytes:
    """The file's bytes, after checking their sha256 against the verified one: what is hashed is what loads."""
    want = expected.get(name)
    if want is None:
        raise BundleError("extra-file", f"{path} is not among the verified files")
    data = path.read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != want.removeprefix("sha256:"):
        raise BundleError("digest-mismatch", f"{path} changed after verification: sha256 {got}")
    return data


def load_model(
    model_dir: Path, dtype: str, device: str, *, expected_sha256: Mapping[str, str] | None = None, role: str = "model"
):
    """A causal LM from a verified directory: safetensors only, trust_remote_code=False, local files only.

    With `expected_sha256` (file name in the directory -> sha256 hex, as the signature lists them),
    config.json and every weight file are read into memory, hashed and loaded from those same bytes, so no
    file can be swapped between verification and loading (peak memory: twice the weights).
    """
    global LOADS
    LOADS += 1
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr is for the one error line
    model_dir = Path(model_dir)
    check_weight_files(model_dir, role)
    dt = torch_dtype(dtype)
    if expected_sha256 is None:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir,
            dtype=dt,
            trust_remote_code=False,
            local_files_only=True,
            use_safetensors=True,
        )
    else:
        from safetensors.torch import load as load_safetensors

        config_dict = json.loads(_read_verified(model_dir / "config.json", expected_sha256, "config.json"))
        model_type = config_dict.pop("model_type", None)
        if model_type is None:
            raise BundleError("invalid-bundle", f"{model_dir}/config.json has no model_type")
        config = AutoConfig.for_model(model_type, **config_dict)
        state_dict: dict = {}
        for path in safetensors_files(model_dir):
            state_dict.update(load_safetensors(_read_verified(path, expected_sha256, path.name)))
        # Built from the config and filled from the hashed bytes: from_pretrained would reopen the files.
        model = AutoModelForCausalLM.from_config(config, dtype=dt, trust_remote_code=False)
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
        if set(missing) - tied or unexpected:
            raise BundleError("invalid-bundle", f"{model_dir}: weights do not fit the config (missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})")
        model.tie_weights()
        model = model.to(dt)
    return model.to(device).eval()
