"""`bundle bench` on a GGUF bundle: our plain and speculative decoding on the llama.cpp engine against
llama-cpp-python's own greedy generation of the same target file (the baseline a user would run instead),
same threads, same prompts, one process.

Runs (CONTRACT.md section 3's keys where they apply): `target_only` our plain decoding of the target
(`runner_plain` is the same run), `llama_cpp_python` llama-cpp-python's `Llama.generate` at temperature 0,
`bundle` our speculative decoding, `draft_only` the draft alone (for its cost). `hf_assisted` is null:
transformers' assisted generation does not run GGUF files.
"""

from __future__ import annotations

__all__ = ["bench_gguf"]

import ctypes
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from runner.checks import gguf_model
from runner.checks.context_window import PromptContext
from runner.bench.runs import Run, by_category, chosen_method, interleaved_rounds, pooled, speculation_figures, timed
from runner.engines import llamacpp, llamacpp_files
from runner.gguf_run import load_gguf_pair
from runner.bench.machine import machine_info
from runner.decoding.run_history import with_history
from runner.decoding.settings import DecodingSettings, draft_length
from runner.decoding.speculative import generate_plain, generate_speculative

# Two computations of the same logits round differently in llama.cpp: a batch of several tokens (a verify
# pass) takes other kernels than a single step, and on the demo's Q4_1 target their logits differ by up to
# ~0.3-0.7 (about 1-3% of the top logit). A difference is a tie when it stays within that drift; a drift
# beyond this share of the top logit is no rounding (a broken computation moves logits by whole units).
DRIFT_LIMIT = 0.05


@dataclass
class Timing:
    """Stats for a generation we do not run ourselves: only how long it took."""

    elapsed_s: float


def _their_generate(llm, eos: set[int], max_new_tokens: int) -> Callable[[list[int]], tuple[list[int], Timing]]:
    """llama-cpp-python's own greedy generation (`Llama.generate`, temperature 0, no penalties), stopping
    at eos or the length limit as ours does. The context is reset first: no prefix is reused across
    prompts or rounds, so it prefills every prompt as ours does."""

    def generate(ids: list[int]) -> tuple[list[int], Timing]:
        start = time.perf_counter()
        llm.reset()
        tokens: list[int] = []
        if max_new_tokens > 0:
            for token in llm.generate(ids, temp=0.0, repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, reset=True):
                tokens.append(int(token))
                if token in eos or len(tokens) >= max_new_tokens:
                    break
        return tokens, Timing(time.perf_counter() - start)

    return generate


def _their_logits(llm, prompt: list[int], position: int) -> torch.Tensor:
    """The logits llama-cpp-python's generation chose its token `position` (0-based, prompt excluded) from:
    its generation rerun to that token, the context's last logits row read before the next decode."""
    llm.reset()
    for i, _ in enumerate(llm.generate(prompt, temp=0.0, repeat_penalty=1.0, reset=True)):
        if i == position:
            return _last_logits(llm)
    raise ValueError(f"their generation ended before token {position}")


def _last_logits(llm) -> torch.Tensor:
    """A copy of the last logits row of a llama-cpp-python context (`llama_get_logits_ith(ctx, -1)`)."""
    import llama_cpp

    pointer = ctypes.cast(llama_cpp.llama_get_logits_ith(llm.ctx, -1), ctypes.POINTER(ctypes.c_float))
    return torch.from_numpy(np.ctypeslib.as_array(pointer, shape=(llm.n_vocab(),)).copy())


def replay(engine, tokens: list[int], calls: Sequence[tuple[int, int]], position: int) -> torch.Tensor:
    """Our target's logits for the token at `position` of `tokens` (prompt included), computed as the run
    computed them: its recorded forward calls (cache length before, tokens in) replayed in order on the
    engine, up to the call that covered position - 1 (runner.bench.torch_bench.replay, for the llama.cpp engine). Inputs
    past what `tokens` holds (rejected drafts) are filler: a row depends on the rows before it, not after."""
    engine.reset(max(start + n for start, n in calls))
    for start, n in calls:
        if start > position - 1:
            break
        if engine.length() > start:
            engine.crop(engine.length() - start)  # back to where the call began
        chunk = (tokens[start:start + n] + [tokens[-1]] * n)[:n]
        covers = position - 1 < start + n
        # the call's own shape: the last logits only for the prefill (the call at 0) and single steps
        logits = engine.forward(torch.tensor(chunk), last_only=n == 1 or start == 0)
        if covers:
            return logits[0 if n == 1 else position - 1 - start].float()
    raise ValueError(f"no recorded call computed position {position}")


def first_difference(engine, llm, prompt: list[int], theirs: list[int], ours: list[int],
                     calls: Sequence[tuple[int, int]]) -> dict[str, Any] | None:
    """Where our tokens leave llama-cpp-python's, and whether that is a tie: both computations replayed to
    that token (theirs rerun, ours from its recorded calls). A tie when each chose its own top token, the two
    tokens' logits are closer in each than the two computations' logits are apart there at most (`drift`, over
    the whole vocabulary), and that drift is rounding-sized (at most DRIFT_LIMIT of the top logit)."""
    i = next((j for j, (a, b) in enumerate(zip(theirs, ours)) if a != b), None)
    if i is None:
        return None if len(theirs) == len(ours) else {"position": min(len(theirs), len(ours)), "tie": False, "gap": None}
    their_logits = _their_logits(llm, prompt, i)
    our_logits = replay(engine, prompt + ours, calls, len(prompt) + i)
    a, b = theirs[i], ours[i]
    their_gap = float(their_logits[a] - their_logits[b])  # >= 0 when their computation chose a
    our_gap = float(our_logits[b] - our_logits[a])  # >= 0 when ours chose b
    drift = float((their_logits - our_logits).abs().max())
    top = float(their_logits.abs().max())
    replayed = int(their_logits.argmax()) == a and int(our_logits.argmax()) == b
    return {"position": i, "theirs": a, "ours": b, "gap_in_theirs": round(their_gap, 6), "gap_in_ours": round(our_gap, 6),
            "drift": round(drift, 6), "top_logit": round(top, 4), "replayed": replayed,
            "tie": replayed and their_gap <= drift and our_gap <= drift and drift <= DRIFT_LIMIT * max(top, 1.0)}


def _ratios(runs: Mapping[str, Run]) -> dict[str, Any]:
    """One round's speed-ups: the bundle over our plain decoding, over llama-cpp-python's, over the faster of
    the two; our plain decoding over llama-cpp-python's (the engine's own overhead)."""
    tps = lambda name: runs[name].tokens_per_second  # noqa: E731
    fastest = max(("target_only", "llama_cpp_python"), key=tps)
    return {"speedup_vs_target": tps("bundle") / tps("target_only"), "speedup_vs_runner_plain": tps("bundle") / tps("target_only"),
            "speedup_vs_llama_cpp_python": tps("bundle") / tps("llama_cpp_python"),
            "plain_vs_llama_cpp_python": tps("target_only") / tps("llama_cpp_python"),
            "speedup_vs_fastest_plain": tps("bundle") / tps(fastest), "fastest_plain": fastest}


def _per_prompt(i: int, runs: Mapping[str, Run]) -> dict[str, Any]:
    ours, stats = runs["bundle"], runs["bundle"].stats[i]
    speed = lambda run: len(run.tokens[i]) / run.stats[i].elapsed_s  # noqa: E731
    return {
        "prompt": i,
        "new_tokens": len(ours.tokens[i]),
        "speedup_vs_target": round(speed(ours) / speed(runs["target_only"]), 3),
        "speedup_vs_runner_plain": round(speed(ours) / speed(runs["target_only"]), 3),
        "speedup_vs_llama_cpp_python": round(speed(ours) / speed(runs["llama_cpp_python"]), 3),
        "per_token_acceptance": round(stats.acceptance or 0.0, 3),
        "mean_accepted_length": round(stats.mean_accepted_length or 0.0, 3),
        "fallback_at": stats.fallback["at_token"] if stats.fallback else None,
        "method": chosen_method(stats),
    }


def bench_gguf(
    dirs: Mapping[str, Path],
    params: Mapping[str, Any],
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 128,
    draft_tokens: int | None = None,
    repeat: int = 1,
    memory_budget: int | None = None,
    progress: Callable[[str], None] | None = None,
    history=None,
    categories: Sequence[str] | None = None,
) -> dict[str, Any]:
    """runner.bench.torch_bench.bench_unpacked for a GGUF pair: the same checks as `bundle run` before any weights load,
    then every method on the same prompts, prompt by prompt, the order rotating; `repeat` rounds, the
    speed-ups the medians of the rounds' (`rounds`), identity and per-prompt figures from the first."""
    say = progress or (lambda _msg: None)
    pair = load_gguf_pair(dirs, params, context=PromptContext(prompts, max_new_tokens),  # each refused where it does not fit
                          draft_tokens=draft_length(params, draft_tokens), memory_budget=memory_budget)
    target, draft, settings, k, eos = pair.target, pair.draft, pair.settings, pair.draft_tokens, pair.eos_ids
    ids = [pair.prompt_ids(p) for p in prompts]
    threads, n_ctx = target.threads, pair.context_tokens

    # llama-cpp-python's own: the same file, threads and batch sizes, its own context
    theirs = llamacpp_files.open_llama(gguf_model.gguf_files(dirs["target"])[0], n_ctx=n_ctx, n_batch=llamacpp.N_BATCH,
                                       n_ubatch=llamacpp.N_BATCH, n_threads=threads, n_threads_batch=threads, logits_all=False)

    methods = _methods(target, draft, theirs, settings, eos, max_new_tokens, k, history, pair.prior)
    say("warming up")
    for engine in (target, draft):
        generate_plain(engine, ids[0], 8, eos_ids=eos)
    _their_generate(theirs, eos, 8)(ids[0])
    rounds = interleaved_rounds(methods, ids, repeat, say)
    draft_only = timed(ids[:2], _plain(draft, eos, max_new_tokens))  # for the cost ratio
    speeds = _speeds(rounds, draft_only, k)
    say("comparing outputs")
    return {
        **speeds,
        **_identity(target, theirs, ids, rounds[0]),
        "fallbacks": [{"prompt": i, **s.fallback} for i, s in enumerate(rounds[0]["bundle"].stats) if s.fallback],
        "per_prompt": [_per_prompt(i, rounds[0]) for i in range(len(ids))],
        "categories": by_category(rounds, list(categories or ["user"] * len(ids)), "target_only", ("llama_cpp_python",)),
        "prompts": len(ids),
        "max_new_tokens": max_new_tokens,
        "draft_tokens": k,
        "tokenizer": {"fingerprint": pair.fingerprint},
        "pairing": pair.pairing,
        "dtype": pair.dtype,
        "device": "cpu",
        "threads": threads,
        "engine": "llama.cpp",
        "machine": machine_info(threads),
    }


def _plain(engine, eos: set[int], max_new_tokens: int) -> Callable[[list[int]], tuple[list[int], Any]]:
    """Our plain decoding of one engine as a bench method."""
    return lambda x: (lambda r: (r.tokens, r.stats))(generate_plain(engine, x, max_new_tokens, eos_ids=eos))


def _methods(target, draft, theirs, settings: DecodingSettings, eos: set[int], max_new_tokens: int, k: int,
             history, prior: str | None = None) -> dict[str, Callable[[list[int]], tuple[list[int], Any]]]:
    """Every method bench times, by name: our plain decoding, llama-cpp-python's, ours."""

    def ours(x: list[int]) -> tuple[list[int], Any]:  # as `bundle run` runs: the run history's advice included
        r = with_history(history, settings.guard, 0.0, None, lambda advice: generate_speculative(
            target, draft, x, max_new_tokens, settings=settings, eos_ids=eos, start_plain=advice, prior=prior))
        return r.tokens, r.stats

    return {"target_only": _plain(target, eos, max_new_tokens), "llama_cpp_python": _their_generate(theirs, eos, max_new_tokens),
            "bundle": ours}


def _speeds(rounds: list[dict[str, Run]], draft_only: Run, k: int) -> dict[str, Any]:
    """Tokens/s of every run (all rounds pooled), the speed-ups (medians of the rounds') and the speculation figures."""
    ratios = [_ratios(rnd) for rnd in rounds]
    runs = {name: pooled([rnd[name] for rnd in rounds]) for name in rounds[0]}
    runs["runner_plain"] = runs["target_only"]  # our plain decoding is the target alone here
    runs["draft_only"] = draft_only
    figures = speculation_figures(runs, k)
    median = lambda key: statistics.median(r[key] for r in ratios)  # noqa: E731
    spec_gain = median("speedup_vs_runner_plain")
    tps = {name: run.tokens_per_second for name, run in runs.items()}
    return {
        "runs": {**{name: run.as_dict() for name, run in runs.items()}, "hf_assisted": None},
        "speedup_vs_target": round(median("speedup_vs_target"), 3),
        "speedup_vs_runner_plain": round(spec_gain, 3),
        "speedup_vs_llama_cpp_python": round(median("speedup_vs_llama_cpp_python"), 3),
        "plain_vs_llama_cpp_python": round(median("plain_vs_llama_cpp_python"), 3),
        "speedup_vs_hf_assisted": None,  # transformers' assisted generation does not run GGUF files
        "speedup_vs_fastest_plain": round(median("speedup_vs_fastest_plain"), 3),
        "fastest_plain": max(("target_only", "llama_cpp_python"), key=lambda name: tps[name]),
        "rounds": [{key: round(value, 3) if isinstance(value, float) else value for key, value in r.items()} for r in ratios],
        **figures,
        "efficiency": round(spec_gain / figures["theoretical_speedup"], 3) if figures["theoretical_speedup"] else None,
    }


def _identity(target, theirs, ids: list[list[int]], first: Mapping[str, Run]) -> dict[str, Any]:
    """Greedy output (the first round's) against llama-cpp-python's own greedy generation of the same file:
    ours and our plain decoding, each difference replayed to tell a tie from a fault."""
    their_tokens = first["llama_cpp_python"].tokens
    differences = [first_difference(target, theirs, p, t, b, s.target_calls)
                   for p, t, b, s in zip(ids, their_tokens, first["bundle"].tokens, first["bundle"].stats)]
    plain_differences = [first_difference(target, theirs, p, t, b, s.target_calls)
                         for p, t, b, s in zip(ids, their_tokens, first["target_only"].tokens, first["target_only"].stats)]
    return {
        "identical_output": all(d is None or d["tie"] for d in differences),
        "exactly_identical": all(d is None for d in differences),
        "runner_plain_identical": all(d is None or d["tie"] for d in plain_differences),
        "runner_plain_exactly_identical": all(d is None for d in plain_differences),
        "differences": [{"prompt": i, **d} for i, d in enumerate(differences) if d],
        "plain_differences": [{"prompt": i, **d} for i, d in enumerate(plain_differences) if d],
    }
