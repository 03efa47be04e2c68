"""Runs an unpacked, verified bundle: every check that needs no weights first, then load, then decode.

Order: pickle-weights refusal, tokenizer gate, config agreement, pairing, then (with the prompt's
length known) the memory preflight. Only when all pass are weights read. The caller (bundle run) verifies the bundle before calling `run_unpacked`.

Two steps, so that a server loads once and generates many times: `load_pair` (every check, the memory
preflight, then the weights; returns a `LoadedPair`) and `generate` (one prompt on a loaded pair).
`run_unpacked` is the two in a row.
"""

from __future__ import annotations

__all__ = [
    "eos_ids", "generate", "load_pair", "model_roles", "preflight", "resolve_device", "run_unpacked", "runtime_draft",
    "runtime_target", "verified_digests", "weight_ranges_at",
]

import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from core.errors import BundleError
from runner.models.lean_tokenizer import load_tokenizer
from runner.models.loading import ModelFiles, check_weight_files, load_models, torch_import_bytes
from runner.checks.modelinfo import (FileRange, Ranges, count_parameters, estimate_memory, read_config, read_raw_config, safetensors_files,
                                     validate_config)
from runner.checks.context_window import PromptContext, model_window
from runner.pair import LoadedPair, TextStream, context_tokens, gguf_dirs
from runner.checks.memory import check_memory
from runner.checks.pairing import check_pairing
from runner.decoding.run_history import with_history
from runner.decoding.methods import DRAFT_FREE_METHODS
from runner.decoding.settings import DecodingSettings, cache_tokens, draft_length, thread_count
from runner.checks.tokenizer_gate import check_config_agrees, check_tokenizers, has_tokenizer_files
from runner.checks.tokenizer_spec import load_spec


def _torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA (or ROCm) build, from its version.py, without importing torch
    (seconds: docs/benchmarks.md): a CPU build can use no GPU, so `bundle run` then starts reading the weights before
    torch is imported, and the import overlaps the read (runner.models.loading). Unreadable: assume it may."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("torch")
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text(encoding="utf-8")
    except (AttributeError, ImportError, OSError, StopIteration, TypeError, ValueError):
        return True
    builds = re.findall(r"^(cuda|hip)\s*(?::[^=]*)?=\s*(.+)$", text, re.M)
    return len(builds) != 2 or any(value.strip() != "None" for _, value in builds)


def resolve_device(device: str | None) -> str:
    if device and not device.startswith("cuda"):
        return device
    if not device and not _torch_has_cuda():
        return "cpu"
    import torch

    if device:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BundleError("usage", f"--device {device}: CUDA is not available here")
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"



def eos_ids(tokenizer, model_dir: Path) -> set[int]:
    """Stop tokens: the tokenizer's eos plus the eos ids of the target's config and generation config."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for config in (read_config(model_dir), _read_json(model_dir / "generation_config.json")):
        value = config.get("eos_token_id")
        ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return ids


def _read_json(path: Path) -> dict:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}



def verified_digests(verified_files: Mapping[str, str] | None, role_path: str) -> dict[str, str] | None:
    """The verified sha256 of each file directly in a role's directory, keyed by file name."""
    if verified_files is None:
        return None
    prefix = role_path.strip("/") + "/"
    return {p[len(prefix) :]: d for p, d in verified_files.items() if p.startswith(prefix) and "/" not in p[len(prefix) :]}


def weight_ranges_at(root: Path, weight_ranges: Mapping[str, FileRange] | None) -> dict[Path, FileRange]:
    """Weight files left in layer blobs, keyed by the path each would have if extracted below root."""
    return {Path(root) / path: where for path, where in (weight_ranges or {}).items()}


def model_roles(roles: Mapping[str, str], params: Mapping) -> tuple[str, ...]:
    """The model roles a bundle runs: target and draft, or the target alone where the Kitfile asks for
    draft-free speculation only (methods: [ngram]) and names no draft."""
    if "target" not in roles:
        raise BundleError("invalid-bundle", "the Kitfile names no target role")
    if "draft" in roles:
        return ("target", "draft")
    if list(params.get("methods") or ()) != list(DRAFT_FREE_METHODS):
        raise BundleError("invalid-bundle", "the Kitfile names no draft role (a bundle without one asks for draft-free speculation: methods: [ngram])")
    return ("target",)


def target_only(target_dir: Path, ranges: Ranges | None = None) -> dict:
    """The pairing figures of a bundle without a draft: the target's family and size."""
    return {"target_family": read_config(target_dir).get("model_type"), "draft_family": None,
            "target_parameters": count_parameters(target_dir, ranges), "draft_parameters": 0, "size_ratio": None}


def preflight(root: Path, roles: Mapping[str, str], params: Mapping, ranges: Ranges | None = None) -> dict:
    """The checks that read no weights, but memory: pickle weights, tokenizer gate, config agreement, pairing.

    ranges: weight files that are not on disk below root but inside layer blobs (see `_ranges`).
    Returns {"dirs", "tokenizer_dir", "fingerprint", "pairing"}; raises BundleError on the first failure.
    """
    models = model_roles(roles, params)
    dirs = {role: Path(root) / path for role, path in roles.items() if role in ("target", "draft", "tokenizer")}
    for role, directory in dirs.items():
        if not directory.is_dir():
            raise BundleError("invalid-bundle", f"the {role} directory {roles[role]} is missing")
    for role in models:
        check_weight_files(dirs[role], role, ranges)
        # Types and ranges of what sizes the model, before anything is sized or built from it (exit 6).
        validate_config(read_raw_config(dirs[role]), role)
    fingerprint = check_tokenizers(dirs)
    tokenizer_dir = dirs.get("tokenizer") or next(d for d in dirs.values() if has_tokenizer_files(d))
    for role in models:
        check_config_agrees(dirs[role], tokenizer_dir, role)
    pairing = check_pairing(dirs["target"], dirs["draft"], params, ranges) if "draft" in models else target_only(dirs["target"], ranges)
    draft_vocab = None
    if params.get("draft_vocab") and "draft" in models:
        path = (dirs["draft"] / str(params["draft_vocab"])).resolve()
        if not path.is_relative_to(dirs["draft"].resolve()) or not path.is_file():
            raise BundleError("invalid-bundle", f"draft_vocab {params['draft_vocab']!r} is not a file in the draft directory")
        from runner.models.draft_vocab import read_draft_vocab  # torch: imported only where a bundle needs it

        draft_vocab = read_draft_vocab(path, load_spec(tokenizer_dir).vocab_size)
    return {"dirs": dirs, "tokenizer_dir": tokenizer_dir, "fingerprint": fingerprint, "pairing": pairing, "draft_vocab": draft_vocab}


def runtime_target(target):
    """The target as the loop runs it: through our compact forward when its architecture allows (see
    runner.models.compact_llama; the same logits, less time per call), else through transformers."""
    from runner.models import compact_llama

    if isinstance(target, compact_llama.CompactLlama):  # loaded as one (runner.models.loading, compact)
        return target
    return compact_llama.CompactLlama(target) if compact_llama.supports(target.config) else target


def runtime_draft(draft, checked: Mapping):
    """The draft as the loop runs it: through our compact forward when its architecture allows (see
    runner.models.compact_llama), scoring only the bundle's draft vocabulary when it names one."""
    from runner.models import compact_llama
    from runner.models.draft_vocab import SubsetHeadDraft

    ids = checked.get("draft_vocab")
    if isinstance(draft, compact_llama.CompactLlama):  # loaded as one (runner.models.loading, compact)
        return draft.with_vocab(ids) if ids else draft
    if compact_llama.supports(draft.config):
        return compact_llama.CompactLlama(draft, ids)
    return SubsetHeadDraft(draft, ids) if ids else draft



def _load_runtime_pair(checked: Mapping, roles: Mapping[str, str], params: Mapping, dtype: str, device: str,
                       verified_files: Mapping[str, str] | None, ranges: Ranges, reproducible: bool) -> tuple[Any, Any]:
    """(target, draft or None) read from the preflight's directories, each file checked against `verified_files`
    where given, as the loop runs them; the target batch-invariant where the run is to be reproducible."""
    dirs = checked["dirs"]
    target, *drafts = load_models(
        [ModelFiles(dirs[role], role, verified_digests(verified_files, roles[role]), ranges) for role in model_roles(roles, params)],
        dtype, device, compact=True,
    )
    target, draft = runtime_target(target), (runtime_draft(drafts[0], checked) if drafts else None)
    if reproducible:  # greedy tokens whatever else shares a pass (runner.models.invariant); the draft only proposes
        if not hasattr(target, "batch_invariant"):
            raise BundleError("usage", "--reproducible runs on the compact torch forward only (Llama, Qwen2, Mistral)")
        target = target.batch_invariant()
    return target, draft


def compute_dtype(dtype: str, device: str, dirs: Mapping[str, Path], params: Mapping, ranges: Ranges | None = None) -> str:
    """The dtype a bundle's weights are computed in when the user names none: the bundle's, except bf16 on a CPU
    whose bf16 products are measured slower than float32's (runner.models.packed.float32_pays: no native bf16),
    where the weights are widened to float32 at load (the run record's dtype says so). Only for a pair whose
    weights are beyond the caches (a tiny one gains nothing and skips the probe); `--dtype bfloat16` keeps bf16,
    and so does `--reproducible` (its invariance was measured in bf16). The memory check that follows counts the
    float32 weights: where they do not fit, it refuses as for any --dtype (name bf16 then)."""
    if dtype != "bfloat16" or device != "cpu":
        return dtype
    from runner.models import packed

    models = [dirs[role] for role in ("target", "draft") if dirs.get(role)]
    if sum(r.length for d in models for r in safetensors_files(d, ranges).values()) < packed.SMALL_BYTES:
        return dtype
    threads = thread_count(params)
    sys.modules["torch"].set_num_threads(threads)  # the probe times the products as the run will run them
    return "float32" if packed.float32_pays(threads) else dtype


def load_pair(
    root: Path,
    roles: Mapping[str, str],
    params: Mapping,
    *,
    context: tuple[int, int] | PromptContext | Callable[[Any], tuple[int, int]],
    draft_tokens: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    memory_budget: int | None = None,
    verified_files: Mapping[str, str] | None = None,
    weight_ranges: Mapping[str, FileRange] | None = None,
    reproducible: bool = False,
) -> LoadedPair:
    """Every check (see `preflight`), the memory preflight, then the weights; raises BundleError on the first failure.

    context: (prompt tokens, new tokens) the caches must hold, a PromptContext (bundle run, tune: its prompts
    refused before loading where they do not fit the model's window, else sized for), or a function of the
    tokenizer giving them. Other arguments as in `run_unpacked`.
    """
    device = resolve_device(device)
    named = dtype  # the user's --dtype: always what runs
    dtype = dtype or params.get("dtype") or ("bfloat16" if device.startswith("cuda") else "float32")
    draft_tokens = draft_length(params, draft_tokens)
    model_roles(roles, params)  # a bundle without a draft runs only where it asks for draft-free speculation
    ggufs = gguf_dirs(root, roles)
    if ggufs:
        if reproducible:
            raise BundleError("usage", "--reproducible runs on the compact torch forward only (Llama, Qwen2, Mistral), not a GGUF pair")
        from runner.gguf_run import load_gguf_pair  # the llama.cpp engine

        return load_gguf_pair(ggufs, params, context=context, draft_tokens=draft_tokens, memory_budget=memory_budget)
    ranges = weight_ranges_at(root, weight_ranges)
    checked = preflight(root, roles, params, ranges)
    dirs = checked["dirs"]
    tokenizer = load_tokenizer(checked["tokenizer_dir"])  # transformers' AutoTokenizer where a lean one would differ
    window = model_window(dirs["target"])
    prompt_tokens, max_new_tokens = context_tokens(context, tokenizer, window)
    max_tokens = cache_tokens(prompt_tokens, max_new_tokens, draft_tokens, DecodingSettings.from_params(params).ngram_tokens)
    if named is None and not reproducible:
        dtype = compute_dtype(dtype, device, dirs, params, ranges)
    torch_later = "torch" not in sys.modules  # a CPU build imports it while the weights are read (resolve_device)
    memory = estimate_memory(dirs["target"], dirs.get("draft"), dtype, max_tokens, prompt_tokens=prompt_tokens,
                             draft_tokens=draft_tokens, ranges=ranges)
    check_memory(memory, memory_budget, device)
    load_start = time.perf_counter()
    target, draft = _load_runtime_pair(checked, roles, params, dtype, device, verified_files, ranges, reproducible)
    threads = thread_count(params)
    sys.modules["torch"].set_num_threads(threads)  # the pod's CPUs (runner.checks.cpus), not the node's
    if torch_later:  # after the estimate: the predicted peak counts the import as load_models measured it
        memory["predicted_peak_bytes"] += torch_import_bytes() or 0
    return LoadedPair(
        tokenizer=tokenizer, target=target, draft=draft, params=params, fingerprint=checked["fingerprint"],
        eos_ids=eos_ids(tokenizer, dirs["target"]), vocab_size=load_spec(checked["tokenizer_dir"]).vocab_size,
        device=device, dtype=dtype, draft_tokens=draft_tokens, pairing=checked["pairing"],
        memory={k: memory[k] for k in ("weights_bytes", "kv_cache_bytes", "activation_bytes", "loader_bytes", "total_bytes", "predicted_peak_bytes")},
        context_tokens=max_tokens, context_window=window, load_s=time.perf_counter() - load_start,
        extra={"engine_fields": {"engine": "torch", "device": device, "dtype": dtype, "threads": threads,
                                 "reproducible": reproducible}},
    )


def generate(
    pair: LoadedPair,
    prompt_ids: list[int],
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    on_text: Callable[[str], None] | None = None,
    on_tokens: Callable[[list[int]], bool | None] | None = None,
) -> dict:
    """One generation on a loaded pair. on_text receives new text as it comes; on_tokens each batch of new
    ids, and returning True from it stops the generation there (a client gone, a stop string seen).

    Returns {"text", "tokens", "stats", "prompt_tokens", "timings": {"prefill_s", "decode_s"},
    "first_token_at"} (first_token_at: a time.perf_counter() value, or None when nothing came).
    """
    from runner.decoding.speculative import generate_speculative

    generate_start = time.perf_counter()
    first_token: list[float] = []
    text_stream = TextStream(pair.tokenizer, on_text) if on_text else None

    def stream(new: list[int]) -> bool:
        if not first_token:
            first_token.append(time.perf_counter())
        if text_stream:
            text_stream(new)
        return bool(on_tokens(new)) if on_tokens else False

    settings = pair.settings
    result = with_history(pair.history, settings.guard, temperature, seed, lambda advice: generate_speculative(
        pair.target,
        pair.draft,
        prompt_ids,
        max_new_tokens,
        settings=settings,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        eos_ids=pair.eos_ids,
        vocab_size=pair.vocab_size,
        on_tokens=stream,
        start_plain=advice,
        prior=pair.prior,
    ))
    end = time.perf_counter()
    first = first_token[0] if first_token else None
    return {
        "text": pair.tokenizer.decode(result.tokens, skip_special_tokens=True),
        "tokens": result.tokens,
        "stats": result.stats.as_dict(),
        "prompt_tokens": len(prompt_ids),
        "timings": {"prefill_s": (first or end) - generate_start, "decode_s": end - (first or end)},
        "first_token_at": first,
        # per draft position: how often drafted, how often accepted (a server sums these across requests)
        "positions": {"drafted": list(result.stats.drafted_at), "accepted": list(result.stats.accepted_at)},
    }


def run_unpacked(
    root: Path,
    roles: Mapping[str, str],
    params: Mapping,
    prompt: str,
    *,
    max_new_tokens: int = 128,
    draft_tokens: int | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    raw: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    memory_budget: int | None = None,
    verified_files: Mapping[str, str] | None = None,
    weight_ranges: Mapping[str, FileRange] | None = None,
    on_text: Callable[[str], None] | None = None,
    history: Any = None,
    reproducible: bool = False,
) -> dict:
    """Checks, loads and runs the pair unpacked at `root` (`load_pair` then `generate`); the `run --json`
    fields this part knows. history: a runner.decoding.run_history.RunHistory of this bundle on this machine.

    roles: role -> directory relative to root (target, draft, tokenizer). params: the Kitfile's
    model.parameters["speculative"] (draft_tokens, min_acceptance, min_size_ratio, allow_cross_family,
    adaptive, guard, dtype). verified_files: path relative to root -> sha256 from the verified signature;
    when given, weights and configs are hashed as they are loaded. weight_ranges: path relative to root ->
    FileRange, for weight files left inside their layer blobs instead of extracted (bundle run); each is
    read from there and hashed against verified_files like a file. Returns {"tokenizer": {"fingerprint"},
    "text", "tokens", "stats", "device", "dtype", "pairing", "memory", "prompt_ids"}.
    """
    run_start = time.perf_counter()
    pair = load_pair(
        root, roles, params, context=PromptContext([prompt], max_new_tokens, raw),
        draft_tokens=draft_tokens, device=device, dtype=dtype, memory_budget=memory_budget, verified_files=verified_files,
        weight_ranges=weight_ranges, reproducible=reproducible,
    )
    pair.history = history
    ids = pair.prompt_ids(prompt, raw)
    result = generate(pair, ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, on_text=on_text)
    end = time.perf_counter()
    return {
        "tokenizer": {"fingerprint": pair.fingerprint},
        "text": result["text"],
        "tokens": result["tokens"],
        "stats": result["stats"],
        **pair.engine_fields(),
        "prompt_tokens": result["prompt_tokens"],
        "prompt_ids": ids,  # for a run record's digest (bundler.trust.requestlog); `bundle run` does not print them
        "pairing": pair.pairing,
        "memory": pair.memory,
        "forward": pair.forward(),
        "timings": {
            "load_s": pair.load_s,
            **result["timings"],
            # from the start of run_unpacked; the caller adds verification and extraction before it
            "first_token_s": (result["first_token_at"] or end) - run_start,
        },
    }
