"""Time `bundle verify` on a generated 1 GiB bundle against the machine's hashing limit and `model_signing`.

The bundle: random bytes as safetensors files, target 11/12 of the size in 2 shards, draft 1/12, packed and
signed with the CLI. Then, in the same run and from page cache (one untimed warm-up each, best of N):

  verify          bundler.trust.verify.verify_bundle in-process (every check, rollback state not recorded)
  openssl_files   `openssl dgst -sha256` over the same layer blobs, one process per core, the files split
                  across cores by size (a layer is one file: neither side can split it)
  openssl_ideal   the hashing limit: total bytes / (cores x one core's openssl rate), as if perfectly split
  model_signing   model_signing's Python API verifying the unpacked files with the public key

Prints a table and, last, one JSON line.

    .venv/bin/python benchmarks/verify.py [--size-mib 1024] [--rounds 3]
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
from typing import Callable

import numpy as np
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bundletree import make_tree  # noqa: E402

REF = "bench-spec:1.0.0"


def _bundle(*args: str) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    subprocess.run([sys.executable, "-m", "bundler", *args], check=True, env=env, stdout=subprocess.DEVNULL)


def _big_tree(root: Path, size_mib: int, target_shards: int = 2) -> Path:
    """The test tree with incompressible safetensors weights: target in `target_shards` shards (11/12), draft 1 file (1/12):
    a draft small enough for pack's pairing check (a size ratio of at least 4)."""
    make_tree(root, name="bench-spec")
    rng = np.random.default_rng(0)
    (root / "target" / "model.safetensors").unlink()
    target = (size_mib * 11 // 12) << 20
    n_shards = max(1, target_shards)
    shards = {f"target/model-{i + 1:05d}-of-{n_shards:05d}.safetensors": target // n_shards + (target % n_shards if i == 0 else 0) for i in range(n_shards)}
    shards["draft/model.safetensors"] = (size_mib << 20) - target
    for name, n in shards.items():
        save_file({"weight": np.frombuffer(rng.bytes(n), dtype=np.uint8)}, str(root / name))
    return root


def _best(fn: Callable[[], object], rounds: int) -> float:
    fn()  # warm-up: page cache, imports, thread pools
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _split(files: list[Path], groups: int) -> list[list[Path]]:
    """Greedy by size, biggest first, onto the least loaded core."""
    out: list[list[Path]] = [[] for _ in range(groups)]
    load = [0] * groups
    for f in sorted(files, key=lambda p: -p.stat().st_size):
        i = load.index(min(load))
        out[i].append(f)
        load[i] += f.stat().st_size
    return [g for g in out if g]


def _openssl(groups: list[list[Path]]) -> None:
    procs = [subprocess.Popen(["openssl", "dgst", "-sha256", *map(str, g)], stdout=subprocess.DEVNULL) for g in groups]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit("openssl dgst failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target-shards", type=int, default=2, help="files the target's weights are split into (model_signing hashes files in parallel; a layer is one sha256 stream)")
    args = parser.parse_args()

    import model_signing

    from bundler.trust.cosign import MODEL_SIGNING_KIND, kind_of
    from bundler.trust.keys import load_public_key, trusted_keys
    from bundler.store.modelkit import load_modelkit
    from bundler.store.refs import parse_ref
    from bundler.store.referrers import find_signatures
    from bundler.store.layout import Store
    from bundler.trust.verify import verify_bundle

    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench-verify-", dir=os.environ.get("BENCH_TMP")) as tmp_s:
        tmp = Path(tmp_s)
        _bundle("keygen", "-o", str(tmp / "keys"))
        key, pub = tmp / "keys" / "bundle.key", tmp / "keys" / "bundle.pub"
        tree = _big_tree(tmp / "ctx", args.size_mib, args.target_shards)
        store_dir = tmp / "store"
        _bundle("pack", str(tree), "-t", REF, "--key", str(key), "--store", str(store_dir))
        shutil.rmtree(tree)  # keep the peak disk use at two copies
        unpacked = tmp / "unpacked"
        _bundle("unpack", REF, "-d", str(unpacked), "--key", str(pub), "--store", str(store_dir))

        store, ref = Store(store_dir), parse_ref(REF)
        mk = load_modelkit(store, ref)
        blobs = [store.blob_path(desc.digest) for _, desc in mk.layers]
        total = sum(p.stat().st_size for p in blobs)
        trusted = trusted_keys([pub])
        signature = tmp / "bundle.sig"
        signature.write_bytes(next(p for _, p in find_signatures(store, mk.digest) if kind_of(p) == MODEL_SIGNING_KIND))

        def ours() -> None:
            report = verify_bundle(store, ref, trusted, record=False)
            if not report.ok:
                raise SystemExit(f"verify failed: {report.error.line() if report.error else '?'}")

        def theirs() -> None:
            model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(unpacked, signature)

        groups = _split(blobs, cores)
        t_verify = _best(ours, args.rounds)
        t_openssl = _best(lambda: _openssl(groups), args.rounds)
        t_one_core = _best(lambda: _openssl([blobs]), max(1, args.rounds - 1))
        t_ideal = t_one_core / cores
        t_ms = _best(theirs, args.rounds)

    gib = total / 2**30
    rows = [
        ("bundle verify (in-process)", t_verify),
        (f"openssl dgst, {len(groups)} processes, files split", t_openssl),
        (f"openssl dgst ideal ({cores} cores, bytes split)", t_ideal),
        ("model_signing verify (in-process)", t_ms),
    ]
    print(f"{gib:.2f} GiB in {len(blobs)} layer blobs, {cores} cores, best of {args.rounds} from page cache")
    print(f"{'what':<46} {'s':>7} {'s/GiB':>7} {'verify / this':>14}")
    for name, t in rows:
        print(f"{name:<46} {t:7.3f} {t / gib:7.3f} {t_verify / t:14.2f}")
    print(json.dumps({
        "bytes": total,
        "cores": cores,
        "rounds": args.rounds,
        "seconds": {"verify": round(t_verify, 3), "openssl_files": round(t_openssl, 3), "openssl_ideal": round(t_ideal, 3),
                    "openssl_one_core": round(t_one_core, 3), "model_signing": round(t_ms, 3)},
        "ratio_vs_openssl_files": round(t_verify / t_openssl, 3),
        "ratio_vs_openssl_ideal": round(t_verify / t_ideal, 3),
        "ratio_vs_model_signing": round(t_verify / t_ms, 3),
        "goal": "ratio_vs_openssl <= 1.15 and ratio_vs_model_signing < 1",
    }))


if __name__ == "__main__":
    main()
