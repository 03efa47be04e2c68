"""`bundle run` start-up of this tree against an older commit's, in the same command (issue #25: the new layout
must not make start-up slower).

Each tree's `bundle` runs as `python -m bundler` with that tree first on the import path (the older commit is
checked out into a temporary git worktree). Per bundle and tree it times, alternating the trees `--rounds` times:

- `bundle --help` (the CLI alone: must import no torch);
- `bundle run REF --max-new-tokens 1 --raw --prompt ...` (verify, checkout, load, the first token), the whole
  process's wall time.

    .venv/bin/python benchmarks/startup.py [--base 6578e38] [--rounds 5]
        [--ref smollm2-spec:1.0.0 --ref smollm2-spec-gguf:1.0.0] [--store demo/work/store]
        [--key demo/work/keys/bundle.pub] [--out FILE]

Prints one JSON object: per bundle and tree the median and min seconds, and head / base (> 1 is slower).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.bench.machine import cpu_info  # noqa: E402


def timed(tree: Path, args: list[str], store: str, key: str) -> float:
    """Wall seconds of one `bundle` process run from `tree`'s code."""
    env = dict(os.environ, PYTHONPATH=str(tree), BUNDLE_HOME=store)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bundler", *args, *(["--key", key] if args[0] == "run" else [])], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="6578e38", help="the older commit (default: before the one-house moves)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ref", action="append", help="bundles to run (default: both demo bundles)")
    parser.add_argument("--store", default=str(ROOT / "demo" / "work" / "store"))
    parser.add_argument("--key", default=str(ROOT / "demo" / "work" / "keys" / "bundle.pub"))
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    refs = args.ref or ["smollm2-spec:1.0.0", "smollm2-spec-gguf:1.0.0"]
    store, key = str(Path(args.store).resolve()), str(Path(args.key).resolve())
    cases = {"help": ["--help"]}
    cases.update({ref: ["run", ref, "--max-new-tokens", "1", "--raw", "--prompt", "def fib(n):"] for ref in refs})
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_tree), args.base],
                       check=True, capture_output=True)
        try:
            trees = {"head": ROOT, "base": base_tree}
            times: dict[str, dict[str, list[float]]] = {case: {"head": [], "base": []} for case in cases}
            for case, argv in cases.items():
                for tree in trees.values():  # one untimed run each: the page cache holds the weights for both
                    timed(tree, argv, store, key)
                for _ in range(args.rounds):
                    for name, tree in trees.items():
                        times[case][name].append(timed(tree, argv, store, key))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False)
    report = {"cpu": cpu_info(), "base": args.base, "rounds": args.rounds, "cases": {}}
    for case, by_tree in times.items():
        medians = {name: statistics.median(values) for name, values in by_tree.items()}
        report["cases"][case] = {
            **{name: {"median_s": round(medians[name], 3), "min_s": round(min(values), 3)} for name, values in by_tree.items()},
            "head_over_base": round(medians["head"] / medians["base"], 3),
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
