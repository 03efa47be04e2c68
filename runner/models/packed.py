"""Weights laid out once, at load, in the CPU matrix kernel's own blocked layout, and the projections that read
the same input fused into one product (q/k/v; the MLP's gate/up).

Why: a decoding step multiplies a handful of rows by every weight, so its matrix products are bound by how fast
the weights stream, and `F.linear` on a weight as it lies streams a bf16 weight at half the speed of the same
product on the layout oneDNN's kernel reads (and two products of one input at less than one of both). Measured
on the Xeon with AMX, 2 threads, the 30 layers and head of the 135M demo target, weights streamed from memory:
23.9 ms per step at 1 row with `F.linear`, 16.1 ms packed, 13.4 ms packed and fused (1.8x); the same at 4, 8 and
16 rows. The packed product is oneDNN's own (`torch.ops.mkldnn._linear_pointwise`, the op
torch's compiler emits for a frozen linear), so its bits are `F.linear`'s up to 31 rows; from 32 rows `F.linear`
changes its blocking and a row's bits with the row count, while the packed one keeps them: every row's result
is the same whatever else the pass holds (measured up to 600 rows).

Packing is chosen by measurement on the machine (`pays`): only where oneDNN packs the weights' dtype, the
packed product gives `F.linear`'s bits for the step sizes decoding uses, rows are the same at every row count
tried, fused rows are the separate products' rows, and the packed product is faster. Elsewhere (another CPU, an
fp32 model, a torch without oneDNN) the weights stay as they are, and so do the numbers.
"""

from __future__ import annotations

__all__ = ["gated_mlp", "linear", "pack", "packed", "pays", "qkv"]

import functools
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

_STEP_ROWS = (1, 2, 5, 8, 16)  # rows per pass the probe checks bit for bit against F.linear (decode, verify, batch)
_PASS_ROWS = (1, 3, 8, 33, 100)  # row counts over which a row's bits must not move


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, on a packed weight (`pack`) as on a plain one."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def qkv(h: torch.Tensor, layer: SimpleNamespace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's query, key and value projections of `h`: one product where the weights are packed and fused
    (runner.models.packed), else three. (Biases: None for Llama without attention_bias, q/k/v for Qwen2.)"""
    if hasattr(layer, "qkv"):
        q = layer.o.shape[1]
        kv = (layer.qkv.shape[0] - q) // 2
        return linear(h, layer.qkv, layer.qkv_bias).split([q, kv, kv], -1)
    return F.linear(h, layer.q, layer.q_bias), F.linear(h, layer.k, layer.k_bias), F.linear(h, layer.v, layer.v_bias)


def gated_mlp(h: torch.Tensor, layer: SimpleNamespace) -> torch.Tensor:
    """A layer's gated SiLU MLP of `h` (its normed input)."""
    if hasattr(layer, "gate_up"):
        gate, up = linear(h, layer.gate_up).chunk(2, -1)
    else:
        gate, up = F.linear(h, layer.gate), F.linear(h, layer.up)
    return linear(F.silu(gate) * up, layer.down)


def packed(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in) in the layout oneDNN's product reads, for `linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)


def _fused(*tensors: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensors[0] is None else torch.cat(tensors)


@functools.cache
def pays(dtype: torch.dtype, threads: int) -> bool:
    """Whether packed, fused weights of `dtype` give the plain product's bits and take less time here, with
    `threads` threads (the decision is measured once per process and dtype)."""
    if dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    gen = torch.Generator().manual_seed(0)
    up, gate = (torch.randn(1536, 576, generator=gen).to(dtype) for _ in range(2))
    try:
        fused = packed(torch.cat([gate, up]))
        for rows in _STEP_ROWS:
            x = torch.randn(1, rows, 576, generator=gen).to(dtype)
            if not torch.equal(linear(x, fused), torch.cat([F.linear(x, gate), F.linear(x, up)], -1)):
                return False
        x = torch.randn(1, max(_PASS_ROWS), 576, generator=gen).to(dtype)
        alone = torch.cat([linear(x[:, i : i + 1], fused) for i in range(x.shape[1])], 1)
        if not all(torch.equal(linear(x[:, :n], fused), alone[:, :n]) for n in _PASS_ROWS):
            return False
    except RuntimeError:  # a oneDNN without this dtype's packed product
        return False
    x = torch.randn(1, 1, 576, generator=gen).to(dtype)
    return _seconds(lambda: linear(x, fused)) < _seconds(lambda: (F.linear(x, gate), F.linear(x, up)))


def _seconds(call, rounds: int = 30) -> float:
    """The best of a few timings of `rounds` calls."""
    call()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(rounds):
            call()
        best = min(best, time.perf_counter() - start)
    return best


def pack(weights: SimpleNamespace) -> SimpleNamespace:
    """`weights` (runner.models.compact_llama's namespace) with every layer's projections packed and q/k/v and
    gate/up fused, in place (the plain tensors are dropped: one copy in memory), when that `pays` here; else
    unchanged. The head is packed by the model that scores with it (its rows may be a subset). The tensors left
    plain are copied out of the checkpoint's buffer, so that buffer is freed once loading ends."""
    if getattr(weights, "packed", False) or not pays(weights.embed.dtype, torch.get_num_threads()):
        return weights
    tied = weights.lm_head is weights.embed
    weights.embed, weights.norm = weights.embed.clone(), weights.norm.clone()
    weights.lm_head = weights.embed if tied else weights.lm_head.clone()
    for layer in weights.layers:
        layer.ln1, layer.ln2 = layer.ln1.clone(), layer.ln2.clone()
        layer.o_bias = None if layer.o_bias is None else layer.o_bias.clone()
        layer.qkv = packed(torch.cat([layer.q, layer.k, layer.v]))
        layer.qkv_bias = _fused(layer.q_bias, layer.k_bias, layer.v_bias)
        layer.gate_up = packed(torch.cat([layer.gate, layer.up]))
        layer.o, layer.down = packed(layer.o), packed(layer.down)
        for name in ("q", "k", "v", "q_bias", "k_bias", "v_bias", "gate", "up"):
            delattr(layer, name)
    weights.packed = True
    return weights
