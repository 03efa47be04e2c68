"""Runs an unpacked, verified bundle: every check that needs no weights first, then load, then decode.

Order: pickle-weights refusal, tokenizer gate, config agreement, pairing, then (with the prompt's
length known) the memory preflight. Only when all pass are weights read. The caller (bundle run) verifies the bundle before calling `run_unpacked`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from bundler.errors import BundleError
from runner import compact_llama
from runner.draft_vocab import SubsetHeadDraft, read_draft_vocab
from runner.gguf_model import bundle_format
from runner.loading import check_weight_files, load_model
from runner.modelinfo import estimate_memory, read_config, read_raw_config, validate_config
from runner.pairing import check_memory, check_pairing
from runner.tokenizer_gate import check_config_agrees, check_tokenizers, has_tokenizer_files, load_spec


def _resolve_device(device: str | None) -> str:
    import torch

    if device:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BundleError("usage", f"--device {device}: CUDA is not available here")
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def _prompt_ids(tokenizer, prompt: str, raw: bool) -> list[int]:
    """The prompt as ids: through the chat template when the tokenizer has one and raw is off."""
    if not raw and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
    else:
        ids = tokenizer(prompt)
    if isinstance(ids, Mapping) or hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def _eos_ids(tokenizer, model_dir: Path) -> set[int]:
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


class _TextStream:
    """Turns new token ids into new text, holding back an incomplete UTF-8 character."""

    def __init__(self, tokenizer, on_text: Callable[[str], None]):
        self.tokenizer, self.on_text, self.tokens, self.shown = tokenizer, on_text, [], 0

    def __call__(self, new: list[int]) -> None:
        self.tokens += new
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        if len(text) > self.shown:
            self.on_text(text[self.shown :])
        self.shown = len(text)


def _verified_digests(verified_files: Mapping[str, str] | None, role_path: str) -> dict[str, str] | None:
    """The verified sha256 of each file directly in a role's directory, keyed by file name."""
    if verified_files is None:
        return None
    prefix = role_path.strip("/") + "/"
    return {p[len(prefix) :]: d for p, d in verified_files.items() if p.startswith(prefix) and "/" not in p[len(prefix) :]}


def preflight(root: Path, roles: Mapping[str, str], params: Mapping) -> dict:
    """The checks that read no weights, but memory: pickle weights, tokenizer gate, config agreement, pairing.

    Returns {"dirs", "tokenizer_dir", "fingerprint", "pairing"}; raises BundleError on the first failure.
    """
    for needed in ("target", "draft"):
        if needed not in roles:
            raise BundleError("invalid-bundle", f"the Kitfile names no {needed} role")
    dirs = {role: Path(root) / path for role, path in roles.items() if role in ("target", "draft", "tokenizer")}
    for role, directory in dirs.items():
        if not directory.is_dir():
            raise BundleError("invalid-bundle", f"the {role} directory {roles[role]} is missing")
    for role in ("target", "draft"):
        check_weight_files(dirs[role], role)
        # Types and ranges of what sizes the model, before anything is sized or built from it (exit 6).
        validate_config(read_raw_config(dirs[role]), role)
    fingerprint = check_tokenizers(dirs)
    tokenizer_dir = dirs.get("tokenizer") or next(d for d in dirs.values() if has_tokenizer_files(d))
    for role in ("target", "draft"):
        check_config_agrees(dirs[role], tokenizer_dir, role)
    pairing = check_pairing(dirs["target"], dirs["draft"], params)
    draft_vocab = None
    if params.get("draft_vocab"):
        path = (dirs["draft"] / str(params["draft_vocab"])).resolve()
        if not path.is_relative_to(dirs["draft"].resolve()) or not path.is_file():
            raise BundleError("invalid-bundle", f"draft_vocab {params['draft_vocab']!r} is not a file in the draft directory")
        draft_vocab = read_draft_vocab(path, load_spec(tokenizer_dir).vocab_size)
    return {"dirs": dirs, "tokenizer_dir": tokenizer_dir, "fingerprint": fingerprint, "pairing": pairing, "draft_vocab": draft_vocab}


def runtime_target(target):
    """The target as the loop runs it: through our compact forward when its architecture allows (see
    runner.compact_llama; the same logits, less time per call), else through transformers."""
    return compact_llama.CompactLlama(target) if compact_llama.supports(target.config) else target


def runtime_draft(draft, checked: Mapping):
    """The draft as the loop runs it: through our compact forward when its architecture allows (see
    runner.compact_llama), scoring only the bundle's draft vocabulary when it names one."""
    ids = checked.get("draft_vocab")
    if compact_llama.supports(draft.config):
        return compact_llama.CompactLlama(draft, ids)
    return SubsetHeadDraft(draft, ids) if ids else draft


def forward_path(model) -> str:
    """Which forward a model runs through: "compact" (runner.compact_llama) or "transformers"."""
    return "compact" if isinstance(model, compact_llama.CompactLlama) else "transformers"


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
    on_text: Callable[[str], None] | None = None,
) -> dict:
    """Checks, loads and runs the pair unpacked at `root`; the `run --json` fields this part knows.

    roles: role -> directory relative to root (target, draft, tokenizer). params: the Kitfile's
    model.parameters["speculative"] (draft_tokens, min_acceptance, min_size_ratio, allow_cross_family,
    adaptive, guard, dtype). verified_files: path relative to root -> sha256 from the verified signature;
    when given, weights and configs are hashed as they are loaded. Returns {"tokenizer": {"fingerprint"},
    "text", "tokens", "stats", "device", "dtype", "pairing", "memory"}.
    """
    from transformers import AutoTokenizer

    from runner.speculative import generate_speculative

    run_start = time.perf_counter()
    device = _resolve_device(device)
    dtype = dtype or params.get("dtype") or ("bfloat16" if device.startswith("cuda") else "float32")
    draft_tokens = int(draft_tokens or params.get("draft_tokens", 5))
    gguf_dirs = {role: Path(root) / path for role, path in roles.items() if role in ("target", "draft")}
    if len(gguf_dirs) == 2 and all(d.is_dir() for d in gguf_dirs.values()) and bundle_format(gguf_dirs) == "gguf":
        from runner.gguf_run import run_gguf

        return run_gguf(gguf_dirs, params, prompt, max_new_tokens=max_new_tokens, draft_tokens=draft_tokens,
                        temperature=temperature, top_p=top_p, seed=seed, raw=raw, memory_budget=memory_budget,
                        on_text=on_text, text_stream=_TextStream)
    checked = preflight(root, roles, params)
    dirs = checked["dirs"]
    tokenizer = AutoTokenizer.from_pretrained(checked["tokenizer_dir"], local_files_only=True, trust_remote_code=False)
    prompt_ids = _prompt_ids(tokenizer, prompt, raw)
    max_tokens = len(prompt_ids) + max_new_tokens + 2 * draft_tokens + 1  # a verify pass may look past the end
    memory = estimate_memory(dirs["target"], dirs["draft"], dtype, max_tokens, prompt_tokens=len(prompt_ids), draft_tokens=draft_tokens)
    check_memory(memory, memory_budget, device)
    load_start = time.perf_counter()
    target = runtime_target(load_model(dirs["target"], dtype, device, role="target",
                                       expected_sha256=_verified_digests(verified_files, roles["target"])))
    draft = runtime_draft(load_model(dirs["draft"], dtype, device, role="draft",
                                        expected_sha256=_verified_digests(verified_files, roles["draft"])), checked)
    generate_start = time.perf_counter()
    first_token: list[float] = []
    text_stream = _TextStream(tokenizer, on_text) if on_text else None

    def stream(new: list[int]) -> None:
        if not first_token:
            first_token.append(time.perf_counter())
        if text_stream:
            text_stream(new)
    result = generate_speculative(
        target,
        draft,
        prompt_ids,
        max_new_tokens,
        draft_tokens=draft_tokens,
        adaptive=bool(params.get("adaptive", True)),
        draft_confidence=float(params.get("draft_confidence", 0.0)),
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        eos_ids=_eos_ids(tokenizer, dirs["target"]),
        min_acceptance=float(params.get("min_acceptance", 0.0)),
        guard=bool(params.get("guard", True)),
        vocab_size=load_spec(checked["tokenizer_dir"]).vocab_size,
        on_tokens=stream,
    )
    end = time.perf_counter()
    return {
        "tokenizer": {"fingerprint": checked["fingerprint"]},
        "text": tokenizer.decode(result.tokens, skip_special_tokens=True),
        "tokens": result.tokens,
        "stats": result.stats.as_dict(),
        "engine": "torch",
        "device": device,
        "dtype": dtype,
        "prompt_tokens": len(prompt_ids),
        "pairing": checked["pairing"],
        "memory": {k: memory[k] for k in ("weights_bytes", "kv_cache_bytes", "activation_bytes", "loader_bytes", "total_bytes", "predicted_peak_bytes")},
        "forward": {"target": forward_path(target), "draft": forward_path(draft)},
        "timings": {
            "load_s": generate_start - load_start,
            "prefill_s": (first_token[0] if first_token else end) - generate_start,
            "decode_s": end - (first_token[0] if first_token else end),
            # from the start of run_unpacked; the caller adds verification and extraction before it
            "first_token_s": (first_token[0] if first_token else end) - run_start,
        },
    }
