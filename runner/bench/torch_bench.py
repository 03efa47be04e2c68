"""`bundle bench`: the target alone, transformers' assisted generation and our runner, same pair, same prompts,
one process, and what the measured acceptance and costs predict (Leviathan et al.). A GGUF bundle is benched
by runner.bench.gguf_bench (llama.cpp engine, against llama-cpp-python's own generation)."""

from __future__ import annotations

__all__ = ["bench_unpacked", "bf16_step", "first_difference", "replay"]

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from runner.models.loading import load_model
from runner.bench.runs import Run, by_category, chosen_method, interleaved_rounds, pooled, speculation_figures, timed
from runner.checks.context_window import fitting_ids, model_window
from runner.checks.modelinfo import FileRange
from runner.pair import gguf_dirs, prompt_ids
from runner.run import eos_ids, preflight, resolve_device, runtime_draft, runtime_target, verified_digests, weight_ranges_at
from runner.decoding.run_history import with_history
from runner.decoding.settings import DecodingSettings
from runner.bench.machine import machine_info
from runner.engines.torch_engine import model_logits, new_cache
from runner.decoding.speculative import generate_plain, generate_speculative
from runner.checks.tokenizer_spec import load_spec

PLAIN_DTYPES = ("float32", "bfloat16")
PROMPT_LOOKUP_TOKENS = 10  # transformers' documented example setting of prompt_lookup_num_tokens
PEERS = ("hf_prompt_lookup", "hf_assisted_default", "hf_assisted_k")


def _hf_assisted(target, draft, eos: set[int], max_new_tokens: int, k: int | None) -> Callable[[list[int]], tuple[list[int], Any]]:
    """transformers' assisted generation (greedy); k None: its defaults, else k tokens, constant schedule."""
    extra = {} if k is None else {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant"}

    def generate(ids: list[int]) -> tuple[list[int], Any]:
        x = torch.tensor([ids], device=target.device)
        with torch.inference_mode():
            out = target.generate(
                x, attention_mask=torch.ones_like(x), assistant_model=draft, do_sample=False, max_new_tokens=max_new_tokens,
                eos_token_id=sorted(eos), pad_token_id=sorted(eos)[0], **extra,
            )
        return out[0, len(ids):].tolist(), None

    return generate


def _hf_prompt_lookup(target, eos: set[int], max_new_tokens: int) -> Callable[[list[int]], tuple[list[int], Any]]:
    """transformers' prompt lookup decoding (greedy): n-gram proposals from the prompt, no draft model."""

    def generate(ids: list[int]) -> tuple[list[int], Any]:
        x = torch.tensor([ids], device=target.device)
        with torch.inference_mode():
            out = target.generate(
                x, attention_mask=torch.ones_like(x), prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS, do_sample=False,
                max_new_tokens=max_new_tokens, eos_token_id=sorted(eos), pad_token_id=sorted(eos)[0],
            )
        return out[0, len(ids):].tolist(), None

    return generate


def bf16_step(value: float) -> float:
    """The spacing of bfloat16 numbers (8 significant bits) at `value`."""
    return 2.0 ** (math.floor(math.log2(abs(value))) - 7) if value else 2.0**-133


def replay(target, tokens: list[int], calls: Sequence[tuple[int, int]], position: int) -> torch.Tensor:
    """The target's logits for the token at `position` of `tokens` (prompt included), computed exactly as a
    run computed them: the run's forward calls (`Stats.target_calls`: cache length before, tokens in),
    replayed in order up to the last call that covered position - 1. Inputs past what `tokens` holds (drafts
    the run rejected) are filler: with causal attention a row's numbers depend on the rows before it and on
    the call's shape, not on the tokens after it."""
    cache, row = new_cache(target), None
    with torch.inference_mode():
        for start, n in calls:
            if start > position - 1:
                break
            if cache.get_seq_length() > start:
                cache.crop(start - cache.get_seq_length())  # back to where the call began
            chunk = (tokens[start:start + n] + [tokens[-1]] * n)[:n]
            logits = model_logits(target, torch.tensor(chunk, device=target.device), cache, last_only=False)
            if position - 1 < start + n:
                row = logits[position - 1 - start]
    if row is None:
        raise ValueError(f"no recorded call computed position {position}")
    return row.float()


def first_difference(target, prompt: list[int], expected: list[int], got: list[int], dtype: str,
                     target_calls: Sequence[tuple[int, int]], calls: Sequence[tuple[int, int]] | None = None,
                     bundle_target=None) -> dict[str, Any] | None:
    """Where `got` (the bundle's output) leaves `expected` (the target alone's), and whether that is a tie.

    Both computations are replayed to the first difference: the target alone's (`target_calls`, its
    prefill and single steps, on `target`), and, given the bundle run's `calls`, the bundle's own (its
    prefill and verify passes, on `bundle_target`, the forward it ran). In bfloat16 it is a tie when the
    two tokens' logits are within one bf16 step in either: the target, computing the same prefix in one of
    the two ways, rates them equal to bf16 precision, and each run took its own computation's top token
    (`replayed` checks the bundle's). In float32 only an exact tie counts."""
    i = next((j for j, (a, b) in enumerate(zip(expected, got)) if a != b), None)
    if i is None:
        return None if len(expected) == len(got) else {"position": min(len(expected), len(got)), "tie": False, "gap": None}
    logits = replay(target, prompt + expected, target_calls, len(prompt) + i)
    top2 = torch.topk(logits, 2).values.tolist()
    step = lambda a, b: bf16_step(max(a, b, key=abs))  # noqa: E731
    alone = float(logits[expected[i]] - logits[got[i]])
    alone_steps = alone / step(float(logits[expected[i]]), float(logits[got[i]]))
    out = {"position": i, "gap": top2[0] - top2[1], "gap_bf16_steps": round((top2[0] - top2[1]) / bf16_step(top2[0]), 2),
           "top_logit": top2[0], "target_alone_gap_bf16_steps": round(alone_steps, 2)}
    bundle_steps = None
    if calls is not None and bundle_target is not None:
        theirs = replay(bundle_target, prompt + got, calls, len(prompt) + i)
        bundle = float(theirs[got[i]] - theirs[expected[i]])
        bundle_steps = bundle / step(float(theirs[got[i]]), float(theirs[expected[i]]))
        out.update(bundle_pass_gap_bf16_steps=round(bundle_steps, 2), replayed=int(theirs.argmax()) == got[i])
    if dtype == "float32":
        out["tie"] = alone == 0.0
    else:
        out["tie"] = alone_steps <= 1.0 or (bool(out.get("replayed")) and bundle_steps is not None and bundle_steps <= 1.0)
    return out



def _per_prompt(i: int, runs: Mapping[str, Run], stats: Any) -> dict[str, Any]:
    """One prompt: tokens, the speed-ups over the target alone and over our plain decoding, how well the draft did."""
    ours = runs["bundle"]
    speedup = lambda plain: round((len(ours.tokens[i]) / stats.elapsed_s) / (len(plain.tokens[i]) / plain.stats[i].elapsed_s), 3)  # noqa: E731
    return {
        "prompt": i,
        "new_tokens": len(ours.tokens[i]),
        "speedup_vs_target": speedup(runs["target_only"]),
        "speedup_vs_runner_plain": speedup(runs["runner_plain"]),
        "per_token_acceptance": round(stats.acceptance or 0.0, 3),
        "mean_accepted_length": round(stats.mean_accepted_length or 0.0, 3),
        "fallback_at": stats.fallback["at_token"] if stats.fallback else None,
        "method": chosen_method(stats),
    }



def _fastest(runs: Mapping[str, Run]) -> tuple[str | None, str]:
    """The faster setting of transformers' assisted generation (None for a bundle without a draft), and the
    fastest plain decoding: transformers in each dtype, or our runner's own plain decoding (its forward)."""
    tps = lambda name: runs[name].tokens_per_second  # noqa: E731
    plain = [f"target_only_{d}" for d in PLAIN_DTYPES] + ["runner_plain"]
    assisted = [name for name in ("hf_assisted_default", "hf_assisted_k") if name in runs]
    return (max(assisted, key=tps) if assisted else None), max(plain, key=tps)


def _ratios(runs: Mapping[str, Run]) -> dict[str, Any]:
    """One round's speed-ups of the bundle over the target alone (transformers, the bundle's dtype), our own
    plain decoding (what speculation alone gains), the best assisted setting and the fastest plain decoding."""
    tps = lambda name: runs[name].tokens_per_second  # noqa: E731
    hf, fastest = _fastest(runs)
    return {"speedup_vs_target": tps("bundle") / tps("target_only"), "speedup_vs_runner_plain": tps("bundle") / tps("runner_plain"),
            "speedup_vs_hf_assisted": tps("bundle") / tps(hf) if hf else None, "speedup_vs_hf_prompt_lookup": tps("bundle") / tps("hf_prompt_lookup"),
            "speedup_vs_fastest_plain": tps("bundle") / tps(fastest), "fastest_plain": fastest}



@dataclass
class _Models:
    """The pair as bench loads it: as transformers loads them (the target alone, assisted generation), as
    `bundle run` runs them (ours), and the target in the other plain dtypes."""

    target: Any
    plain_draft: Any
    fast_target: Any
    draft: Any
    others: dict[str, Any] = field(default_factory=dict)


def _load_models(checked: Mapping[str, Any], roles: Mapping[str, str], dtype: str, device: str,
                 verified_files: Mapping[str, str] | None, ranges: Mapping[Path, FileRange], has_draft: bool) -> _Models:
    """The pair loaded from the preflight's directories (weight files checked against `verified_files` where given):
    as transformers loads them, as `bundle run` runs them, and the target in the other plain dtypes."""
    dirs = checked["dirs"]
    load = lambda role, dt: load_model(dirs[role], dt, device, role=role, expected_sha256=verified_digests(verified_files, roles[role]),  # noqa: E731
                                       ranges=ranges)
    target, plain_draft = load("target", dtype), (load("draft", dtype) if has_draft else None)
    # Ours run as `bundle run` runs them; the target alone and transformers' assisted generation get the
    # models as transformers loads them.
    models = _Models(target, plain_draft, runtime_target(target), runtime_draft(plain_draft, checked) if has_draft else None)
    models.others = {other: load("target", other) for other in PLAIN_DTYPES if other != dtype}
    return models


def bench_unpacked(
    root: Path,
    roles: Mapping[str, str],
    params: Mapping[str, Any],
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 128,
    draft_tokens: int | None = None,
    repeat: int = 1,
    device: str | None = None,
    verified_files: Mapping[str, str] | None = None,
    weight_ranges: Mapping[str, FileRange] | None = None,
    progress: Callable[[str], None] | None = None,
    history: Any = None,
    categories: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Every method on the same prompts in this process; tokens/s, ratios, acceptance, costs, identity.
    weight_ranges: weight files left inside their layer blobs, as run_unpacked takes them. categories: each
    prompt's kind of task (runner.bench.prompt_sets); the report gives each category's figures.

    repeat: rounds over all prompts; the speed-ups are then the medians of the rounds' (`rounds`), tokens/s
    and acceptance are over all rounds, and identity, fallbacks and per-prompt figures are the first round's."""
    from transformers import AutoTokenizer

    ggufs = gguf_dirs(root, roles)
    if ggufs:
        from runner.bench.gguf_bench import bench_gguf  # the llama.cpp engine, against llama-cpp-python's own generation

        return bench_gguf(ggufs, params, prompts, max_new_tokens=max_new_tokens, draft_tokens=draft_tokens,
                          repeat=repeat, progress=progress, history=history, categories=categories)
    say = progress or (lambda _msg: None)
    device = resolve_device(device)
    dtype = str(params.get("dtype") or "float32")
    has_draft = "draft" in roles  # a bundle without one runs prompt lookup alone
    settings = DecodingSettings.from_params(params, draft_tokens, has_draft=has_draft)
    k = settings.draft_tokens
    ranges = weight_ranges_at(root, weight_ranges)
    checked = preflight(root, roles, params, ranges)
    dirs = checked["dirs"]
    tokenizer = AutoTokenizer.from_pretrained(checked["tokenizer_dir"], local_files_only=True, trust_remote_code=False)
    # each prompt refused (usage) before any weights load where it and max_new_tokens do not fit the window
    ids = fitting_ids(prompts, max_new_tokens, model_window(dirs["target"]), tokenizer, lambda p: prompt_ids(tokenizer, p, raw=False))
    eos = eos_ids(tokenizer, dirs["target"])
    vocab = load_spec(checked["tokenizer_dir"]).vocab_size
    models = _load_models(checked, roles, dtype, device, verified_files, ranges, has_draft)

    rounds = _timed_rounds(models, _methods(models, settings, eos, vocab, max_new_tokens, k, history), ids, eos, dtype, repeat, say)
    # the draft alone, for the cost ratio (nothing to time without a draft: prompt lookup costs no model call)
    draft_only = timed(ids[:2], _plain(models.draft, eos, vocab, max_new_tokens)) if has_draft else Run()
    models.others.clear()  # the other dtypes' targets: not needed for the report
    labels = list(categories or ["user"] * len(ids))
    return {**_report(models, rounds, draft_only, ids, dtype, k), "prompts": len(ids), "max_new_tokens": max_new_tokens,
            "categories": by_category(rounds, labels, "runner_plain", PEERS),
            "dtype": dtype, "device": device, "threads": torch.get_num_threads(), "engine": "torch",
            "machine": machine_info(torch.get_num_threads())}


def _plain(model: Any, eos: set[int], vocab: int, max_new_tokens: int) -> Callable[[list[int]], tuple[list[int], Any]]:
    """Plain decoding of one model as a bench method."""
    return lambda x: (lambda r: (r.tokens, r.stats))(generate_plain(model, x, max_new_tokens, eos_ids=eos, vocab_size=vocab))


def _methods(models: _Models, settings: DecodingSettings, eos: set[int], vocab: int, max_new_tokens: int, k: int,
             history: Any) -> dict[str, Callable[[list[int]], tuple[list[int], Any]]]:
    """Every method bench times, by name: the target alone, our plain decoding, ours, transformers' assisted
    generation in two settings, transformers' prompt lookup, the target alone in the other dtypes."""
    plain = lambda model: _plain(model, eos, vocab, max_new_tokens)  # noqa: E731

    def ours(x: list[int]) -> tuple[list[int], Any]:  # as `bundle run` runs: the run history's advice included
        r = with_history(history, settings.guard, 0.0, None, lambda advice: generate_speculative(
            models.fast_target, models.draft, x, max_new_tokens, settings=settings, eos_ids=eos, vocab_size=vocab, start_plain=advice))
        return r.tokens, r.stats

    target, plain_draft = models.target, models.plain_draft
    return {
        "target_only": plain(target),
        **({"runner_plain": plain(models.fast_target)} if models.fast_target is not target else {}),
        "bundle": ours,
        **({"hf_assisted_default": _hf_assisted(target, plain_draft, eos, max_new_tokens, None),
            "hf_assisted_k": _hf_assisted(target, plain_draft, eos, max_new_tokens, k)} if plain_draft is not None else {}),
        "hf_prompt_lookup": _hf_prompt_lookup(target, eos, max_new_tokens),
        **{f"target_only_{other}": plain(model) for other, model in models.others.items()},
    }


def _timed_rounds(models: _Models, methods: Mapping[str, Callable[[list[int]], tuple[list[int], Any]]], ids: list[list[int]],
                  eos: set[int], dtype: str, repeat: int, say: Callable[[str], None]) -> list[dict[str, Run]]:
    """Every model warmed up, then `repeat` interleaved rounds of every method; each round's target alone also
    named for its dtype, and standing in for our plain decoding where our forward does not run the target."""
    say("warming up")
    for model in {id(m): m for m in (models.target, models.fast_target, models.draft, *models.others.values()) if m is not None}.values():
        generate_plain(model, ids[0], 8, eos_ids=eos)
    rounds = interleaved_rounds(methods, ids, repeat, say)
    for runs in rounds:
        runs[f"target_only_{dtype}"] = runs["target_only"]
        runs.setdefault("runner_plain", runs["target_only"])  # a target our forward does not run: transformers'
    return rounds


def _report(models: _Models, rounds: list[dict[str, Run]], draft_only: Run, ids: list[list[int]], dtype: str,
            k: int) -> dict[str, Any]:
    """What the rounds measured: tokens/s of every run, the speed-ups (medians of the rounds'), the
    speculation figures, and whether the bundle's output is the target alone's (the first round's)."""
    ratios = [_ratios(runs) for runs in rounds]
    runs = {name: pooled([rnd[name] for rnd in rounds]) for name in rounds[0]}
    runs["draft_only"] = draft_only
    first = rounds[0]
    hf_best, fastest_plain = _fastest(runs)
    figures = speculation_figures(runs, k)
    alone, bundle = first["target_only"], first["bundle"]
    differences = [first_difference(models.target, p, t, b, dtype, ts.target_calls, bs.target_calls, models.fast_target)
                   for p, t, b, ts, bs in zip(ids, alone.tokens, bundle.tokens, alone.stats, bundle.stats)]
    identical = all(d is None or d["tie"] for d in differences)
    median = lambda key: statistics.median(r[key] for r in ratios)  # noqa: E731
    speedup = median("speedup_vs_target")
    spec_gain = median("speedup_vs_runner_plain")
    return {
        "runs": {**{name: run.as_dict() for name, run in runs.items()},
                 "hf_assisted": {**runs[hf_best].as_dict(), "setting": hf_best} if hf_best else None},
        "speedup_vs_target": round(speedup, 3),
        "speedup_vs_runner_plain": round(spec_gain, 3),
        "speedup_vs_hf_assisted": round(median("speedup_vs_hf_assisted"), 3) if hf_best else None,
        "speedup_vs_hf_prompt_lookup": round(median("speedup_vs_hf_prompt_lookup"), 3),
        "speedup_vs_fastest_plain": round(median("speedup_vs_fastest_plain"), 3),
        "fastest_plain": fastest_plain,
        "rounds": [{key: round(value, 3) if isinstance(value, float) else value for key, value in r.items()} for r in ratios],
        **figures,
        "efficiency": round(spec_gain / figures["theoretical_speedup"], 3) if figures["theoretical_speedup"] else None,
        "identical_output": identical,
        "exactly_identical": all(d is None for d in differences),
        "runner_plain_identical": first["runner_plain"].tokens == first["target_only"].tokens,
        "differences": [{"prompt": i, **d} for i, d in enumerate(differences) if d],
        "fallbacks": [{"prompt": i, **s.fallback} for i, s in enumerate(first["bundle"].stats) if s.fallback],
        "per_prompt": [_per_prompt(i, first, s) for i, s in enumerate(first["bundle"].stats)],
    }
