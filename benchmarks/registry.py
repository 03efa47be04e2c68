"""Push and pull a generated 1 GiB bundle through a loopback docker-registry; compare with `skopeo copy`.

Each transfer goes to a fresh registry (its own storage), so nothing is deduplicated between tools.
Push: `bundle push` vs `skopeo copy oci:STORE:REF docker://...` of the same layout.
Pull: `bundle pull` (download, digest checks, full verify, commit) vs `skopeo copy docker://... oci:DIR`.
Prints one JSON object; ratio = skopeo seconds / bundle seconds (>= 0.8 is the goal).

    .venv/bin/python benchmarks/registry.py [--size-mib 1024] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bundletree import make_tree  # noqa: E402
from registry_server import running_registry  # noqa: E402


def _bundle(*args: str, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "bundler", *args], check=True, env=env, stdout=subprocess.DEVNULL)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _big_tree(root: Path, size_mib: int) -> Path:
    """The test tree with its target (3/4) and draft (1/4) weights replaced by incompressible bytes."""
    make_tree(root, name="bench-spec")
    rng = np.random.default_rng(0)
    for role, share in (("target", 0.75), ("draft", 0.25)):
        n = int(size_mib * share) << 20
        save_file({"model.embed_tokens.weight": np.frombuffer(rng.bytes(n), dtype=np.uint8)}, str(root / role / "model.safetensors"))
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-registry-", dir=os.environ.get("BENCH_TMP")) as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "docker").mkdir()
        env = {**os.environ, "DOCKER_CONFIG": str(tmp / "docker"), "PYTHONWARNINGS": "ignore"}
        env.pop("BUNDLE_REGISTRY_USER", None)
        _bundle("keygen", "-o", str(tmp / "keys"), env=env)
        tree = _big_tree(tmp / "ctx", args.size_mib)
        store = tmp / "store"
        local = "bench/bench-spec:v1"
        _bundle("pack", str(tree), "-t", local, "--store", str(store), "--key", str(tmp / "keys" / "bundle.key"), env=env)
        layout_bytes = sum(p.stat().st_size for p in (store / "blobs" / "sha256").iterdir())
        results: dict[str, list[float]] = {"bundle_push": [], "skopeo_push": [], "bundle_pull": [], "skopeo_pull": []}
        for rnd in range(args.rounds):
            with running_registry() as reg_a, running_registry() as reg_b:
                ours = f"{reg_a.host}/bench/bench-spec:v1"
                # the store tags a bundle by its full reference: tag the same manifest for this registry
                index = json.loads((store / "index.json").read_text())
                entry = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == local)
                index["manifests"].append({**entry, "annotations": {"org.opencontainers.image.ref.name": ours}})
                (store / "index.json").write_text(json.dumps(index))
                results["skopeo_push"].append(_timed(lambda: subprocess.run(
                    ["skopeo", "copy", "-q", "--dest-tls-verify=false", f"oci:{store}:{local}", f"docker://{reg_b.host}/bench/bench-spec:v1"], check=True)))
                results["bundle_push"].append(_timed(lambda: _bundle("push", ours, "--plain-http", "--store", str(store), env=env)))
                pulled = tmp / f"pulled-{rnd}"
                results["bundle_pull"].append(_timed(lambda: _bundle(
                    "pull", ours, "--plain-http", "--key", str(tmp / "keys" / "bundle.pub"), "--store", str(pulled), env=env)))
                results["skopeo_pull"].append(_timed(lambda: subprocess.run(
                    ["skopeo", "copy", "-q", "--src-tls-verify=false", f"docker://{reg_b.host}/bench/bench-spec:v1", f"oci:{tmp / f'skopeo-{rnd}'}:v1"], check=True)))
                index["manifests"] = [m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != ours]
                (store / "index.json").write_text(json.dumps(index))
                for d in (pulled, tmp / f"skopeo-{rnd}"):
                    subprocess.run(["rm", "-rf", str(d)], check=True)
        best = {k: min(v) for k, v in results.items()}
        mib = layout_bytes / 2**20
        out = {
            "bundle_bytes": layout_bytes,
            "rounds": args.rounds,
            "seconds": {k: [round(x, 2) for x in v] for k, v in results.items()},
            "push_mib_s": {"bundle": round(mib / best["bundle_push"], 1), "skopeo": round(mib / best["skopeo_push"], 1)},
            "pull_mib_s": {"bundle": round(mib / best["bundle_pull"], 1), "skopeo": round(mib / best["skopeo_pull"], 1)},
            "push_ratio_vs_skopeo": round(best["skopeo_push"] / best["bundle_push"], 2),
            "pull_ratio_vs_skopeo": round(best["skopeo_pull"] / best["bundle_pull"], 2),
            "notes": "best of rounds; bundle pull includes the full verify (signature, every file) before it commits",
        }
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
