"""Llama models (target and draft) stepped by a forward pass of our own, with a KV cache of our own.

Why not transformers' forward: it adds fixed work around every call (mask construction, cache objects,
the rotary module, output classes), and the decoding loop makes one call per token. A 2-layer, 256-wide
draft does about 1 ms of matrix work per step on this CPU and transformers added more than that; the
30-layer demo target takes 36 ms per step through transformers and 32 through this forward (bf16, 2
threads). The logits are transformers' bit for bit, in bf16 too: the same operations in the same order,
the same rotary frequencies, attention called the way transformers' SDPA path calls it. It runs only the
architecture it implements exactly (`supports`: Llama, Qwen2 (q/k/v biases) and Mistral with full
attention, SiLU MLP, default RoPE); tests check its logits against transformers' on the same weights. Any other model runs through transformers.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from runner.draft_vocab import full_vocab_logits, head_rows


# Decoders whose layers are Llama's: RMSNorm, rotary attention (Qwen2 adds q/k/v biases), a SiLU gated
# MLP; supported only with full attention on every layer.
ARCHITECTURES = ("llama", "qwen2", "mistral")


def _full_attention(config) -> bool:
    if getattr(config, "model_type", None) == "qwen2" and getattr(config, "use_sliding_window", False):
        return False
    if getattr(config, "model_type", None) == "mistral" and getattr(config, "sliding_window", None) is not None:
        return False
    return all(t == "full_attention" for t in (getattr(config, "layer_types", None) or ()))


def supports(config) -> bool:
    """Whether `config` is a model this module computes exactly as transformers does."""
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
            new = old.new_empty(size)
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


class CompactLlama(torch.nn.Module):
    """Wraps a transformers Llama causal LM (its weights, unchanged and not copied) with a lean forward.

    `ids` (optional): score only these vocabulary ids (see runner.draft_vocab); the others get -inf.
    Called like a transformers model by the decoding loop: `model(input_ids=, cache=, logits_to_keep=)`
    with a cache from `new_cache()`.
    """

    def __init__(self, model: torch.nn.Module, ids: list[int] | None = None) -> None:
        super().__init__()
        if not supports(model.config):
            raise ValueError("CompactLlama runs Llama, Qwen2 and Mistral models with full attention, SiLU and default RoPE only")
        self.inner = model
        self.config = model.config
        c = model.config
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        self.scale = self.head_dim**-0.5  # as transformers passes it
        self.full_size = model.lm_head.out_features
        weight = model.lm_head.weight
        index, head = (None, weight) if ids is None else head_rows(weight, ids)
        self.register_buffer("ids", index, persistent=False)
        self.register_buffer("head", head, persistent=False)
        # transformers' own frequencies, as its rotary module holds them (rounded to bf16 when the model was
        # cast after loading) and uses them (in float32).
        self.register_buffer("inv_freq", model.model.rotary_emb.inv_freq.float(), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def new_cache(self, tokens: int = 0) -> CompactCache:
        """An empty cache; `tokens`: room to reserve now (the run's whole length, when the caller knows it)."""
        cache = CompactCache(len(self.inner.model.layers), self.kv_heads, self.head_dim, self.head.dtype, self.device)
        cache.reserve(tokens)
        return cache

    def forward(self, input_ids: torch.Tensor, cache: CompactCache | None = None, logits_to_keep: int = 0,
                **_ignored) -> SimpleNamespace:
        body = self.inner.model
        cache = cache if cache is not None else self.new_cache()
        t = input_ids.shape[-1]
        start, end = cache.length, cache.length + t
        cache.reserve(end)
        x = body.embed_tokens(input_ids.view(1, t))
        # RoPE as transformers computes it: angles in float32, cos/sin cast to the activations' dtype.
        angles = torch.outer(torch.arange(start, end, device=x.device, dtype=torch.float32), self.inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        # Attention called as transformers' SDPA path calls it: a prefill into an empty cache is causal without
        # a mask; one token sees the whole cache; several tokens on top of a cache get a boolean mask. (There
        # transformers repeats the key/value heads; grouped-query SDPA gives the same bf16 numbers without the
        # copies: tests/test_compact_llama.py checks every logit bit for bit.)
        mask = None
        if t > 1 and start > 0:
            mask = (torch.arange(end, device=x.device)[None, :] <= torch.arange(start, end, device=x.device)[:, None]).view(1, 1, t, end)
        for i, layer in enumerate(body.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = _rms_norm(x, layer.input_layernorm.weight, self.eps)
            # biases: None for Llama without attention_bias, q/k/v for Qwen2
            q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(1, t, self.heads, self.head_dim).transpose(1, 2)
            k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(1, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(1, t, self.kv_heads, self.head_dim).transpose(1, 2)
            cache.keys[i, :, :, start:end] = _rotate(k, cos, sin)
            cache.values[i, :, :, start:end] = v
            out = F.scaled_dot_product_attention(
                _rotate(q, cos, sin), cache.keys[i, :, :, :end], cache.values[i, :, :, :end], attn_mask=mask,
                is_causal=t > 1 and start == 0, scale=self.scale, enable_gqa=self.heads != self.kv_heads,
            )
            x = x + F.linear(out.transpose(1, 2).reshape(1, t, -1), attn.o_proj.weight, attn.o_proj.bias)
            h = _rms_norm(x, layer.post_attention_layernorm.weight, self.eps)
            x = x + F.linear(F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight), mlp.down_proj.weight)
        cache.length = end
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        scores = F.linear(_rms_norm(x, body.norm.weight, self.eps), self.head)
        return SimpleNamespace(logits=scores if self.ids is None else full_vocab_logits(scores, self.ids, self.full_size))
