"""Pack a generated 1 GiB two-model tree; report pack time as a ratio to `tar -cf` + `openssl dgst -sha256`
of the same tree (two passes, the baseline), measured in the same run, and pack's peak memory.

    .venv/bin/python benchmarks/pack.py [--gib 1.0] [--rounds 3] [--keep]

Goal (issue 2): ratio <= 1.0, peak memory < 200 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

KITFILE = """\
manifestVersion: 1.0.0
package: {name: bench-spec, version: 1.0.0}
model:
  path: target/
  parts:
    - {name: draft, path: draft/, type: draft}
    - {name: tokenizer, path: tokenizer/, type: tokenizer}
"""

PACK_SNIPPET = """
import sys, time
from pathlib import Path
from bundler.verbs.pack import pack
from bundler.store.refs import parse_ref
from bundler.store.layout import Store
t = time.perf_counter()
pack(Path(sys.argv[1]), parse_ref("bench-spec:1.0.0"), Store(Path(sys.argv[2])))
print(time.perf_counter() - t)
"""


def make_tree(root: Path, gib: float) -> int:
    """target/ in two shards (3/4 of the bytes), draft/ (1/4), a tokenizer: random bytes, written once."""
    from bundletree import tokenizer_json

    total = int(gib * (1 << 30))
    sizes = {"target/model-00001-of-00002.safetensors": total * 3 // 8, "target/model-00002-of-00002.safetensors": total * 3 // 8,
             "draft/model.safetensors": total - 2 * (total * 3 // 8)}
    for name, size in sizes.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, 16 << 20)
                f.write(os.urandom(n))
                left -= n
    for model in ("target", "draft"):
        (root / model / "config.json").write_text('{"model_type": "llama"}')
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer.json").write_text(tokenizer_json())
    (root / "Kitfile").write_text(KITFILE)
    return total


def baseline(ctx: Path, work: Path) -> float:
    """tar -cf the same tree, then openssl dgst -sha256 the tar: write, then hash, two passes."""
    tar = work / "baseline.tar"
    start = time.perf_counter()
    subprocess.run(["tar", "-cf", str(tar), "-C", str(ctx), "target", "draft", "tokenizer"], check=True)
    subprocess.run(["openssl", "dgst", "-sha256", str(tar)], check=True, capture_output=True)
    elapsed = time.perf_counter() - start
    tar.unlink()
    return elapsed


def ours(ctx: Path, work: Path) -> tuple[float, float, float]:
    """(pack time measured inside the process, whole process wall time, peak RSS MiB) for one pack into a fresh store."""
    store = work / "store"
    shutil.rmtree(store, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", PACK_SNIPPET, str(ctx), str(store)], stdout=subprocess.PIPE, cwd=ROOT)
    out = proc.stdout.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"pack failed with status {status}")
    shutil.rmtree(store)
    return float(out), wall, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the generated tree")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="specbundle-bench-pack-", dir=os.environ.get("BENCH_TMP")))
    try:
        ctx = work / "ctx"
        total = make_tree(ctx, args.gib)
        subprocess.run(["cat", *map(str, ctx.rglob("*.safetensors"))], stdout=subprocess.DEVNULL, check=True)  # page cache
        base, pack_in, pack_wall, rss = [], [], [], []
        for _ in range(args.rounds):  # interleaved, so both see the same machine
            base.append(baseline(ctx, work))
            t_in, t_wall, peak = ours(ctx, work)
            pack_in.append(t_in), pack_wall.append(t_wall), rss.append(peak)
        b, p, w = min(base), min(pack_in), min(pack_wall)
        result = {
            "bytes": total, "rounds": args.rounds, "cpus": os.cpu_count(),
            "baseline_tar_then_openssl_s": round(b, 3), "pack_s": round(p, 3), "pack_process_wall_s": round(w, 3),
            "ratio_pack_vs_baseline": round(p / b, 3), "ratio_process_vs_baseline": round(w / b, 3),
            "peak_rss_mib": round(max(rss), 1), "pack_gib_per_s": round(total / (1 << 30) / p, 3),
        }
        print(f"{'tar -cf + openssl dgst (2 passes)':<36} {b:7.3f} s")
        print(f"{'bundle pack (in process)':<36} {p:7.3f} s   ratio {p / b:.2f}  (goal <= 1.0)")
        print(f"{'bundle pack (whole process)':<36} {w:7.3f} s   ratio {w / b:.2f}")
        print(f"{'peak memory of the pack process':<36} {max(rss):7.1f} MiB (goal < 200)")
        print(json.dumps(result))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
