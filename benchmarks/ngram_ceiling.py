"""How far prompt lookup can pay on a GGUF target on this machine: the ceiling, and what policies reach.

    .venv/bin/python benchmarks/ngram_ceiling.py [--ctx demo/work/ctx-gguf] [--gguf FILE.gguf ...]
        [--prompts grounded] [--max-new-tokens 256] [--threads 2]

Greedy prompt lookup is deterministic given the target's greedy output: at each position the n-gram index
of the prompt and the text so far proposes the same tokens whatever the loop did before. So one plain run
over the prompts, and the cost of a verify pass of each length (1..10 tokens, through the engine `bundle
run` uses, at the prompts' context), measure everything; policies are replayed on those records:

- `oracle`: at every position the best choice knowing which proposed tokens the target accepts (dynamic
  programming over plain steps and all-accepted proposals): no lossless n-gram policy does better;
- `fixed L`: propose up to L tokens at every match (llama.cpp's ngram-simple with --spec-draft-n-max L);
- `guard`: the policy's choice per step (runner.decoding.match_length.MatchLength.ngram_length: acceptance per match length,
  the measured costs), replayed through the same MatchLength object.

Prints one JSON object: the file, the cost curve in target steps, and per policy the predicted speed-up over
plain decoding, overall and per category. A model of the loop, not a timing of it: `bundle bench` measures
the loop. --gguf adds other quantizations of the same model (their own cost curves; the output replayed is
each file's own greedy output).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.bench.machine import machine_info  # noqa: E402
from runner.bench.prompt_sets import read_prompts  # noqa: E402
from runner.decoding.match_length import MatchLength  # noqa: E402
from runner.decoding.ngram import DEFAULT_MAX_N, DEFAULT_MIN_N, NgramProposer  # noqa: E402
from runner.decoding.speculative import generate_plain  # noqa: E402
from runner.decoding.stats import Stats  # noqa: E402
from runner.engines import llamacpp  # noqa: E402
from runner.gguf_run import GGUFTokenizer  # noqa: E402
from runner.checks import gguf_header, gguf_model  # noqa: E402

LONGEST = 9  # proposals up to 9 tokens: passes of up to 10


def cost_curve(engine, prompt: list[int], reps: int = 12, rounds: int = 3) -> dict[int, float]:
    """A verify pass of n tokens (n = 1..LONGEST + 1) after `prompt`, in single steps (medians of medians)."""
    engine.reset(len(prompt) + LONGEST + 2)
    engine.forward(torch.tensor(prompt), last_only=True)
    base, times = engine.length(), {}
    for _ in range(rounds):
        for n in range(1, LONGEST + 2):
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                engine.forward(torch.tensor(prompt[:n]), last_only=False)
                ts.append(time.perf_counter() - t0)
                engine.crop(engine.length() - base)
            times.setdefault(n, []).append(statistics.median(ts))
    one = statistics.median(times[1])
    return {n: round(statistics.median(v) / one, 3) for n, v in times.items()}


def accepted_runs(prompt: list[int], out: list[int]) -> list[tuple[list[int], int, int]]:
    """At each position of `out`: the proposal (up to LONGEST), its match length, and how many of it match out."""
    proposer, records = NgramProposer(DEFAULT_MIN_N, DEFAULT_MAX_N), []
    proposer.extend(prompt)
    for i in range(len(out)):
        proposal, matched = proposer.propose_match(LONGEST)
        n = 0
        while n < len(proposal) and i + n < len(out) and proposal[n] == out[i + n]:
            n += 1
        records.append((proposal, matched, n))
        proposer.extend(out[i : i + 1])
    return records


def oracle(records, cost: dict[int, float]) -> float:
    """Target steps of the best schedule knowing acceptance: plain steps, or proposals all of whose tokens are accepted."""
    best = [0.0] * (len(records) + 1)
    for i in range(len(records) - 1, -1, -1):
        best[i] = 1 + best[i + 1]
        for m in range(1, records[i][2] + 1):
            best[i] = min(best[i], cost[m + 1] + best[min(len(records), i + m + 1)])
    return best[0]


def fixed(records, cost: dict[int, float], longest: int) -> float:
    steps, i = 0.0, 0
    while i < len(records):
        proposal, _, n = records[i]
        proposal = proposal[: min(longest, len(records) - i - 1)]
        if not proposal:
            steps, i = steps + 1, i + 1
            continue
        n = min(n, len(proposal))
        steps, i = steps + cost[len(proposal) + 1], i + n + 1
    return steps


def guarded(records, cost: dict[int, float]) -> float:
    """The guard's choice per step, its costs those of the curve (timed passes fed to its statistics)."""
    stats = Stats()
    stats.record_step(1.0)
    for k in range(1, LONGEST + 1):
        for _ in range(2):
            stats.record_iteration(k, 0, 0.0, cost[k + 1], catch_up=False, method="ngram")
    guard = MatchLength(stats, costs=None, memory=None)
    steps, i = 0.0, 0
    while i < len(records):
        proposal, matched, n = records[i]
        proposal = proposal[: min(LONGEST, len(records) - i - 1)]
        m = guard.ngram_length(matched, len(proposal)) if proposal else 0
        if m == 0:
            if proposal:
                guard.ngram_observed(matched, 1, int(n > 0))
            steps, i = steps + 1, i + 1
            continue
        n = min(n, m)
        guard.ngram_observed(matched, m, n)
        steps, i = steps + cost[m + 1], i + n + 1
    return steps


def measure(path: Path, ids: list[list[int]], categories: list[str], eos: set[int], max_new: int, threads: int) -> dict:
    engine = llamacpp.load(path, n_ctx=max(map(len, ids)) + max_new + LONGEST + 4, threads=threads)
    longest_prompt = max(ids, key=len)
    curve = cost_curve(engine, longest_prompt)
    records = [(c, accepted_runs(x, generate_plain(engine, x, max_new, eos_ids=eos).tokens)) for c, x in zip(categories, ids)]
    policies = {"oracle": lambda r: oracle(r, curve), "guard": lambda r: guarded(r, curve),
                **{f"fixed {n}": (lambda r, n=n: fixed(r, curve, n)) for n in (1, 2, 3, 4, 8)}}
    out = {}
    for name, policy in policies.items():
        per: dict[str, list[float]] = {}
        for category, r in records:
            tokens_steps = per.setdefault(category, [0.0, 0.0])
            tokens_steps[0] += len(r)
            tokens_steps[1] += policy(r)
        tokens, steps = sum(t for t, _ in per.values()), sum(s for _, s in per.values())
        out[name] = {"speedup": round(tokens / steps, 3), "by_category": {c: round(t / s, 3) for c, (t, s) in per.items()}}
    return {"file": path.name, "context": len(longest_prompt), "cost_curve": curve, "policies": out}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ctx", type=Path, default=ROOT / "demo" / "work" / "ctx-gguf")
    parser.add_argument("--gguf", type=Path, action="append", default=[], help="another GGUF file of the same model")
    parser.add_argument("--prompts", default="grounded")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    target = gguf_model.gguf_files(args.ctx / "target")[0]
    tokenizer = GGUFTokenizer(target, gguf_header.read_header(target)["metadata"])
    prompts = read_prompts(args.prompts)
    ids = [tokenizer.prompt_ids(p.text, raw=False) for p in prompts]
    results = [measure(path, ids, [p.category for p in prompts], tokenizer.eos_ids(), args.max_new_tokens, args.threads)
               for path in [target, *args.gguf]]
    print(json.dumps({"machine": machine_info(args.threads), "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
                      "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
