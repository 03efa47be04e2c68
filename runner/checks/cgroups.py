"""The process's cgroups as the kernel lists them: each directory of one controller's hierarchy, the process's own
cgroup and its ancestors, for reading a limit that any of them may set (runner.checks.cpus, runner.checks.memory).
The hierarchy is read below `SPECBUNDLE_CGROUP_ROOT` when that is set (tests give a directory of their own),
else /sys/fs/cgroup."""

from __future__ import annotations

__all__ = ["CGROUP_ROOT_ENV", "cgroup_dirs"]

import os
from pathlib import Path

CGROUP_ROOT_ENV = "SPECBUNDLE_CGROUP_ROOT"


def cgroup_dirs(controller: str, proc_cgroup: str | Path = "/proc/self/cgroup",
                root: str | Path | None = None) -> list[tuple[Path, bool]]:
    """(directory, is cgroup v2) for the process's cgroup and each ancestor, root first: the unified (v2)
    hierarchy's, and the v1 hierarchy that mounts `controller`; [] where /proc/self/cgroup cannot be read."""
    root = Path(root if root is not None else os.environ.get(CGROUP_ROOT_ENV) or "/sys/fs/cgroup")
    try:
        lines = Path(proc_cgroup).read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    dirs = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            base, v2 = root, True
        elif controller in parts[1].split(","):
            base, v2 = root / controller, False
        else:
            continue
        path = parts[2].strip("/")
        levels = [path.split("/")[:i] for i in range(path.count("/") + 2)] if path else [[]]
        dirs += [(base.joinpath(*level), v2) for level in levels]  # where this namespace shows them
    return dirs
