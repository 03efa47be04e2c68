"""Runs an unpacked GGUF bundle on the llama.cpp engine: the GGUF checks (runner.checks.gguf_model) before any
weights load, then both files through runner.engines.llamacpp, then the one decoding loop."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from runner.models import chat_template

from runner.checks import gguf_model
from runner.engines import llamacpp
from runner.pair import LoadedPair
from runner.checks.pairing import check_memory


# The template's bos/eos variables render empty: llama.cpp adds bos itself (tokenizer.ggml.add_bos_token).
NO_BOS_EOS = {"bos_token": "", "eos_token": ""}


class GGUFTokenizer:
    """The target file's own llama.cpp tokenizer (vocabulary only), with the calls run.py's text stream uses."""

    def __init__(self, path: Path, metadata: Mapping) -> None:
        self.llm = llamacpp.open_llama(path, vocab_only=True)
        self.metadata = metadata
        self.eos_token_id = metadata.get("tokenizer.ggml.eos_token_id")
        self.special = {i for i, t in enumerate(metadata.get("tokenizer.ggml.token_type") or []) if t == 3}
        self._pieces = llamacpp.Pieces(self.llm)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """llama-cpp-python's detokenize, byte for byte, from cached pieces: a stream decodes its whole text at
        every token, and detokenize asks llama.cpp for every token's piece again (O(n) C calls per token)."""
        kept = [i for i in ids if not (skip_special_tokens and i in self.special)]
        return self._pieces.join(kept).decode("utf-8", "replace")

    def prompt_ids(self, prompt: str, raw: bool) -> list[int]:
        """Through the file's chat template (tokenizer.chat_template, rendered as transformers does, bounded:
        runner.models.chat_template) unless raw; bos added as the file says."""
        template = self.llm.metadata.get("tokenizer.chat_template")
        add_bos = bool(self.metadata.get("tokenizer.ggml.add_bos_token", False))
        if raw or not template:
            return self.llm.tokenize(prompt.encode(), add_bos=add_bos, special=False)
        text = chat_template.render(template, [{"role": "user", "content": prompt}], variables=NO_BOS_EOS)
        return self.llm.tokenize(text.encode(), add_bos=add_bos, special=True)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """A chat (OpenAI-style messages) through the file's chat template (raw contents without one)."""
        template = self.llm.metadata.get("tokenizer.chat_template")
        add_bos = bool(self.metadata.get("tokenizer.ggml.add_bos_token", False))
        if not template:
            return self.llm.tokenize("\n".join(m["content"] for m in messages).encode(), add_bos=add_bos, special=False)
        text = chat_template.render(template, messages, variables=NO_BOS_EOS)
        return self.llm.tokenize(text.encode(), add_bos=add_bos, special=True)

    def eos_ids(self) -> set[int]:
        m = self.metadata
        return {int(m[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if m.get(k) is not None}


def load_gguf_pair(dirs: Mapping[str, Path], params: Mapping, *, context, draft_tokens: int,
                   memory_budget: int | None):
    """runner.run.load_pair for a GGUF pair (bundle serve): the same checks, then both files loaded once.
    context: (prompt tokens, new tokens), or a function of the tokenizer giving them."""

    files = {role: gguf_model.gguf_files(dirs[role])[0] for role in ("target", "draft")}
    headers = {role: gguf_model.read_header(path) for role, path in files.items()}
    fingerprint = gguf_model.check_tokenizers(files, headers)
    pairing = gguf_model.check_pairing(headers, params)
    tokenizer = GGUFTokenizer(files["target"], headers["target"]["metadata"])
    prompt_tokens, new_tokens = context(tokenizer) if callable(context) else context
    n_ctx = prompt_tokens + new_tokens + 2 * draft_tokens + 2
    memory = gguf_model.estimate_memory(headers, n_ctx)
    check_memory(memory, memory_budget, "cpu")
    threads = int(params.get("threads") or os.cpu_count() or 1)
    load_start = time.perf_counter()
    target = llamacpp.load(files["target"], n_ctx=n_ctx, threads=threads)
    draft = llamacpp.load(files["draft"], n_ctx=n_ctx, threads=threads)
    return LoadedPair(
        tokenizer=tokenizer, target=target, draft=draft, params=params, fingerprint=fingerprint,
        eos_ids=tokenizer.eos_ids(), vocab_size=None, device="cpu",
        dtype=str(headers["target"]["metadata"].get("general.file_type", "gguf")), draft_tokens=draft_tokens,
        pairing=pairing, memory=memory, context_tokens=n_ctx, load_s=time.perf_counter() - load_start,
        engine="llama.cpp", extra={"forward": {"target": "llama.cpp", "draft": "llama.cpp"}, "threads": threads},
    )


def run_gguf(
    dirs: Mapping[str, Path],
    params: Mapping,
    prompt: str,
    *,
    max_new_tokens: int,
    draft_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    raw: bool,
    memory_budget: int | None,
    on_text: Callable[[str], None] | None,
    text_stream: Callable,
    history=None,
) -> dict:
    """run_unpacked for a GGUF pair; the same `run --json` fields, "engine": "llama.cpp"."""
    from runner.decoding.run_history import with_history
    from runner.decoding.speculative import generate_speculative

    run_start = time.perf_counter()
    files = {role: gguf_model.gguf_files(dirs[role])[0] for role in ("target", "draft")}
    headers = {role: gguf_model.read_header(path) for role, path in files.items()}
    fingerprint = gguf_model.check_tokenizers(files, headers)
    pairing = gguf_model.check_pairing(headers, params)
    tokenizer = GGUFTokenizer(files["target"], headers["target"]["metadata"])
    prompt_ids = tokenizer.prompt_ids(prompt, raw)
    n_ctx = len(prompt_ids) + max_new_tokens + 2 * draft_tokens + 2
    memory = gguf_model.estimate_memory(headers, n_ctx)
    check_memory(memory, memory_budget, "cpu")
    threads = int(params.get("threads") or os.cpu_count() or 1)
    load_start = time.perf_counter()
    target = llamacpp.load(files["target"], n_ctx=n_ctx, threads=threads)
    draft = llamacpp.load(files["draft"], n_ctx=n_ctx, threads=threads)
    generate_start = time.perf_counter()
    first_token: list[float] = []
    stream = text_stream(tokenizer, on_text) if on_text else None

    def on_tokens(new: list[int]) -> None:
        if not first_token:
            first_token.append(time.perf_counter())
        if stream:
            stream(new)

    result = with_history(history, params, temperature, seed, lambda advice: generate_speculative(
        target, draft, prompt_ids, max_new_tokens, draft_tokens=draft_tokens,
        adaptive=bool(params.get("adaptive", True)), draft_confidence=float(params.get("draft_confidence", 0.0)),
        temperature=temperature, top_p=top_p, seed=seed, eos_ids=tokenizer.eos_ids(),
        min_acceptance=float(params.get("min_acceptance", 0.0)), guard=bool(params.get("guard", True)),
        on_tokens=on_tokens, start_plain=advice,
    ))
    end = time.perf_counter()
    first = first_token[0] if first_token else end
    return {
        "tokenizer": {"fingerprint": fingerprint},
        "text": tokenizer.decode(result.tokens),
        "tokens": result.tokens,
        "stats": result.stats.as_dict(),
        "engine": "llama.cpp",
        "engine_version": llamacpp.version(),
        "threads": threads,
        "device": "cpu",
        "dtype": headers["target"]["metadata"].get("general.file_type", "gguf"),
        "prompt_tokens": len(prompt_ids),
        "pairing": pairing,
        "memory": memory,
        "forward": {"target": "llama.cpp", "draft": "llama.cpp"},
        "timings": {"load_s": generate_start - load_start, "prefill_s": first - generate_start,
                    "decode_s": end - first, "first_token_s": first - run_start},
    }
