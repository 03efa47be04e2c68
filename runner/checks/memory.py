"""Memory: what the machine and the process's cgroup leave, the preflight that refuses a pair that does not fit,
and the sizing of a server's batch (its sequences' KV caches and its prompt cache) under both.

MemAvailable is the node's figure: in a container (a Kubernetes pod's `limits.memory`) the cgroup's limit less
its usage is what the process may still take, so sizing takes the smaller of the two. The cgroup hierarchy is
read below `SPECBUNDLE_CGROUP_ROOT` when that is set (tests give a directory of their own), else /sys/fs/cgroup.
"""

from __future__ import annotations

__all__ = [
    "PROMPT_CACHE_MAX", "SEQUENCES_CAP", "ServeMemory", "available_memory", "cgroup_room",
    "check_memory", "default_prompt_cache", "human_bytes", "size_serving",
]

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.errors import BundleError
from runner.checks.cgroups import cgroup_dirs, read_limit

UNLIMITED = 1 << 60  # a cgroup v1 limit this high (the kernel writes 2^63 less a page) is no limit
SEQUENCES_CAP = 8  # a server's default number of sequences, at most (fewer where their KV caches do not fit)
PROMPT_CACHE_MAX = 8 << 30  # the prompt cache's default size at most (llama-server's --cache-ram default)


def human_bytes(n: float) -> str:
    """Bytes for a person: 300.00 MiB, 1.50 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


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
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cgroup_room(proc_cgroup: str | Path = "/proc/self/cgroup", root: str | Path | None = None) -> int | None:
    """Bytes the process's memory cgroup and its ancestors still allow (the least of limit less usage), or None
    where none has a limit. cgroup v2 (memory.max, memory.current) and v1 (the memory controller's
    memory.limit_in_bytes, memory.usage_in_bytes). root: the hierarchy's mount (default: $SPECBUNDLE_CGROUP_ROOT,
    else /sys/fs/cgroup)."""
    rooms = []
    for directory, v2 in cgroup_dirs("memory", proc_cgroup, root):
        files = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        limit, usage = (read_limit(directory / name) for name in files)  # None: unreadable, no limit
        try:
            if limit is not None and usage is not None and limit != "max" and int(limit) < UNLIMITED:
                rooms.append(max(int(limit) - int(usage), 0))
        except ValueError:
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


def default_prompt_cache(left: int, room: int | None) -> int:
    """The prompt cache's default size: half the memory left once the pair and its sequences' caches are
    counted (`left`; `room`: what the cgroup's limit still allows besides those caches, None without a limit),
    at most PROMPT_CACHE_MAX."""
    return max(0, min(PROMPT_CACHE_MAX, left // 2, room // 2 if room is not None else left))


@dataclass(frozen=True)
class ServeMemory:
    """A server's batch, sized: its sequences and its prompt cache's byte limit."""

    sequences: int
    prompt_cache_bytes: int
    cgroup_room: int | None  # what the cgroup allowed when it was sized (None: no limit)


def size_serving(memory: Mapping, context_tokens: int, *, sequences: int | None, prompt_cache: int | None,
                 budget: int | None) -> ServeMemory:
    """The batch of a loaded pair (memory: its estimate, with `kv_cache_bytes` for one sequence of both models):
    as many sequences as fit (at most SEQUENCES_CAP) or the number asked, checked; the prompt cache as asked,
    else default_prompt_cache. Without --memory-budget, both fit MemAvailable and the cgroup's room (measured
    with the pair loaded: its usage counts the weights already)."""
    kv, total = int(memory["kv_cache_bytes"]), int(memory["total_bytes"])
    room = cgroup_room() if budget is None else None
    left = (budget if budget is not None else available_memory("cpu")) - total
    fits = left if room is None else min(left, room)
    if sequences is None:
        sequences = SEQUENCES_CAP if kv <= 0 else max(1, min(SEQUENCES_CAP, fits // kv))
    else:  # the memory preflight, for the batch's caches beside the loaded pair's own
        estimate = {**memory, "kv_cache_bytes": kv * (1 + sequences), "total_bytes": total + kv * sequences,
                    "max_tokens": f"{sequences} x {context_tokens}"}
        check_memory(estimate, budget, "cpu")
        if room is not None and kv * sequences > room:
            raise BundleError("memory-budget", f"--sequences {sequences}: their KV caches need {human_bytes(kv * sequences)} "
                                               f"but the memory cgroup's limit leaves {human_bytes(room)}")
    if prompt_cache is None:
        caches = kv * sequences
        prompt_cache = default_prompt_cache(left - caches, room - caches if room is not None else None)
    return ServeMemory(sequences, prompt_cache, room)
