"""Which greedy drafting policy (draft length k, draft_confidence) pays most for a pair on this machine.

    .venv/bin/python benchmarks/draft_policy.py [--ctx demo/work/ctx] [--prompts FILE.jsonl]
        [--max-new-tokens 256] [--dtype bfloat16] [--threads 2]

Greedy speculation is deterministic: at each position of the target's own output, the draft proposes
the same tokens whatever came before. So one pass over the prompts measures everything a policy needs:
the target's greedy output, and at every position the draft's next 8 greedy tokens with the probability
it gave each. Every policy is then replayed on those records (the same rule as runner.decoding.speculative's
_draft: stop after k tokens, or once the product of the probabilities falls below the confidence), with
the measured costs of a draft step and of a verify pass of each length, both through the forward
`bundle run` uses. Prints one JSON line per policy, best first: tokens per pass, drafted per pass and
the predicted speed-up over plain decoding. A model of the loop, not a timing of it: `bundle bench`
measures the chosen policy. Without --prompts, the quick set of benchmarks/quick_prompts.py.
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

from runner.models.draft_vocab import read_draft_vocab  # noqa: E402
from runner.models.loading import load_model  # noqa: E402
from runner.pair import prompt_ids  # noqa: E402
from runner.run import eos_ids, runtime_draft, runtime_target  # noqa: E402
from runner.engines.torch_engine import model_logits, new_cache  # noqa: E402
from runner.decoding.speculative import generate_plain  # noqa: E402
from runner.checks.tokenizer_spec import load_spec  # noqa: E402
from benchmarks.quick_prompts import quick_lines  # noqa: E402

KMAX = 8


@torch.inference_mode()
def draft_records(draft, prompt: list[int], output: list[int]) -> list[list[tuple[int, float]]]:
    """At each position of `output`: the draft's next KMAX greedy tokens and the probability of each."""
    cache = new_cache(draft, len(prompt) + len(output) + KMAX + 1)
    path = torch.tensor(prompt + output)
    logits = model_logits(draft, path[: len(prompt)], cache, last_only=True)
    records = []
    for p in range(len(output)):
        row, step = [], logits
        for j in range(KMAX):
            probs = torch.softmax(step[-1].float(), -1)
            token = int(probs.argmax())
            row.append((token, float(probs[token])))
            if j + 1 < KMAX:
                step = model_logits(draft, torch.tensor([token]), cache, last_only=True)
        records.append(row)
        cache.crop(-(KMAX - 1))
        logits = model_logits(draft, path[len(prompt) + p : len(prompt) + p + 1], cache, last_only=True)
    return records


@torch.inference_mode()
def pass_costs(target, draft, context: int = 300, rounds: int = 30) -> tuple[dict[int, float], float, float]:
    """Verify passes of 1..KMAX+1 tokens and a draft step, in target steps (medians of interleaved rounds,
    so a machine that changes speed moves them alike), and the target step's ms."""
    calls = [(target, t) for t in range(1, KMAX + 2)] + [(draft, 1)]
    caches = []
    for model, tokens in calls:
        cache = new_cache(model, context + tokens)
        model_logits(model, torch.randint(10, 40000, (context,)), cache, last_only=True)
        caches.append(cache)
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for i, ((model, tokens), cache) in enumerate(zip(calls, caches)):
            x = torch.randint(10, 40000, (tokens,))
            t0 = time.perf_counter()
            model_logits(model, x, cache, last_only=model is draft)
            times[i].append(time.perf_counter() - t0)
            cache.crop(-tokens)
    ms = [1000 * statistics.median(t) for t in times]
    return {t: ms[t - 1] / ms[0] for t in range(1, KMAX + 2)}, ms[-1] / ms[0], ms[0]


def replay(outputs: list[list[int]], records: list[list[list[tuple[int, float]]]], k: int, confidence: float):
    """Passes, drafted tokens and new tokens of the policy over every prompt."""
    passes = drafted = produced = 0
    by_length: dict[int, int] = {}
    for output, rows in zip(outputs, records):
        p = 0
        while p < len(output):
            m, sure = 0, 1.0
            for token, prob in rows[p][: min(k, len(output) - p - 1)]:
                m += 1
                sure *= prob
                if confidence > 0 and sure < confidence:
                    break
            n = 0
            while n < m and rows[p][n][0] == output[p + n]:
                n += 1
            passes, drafted, produced = passes + 1, drafted + m, produced + n + 1
            by_length[m + 1] = by_length.get(m + 1, 0) + 1
            p += n + 1
    return passes, drafted, produced, by_length


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", default=str(ROOT / "demo" / "work" / "ctx"), help="a bundle context: target/, draft/, tokenizer/")
    ap.add_argument("--prompts", help="JSON lines {\"prompt\": ...} [default: the quick set, benchmarks/quick_prompts.py]")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    ctx = Path(args.ctx)
    tokenizer = AutoTokenizer.from_pretrained(ctx / "tokenizer")
    vocab_file = ctx / "draft" / "draft_vocab.json"
    ids = read_draft_vocab(vocab_file, load_spec(ctx / "tokenizer").vocab_size) if vocab_file.exists() else None
    target = runtime_target(load_model(ctx / "target", args.dtype, "cpu", role="target"))  # as bundle run runs both
    draft = runtime_draft(load_model(ctx / "draft", args.dtype, "cpu", role="draft"), {"draft_vocab": ids})
    eos = eos_ids(tokenizer, ctx / "target")  # the stop tokens bundle run uses
    lines = Path(args.prompts).read_text().splitlines() if args.prompts else quick_lines()
    prompts = [prompt_ids(tokenizer, json.loads(line)["prompt"], raw=False) for line in lines if line.strip()]
    outputs = [generate_plain(target, p, args.max_new_tokens, eos_ids=eos).tokens for p in prompts]
    records = [draft_records(draft, p, o) for p, o in zip(prompts, outputs)]
    verify, draft_cost, step = pass_costs(target, draft)
    print(json.dumps({"target_step_ms": round(step, 2), "draft_cost_ratio": round(draft_cost, 4),
                      "verify_cost": {t: round(v, 3) for t, v in verify.items()}}))
    results = []
    for k in range(1, KMAX + 1):
        for confidence in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7):
            passes, drafted, produced, by_length = replay(outputs, records, k, confidence)
            cost = sum(verify[length] * count for length, count in by_length.items()) + drafted * draft_cost
            results.append({"k": k, "confidence": confidence, "tokens_per_pass": round(produced / passes, 3),
                            "drafted_per_pass": round(drafted / passes, 3), "predicted_speedup": round(produced / cost, 3)})
    for r in sorted(results, key=lambda r: -r["predicted_speedup"]):
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
