"""Create the untrained demo draft: a small Llama sharing the target's tokenizer, its tied embedding
initialised by an SVD projection of the target's embedding (so the draft starts out knowing which tokens
are alike, instead of learning 49152 rows from scratch).

    .venv/bin/python demo/make_draft.py [--layers 2 --hidden 256 --intermediate 1024]

Writes demo/work/init/ (config.json, model.safetensors). Idempotent: kept if it exists (--force to redo).
Needs demo/work/target/ (run demo/convert_target.py first).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

DEMO = Path(__file__).resolve().parent
WORK = DEMO / "work"
TARGET_DIR = WORK / "target"
INIT_DIR = WORK / "init"


def draft_config(target: LlamaConfig, layers: int, hidden: int, intermediate: int) -> LlamaConfig:
    """The draft's config: the target's vocabulary, special tokens, head_dim and rope; smaller body."""
    head_dim = 64
    heads = hidden // head_dim
    return LlamaConfig(
        vocab_size=target.vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads, head_dim=head_dim,
        max_position_embeddings=target.max_position_embeddings, rms_norm_eps=1e-5,
        rope_parameters=dict(target.rope_parameters), tie_word_embeddings=True,
        bos_token_id=target.bos_token_id, eos_token_id=target.eos_token_id, pad_token_id=target.pad_token_id,
        hidden_act="silu", attention_bias=False, mlp_bias=False,
    )


def svd_embedding(target_embedding: torch.Tensor, hidden: int) -> torch.Tensor:
    """Rank-`hidden` projection of the target's embedding (U_r S_r), rescaled to the target's row norm."""
    emb = target_embedding.double()
    emb = emb - emb.mean(0, keepdim=True)
    u, s, _ = torch.linalg.svd(emb, full_matrices=False)
    proj = u[:, :hidden] * s[:hidden]
    proj *= target_embedding.double().norm(dim=1).mean() / proj.norm(dim=1).mean()
    return proj.float()


def main() -> int:
    """Build and save the initial draft."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    if (INIT_DIR / "model.safetensors").exists() and not args.force:
        print(f"initial draft exists: {INIT_DIR}")
        return 0
    torch.set_num_threads(int(os.environ.get("DEMO_THREADS", "1")))
    torch.manual_seed(0)
    target_cfg = LlamaConfig.from_pretrained(TARGET_DIR)
    weights = load_file(str(TARGET_DIR / "model.safetensors"))
    cfg = draft_config(target_cfg, args.layers, args.hidden, args.intermediate)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(svd_embedding(weights["model.embed_tokens.weight"], args.hidden))
        # The tied head would otherwise start out predicting the current token with logits ~50 (the
        # residual stream is mostly the input embedding): start with a soft output distribution instead.
        model.model.norm.weight.fill_(0.25)
    model.tie_weights()
    if INIT_DIR.exists():
        shutil.rmtree(INIT_DIR)
    model.save_pretrained(str(INIT_DIR), safe_serialization=True)
    GenerationConfig.from_pretrained(TARGET_DIR).save_pretrained(str(INIT_DIR))
    n = sum(p.numel() for p in model.parameters())
    print(f"initial draft: {args.layers} layers, hidden {args.hidden}, {n / 1e6:.1f}M params -> {INIT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
