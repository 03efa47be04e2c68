"""The process's cgroups as the kernel lists them: each directory of one controller's hierarchy, the process's own
cgroup and its ancestors, for reading a limit that any of them may set (runner.checks.cpus, runner.checks.memory).
The hierarchy is read below `SPECBUNDLE_CGROUP_ROOT` when that is set (tests give a directory of their own),
else /sys/fs/cgroup.

Every file here is read as a hostile /sys or $SPECBUNDLE_CGROUP_ROOT could lay it out: `read_limit` takes a
regular file only, opened without blocking, at most LIMIT_FILE_BYTES of it (a real limit file holds one short
line); anything else reads as None, which the callers take as "no limit"."""

from __future__ import annotations

__all__ = ["CGROUP_ROOT_ENV", "LIMIT_FILE_BYTES", "cgroup_dirs", "read_limit"]

import os
from pathlib import Path

from core.boundedread import NotReadable, read_bounded

CGROUP_ROOT_ENV = "SPECBUNDLE_CGROUP_ROOT"
LIMIT_FILE_BYTES = 256  # cpu.max is "QUOTA PERIOD", memory.max one integer: a few dozen bytes
PROC_CGROUP_BYTES = 64 << 10  # /proc/self/cgroup: a line per hierarchy, each a path


def read_limit(path: Path) -> str | None:
    """A cgroup file's one line, stripped; None where it is missing, not a regular file, longer than
    LIMIT_FILE_BYTES or not ASCII."""
    try:
        return read_bounded(path, LIMIT_FILE_BYTES).decode("ascii").strip()
    except (NotReadable, UnicodeDecodeError):
        return None


def cgroup_dirs(controller: str, proc_cgroup: str | Path = "/proc/self/cgroup",
                root: str | Path | None = None) -> list[tuple[Path, bool]]:
    """(directory, is cgroup v2) for the process's cgroup and each ancestor, root first: the unified (v2)
    hierarchy's, and the v1 hierarchy that mounts `controller`; [] where /proc/self/cgroup cannot be read."""
    root = Path(root if root is not None else os.environ.get(CGROUP_ROOT_ENV) or "/sys/fs/cgroup")
    try:
        lines = read_bounded(proc_cgroup, PROC_CGROUP_BYTES).decode("ascii").splitlines()
    except (NotReadable, UnicodeDecodeError):
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
