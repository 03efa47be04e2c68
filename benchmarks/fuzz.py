"""A seeded fuzz campaign over a signed bundle's store files: `bundle verify` must never crash, hang or pass.

One tiny bundle is packed and signed once. Each case copies that store, changes one file the way a
careless disk or a hostile store owner might (flip, truncate, extend, splice random bytes, empty it,
replace it with a JSON nesting bomb, a JSON value of another type, a directory or a FIFO, or delete it),
then runs `bundle verify --json` on it. Files: index.json, the bundle manifest, its config, a layer,
the signature manifest, the Sigstore bundle, and the trusted public key file.

Outcomes per case: `ok` (exit 0), `refused` (exit 2-6 with one `error: [code]` line), `crash` (exit 1 or
an exception escaping main), `hang` (over the per-case time limit). A case passes when it is refused, or
ok only where the change cannot matter (a key file or index.json edited to the same meaning); `ok` on a
changed content-addressed blob (manifest, config, layer, signature) is counted as a bypass.

Running each case as a CLI subprocess costs ~1 s of interpreter start-up on this machine, so the CLI's
`main` runs in-process inside a few long-lived worker processes, each case bounded by an address space limit in
the worker and a wall-clock limit in the parent (the worker is killed and replaced on a hang). The workers come
from multiprocessing's "forkserver" (`_context`), never a plain fork of the caller: a worker forked from a
caller with threads (a pytest-xdist worker runs execnet's) can inherit a lock held by a thread it does not have,
and one waited in `Thread.start` forever.

    .venv/bin/python benchmarks/fuzz.py [--cases 10000] [--seed 1] [--workers 2] [--timeout 20]

`--surface gguf` fuzzes GGUF headers instead (`gguf_campaign`): each case changes the header of a GGUF
pair's target or draft file (bit flips, cuts, integers overwritten with edge values, inserted entries:
nested arrays, huge counts and lengths, a duplicate key, a token made equal to another, which llama.cpp
aborts on) and runs `bundle pack` on it. Outcomes: `ok` (packed: the change did not matter), `refused`,
`crash` (exit 1, or the worker died: llama.cpp aborting the process), `hang`.

`--surface requests` runs the request-body campaign of benchmarks/fuzz_requests.py instead: mutated
OpenAI request bodies against a real `bundle serve` (0 5xx, 0 hangs, 0 dropped answers, exit 0 at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

REF = "fuzz-spec:1.0.0"
TARGETS = ("index", "manifest", "config", "layer", "signature-manifest", "signature", "key")
BLOBS = {"manifest", "config", "layer", "signature-manifest", "signature"}
MUTATIONS = ("flip", "flips", "truncate", "extend", "splice", "empty", "bomb", "retype", "directory", "fifo", "delete", "zero-fill")
MEMORY_LIMIT = 2 << 30  # per worker address space: a case that tries to exhaust memory fails inside it


def build_base(root: Path) -> dict[str, Any]:
    """Pack and sign the one bundle every case starts from; the paths of the files the cases change."""
    from bundler.trust.keys import generate_keypair
    from bundletree import make_tree

    make_tree(root / "ctx", name="fuzz-spec")
    key, pub = generate_keypair(root / "keys")
    store = root / "store"
    code = _main(["pack", str(root / "ctx"), "-t", REF, "--key", str(key), "--store", str(store)])[0]
    assert code == 0, "packing the base bundle failed"
    index = json.loads((store / "index.json").read_text())
    blobs = store / "blobs" / "sha256"
    [tagged] = [m for m in index["manifests"] if "annotations" in m]
    # The model-signing signature (the cosign-style one beside it is the other artifact): a change to either is
    # a damaged store, which verify refuses.
    from bundler.trust.cosign import MODEL_SIGNING_KIND, kind_of

    [sig] = [m for m in index["manifests"] if "artifactType" in m and not _is_attestation(blobs, m)
             and kind_of(_signature_payload(blobs, m)) == MODEL_SIGNING_KIND]
    manifest = json.loads((blobs / tagged["digest"][7:]).read_text())
    sig_manifest = json.loads((blobs / sig["digest"][7:]).read_text())
    files = {
        "index": "index.json",
        "manifest": f"blobs/sha256/{tagged['digest'][7:]}",
        "config": f"blobs/sha256/{manifest['config']['digest'][7:]}",
        "layer": [f"blobs/sha256/{layer['digest'][7:]}" for layer in manifest["layers"]],
        "signature-manifest": f"blobs/sha256/{sig['digest'][7:]}",
        "signature": f"blobs/sha256/{sig_manifest['layers'][0]['digest'][7:]}",
    }
    return {"store": str(store), "pub": str(pub), "files": files}


def _is_attestation(blobs: Path, entry: dict[str, Any]) -> bool:
    """An SBOM or provenance referrer (a Sigstore bundle too, told from signatures by its predicate type annotation)."""
    from bundler.format.mediatypes import ATTESTATION_PREDICATES, PREDICATE_TYPE_ANNOTATION

    manifest = json.loads((blobs / entry["digest"][7:]).read_text())
    return manifest.get("annotations", {}).get(PREDICATE_TYPE_ANNOTATION) in ATTESTATION_PREDICATES


def _signature_payload(blobs: Path, entry: dict[str, Any]) -> bytes:
    """The Sigstore bundle a signature artifact's index entry leads to."""
    manifest = json.loads((blobs / entry["digest"][7:]).read_text())
    return (blobs / manifest["layers"][0]["digest"][7:]).read_bytes()


def _main(args: list[str]) -> tuple[int, str, str]:
    """The CLI's main, in this process: (exit code, stdout, stderr)."""
    from bundler.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main.main(args=args, prog_name="bundle")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # noqa: BLE001 - escaping main at all is a crash
            return 1, out.getvalue(), f"escaped main: {type(exc).__name__}: {exc}"
    return code, out.getvalue(), err.getvalue()


def _mutate(path: Path, how: str, rng: random.Random) -> None:
    data = path.read_bytes() if path.is_file() else b""
    if how == "flip" and data:
        i = rng.randrange(len(data))
        data = data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]
    elif how == "flips" and data:
        buf = bytearray(data)
        for _ in range(rng.randint(2, 32)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        data = bytes(buf)
    elif how == "truncate":
        data = data[: rng.randrange(len(data) + 1)]
    elif how == "extend":
        data = data + rng.randbytes(rng.randint(1, 4096))
    elif how == "splice" and data:
        i = rng.randrange(len(data))
        data = data[:i] + rng.randbytes(rng.randint(1, 64)) + data[i + rng.randint(0, 64) :]
    elif how == "empty":
        data = b""
    elif how == "bomb":
        depth = rng.choice([100, 600, 5000, 200_000])
        data = (b"[" * depth + b"]" * depth) if rng.random() < 0.5 else (b'{"a":' * depth + b"1" + b"}" * depth)
    elif how == "retype":
        data = rng.choice([b"[]", b"null", b"1e999", b'"x"', b'{"manifests": {}}', b'{"schemaVersion": 2, "subject": [], "layers": {}}', b"{" + b'"k":1,' * 50_000 + b'"k":2}'])
    elif how == "zero-fill":
        data = bytes(len(data))
    if how == "delete":
        path.unlink()
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    else:
        os.chmod(path, 0o644)
        path.write_bytes(data)


def run_case(base: dict[str, Any], seed: int, case: int, work: Path) -> dict[str, Any]:
    """One case: copy the base store, change one file, run verify; the outcome."""
    rng = random.Random(seed * 1_000_003 + case)
    target, how = rng.choice(TARGETS), rng.choice(MUTATIONS)
    root = work / f"case-{case}"
    store = root / "store"
    shutil.copytree(base["store"], store)
    pub = root / "bundle.pub"
    shutil.copy(base["pub"], pub)
    if target == "key":
        path = pub
    else:
        rel = base["files"][target]
        path = store / (rng.choice(rel) if isinstance(rel, list) else rel)
    before = path.read_bytes()
    _mutate(path, how, rng)
    changed = not path.is_file() or path.read_bytes() != before
    try:
        code, out, err = _main(["verify", REF, "--json", "--key", str(pub), "--store", str(store)])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = err.strip().splitlines()
    if code == 0:
        outcome = "bypass" if changed and target in BLOBS else "ok"
    elif code == 1 or not lines or not lines[-1].startswith("error: ["):
        outcome = "crash"
    else:
        outcome = "refused"
    return {"case": case, "target": target, "mutation": how, "exit": code, "outcome": outcome, "error": lines[-1][:200] if lines else ""}


def _worker(conn: Any, base: dict[str, Any], seed: int, work: str, run: Any = None) -> None:
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    os.environ.pop("BUNDLE_TRUSTED_KEYS", None)
    while True:
        case = conn.recv()
        if case is None:
            return
        try:
            conn.send((run or run_case)(base, seed, case, Path(work)))
        except MemoryError:
            conn.send({"case": case, "outcome": "crash", "error": "MemoryError outside main", "exit": 1})


def _context() -> Any:
    """multiprocessing's forkserver, the CLI imported in it once: each worker is a fork of that one-threaded
    server (with the CLI's imports done), whatever threads the caller runs."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["bundler.cli"])
    return ctx


def campaign(cases: int, seed: int = 1, workers: int = 2, timeout: float = 20.0, progress: bool = False,
             build: Any = None, run: Any = None) -> dict[str, Any]:
    """Run `cases` seeded cases on `workers` processes; the tally and every non-refused, non-ok case.
    build(root) -> base and run(base, seed, case, work) -> outcome: another surface (default: the store's)."""
    ctx = _context()
    tmp = Path(tempfile.mkdtemp(prefix="specbundle-fuzz-"))
    try:
        base = (build or build_base)(tmp / "base")
        work = tmp / "work"
        work.mkdir()
        started = time.perf_counter()
        tally: Counter[str] = Counter()
        by_error: Counter[str] = Counter()
        bad: list[dict[str, Any]] = []
        pending = list(range(cases))[::-1]
        procs: list[dict[str, Any]] = []

        def spawn() -> dict[str, Any]:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child, base, seed, str(work), run), daemon=True)
            p.start()
            return {"proc": p, "conn": parent, "case": None, "since": 0.0}

        procs = [spawn() for _ in range(max(1, workers))]
        done = 0
        while done < cases:
            for slot in procs:
                if slot["case"] is None and pending:
                    slot["case"] = pending.pop()
                    slot["since"] = time.perf_counter()
                    slot["conn"].send(slot["case"])
            for i, slot in enumerate(procs):
                if slot["case"] is None:
                    continue
                if slot["conn"].poll(0.01):
                    try:
                        result = slot["conn"].recv()
                    except EOFError:  # the worker died (killed by its memory limit): a crash
                        result = {"case": slot["case"], "outcome": "crash", "error": "worker died", "exit": -1}
                        procs[i] = spawn()
                    tally[result["outcome"]] += 1
                    if result["outcome"] == "refused":
                        by_error[result["error"].split("]")[0] + "]"] += 1
                    else:
                        by_error["ok"] += result["outcome"] == "ok"
                    if result["outcome"] not in ("refused", "ok"):
                        bad.append(result)
                    procs[i]["case"] = None
                    done += 1
                    if progress and done % 500 == 0:
                        print(f"{done}/{cases} {dict(tally)} {time.perf_counter() - started:.0f}s", file=sys.stderr)
                elif not slot["proc"].is_alive() or time.perf_counter() - slot["since"] > timeout:
                    slot["proc"].kill()
                    slot["proc"].join()
                    tally["hang" if slot["proc"].exitcode in (-9, None) and time.perf_counter() - slot["since"] > timeout else "crash"] += 1
                    bad.append({"case": slot["case"], "outcome": "hang", "error": f"over {timeout}s"})
                    procs[i] = spawn()
                    done += 1
        for slot in procs:
            with contextlib.suppress(OSError, BrokenPipeError):
                slot["conn"].send(None)
            slot["proc"].join(timeout=5)
            if slot["proc"].is_alive():
                slot["proc"].kill()
        seconds = time.perf_counter() - started
        return {"cases": cases, "seed": seed, "workers": workers, "seconds": round(seconds, 1), "cases_per_second": round(cases / seconds, 1),
                "outcomes": dict(tally), "errors": dict(by_error.most_common()), "bad": bad[:50]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- GGUF headers --------------------------------------------------------------------------------------------

GGUF_REF = "fuzz-gguf:1.0.0"
GGUF_MUTATIONS = ("flip", "flips", "truncate", "u64", "u32", "splice", "insert", "same-token")
EDGE_U64 = (0, 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63, 2**64 - 1)
EDGE_U32 = (0, 1, 7, 8, 9, 12, 13, 4, 5, 10, 2**31, 2**32 - 1)


def _write_gguf_context(ctx: Path) -> None:
    """make_pair's context with a tiny GGUF pair as target and draft; exits 0 when `bundle pack` accepts it."""
    from tinygguf import write_gguf
    from tinymodels import make_pair

    make_pair(ctx)
    for role, size in (("target", dict(hidden=128, layers=2)), ("draft", dict(hidden=32, layers=1, heads=2, kv_heads=1))):
        shutil.rmtree(ctx / role)
        (ctx / role).mkdir()
        write_gguf(ctx / role / "model.gguf", seed=0 if role == "target" else 1, **size)
    code, _, err = _main(["pack", str(ctx), "-t", GGUF_REF, "--store", str(ctx.parent / "check-store")])
    sys.exit(0 if code == 0 else f"packing the base GGUF pair failed: {err}")


def build_gguf_base(root: Path) -> dict[str, Any]:
    """A bundle context with a tiny GGUF pair that `bundle pack` accepts; where each file's header ends.
    It is built in a child process: make_pair's torch threads stay out of the caller."""
    ctx = root / "ctx"
    builder = _context().Process(target=_write_gguf_context, args=(ctx,))
    builder.start()
    builder.join()
    assert builder.exitcode == 0, "building the base GGUF pair failed"
    ends = {}
    for role in ("target", "draft"):
        data = (ctx / role / "model.gguf").read_bytes()
        ends[role] = data.index(b"output.weight") + len(b"output.weight") + 40  # the last tensor info
    return {"ctx": str(ctx), "header_end": ends}


def _hostile_entry(rng: random.Random) -> bytes:
    """One metadata entry a hostile tool could write: nested arrays, a huge count or length, a duplicate key,
    a tokenizer field of the wrong type."""
    import struct

    def text(t: bytes) -> bytes:
        return struct.pack("<Q", len(t)) + t

    kind = rng.choice(["nest", "deep", "count", "length", "duplicate", "wrong-type", "unknown-type"])
    if kind == "nest":
        return text(b"fuzz.nested") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 0, 0)
    if kind == "deep":
        return text(b"fuzz.deep") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * rng.choice([10, 1000, 100_000])
    if kind == "count":
        return text(b"fuzz.count") + struct.pack("<IIQ", 9, rng.choice([0, 4, 8, 12]), rng.choice(EDGE_U64[3:]))
    if kind == "length":
        return text(b"fuzz.length") + struct.pack("<IQ", 8, rng.choice(EDGE_U64[2:]))
    if kind == "duplicate":
        return text(b"general.architecture") + struct.pack("<I", 8) + text(b"llama")
    if kind == "wrong-type":
        key = rng.choice([b"tokenizer.ggml.eos_token_id", b"tokenizer.ggml.add_bos_token", b"llama.block_count"])
        return text(key) + struct.pack("<I", 8) + text(b"many")
    return text(b"fuzz.type") + struct.pack("<I", rng.choice([13, 99, 2**32 - 1]))


def _mutate_gguf(path: Path, end: int, how: str, rng: random.Random) -> None:
    import struct

    data = bytearray(path.read_bytes())
    at = rng.randrange(end)
    if how == "flip":
        data[at] ^= 1 << rng.randrange(8)
    elif how == "flips":
        for _ in range(rng.randint(2, 32)):
            data[rng.randrange(end)] = rng.randrange(256)
    elif how == "truncate":
        del data[at:]
    elif how == "u64":
        data[at : at + 8] = struct.pack("<Q", rng.choice(EDGE_U64))
    elif how == "u32":
        data[at : at + 4] = struct.pack("<I", rng.choice(EDGE_U32))
    elif how == "splice":
        data[at : at + rng.randint(0, 64)] = rng.randbytes(rng.randint(1, 64))
    elif how == "insert":  # one more entry, first of the metadata: n_kv (bytes 16-24) counts it
        (n_kv,) = struct.unpack_from("<Q", data, 16)
        struct.pack_into("<Q", data, 16, n_kv + 1)
        data[24:24] = _hostile_entry(rng)
    elif how == "same-token":  # a token's text made another's of the same length: two equal tokens
        from tinygguf import tokenizer_fields

        tokens = [t.encode() for t in tokenizer_fields()["tokens"]]
        a = rng.randrange(len(tokens))
        same = [t for t in tokens if len(t) == len(tokens[a]) and t != tokens[a]]
        if same:
            old = struct.pack("<Q", len(tokens[a])) + tokens[a]
            i = data.find(old)
            data[i + 8 : i + 8 + len(tokens[a])] = rng.choice(same)
    path.write_bytes(bytes(data))


def run_gguf_case(base: dict[str, Any], seed: int, case: int, work: Path) -> dict[str, Any]:
    """One case: copy the GGUF context, change one file's header, run `bundle pack`; the outcome."""
    rng = random.Random(seed * 1_000_003 + case)
    role, how = rng.choice(["target", "draft", "both"]), rng.choice(GGUF_MUTATIONS)
    root = work / f"case-{case}"
    ctx = root / "ctx"
    shutil.copytree(base["ctx"], ctx)
    # "both": the same change to both files (their metadata lie at the same offsets), so a hostile tokenizer
    # passes the gate's comparison and reaches llama.cpp
    state = rng.getstate()
    for changed in (["target", "draft"] if role == "both" else [role]):
        rng.setstate(state)
        end = min(base["header_end"].values()) if role == "both" else base["header_end"][changed]
        _mutate_gguf(ctx / changed / "model.gguf", end, how, rng)
    try:
        code, _, err = _main(["pack", str(ctx), "-t", GGUF_REF, "--store", str(root / "store")])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = err.strip().splitlines()
    if code == 0:
        outcome = "ok"
    elif code == 1 or not lines or not lines[-1].startswith("error: ["):
        outcome = "crash"
    else:
        outcome = "refused"
    return {"case": case, "target": role, "mutation": how, "exit": code, "outcome": outcome, "error": lines[-1][:200] if lines else ""}


def gguf_campaign(cases: int, seed: int = 1, workers: int = 2, timeout: float = 60.0, progress: bool = False) -> dict[str, Any]:
    """`campaign` on GGUF headers: `bundle pack` on a pair whose target or draft header was changed."""
    return campaign(cases, seed, workers, timeout, progress, build=build_gguf_base, run=run_gguf_case)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per case before it counts as a hang")
    parser.add_argument("--surface", choices=["store", "gguf", "requests"], default="store",
                        help="store: mutated store files under `bundle verify`; gguf: mutated GGUF headers under `bundle pack`; "
                             "requests: mutated request bodies against a real `bundle serve` (benchmarks/fuzz_requests.py)")
    args = parser.parse_args()
    if args.surface == "gguf":
        result = gguf_campaign(args.cases, args.seed, args.workers, args.timeout, progress=True)
    elif args.surface == "requests":
        from fuzz_requests import campaign as requests_campaign

        result = requests_campaign(args.cases, args.seed, args.workers, args.timeout, progress=True)
    else:
        result = campaign(args.cases, args.seed, args.workers, args.timeout, progress=True)
    for name, count in sorted(result["outcomes"].items()):
        print(f"{name:10} {count}")
    print(f"{result['cases']} cases in {result['seconds']} s ({result['cases_per_second']}/s), seed {result['seed']}, {result['workers']} workers")
    print(json.dumps(result))
    if any(result["outcomes"].get(k) for k in ("crash", "hang", "bypass", "error", "dropped", "bad-answer", "exit")):
        sys.exit(1)


if __name__ == "__main__":
    main()
