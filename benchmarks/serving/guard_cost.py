"""What a run costs the guard where the draft does not pay, phase by phase (mode `guard-cost`), on the GGUF demo
pair's files (after `make demo`): plain decoding and speculative decoding with a fresh guard (no run history:
each run finds out for itself) on the same prompts, ABBA per prompt (plain, speculative, speculative, plain; then
the other way round), every forward pass of both engines timed. Reported: the speculative runs' speed as a ratio
of plain decoding's, and where the difference goes: verify passes, draft steps, the draft's prefill of the prompt
and catch-ups, in target steps each.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from serving.common import ROOT, add_prompt_option, machine, read_prompt_set


def add_options(parser: argparse.ArgumentParser) -> None:
    add_prompt_option(parser)
    parser.add_argument("--context", default=str(ROOT / "demo" / "work" / "ctx-gguf"),
                        help="a GGUF bundle context: target/ and draft/ hold one .gguf file each")
    parser.add_argument("--limit", type=int, default=24, help="the first N prompts of the set")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--draft-tokens", type=int, default=3)


class Timed:
    """An engine whose forward passes are timed into `log` as (role, tokens, seconds)."""

    def __init__(self, engine: Any, log: list, role: str) -> None:
        self.engine, self.log, self.role = engine, log, role

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def forward(self, ids: Any, last_only: bool) -> Any:
        start = time.perf_counter()
        out = self.engine.forward(ids, last_only)
        self.log.append((self.role, len(ids.view(-1)), time.perf_counter() - start))
        return out


def _phase(index: int, role: str, tokens: int) -> str:
    if index == 0 and tokens > 1:
        return "target prefill"
    return f"{role} {'step' if tokens == 1 else ('verify' if role == 'target' else 'prompt/catch-up')}"


def _measure(args: argparse.Namespace) -> tuple[dict[str, dict[str, float]], int]:
    """Seconds, tokens, and each phase's seconds and calls, summed per kind (plain, speculative); runs of each kind."""
    from runner.checks import gguf_header
    from runner.decoding.speculative import generate_plain, generate_speculative
    from runner.engines import llamacpp
    from runner.gguf_run import GGUFTokenizer

    context = Path(args.context)
    target_file, draft_file = (next((context / role).glob("*.gguf")) for role in ("target", "draft"))
    tokenizer = GGUFTokenizer(target_file, gguf_header.read_header(target_file)["metadata"])
    ids = [tokenizer.prompt_ids(p, raw=False) for p in read_prompt_set(args.prompts)[: args.limit]]
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
                    result = generate_speculative(Timed(target, log, "target"), Timed(draft, log, "draft"), x,
                                                  args.max_new_tokens, draft_tokens=args.draft_tokens, eos_ids=eos)
                add(kind, "seconds", time.perf_counter() - start)
                add(kind, "tokens", len(result.tokens))
                for j, (role, n, seconds) in enumerate(log):
                    add(kind, _phase(j, role, n), seconds)
                    add(kind, _phase(j, role, n) + " calls", 1)
                add(kind, "python", time.perf_counter() - start - sum(s for _, _, s in log))
    return sums, 2 * args.rounds * len(ids)


def run(args: argparse.Namespace) -> dict[str, Any]:
    sums, runs = _measure(args)
    plain, spec = sums["plain"], sums["speculative"]
    step = plain["target step"] / plain["target step calls"]
    phases = {phase: {"calls_a_run": spec[phase + " calls"] / runs, "target_steps_each": spec[phase] / spec[phase + " calls"] / step}
              for phase in ("target verify", "draft step", "draft prompt/catch-up") if spec.get(phase + " calls")}
    return {**machine(), "context": args.context, "prompts": args.prompts, "runs": runs,
            "speculative_over_plain_tps": (spec["tokens"] / spec["seconds"]) / (plain["tokens"] / plain["seconds"]),
            "target_step_s": step, "speculative_phases": phases,
            "sums": {kind: {k: round(v, 4) for k, v in sorted(s.items())} for kind, s in sums.items()}}
