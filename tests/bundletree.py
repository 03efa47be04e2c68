"""Small bundle context trees for bundler tests: real safetensors and tokenizer files, no torch needed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

KITFILE = """\
manifestVersion: 1.0.0
package: {{name: {name}, version: {version}, authors: [tests], license: Apache-2.0}}
model:
  name: tiny-target
  path: target/
  framework: transformers
  parts:
    - {{name: draft, path: draft/, type: draft}}
    - {{name: tokenizer, path: tokenizer/, type: tokenizer}}
  parameters:
    speculative: {{draft_tokens: 4, min_acceptance: 0.3}}
docs:
  - {{path: README.md}}
"""


def tokenizer_json(vocab: list[str] | None = None) -> str:
    """A word-level tokenizer (deterministic, no training) as tokenizer.json text."""
    words = vocab or ["<unk>", "<s>", "</s>", "hello", "world", "spec", "bundle", "draft", "target", "token"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok.to_str()


def _model_dir(path: Path, hidden: int, layers: int, seed: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {"model.embed_tokens.weight": rng.standard_normal((10, hidden), dtype=np.float32)}
    for i in range(layers):
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = rng.standard_normal((hidden * 2, hidden), dtype=np.float32)
    save_file(tensors, str(path / "model.safetensors"))
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "num_hidden_layers": layers,
              "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": hidden * 2, "vocab_size": 10,
              "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True}
    (path / "config.json").write_text(json.dumps(config, indent=2))


def make_tree(root: Path, name: str = "tiny-spec", version: str = "1.0.0", seed: int = 0) -> Path:
    """root/{Kitfile, README.md, target/, draft/, tokenizer/}; returns root."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "Kitfile").write_text(KITFILE.format(name=name, version=version))
    (root / "README.md").write_text(f"# {name}\nA tiny bundle made by the tests.\n")
    _model_dir(root / "target", 32, 4, seed)
    _model_dir(root / "draft", 8, 1, seed + 1)
    (root / "tokenizer").mkdir(exist_ok=True)
    (root / "tokenizer" / "tokenizer.json").write_text(tokenizer_json())
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    return root
