"""Loads an unpacked GGUF bundle on the llama.cpp engine: the GGUF checks (runner.checks.gguf_model) before any
weights load, then both files through runner.engines.llamacpp, into the LoadedPair that runner.run's one
generate step (and serve, and bench) takes."""

from __future__ import annotations

__all__ = ["GGUFTokenizer", "NO_BOS_EOS", "load_gguf_pair"]

import time
from collections.abc import Mapping
from pathlib import Path

from runner.checks import gguf_model
from runner.checks.context_window import gguf_window
from runner.checks.memory import check_memory
from runner.decoding.settings import DecodingSettings, cache_tokens, thread_count
from runner.engines import llamacpp, llamacpp_files
from runner.models import chat_template
from runner.pair import LoadedPair, context_tokens


# The template's bos/eos variables render empty: llama.cpp adds bos itself (tokenizer.ggml.add_bos_token).
NO_BOS_EOS = {"bos_token": "", "eos_token": ""}


class GGUFTokenizer:
    """The target file's own llama.cpp tokenizer (vocabulary only), with the calls run.py's text stream uses."""

    def __init__(self, path: Path, metadata: Mapping) -> None:
        self.llm = llamacpp_files.open_llama(path, vocab_only=True)
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
                   memory_budget: int | None) -> LoadedPair:
    """runner.run.load_pair for a GGUF pair (bundle run, serve, bench): the GGUF checks, the memory preflight,
    then both files loaded once. context: as runner.run.load_pair takes it (a PromptContext checked against the
    target file's context_length)."""
    checked = gguf_model.preflight(dirs, params)
    files, headers = checked["files"], checked["headers"]
    tokenizer = GGUFTokenizer(files["target"], headers["target"]["metadata"])
    window = gguf_window(headers["target"]["metadata"])
    prompt_tokens, new_tokens = context_tokens(context, tokenizer, window)
    n_ctx = cache_tokens(prompt_tokens, new_tokens, draft_tokens, DecodingSettings.from_params(params).ngram_tokens)
    memory = gguf_model.estimate_memory(headers, n_ctx)
    check_memory(memory, memory_budget, "cpu")
    threads = thread_count(params)
    load_start = time.perf_counter()
    target = llamacpp.load(files["target"], n_ctx=n_ctx, threads=threads)
    draft = llamacpp.load(files["draft"], n_ctx=n_ctx, threads=threads) if "draft" in files else None  # draft-free: prompt lookup
    file_type = headers["target"]["metadata"].get("general.file_type", "gguf")
    return LoadedPair(
        tokenizer=tokenizer, target=target, draft=draft, params=params, fingerprint=checked["fingerprint"],
        eos_ids=tokenizer.eos_ids(), vocab_size=None, device="cpu", dtype=str(file_type), draft_tokens=draft_tokens,
        pairing=checked["pairing"], memory=memory, context_tokens=n_ctx, context_window=window, load_s=time.perf_counter() - load_start,
        engine="llama.cpp", extra={"forward": {"target": "llama.cpp", "draft": "llama.cpp" if draft is not None else None},
                                   # run --json's: the file type as the header has it (a number)
                                   "engine_fields": {"engine": "llama.cpp", "engine_version": llamacpp_files.version(),
                                                     "threads": threads, "device": "cpu", "dtype": file_type}},
    )
