"""Pairing policy: a shared model family, a minimum size gap, and memory enough for both.

All of it is decided from config.json and safetensors headers, before any weight is read.
"""

from __future__ import annotations

__all__ = ["PairingPolicy", "available_memory", "cgroup_room", "check_memory", "check_pairing"]

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


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


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


def available_memory(device: str = "cpu") -> int:
    """Bytes free for the models: free GPU memory on CUDA, else MemAvailable from /proc/meminfo."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    # psutil is not a dependency; /proc/meminfo's MemAvailable is what it reads on Linux anyway.
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


UNLIMITED = 1 << 60  # a cgroup v1 limit this high (the kernel writes 2^63 less a page) is no limit


def cgroup_room(proc_cgroup: str | Path = "/proc/self/cgroup", root: str | Path = "/sys/fs/cgroup") -> int | None:
    """Bytes the process's memory cgroup and its ancestors still allow (the least of limit less usage), or None
    where none has a limit: what a container's memory limit (a Kubernetes pod's `limits.memory`) leaves, which
    MemAvailable, the node's figure, does not show. cgroup v2 (memory.max, memory.current) and v1 (the memory
    controller's memory.limit_in_bytes, memory.usage_in_bytes)."""
    try:
        lines = Path(proc_cgroup).read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    rooms = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            base, files = Path(root), ("memory.max", "memory.current")
        elif "memory" in parts[1].split(","):
            base, files = Path(root) / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        path = parts[2].strip("/")
        levels = [path.split("/")[:i] for i in range(path.count("/") + 2)] if path else [[]]
        for level in levels:  # the cgroup and its ancestors, where this namespace shows them
            try:
                limit, usage = ((base.joinpath(*level) / name).read_text(encoding="ascii").strip() for name in files)
                if limit != "max" and int(limit) < UNLIMITED:
                    rooms.append(max(int(limit) - int(usage), 0))
            except (OSError, ValueError, UnicodeDecodeError):
                continue
    return min(rooms) if rooms else None


def check_memory(estimate: Mapping, budget_bytes: int | None, device: str = "cpu") -> None:
    """Refuses (code "memory-budget") when the estimate exceeds the budget, or the memory available."""
    limit = budget_bytes if budget_bytes is not None else available_memory(device)
    source = "--memory-budget" if budget_bytes is not None else f"available on {device}"
    if estimate["total_bytes"] > limit:
        raise BundleError(
            "memory-budget",
            f"needs {human_bytes(estimate['total_bytes'])} (weights {human_bytes(estimate['weights_bytes'])} "
            f"+ KV cache {human_bytes(estimate['kv_cache_bytes'])} for {estimate.get('max_tokens', '?')} tokens) "
            f"but {human_bytes(limit)} is {source}",
        )
