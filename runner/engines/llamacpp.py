"""The llama.cpp engine: a GGUF file through llama-cpp-python, driven token batch by token batch.

llama-cpp-python's high-level `Llama` loads the file and owns the context; the loop needs two things it
does not expose, so they come from its low-level binding of llama.cpp's C API: a decode of a batch with
logits for every position (a verify pass of k + 1 tokens) and the removal of the cache's tail
(`llama_memory_seq_rm`, a rejected draft). For continuous batching the engine builds a second context over
its loaded model, one sequence id per generation (SharedContext); both fill llama.cpp's batch alike
(`fill_batch`).
"""

from __future__ import annotations

__all__ = ["LlamaCppEngine", "LogitsBuffer", "N_BATCH", "Pieces", "SharedContext", "fill_batch", "load"]

import ctypes
import os
from pathlib import Path

import numpy as np
import torch

from runner.engines.cells import BATCH_TOKENS, Row, SequenceCells
from runner.engines.llamacpp_files import open_llama

N_BATCH = BATCH_TOKENS  # tokens per llama_decode call (a longer prompt is prefilled in chunks)


class Pieces(dict):
    """Each token's text piece (bytes) of a loaded model's vocabulary, asked of llama.cpp once per token id;
    `join` gives what llama-cpp-python's `Llama.detokenize` gives for the same ids."""

    def __init__(self, llm) -> None:  # llm: llama_cpp.Llama
        import llama_cpp

        super().__init__()
        self._lib, self._vocab, self.bos = llama_cpp, llama_cpp.llama_model_get_vocab(llm.model), llm.token_bos()
        self._buffer = (ctypes.c_char * 32)()

    def __missing__(self, token: int) -> bytes:
        # As LlamaModel.detokenize asks for a piece: a 32-byte buffer, special tokens rendered empty. A piece
        # longer than the buffer (llama.cpp answers minus its length) comes out empty there, and so here.
        n = self._lib.llama_token_to_piece(self._vocab, self._lib.llama_token(token), self._buffer, 32, 0, False)
        piece = self[token] = bytes(self._buffer[:n]) if n >= 0 else b""
        return piece

    def join(self, tokens: list[int]) -> bytes:
        text = b"".join(map(self.__getitem__, tokens))
        # detokenize drops the space a bos-led text begins with (Llama 1 added one at the start of a prompt)
        return text[1:] if tokens and tokens[0] == self.bos and text[:1] == b" " else text


class LogitsBuffer:
    """A llama.cpp context's logits buffer as a numpy array of its first n rows (each of `vocab_size` floats),
    a view valid until the context's next decode. The views are kept for the buffer's address: numpy's as_array
    makes a ctypes array type each call, a visible share of a step's Python (docs/benchmarks.md); llama.cpp moves the buffer only when it grows it, and the old views then go."""

    def __init__(self, lib, ctx, vocab_size: int) -> None:  # lib: the llama_cpp module; ctx: its context
        self._lib, self._ctx, self._vocab_size = lib, ctx, vocab_size
        self._address: int | None = None
        self._views: dict[int, np.ndarray] = {}  # rows: the view (at most N_BATCH of them)

    def rows(self, n: int) -> np.ndarray:
        address = ctypes.cast(self._lib.llama_get_logits(self._ctx), ctypes.c_void_p).value
        if address != self._address:
            self._address, self._views = address, {}
        view = self._views.get(n)
        if view is None:
            pointer = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            view = self._views[n] = np.ctypeslib.as_array(pointer, shape=(n, self._vocab_size))
        return view


class LlamaCppEngine:
    """A GGUF model behind the engine interface (runner.engines.Engine)."""

    name = "llama.cpp"
    device = torch.device("cpu")

    def __init__(self, path: str | Path, n_ctx: int = 4096, threads: int | None = None) -> None:
        import llama_cpp

        self._lib = llama_cpp
        threads = threads or len(os.sched_getaffinity(0))  # callers pass runner.checks.cpus.usable_cpus()
        self.llm = open_llama(path, n_ctx=n_ctx, n_batch=N_BATCH, n_ubatch=N_BATCH, n_threads=threads,
                              n_threads_batch=threads, logits_all=False)
        self.threads, self.n_ctx = threads, self.llm.n_ctx()
        self.batches = True
        self.vocab_size = self.llm.n_vocab()
        self.parameters = int(llama_cpp.llama_model_n_params(self.llm.model))
        self._batch = llama_cpp.llama_batch_init(N_BATCH, 0, 1)
        self._memory = llama_cpp.llama_get_memory(self.llm.ctx)
        self._logits = LogitsBuffer(llama_cpp, self.llm.ctx, self.vocab_size)
        self.n = 0

    def __del__(self) -> None:
        batch = getattr(self, "_batch", None)
        if batch is not None:
            self._lib.llama_batch_free(batch)
            self._batch = None

    def reset(self, room: int) -> None:
        if room > self.n_ctx:
            raise ValueError(f"{room} tokens exceed the llama.cpp context ({self.n_ctx})")
        self._lib.llama_memory_clear(self._memory, True)
        self.n = 0

    def _decode(self, ids: list[int], all_logits: bool) -> np.ndarray:
        fill_batch(self._batch, [(0, ids, all_logits)], [self.n])
        if self._lib.llama_decode(self.llm.ctx, self._batch) != 0:
            raise RuntimeError("llama_decode failed")
        self.n += len(ids)
        # the context reuses its buffer on the next decode: copy
        return self._logits.rows(len(ids) if all_logits else 1).copy()

    def forward(self, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        tokens = ids.view(-1).tolist()
        if self.n + len(tokens) > self.n_ctx:
            raise ValueError(f"{self.n + len(tokens)} tokens exceed the llama.cpp context ({self.n_ctx})")
        if last_only:
            for i in range(0, len(tokens), N_BATCH):
                out = self._decode(tokens[i : i + N_BATCH], all_logits=False)
            return torch.from_numpy(out)
        if len(tokens) > N_BATCH:
            return torch.cat([self.forward(ids[i : i + N_BATCH], False) for i in range(0, len(tokens), N_BATCH)])
        return torch.from_numpy(self._decode(tokens, all_logits=True))

    def crop(self, n: int) -> None:
        self.n -= n
        self._lib.llama_memory_seq_rm(self._memory, 0, self.n, -1)

    def length(self) -> int:
        return self.n

    def batch_context(self, sequences: int, n_ctx_seq: int) -> SharedContext:
        """A llama.cpp context of many sequences over this engine's loaded model (continuous batching)."""
        return SharedContext(self, sequences, n_ctx_seq)


def fill_batch(batch, rows: list[Row], starts: list[int]) -> int:
    """Rows (sequence, tokens, all_logits) into a llama_batch, each row's tokens at the positions from its
    start on, logits asked for every token of an all_logits row and the last of the others; the token count."""
    i = 0
    for (seq, tokens, all_logits), start in zip(rows, starts):
        last = len(tokens) - 1
        for j, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + j, 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = all_logits or j == last
            i += 1
    batch.n_tokens = i
    return i


class SharedContext(SequenceCells):
    """One llama.cpp context over an engine's loaded model, holding up to `sequences` sequences of
    `n_ctx_seq` tokens each (a KV cache of its own per sequence: kv_unified off, as the sequences share no
    cells): runner.engines.BatchContext. The weights are the engine's: nothing is loaded twice."""

    def __init__(self, engine: LlamaCppEngine, sequences: int, n_ctx_seq: int) -> None:
        import llama_cpp
        from llama_cpp._utils import suppress_stdout_stderr

        super().__init__(sequences, n_ctx_seq, engine.vocab_size)
        self._lib = llama_cpp
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = sequences * n_ctx_seq
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = sequences
        params.n_threads = params.n_threads_batch = engine.threads
        params.kv_unified = False
        params.no_perf = True
        self._engine = engine  # the model must outlive this context
        with suppress_stdout_stderr(disable=False):  # llama.cpp's start-up log, as the engine's Llama(verbose=False)
            self.ctx = llama_cpp.llama_init_from_model(engine.llm.model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {sequences} sequences of {n_ctx_seq} tokens")
        self._memory = llama_cpp.llama_get_memory(self.ctx)
        self._batch = llama_cpp.llama_batch_init(N_BATCH, 0, 1)
        self._logits = LogitsBuffer(llama_cpp, self.ctx, self.vocab_size)

    def close(self) -> None:
        if self._batch is not None:
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self.ctx)
            self._batch = self.ctx = None

    def __del__(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self.close()

    def decode(self, rows: list[Row]) -> list[np.ndarray]:
        """One llama_decode of rows (sequence, tokens, all_logits) appended to their sequences' caches (at
        most N_BATCH tokens in all); returns each row's logits: (len(tokens), V), or (1, V) for its last.
        The arrays are views of the context's buffer, valid until its next decode (a copy of a verify pass's
        rows would cost more than their argmax): use them before decoding again."""
        self.check(rows)
        n = fill_batch(self._batch, rows, [self.length(seq) for seq, _, _ in rows])
        if n and self._lib.llama_decode(self.ctx, self._batch) != 0:
            raise RuntimeError("llama_decode failed (the KV cache is full?)")
        outputs = sum(len(t) if a else 1 for _, t, a in rows if t)
        return self.appended(rows, self._logits.rows(outputs) if outputs else None)

    def keep(self, seq: int, n: int) -> None:
        """Keeps the first n tokens of a sequence's cache (0: frees the sequence)."""
        self._lib.llama_memory_seq_rm(self._memory, seq, n, -1)
        del self.contents[seq][n:]

    def state(self, seq: int) -> tuple[ctypes.Array, int]:
        """A copy of a sequence's cells (llama.cpp's own serialisation) and its size in bytes."""
        size = self._lib.llama_state_seq_get_size(self.ctx, seq)
        buffer = (ctypes.c_uint8 * size)()
        return buffer, self._lib.llama_state_seq_get_data(self.ctx, buffer, size, seq)

    def restore(self, seq: int, state: ctypes.Array, tokens: list[int]) -> None:
        """A sequence's cells replaced by a copy `state` made, which holds `tokens`; the sequence emptied where
        llama.cpp cannot place it."""
        if not self._lib.llama_state_seq_set_data(self.ctx, state, len(state), seq):
            self.keep(seq, 0)
            return
        self.contents[seq] = list(tokens)


def load(path: str | Path, n_ctx: int = 4096, threads: int | None = None) -> LlamaCppEngine:
    """Loads one GGUF file into a llama.cpp engine (n_ctx: the most tokens its cache holds)."""
    return LlamaCppEngine(path, n_ctx, threads)
