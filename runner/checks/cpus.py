"""CPUs the process may use: the affinity mask, bounded by the CPU quota of its cgroup and the cgroup's ancestors.

`os.cpu_count()` is the node's count: a pod limited to 2 CPUs on a 64-core node would start 64 threads, which the
quota then throttles. The quota is cgroup v2's `cpu.max` ("QUOTA PERIOD", or "max PERIOD") or cgroup v1's
`cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: none), rounded up to whole CPUs. The hierarchy is read below
`SPECBUNDLE_CGROUP_ROOT` when that is set (tests give a directory of their own), else /sys/fs/cgroup, as
runner.checks.memory reads it.
"""

from __future__ import annotations

__all__ = ["cgroup_cpu_quota", "usable_cpus"]

import math
import os
from pathlib import Path

from runner.checks.cgroups import cgroup_dirs, read_limit


def _quota_at(directory: Path, v2: bool) -> float | None:
    """CPUs (quota / period) one cgroup directory allows, or None where it sets no quota or cannot be read
    (runner.checks.cgroups.read_limit: a regular file of a few hundred bytes, read without blocking)."""
    if v2:
        quota, _, period = (read_limit(directory / "cpu.max") or "").partition(" ")
    else:
        quota, period = read_limit(directory / "cpu.cfs_quota_us") or "", read_limit(directory / "cpu.cfs_period_us") or ""
    try:
        if quota == "max" or int(quota) <= 0 or int(period) <= 0:
            return None
        return int(quota) / int(period)
    except ValueError:
        return None


def cgroup_cpu_quota(proc_cgroup: str | Path = "/proc/self/cgroup", root: str | Path | None = None) -> float | None:
    """The least CPU quota (in CPUs, fractional) of the process's cgroup and its ancestors, cgroup v2 or v1;
    None where none sets one. root: the hierarchy's mount (default: $SPECBUNDLE_CGROUP_ROOT, else /sys/fs/cgroup)."""
    quotas = [q for directory, v2 in cgroup_dirs("cpu", proc_cgroup, root) if (q := _quota_at(directory, v2)) is not None]
    return min(quotas) if quotas else None


def usable_cpus(affinity: int | None = None, proc_cgroup: str | Path = "/proc/self/cgroup",
                root: str | Path | None = None) -> int:
    """Threads worth starting: the CPUs in the affinity mask (affinity: that count, where a caller knows it),
    at most the cgroup's CPU quota rounded up; at least 1."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota(proc_cgroup, root)
    return max(1, min(affinity, math.ceil(quota)) if quota is not None else affinity)
