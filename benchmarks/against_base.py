"""`bundle verify` and `bundle pull` of this tree against an older commit's, in the same command.

Runs benchmarks/verify.py (each tree's own copy: it imports `bundler` in-process; the two copies are the same)
and benchmarks/registry.py (this tree's copy: it only runs `bundle` subprocesses) once with the older commit's
`bundler` and once with this tree's, alternating, `--rounds` times. Each run already reports itself as a
ratio against a tool timed in the same run (openssl for verify, skopeo for pull), so the comparison is a
ratio of ratios and a busy machine cancels out of it as far as it can.

    .venv/bin/python benchmarks/against_base.py [--base b5f9d7d] [--size-mib 512] [--rounds 2]

Prints one JSON object: per tree the medians, and head / base for each (verify: > 1 is slower; pull:
< 1 is slower). The goal of issue #14: both within 5%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(script: Path, tree: Path, *args: str) -> dict:
    """One benchmark script with `tree`'s bundler first on the import path; its last JSON object."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(script), *args], check=True, capture_output=True,
                          text=True, env=env, cwd=tree)
    out = proc.stdout
    start = out.rfind("\n{") + 1 if not out.startswith("{") else 0
    return json.loads(out[start:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="b5f9d7d", help="the older commit (default: the end of the previous round)")
    parser.add_argument("--size-mib", default="512")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-base-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.base], check=True)
        try:
            trees = {"base": base, "head": ROOT}
            verify: dict[str, list[float]] = {"base": [], "head": []}
            pull: dict[str, list[float]] = {"base": [], "head": []}
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    verify[name].append(_run(tree / "benchmarks" / "verify.py", tree, "--size-mib", args.size_mib, "--rounds", "2")["ratio_vs_openssl_files"])
                    pull[name].append(_run(ROOT / "benchmarks" / "registry.py", tree, "--size-mib", args.size_mib, "--rounds", "1")["pull_ratio_vs_skopeo"])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    med = {k: {"verify_vs_openssl": statistics.median(verify[k]), "pull_vs_skopeo": statistics.median(pull[k])} for k in verify}
    print(json.dumps({
        "base": args.base,
        "size_mib": int(args.size_mib),
        "rounds": args.rounds,
        "runs": {"verify_vs_openssl": verify, "pull_vs_skopeo": pull},
        "median": med,
        "verify_head_over_base": round(med["head"]["verify_vs_openssl"] / med["base"]["verify_vs_openssl"], 3),
        "pull_head_over_base": round(med["head"]["pull_vs_skopeo"] / med["base"]["pull_vs_skopeo"], 3),
        "goal": "verify_head_over_base <= 1.05 and pull_head_over_base >= 0.95",
    }, indent=2))


if __name__ == "__main__":
    main()
