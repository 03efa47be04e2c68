"""Tiny real models for tests: random Llama target/draft pairs and a BPE tokenizer trained on the spot.

Nothing is downloaded. `make_pair` writes a bundle context the way CONTRACT.md section 1 lays it out:
`root/target/`, `root/draft/`, `root/tokenizer/` and `root/Kitfile`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
BOS, EOS, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "speculative decoding drafts tokens with a small model and verifies them with a large one",
    "def add(a, b):\n    return a + b\n",
    "numbers like 3.14159, 42 and 1,000,000 appear in text",
    "tokenizers must match exactly or the draft proposes the wrong ids",
    "caf\u00e9 na\u00efve \u6771\u4eac \U0001f44d",
] * 20


def train_tokenizer(vocab_size: int = 320) -> Tokenizer:
    """A byte-level BPE tokenizer (like SmolLM2's) trained on a fixed corpus; deterministic."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def write_tokenizer(directory: Path, tokenizer: Tokenizer) -> Path:
    """Writes tokenizer.json and a tokenizer_config.json with special tokens and a chat template."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return directory


def tiny_llama_config(
    vocab_size: int, *, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2, init_std: float = 0.02
) -> LlamaConfig:
    """A small Llama config whose special-token ids agree with `train_tokenizer`."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=SPECIAL_TOKENS.index(BOS),
        eos_token_id=SPECIAL_TOKENS.index(EOS),
        pad_token_id=SPECIAL_TOKENS.index(PAD),
        initializer_range=init_std,
    )


ARCHITECTURES = ("llama", "qwen2", "mistral", "gemma2", "phi3")


def tiny_config(arch: str, vocab_size: int, *, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                init_std: float = 0.02):
    """A small config of one of `ARCHITECTURES` (transformers' own classes), special ids as `train_tokenizer`'s."""
    from transformers import AutoConfig

    if arch == "llama":
        return tiny_llama_config(vocab_size, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, init_std=init_std)
    settings = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads, max_position_embeddings=2048,
        tie_word_embeddings=arch in ("qwen2", "gemma2"), bos_token_id=SPECIAL_TOKENS.index(BOS),
        eos_token_id=SPECIAL_TOKENS.index(EOS), pad_token_id=SPECIAL_TOKENS.index(PAD), initializer_range=init_std,
    )
    if arch == "mistral":
        settings["sliding_window"] = None  # full attention, as Mistral 7B v0.2 and later
    if arch == "gemma2":
        settings.update(sliding_window=16, query_pre_attn_scalar=hidden // heads)  # prompts here cross the window
    if arch == "phi3":
        settings.pop("head_dim")
    return AutoConfig.for_model(arch, **settings)


def tiny_model(arch: str, vocab_size: int, *, seed: int = 0, dtype: torch.dtype = torch.float32, **shape):
    """A randomly initialised tiny causal LM of `arch` in eval mode; `shape` goes to `tiny_config`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, vocab_size, **shape))
    return model.to(dtype).eval()


def tiny_llama(vocab_size: int, *, seed: int = 0, dtype: torch.dtype = torch.float32, **shape) -> LlamaForCausalLM:
    """A randomly initialised tiny Llama in eval mode; `shape` goes to `tiny_llama_config`."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(vocab_size, **shape))
    return model.to(dtype).eval()


def layer_skip_draft(target: LlamaForCausalLM, layers: int = 1) -> LlamaForCausalLM:
    """A draft made of the target's first `layers` layers: it agrees with the target often, not always."""
    config = LlamaConfig.from_dict(target.config.to_dict())
    config.num_hidden_layers = layers
    draft = LlamaForCausalLM(config).to(target.dtype).eval()
    draft.load_state_dict(target.state_dict(), strict=False)
    return draft


def write_kitfile(root: Path, *, name: str = "tiny-spec", version: str = "1.0.0", speculative: dict | None = None) -> Path:
    """The Kitfile of CONTRACT.md section 1 for a context laid out by `make_pair`."""
    speculative = speculative or {"draft_tokens": 4, "min_acceptance": 0.0}
    spec = ", ".join(f"{k}: {json.dumps(v)}" for k, v in speculative.items())
    text = f"""manifestVersion: 1.0.0
package: {{name: {name}, version: {version}, authors: [specbundle tests], license: Apache-2.0}}
model:
  name: {name}-target
  path: target/
  framework: transformers
  parts:
    - {{name: draft, path: draft/, type: draft}}
    - {{name: tokenizer, path: tokenizer/, type: tokenizer}}
  parameters:
    speculative: {{{spec}}}
docs:
  - {{path: README.md}}
"""
    path = root / "Kitfile"
    path.write_text(text)
    (root / "README.md").write_text(f"# {name}\n\nA tiny random speculative pair for tests.\n")
    return path


def make_pair(
    root: Path,
    *,
    vocab_size: int = 320,
    target_layers: int = 2,
    draft_layers: int = 1,
    target_hidden: int = 64,
    draft_hidden: int = 16,
    target_vocab_pad: int = 0,
    tokenizer_in_models: bool = False,
    seed: int = 0,
    init_std: float = 0.1,
    speculative: dict | None = None,
    arch: str = "llama",
    max_shard_size: str | None = None,
) -> dict[str, Path]:
    """Writes a tiny target/draft pair, their tokenizer and a Kitfile under `root`.

    The target has about 12x the draft's parameters (the default pairing policy wants >= 4x).
    `init_std` 0.1 gives varied greedy text (0.02, transformers' default, repeats one token).
    `target_vocab_pad` pads the target's embedding beyond the tokenizer's vocabulary, as Qwen does.
    With `tokenizer_in_models` the tokenizer files are copied into target/ and draft/ as well.
    `arch`: one of `ARCHITECTURES` for both models; `max_shard_size` shards the target's weights.
    Returns the paths: root, target, draft, tokenizer, kitfile.
    """
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size)
    n_tokens = tokenizer.get_vocab_size(with_added_tokens=True)
    paths = {"root": root, "target": root / "target", "draft": root / "draft", "tokenizer": root / "tokenizer"}
    target = tiny_model(
        arch, n_tokens + target_vocab_pad, seed=seed, hidden=target_hidden, layers=target_layers, init_std=init_std
    )
    draft = tiny_model(
        arch, n_tokens, seed=seed + 1, hidden=draft_hidden, layers=draft_layers, heads=2, kv_heads=1, init_std=init_std
    )
    shards = {"max_shard_size": max_shard_size} if max_shard_size else {}
    target.save_pretrained(paths["target"], safe_serialization=True, **shards)
    draft.save_pretrained(paths["draft"], safe_serialization=True)
    write_tokenizer(paths["tokenizer"], tokenizer)
    if tokenizer_in_models:
        write_tokenizer(paths["target"], tokenizer)
        write_tokenizer(paths["draft"], tokenizer)
    paths["kitfile"] = write_kitfile(root, speculative=speculative)
    return paths


def truncate_weights_to_header(model_dir: Path) -> None:
    """Cuts each safetensors file after its header: parameter counts still read, loading would fail.

    Tests use it to prove a refusal came before any weight was loaded.
    """
    for path in Path(model_dir).glob("*.safetensors"):
        data = path.read_bytes()
        header_end = 8 + int.from_bytes(data[:8], "little")
        path.write_bytes(data[:header_end])
