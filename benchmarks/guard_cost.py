"""What a run costs the guard when the draft does not pay, phase by phase, on the GGUF demo pair (after `make demo`).

Plain decoding and speculative decoding with a fresh guard (no run history: each run finds out for itself)
on the same prompts, ABBA per prompt (plain, speculative, speculative, plain; then the other way round), every
forward pass of both engines timed. Prints the total time of each, the speculative run's speed as a ratio of
plain decoding's, and where the difference goes: target steps saved, verify passes, draft steps, the draft's
prefill of the prompt and catch-ups, Python around them.

    .venv/bin/python benchmarks/guard_cost.py [--prompts 24] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.checks import gguf_model  # noqa: E402
from runner.engines import llamacpp  # noqa: E402
from runner.gguf_run import GGUFTokenizer  # noqa: E402
from runner.decoding.speculative import generate_plain, generate_speculative  # noqa: E402

CONTEXT = ROOT / "demo" / "work" / "ctx-gguf"


class Timed:
    """An engine whose forward passes are timed into `log` as (role, tokens, seconds)."""

    def __init__(self, engine, log: list, role: str) -> None:
        self.engine, self.log, self.role = engine, log, role

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def forward(self, ids, last_only):
        start = time.perf_counter()
        out = self.engine.forward(ids, last_only)
        self.log.append((self.role, len(ids.view(-1)), time.perf_counter() - start))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    target_file, draft_file = (next((CONTEXT / role).glob("*.gguf")) for role in ("target", "draft"))
    tokenizer = GGUFTokenizer(target_file, gguf_model.read_header(target_file)["metadata"])
    prompts = [json.loads(line)["prompt"] for line in (ROOT / "runner" / "bench" / "prompts.jsonl").read_text().splitlines()]
    ids = [tokenizer.prompt_ids(p, raw=False) for p in prompts[: args.prompts]]
    eos, n_ctx = tokenizer.eos_ids(), max(map(len, ids)) + args.max_new_tokens + 20
    target, draft = llamacpp.load(target_file, n_ctx=n_ctx, threads=2), llamacpp.load(draft_file, n_ctx=n_ctx, threads=2)
    for engine in (target, draft):  # warm-up
        generate_plain(engine, ids[0], 8, eos_ids=eos)
    sums: dict[str, dict[str, float]] = {"plain": {}, "speculative": {}}

    def add(kind: str, key: str, value: float) -> None:
        sums[kind][key] = sums[kind].get(key, 0.0) + value

    for r in range(args.rounds):
        for i, x in enumerate(ids):
            order = ["plain", "speculative", "speculative", "plain"]
            for kind in order if (i + r) % 2 == 0 else order[::-1]:
                log: list = []
                start = time.perf_counter()
                if kind == "plain":
                    result = generate_plain(Timed(target, log, "target"), x, args.max_new_tokens, eos_ids=eos)
                else:
                    result = generate_speculative(Timed(target, log, "target"), Timed(draft, log, "draft"), x, args.max_new_tokens,
                                                  draft_tokens=3, eos_ids=eos)
                add(kind, "seconds", time.perf_counter() - start)
                add(kind, "tokens", len(result.tokens))
                for j, (role, n, seconds) in enumerate(log):
                    phase = "target prefill" if j == 0 and n > 1 else f"{role} {'step' if n == 1 else ('verify' if role == 'target' else 'prompt/catch-up')}"
                    add(kind, phase, seconds)
                    add(kind, phase + " calls", 1)
                add(kind, "python", time.perf_counter() - start - sum(s for _, _, s in log))
    plain, spec = sums["plain"], sums["speculative"]
    for kind, s in sums.items():
        print(kind, {k: round(v, 3) for k, v in sorted(s.items())})
    ratio = (spec["tokens"] / spec["seconds"]) / (plain["tokens"] / plain["seconds"])
    step = plain["target step"] / plain["target step calls"]
    runs = 2 * args.rounds * len(ids)
    print(f"speculative / plain tokens per second: {ratio:.4f}; a target step {step * 1e3:.2f} ms")
    for phase in ("target verify", "draft step", "draft prompt/catch-up"):
        if spec.get(phase + " calls"):
            print(f"  {phase}: {spec[phase + ' calls'] / runs:.1f} a run, {spec[phase] / spec[phase + ' calls'] / step:.2f} target steps each")


if __name__ == "__main__":
    main()
