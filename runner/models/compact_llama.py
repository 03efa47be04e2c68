"""Llama models (target and draft) stepped by a forward pass of our own, with a KV cache of our own.

Why not transformers' forward: it adds fixed work around every call (mask construction, cache objects,
the rotary module, output classes), and the decoding loop makes one call per token: for a small draft that
work outweighs its matrix work (docs/benchmarks.md). The logits are transformers' bit for bit, in bf16 too: the same operations in the same order,
the same rotary frequencies, attention called the way transformers' SDPA path calls it. It runs only the
architecture it implements exactly (`supports`: Llama, Qwen2 (q/k/v biases) and Mistral with full
attention, SiLU MLP, default RoPE); tests check its logits against transformers' on the same weights. Any other model runs through transformers.
Where the weights are packed for oneDNN (runner.models.packed, bf16 where a probe at load measures it exact and
faster) that holds for passes of up to 31 tokens, the sizes decoding steps use; a longer prefill's products
may then differ from `F.linear`'s in the last bit, because `F.linear` changes its blocking with the row count
and the packed product does not. float32 weights may be laid out transposed instead (runner.models.packed):
float32 logits are transformers' within its rounding, not bit for bit, either way.
"""

from __future__ import annotations

__all__ = ["CompactLlama", "compact_config", "supports", "weights_from_state_dict"]

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from runner.models.draft_vocab import full_vocab_logits, head_rows
from runner.models.invariant import InvariantForward, room
from runner.models import packed
from runner.models.packed import gated_mlp, linear, qkv
from runner.models.row_plan import BatchedCache, RowPlan, attention_parts
from runner.checks.modelinfo import COMPACT_ARCHITECTURES as ARCHITECTURES

# ARCHITECTURES: decoders whose layers are Llama's: RMSNorm, rotary attention (Qwen2 adds q/k/v biases), a
# SiLU gated MLP; supported only with full attention on every layer.


def _full_attention(config) -> bool:
    if getattr(config, "model_type", None) == "qwen2" and getattr(config, "use_sliding_window", False):
        return False
    if getattr(config, "model_type", None) == "mistral" and getattr(config, "sliding_window", None) is not None:
        return False
    return all(t == "full_attention" for t in (getattr(config, "layer_types", None) or ()))


def supports(config) -> bool:
    """Whether `config` (transformers' config object, or `compact_config`'s) is a model this module computes
    exactly as transformers does."""
    rope = getattr(config, "rope_parameters", None) or {}
    return (
        getattr(config, "model_type", None) in ARCHITECTURES
        and _full_attention(config)
        and not getattr(config, "attention_bias", False)  # Llama's o_proj bias: not checked here, so not run
        and not getattr(config, "mlp_bias", False)
        and getattr(config, "hidden_act", None) == "silu"
        and rope.get("rope_type", "default") == "default"
        and "rope_theta" in rope
        and getattr(config, "pretraining_tp", 1) == 1
    )


# transformers' defaults (its config classes, 5.x) for the config.json fields this forward reads, where a
# file leaves them out (save_pretrained writes only what differs from them); None: derived as transformers
# derives it. tests/test_compact_llama.py checks every field against the config classes themselves.
_DEFAULTS = {
    "llama": {"num_key_value_heads": None, "intermediate_size": 11008, "pretraining_tp": 1},
    "qwen2": {"num_key_value_heads": 32, "intermediate_size": 22016, "use_sliding_window": False},
    "mistral": {"num_key_value_heads": 8, "intermediate_size": 14336, "sliding_window": 4096},
}
_COMMON = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
_ROPE_KEYS = {"rope_type", "rope_theta"}  # any other key (scaling of any kind): not this forward's RoPE


class CompactConfig(SimpleNamespace):
    """config.json's fields as attributes, as the loop reads a transformers config."""

    def get_text_config(self) -> "CompactConfig":
        return self


def compact_config(config: dict) -> CompactConfig | None:
    """The fields of a validated config.json dict that this forward reads, with transformers' defaults, when
    `supports` them; else None (the model then loads and runs through transformers). No transformers import:
    `bundle run` on a Llama, Qwen2 or Mistral pair never pays for one (about 4 s on this CPU)."""
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES or config.get("text_config") is not None:
        return None
    fields = {**_COMMON, **_DEFAULTS[model_type], **config}
    rope = dict(fields.get("rope_parameters") or fields.get("rope_scaling") or {})
    if "type" in rope:
        rope.setdefault("rope_type", rope.pop("type"))
    rope.setdefault("rope_type", "default")
    rope.setdefault("rope_theta", fields.get("rope_theta", 10000.0))
    if set(rope) - _ROPE_KEYS:
        return None
    heads = fields["num_attention_heads"]
    fields.update(
        rope_parameters=rope,
        num_key_value_heads=fields["num_key_value_heads"] or heads,
        head_dim=fields.get("head_dim") or fields["hidden_size"] // heads,
    )
    if model_type == "qwen2" and fields.get("layer_types") is None:  # as Qwen2Config derives them
        window = fields.get("max_window_layers", 28)
        fields["layer_types"] = ["sliding_attention" if fields["use_sliding_window"] and i >= window else "full_attention"
                                 for i in range(fields["num_hidden_layers"])]
    namespace = CompactConfig(**fields)
    return namespace if supports(namespace) else None


def _expected_shapes(c: SimpleNamespace) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of config `c` holds, and its shape, as transformers names them."""
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size), "model.norm.weight": (c.hidden_size,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (q, c.hidden_size), p + "self_attn.k_proj.weight": (kv, c.hidden_size),
            p + "self_attn.v_proj.weight": (kv, c.hidden_size), p + "self_attn.o_proj.weight": (c.hidden_size, q),
            p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
            p + "input_layernorm.weight": (c.hidden_size,), p + "post_attention_layernorm.weight": (c.hidden_size,),
        })
        if c.model_type == "qwen2":  # q/k/v biases, always
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,), p + "self_attn.v_proj.bias": (kv,)})
    return shapes


# A layer's tensors as this forward names them -> their names in a transformers checkpoint (below
# "model.layers.N."); a bias a model has not is None.
_LAYER_TENSORS = {
    "q": "self_attn.q_proj.weight", "q_bias": "self_attn.q_proj.bias", "k": "self_attn.k_proj.weight",
    "k_bias": "self_attn.k_proj.bias", "v": "self_attn.v_proj.weight", "v_bias": "self_attn.v_proj.bias",
    "o": "self_attn.o_proj.weight", "o_bias": "self_attn.o_proj.bias", "gate": "mlp.gate_proj.weight",
    "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight", "ln1": "input_layernorm.weight",
    "ln2": "post_attention_layernorm.weight",
}


def _weights(config, tensor, lm_head: torch.Tensor, inv_freq: torch.Tensor) -> SimpleNamespace:
    """The weights this forward runs on, from `tensor(checkpoint name)` (None where a model has none)."""
    layers = [SimpleNamespace(**{field: tensor(f"model.layers.{i}.{name}") for field, name in _LAYER_TENSORS.items()})
              for i in range(config.num_hidden_layers)]
    return SimpleNamespace(config=config, embed=tensor("model.embed_tokens.weight"), layers=layers,
                           norm=tensor("model.norm.weight"), lm_head=lm_head, inv_freq=inv_freq)


def weights_from_state_dict(config: SimpleNamespace, state_dict: dict) -> SimpleNamespace | None:
    """The model's weights (the tensors themselves, not copied) when `state_dict` holds exactly the tensors of
    `config`'s checkpoint with their shapes; else None, and transformers builds the model (and reports what
    does not fit, as it does for every other model)."""
    shapes = _expected_shapes(config)
    if set(state_dict) != set(shapes) or any(tuple(state_dict[k].shape) != s for k, s in shapes.items()):
        return None
    # inv_freq as transformers' rotary module computes it (default RoPE), in float32
    dim, base = config.head_dim, config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    lm_head = state_dict["model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"]
    return _weights(config, state_dict.get, lm_head, inv_freq)


def _weights_from_model(model: torch.nn.Module) -> SimpleNamespace:
    """The same from a transformers model (its parameters, not copied). The frequencies are its rotary
    module's own, as it holds them (rounded to bf16 when the model was cast after loading) and uses them (in
    float32)."""
    tensors = dict(model.named_parameters())
    return _weights(model.config, tensors.get, model.lm_head.weight, model.model.rotary_emb.inv_freq.float())


class CompactCache:
    """Keys and values of every layer in one growing tensor each; `length` tokens are valid."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.keys = torch.empty(layers, 1, kv_heads, 0, head_dim, dtype=dtype, device=device)
        self.values = torch.empty_like(self.keys)
        self.length = 0

    def reserve(self, length: int) -> None:
        """Room for `length` tokens; the capacity at least doubles when it grows, so appends stay cheap."""
        capacity = self.keys.shape[3]
        if length <= capacity:
            return
        size = list(self.keys.shape)
        size[3] = max(length, 2 * capacity, 64)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(size)  # finite: the invariant forward reads masked cells too (runner.models.invariant)
            new[:, :, :, : self.length] = old[:, :, :, : self.length]
            setattr(self, name, new)

    def crop(self, length: int) -> None:
        """Keeps the first `length` tokens; a negative `length` drops that many (as DynamicCache.crop)."""
        self.length = self.length + length if length < 0 else min(length, self.length)

    def get_seq_length(self) -> int:
        return self.length


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: normalised in float32, scaled in the weights' dtype."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def _mlp(x: torch.Tensor, layer: SimpleNamespace, eps: float) -> torch.Tensor:
    """A layer's second half: the residual stream after its gated SiLU MLP."""
    return x + gated_mlp(_rms_norm(x, layer.ln2, eps), layer)


def _packed_head(weights: SimpleNamespace, head: torch.Tensor, ids: list[int] | None) -> torch.Tensor:
    """The head in the layout of packed weights (runner.models.packed): the whole vocabulary's packed once per
    weights, shared by the models that score it all; a subset's per model."""
    if ids is not None:
        return packed.head(weights, head)
    if getattr(weights, "packed_head", None) is None:
        weights.packed_head = packed.head(weights, head)
    return weights.packed_head


class CompactLlama(torch.nn.Module):
    """A lean forward over a Llama-family model's weights: those of a transformers model, or those
    `weights_from_state_dict` took from a checkpoint (`bundle run` builds no transformers model). The weights
    are used as they are, never copied.

    `ids` (optional): score only these vocabulary ids (see runner.models.draft_vocab); the others get -inf.
    Called like a transformers model by the decoding loop: `model(input_ids=, cache=, logits_to_keep=)`
    with a cache from `new_cache()`.
    """

    def __init__(self, model: torch.nn.Module | SimpleNamespace, ids: list[int] | None = None,
                 reproducible: bool = False) -> None:
        super().__init__()
        if not supports(model.config):
            raise ValueError("CompactLlama runs Llama, Qwen2 and Mistral models with full attention, SiLU and default RoPE only")
        self.weights = model if isinstance(model, SimpleNamespace) else _weights_from_model(model)
        self.config = c = self.weights.config
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        self.scale = self.head_dim**-0.5  # as transformers passes it
        weight = self.weights.lm_head
        self.full_size = weight.shape[0]
        index, head = (None, weight) if ids is None else head_rows(weight, ids)
        self.register_buffer("ids", index, persistent=False)
        self.head = _packed_head(self.weights, head, ids) if getattr(self.weights, "packed", False) else head
        self.register_buffer("inv_freq", self.weights.inv_freq, persistent=False)
        self.vocab_ids = ids
        # --reproducible: every pass through the batch-invariant forward (runner.models.invariant)
        self.invariant = InvariantForward(self) if reproducible else None

    def with_vocab(self, ids: list[int]) -> "CompactLlama":
        """The same model (the same weights) scoring only `ids`."""
        return CompactLlama(self.weights, ids, self.invariant is not None)

    def batch_invariant(self) -> "CompactLlama":
        """The same model (the same weights) whose logits for a token do not depend on the other tokens of its
        pass (runner.models.invariant): `--reproducible`."""
        return CompactLlama(self.weights, self.vocab_ids, reproducible=True)

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    def parameters(self, recurse: bool = True):
        """The model's weight tensors, each once (a tied head is the embedding), as a transformers model's."""
        w = self.weights
        tensors = [w.embed, w.lm_head, w.norm, *(t for layer in w.layers for t in vars(layer).values())]
        return iter({id(t): t for t in tensors if t is not None}.values())

    def new_cache(self, tokens: int = 0) -> CompactCache:
        """An empty cache; `tokens`: room to reserve now (the run's whole length, when the caller knows it)."""
        cache = CompactCache(len(self.weights.layers), self.kv_heads, self.head_dim, self.head.dtype, self.device)
        cache.reserve(tokens)
        return cache

    def forward(self, input_ids: torch.Tensor, cache: CompactCache | None = None, logits_to_keep: int = 0,
                **_ignored) -> SimpleNamespace:
        w = self.weights
        cache = cache if cache is not None else self.new_cache()
        t = input_ids.shape[-1]
        start, end = cache.length, cache.length + t
        if self.invariant is not None:
            cache.reserve(room(end))
            keep = range(t - logits_to_keep if logits_to_keep else 0, t)
            logits = self.invariant.rows(cache.keys, cache.values, [(0, start, input_ids.view(-1).tolist())], list(keep))
            cache.length = end
            return SimpleNamespace(logits=logits[None])
        cache.reserve(end)
        x = F.embedding(input_ids.view(1, t), w.embed)
        cos, sin = self._rope(torch.arange(start, end, device=x.device), x.dtype)
        # Attention called as transformers' SDPA path calls it: a prefill into an empty cache is causal without
        # a mask; one token sees the whole cache; several tokens on top of a cache get a boolean mask. (There
        # transformers repeats the key/value heads; grouped-query SDPA gives the same bf16 numbers without the
        # copies: tests/test_compact_llama.py checks every logit bit for bit.)
        mask = None
        if t > 1 and start > 0:
            mask = (torch.arange(end, device=x.device)[None, :] <= torch.arange(start, end, device=x.device)[:, None]).view(1, 1, t, end)
        for i, layer in enumerate(w.layers):
            q, k, v = qkv(_rms_norm(x, layer.ln1, self.eps), layer)
            q = q.view(1, t, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(1, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(1, t, self.kv_heads, self.head_dim).transpose(1, 2)
            cache.keys[i, :, :, start:end] = _rotate(k, cos, sin)
            cache.values[i, :, :, start:end] = v
            out = F.scaled_dot_product_attention(
                _rotate(q, cos, sin), cache.keys[i, :, :, :end], cache.values[i, :, :, :end], attn_mask=mask,
                is_causal=t > 1 and start == 0, scale=self.scale, enable_gqa=self.heads != self.kv_heads,
            )
            x = _mlp(x + linear(out.transpose(1, 2).reshape(1, t, -1), layer.o, layer.o_bias), layer, self.eps)
        cache.length = end
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return SimpleNamespace(logits=self._logits(x))

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin at `positions`, as transformers computes them: angles in float32, the tables cast
        to the activations' dtype. (positions, head dim) each."""
        angles = torch.outer(positions.to(torch.float32), self.inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        scores = linear(_rms_norm(x, self.weights.norm, self.eps), self.head)
        return scores if self.ids is None else full_vocab_logits(scores, self.ids, self.full_size)

    def new_batched_cache(self, sequences: int, limit: int) -> BatchedCache:
        """An empty cache for `sequences` sequences of up to `limit` positions each (room grows as they do)."""
        return BatchedCache(len(self.weights.layers), sequences, self.kv_heads, self.head_dim, self.head.dtype,
                            self.device, limit)

    def forward_rows(self, cache: BatchedCache, rows: list[tuple[int, int, list[int]]], outputs: list[int]) -> torch.Tensor:
        """One pass over several sequences' tokens at once (continuous batching): rows of (sequence, start, tokens),
        each row's tokens at positions start, start + 1, ... of its sequence (on top of the start positions its
        cache holds already; at most one row per sequence). The matrix products run over all rows' tokens
        together; attention runs per row, over its own sequence's cells, in one call (rows padded to the
        longest, a mask per row). Returns the logits of the tokens at `outputs` (indices into all rows'
        tokens, in order), in float32: (len(outputs), V)."""
        if self.invariant is not None:
            cache.reserve(room(max(start + len(tokens) for _, start, tokens in rows)))
            return self.invariant.rows(cache.keys, cache.values, rows, outputs).float()
        w, heads, kv_heads, d = self.weights, self.heads, self.kv_heads, self.head_dim
        plan = RowPlan(rows, self.device, heads // kv_heads)
        parts = attention_parts(rows, self.device, heads // kv_heads)  # None: the whole pass attends at once
        t, end = plan.tokens, plan.end
        cache.reserve(end)
        x = F.embedding(plan.ids.view(1, t), w.embed)
        cos, sin = (table[:, None] for table in self._rope(plan.positions, x.dtype))  # one per token, for all its heads
        for i, layer in enumerate(w.layers):
            q, k, v = qkv(_rms_norm(x, layer.ln1, self.eps), layer)  # (1, tokens, ...), as forward's: the same kernels
            q = _rotate(q.view(t, heads, d), cos, sin)
            k = _rotate(k.view(t, kv_heads, d), cos, sin)
            v = v.view(t, kv_heads, d)
            keys, values = cache.keys[i], cache.values[i]  # (sequences, kv heads, positions, head dim)
            if parts is None:
                out = self._attend(plan, q, k, v, keys, values)
            else:  # rows of very different lengths: each part's tokens on their own (runner.models.row_plan)
                out = q.new_empty(t, heads * d)
                for part, tokens in parts:
                    out[tokens] = self._attend(part, q[tokens], k[tokens], v[tokens], keys, values)
            x = _mlp(x + linear(out.view(1, t, -1), layer.o, layer.o_bias), layer, self.eps)
        return self._logits(x[:, outputs])[0].float()

    def _attend(self, plan: RowPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor) -> torch.Tensor:
        """Attention of a plan's rows: their keys and values (tokens, kv heads, head dim) into their sequences'
        cells of one layer, then each query (tokens, heads, head dim) over its own sequence's cells, in one call
        (rows padded to the longest, a mask per row). Returns (tokens, heads x head dim)."""
        heads, kv_heads, d, rows = self.heads, self.kv_heads, self.head_dim, plan.rows
        plan.write(keys, k)
        plan.write(values, v)
        if plan.padding:
            padded = q.new_zeros(plan.slots, heads, d)
            padded[plan.slot] = q
        else:  # rows of one length (single steps of many sequences, or one row): the tokens are the layout
            padded = q
        padded = padded.view(rows, plan.width, heads, d).transpose(1, 2)
        if plan.grouped:  # the query heads that share a kv head as more queries of it (see RowPlan)
            padded = padded.reshape(rows, kv_heads, plan.grouped * plan.width, d)
        out = F.scaled_dot_product_attention(
            padded, plan.cells(keys), plan.cells(values), attn_mask=plan.mask, is_causal=plan.causal,
            scale=self.scale, enable_gqa=heads != kv_heads and not plan.grouped,
        )
        out = out.reshape(rows, heads, plan.width, d).transpose(1, 2).reshape(plan.slots, heads * d)
        return out[plan.slot] if plan.padding else out

