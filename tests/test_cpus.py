"""Threads follow the CPUs a process may use (runner.checks.cpus): the affinity mask, and the CPU quota of a
cgroup tree (v2 cpu.max, v1 cfs_quota_us) read below SPECBUNDLE_CGROUP_ROOT, here a directory of the test's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_bundle
from runner.checks.cpus import cgroup_cpu_quota, usable_cpus
from tests.test_gguf_bench import gguf_context
from tests.tinymodels import make_pair

REF = "tiny-spec:1.0.0"
ROOT = Path(__file__).resolve().parent.parent


def _v2_tree(tmp_path: Path, levels: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup v2 hierarchy whose process sits in /pod/ctr: cpu.max at each level named (path -> content)."""
    root = tmp_path / "cgroup"
    for level, content in levels.items():
        (root / level).mkdir(parents=True, exist_ok=True)
        (root / level / "cpu.max").write_text(content + "\n")
    (root / "pod" / "ctr").mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/pod/ctr\n")
    return root, proc


def test_cgroup_v2_quota_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    root, proc = _v2_tree(tmp_path, {"": "max 100000", "pod": "250000 100000", "pod/ctr": "max 100000"})
    assert cgroup_cpu_quota(proc, root) == 2.5
    assert usable_cpus(64, proc, root) == 3  # rounded up: 2.5 CPUs of time keep 3 threads busy part of it
    assert usable_cpus(2, proc, root) == 2  # the mask bounds it too
    root, proc = _v2_tree(tmp_path / "none", {"": "max 100000"})
    assert cgroup_cpu_quota(proc, root) is None and usable_cpus(64, proc, root) == 64


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    for level, quota in (("", "-1"), ("kubepods", "400000"), ("kubepods/pod1", "150000")):
        (root / "cpu" / level).mkdir(parents=True, exist_ok=True)
        (root / "cpu" / level / "cpu.cfs_quota_us").write_text(quota + "\n")
        (root / "cpu" / level / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("4:memory:/kubepods/pod1\n2:cpu,cpuacct:/kubepods/pod1\n0::/\n")
    assert cgroup_cpu_quota(proc, root) == 1.5 and usable_cpus(32, proc, root) == 2


def test_unreadable_or_malformed_files_set_no_quota(tmp_path: Path) -> None:
    root, proc = _v2_tree(tmp_path, {"pod": "lots 100000", "pod/ctr": "100000 0"})
    assert cgroup_cpu_quota(proc, root) is None
    assert cgroup_cpu_quota(tmp_path / "absent", root) is None
    assert usable_cpus(1, tmp_path / "absent", root) == 1


@pytest.fixture(scope="module", params=["torch", "gguf"])
def signed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict[str, Path]:
    """A signed tiny pair on each engine: torch (safetensors) and llama.cpp (GGUF)."""
    base = tmp_path_factory.mktemp(f"cpus-{request.param}")
    (make_pair if request.param == "torch" else gguf_context)(base / "ctx")
    store = base / "store"
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(store), check=True)
    return {"base": base, "store": store, "engine": request.param}


def _run_json(signed: dict[str, Path], pub: Path, prefix: list[str], env: dict[str, str]) -> dict:
    argv = [*prefix, sys.executable, "-m", "bundler", "run", REF, "--prompt", "hello", "--max-new-tokens", "4",
            "--key", str(pub), "--store", str(signed["store"]), "--json"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["engine"] == {"torch": "torch", "gguf": "llama.cpp"}[signed["engine"]]
    return report


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is not installed")
def test_run_json_reports_one_thread_under_a_one_cpu_mask(signed: dict[str, Path], keypair: tuple[Path, Path]) -> None:
    assert _run_json(signed, keypair[1], ["taskset", "-c", "0"], {})["threads"] == 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a mask of two CPUs or more")
def test_run_json_reports_the_quota_under_a_larger_mask(signed: dict[str, Path], keypair: tuple[Path, Path], tmp_path: Path) -> None:
    """A quota of 1 CPU (then 2) on this machine's mask of 2 or more: the quota decides where it is smaller."""
    cpus = len(os.sched_getaffinity(0))
    for quota, expected in (("100000 100000", 1), ("200000 100000", 2)):
        root = tmp_path / quota.replace(" ", "-")
        own = Path("/proc/self/cgroup").read_text().splitlines()
        for line in own:  # this process's own cgroup paths, reproduced in the fake tree with the quota at its root
            parts = line.split(":", 2)
            if parts[0] == "0":
                (root / parts[2].strip("/")).mkdir(parents=True, exist_ok=True)
        root.mkdir(parents=True, exist_ok=True)
        (root / "cpu.max").write_text(quota + "\n")
        report = _run_json(signed, keypair[1], [], {"SPECBUNDLE_CGROUP_ROOT": str(root)})
        assert report["threads"] == min(expected, cpus)
