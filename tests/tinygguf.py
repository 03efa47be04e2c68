"""Tiny real GGUF models for tests, written with the `gguf` package: nothing is downloaded.

`write_gguf` writes a random Llama (f32 tensors) with the tokenizer of tests/tinymodels.train_tokenizer in
GGUF's own tokenizer metadata (byte-level BPE: tokens, token types, merges, bos/eos, add_bos), the way
llama.cpp's converter writes SmolLM2. `tokenizer` overrides one metadata field (a near-miss).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

from tests.tinymodels import SPECIAL_TOKENS, train_tokenizer


def tokenizer_fields() -> dict:
    """GGUF tokenizer metadata of the tiny BPE tokenizer (ids 0..2 are the special tokens)."""
    data = json.loads(train_tokenizer().to_str())
    vocab = data["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    types = [gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL for t in tokens]
    return {"model": "gpt2", "pre": "smollm", "tokens": tokens, "token_type": [int(t) for t in types],
            "merges": merges, "bos_token_id": 1, "eos_token_id": 2, "add_bos_token": False}


def write_gguf(path: Path, *, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               seed: int = 0, std: float = 0.3, logit_scale: float = 1.0, tokenizer: dict | None = None) -> Path:
    """A random tiny Llama in one GGUF file; returns its path (logit_scale > 1: peakier distributions)."""
    fields = {**tokenizer_fields(), **(tokenizer or {})}
    vocab, ff, head_dim = len(fields["tokens"]), 2 * hidden, hidden // heads
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model(fields["model"])
    w.add_tokenizer_pre(fields["pre"])
    w.add_token_list(fields["tokens"])
    w.add_token_types(fields["token_type"])
    w.add_token_merges(fields["merges"])
    w.add_bos_token_id(fields["bos_token_id"])
    w.add_eos_token_id(fields["eos_token_id"])
    w.add_add_bos_token(fields["add_bos_token"])

    def tensor(name: str, *shape: int, scale: float = std) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale / np.sqrt(shape[-1]) * 4).astype(np.float32))

    tensor("token_embd.weight", vocab, hidden)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    tensor("output.weight", vocab, hidden, scale=std * logit_scale)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        tensor(f"blk.{i}.attn_q.weight", hidden, hidden)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_output.weight", hidden, hidden)
        tensor(f"blk.{i}.ffn_gate.weight", ff, hidden)
        tensor(f"blk.{i}.ffn_up.weight", ff, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
