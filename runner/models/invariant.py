"""The batch-invariant forward (`--reproducible`): a token's logits do not depend on what else is in the pass.

Why the ordinary forward is not: the CPU's matrix kernels (oneDNN, MKL) choose their blocking, and so the order
in which a dot product is summed, by the number of rows in the call (measured on this Xeon with AMX and with
oneDNN held to AVX-512 and to AVX2: a row's bf16 bits change from 33 rows on, its fp32 bits from 2), and the
attention kernel splits its work by the number of queries and cells. So a sequence's logits depend on how many
other sequences share its step, on whether its prompt came from the prompt cache (its cells were computed in
another pass) and on whether the guard speculated (a verify pass is k + 1 rows): at a near-tie the greedy
token differs (docs/benchmarks.md).

Here every operation a token meets has the same shape whatever the pass holds (vLLM's batch-invariant mode and
SGLang's deterministic inference do the same on GPUs):

- the pass's tokens go through the layers in blocks of exactly `BLOCK` token slots (a short block padded with
  slots that write no cell), one block after the other through the whole stack, so a row that spans two blocks
  finds its earlier tokens' cells written; every matrix product has `BLOCK` rows (with a fixed row count a row's
  bits depend neither on its slot nor on the other rows: measured on the three kernel paths above);
- attention runs per token over its own sequence's cells in fixed runs of `CELLS` cells, combined in order by an
  online softmax in float32; the runs past a token's position are fully masked and leave its sums unchanged
  (a max with -inf, a factor exp(0) = 1, an added 0), so its result depends only on its position;
- elementwise transcendental functions (exp, SiLU) run on tensors whose size is a multiple of 64 elements, so
  every element takes the vector path (torch computes a tail past the last full vector with scalar code whose
  rounding differs); RoPE's tables are computed once per `ROPE_CHUNK` positions and looked up.

What it does not promise: the same bits on another CPU, thread count, torch version or dtype (each is named in
a run record), nor transformers' numbers (its attention sums in another order; the default forward keeps those).
"""

from __future__ import annotations

__all__ = ["BLOCK", "CELLS", "InvariantForward", "room"]

import torch
import torch.nn.functional as F

from runner.models.packed import gated_mlp, linear, qkv

BLOCK = 8  # token slots per pass through the layers
CELLS = 256  # cells per attention run
ROPE_CHUNK = 1024  # positions whose RoPE tables are computed in one call
LANES = 64  # elements: a multiple of every vector width torch's elementwise kernels use here


def room(length: int) -> int:
    """The cells a cache must have for a token at position length - 1: whole attention runs."""
    return -(-length // CELLS) * CELLS


class InvariantForward:
    """The batch-invariant forward over a CompactLlama's weights (runner.models.compact_llama): `rows`."""

    def __init__(self, model) -> None:
        self.model = model
        self._cos: list[torch.Tensor] = []  # RoPE tables per ROPE_CHUNK positions
        self._sin: list[torch.Tensor] = []

    def _rope(self, positions: list[int], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at `positions`, (len, 1, head dim), from tables computed ROPE_CHUNK positions at a time."""
        while len(self._cos) * ROPE_CHUNK <= max(positions):
            start = len(self._cos) * ROPE_CHUNK
            cos, sin = self.model._rope(torch.arange(start, start + ROPE_CHUNK, device=self.model.device), dtype)
            self._cos.append(cos)
            self._sin.append(sin)
        index = torch.tensor(positions, device=self.model.device)
        cos, sin = torch.cat(self._cos), torch.cat(self._sin)
        return cos[index][:, None], sin[index][:, None]

    def rows(self, keys: torch.Tensor, values: torch.Tensor, rows: list[tuple[int, int, list[int]]],
             outputs: list[int]) -> torch.Tensor:
        """Rows of (sequence, start, tokens) appended to their sequences' cells (keys, values: (layers,
        sequences, kv heads, cells, head dim), with `room` for every token); the logits of the tokens at
        `outputs` (indices into all rows' tokens), in the weights' dtype: (len(outputs), V)."""
        slots = [(seq, pos, token) for seq, start, tokens in rows for pos, token in enumerate(tokens, start)]
        picked: dict[int, torch.Tensor] = {}
        wanted = set(outputs)
        for first in range(0, len(slots), BLOCK):
            block = slots[first : first + BLOCK]
            x = self._block(keys, values, block)  # every block: each writes its tokens' cells
            for i in range(first, first + len(block)):
                if i in wanted:
                    picked[i] = x[i - first]
        hidden = torch.stack([picked[i] for i in outputs])
        return torch.cat([self._logits(hidden[i : i + BLOCK]) for i in range(0, len(outputs), BLOCK)])

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head over up to BLOCK rows, padded to BLOCK."""
        n = hidden.shape[0]
        padded = hidden.new_zeros(BLOCK, hidden.shape[1])
        padded[:n] = hidden
        return self.model._logits(padded)[:n]

    def _block(self, keys: torch.Tensor, values: torch.Tensor, block: list[tuple[int, int, int]]) -> torch.Tensor:
        """Up to BLOCK tokens through every layer (their cells written); the residual stream after the last
        layer, (BLOCK, hidden). Padding slots read cell 0 of the first slot's sequence and write nothing."""
        m, w = self.model, self.model.weights
        n, pad = len(block), BLOCK - len(block)
        device = m.device
        seqs = torch.tensor([s for s, _, _ in block] + [block[0][0]] * pad, device=device)
        positions = [p for _, p, _ in block] + [0] * pad
        pos = torch.tensor(positions, device=device)
        x = F.embedding(torch.tensor([t for _, _, t in block] + [0] * pad, device=device), w.embed)
        cos, sin = self._rope(positions, x.dtype)
        runs = room(max(positions) + 1) // CELLS
        heads, kv_heads, d = m.heads, m.kv_heads, m.head_dim
        for i, layer in enumerate(w.layers):
            q, k, v = qkv(_rms_norm(x, layer.ln1, m.eps), layer)
            q = _rotate(q.view(BLOCK, heads, d), cos, sin)
            k = _rotate(k.view(BLOCK, kv_heads, d), cos, sin)
            v = v.view(BLOCK, kv_heads, d)
            keys[i, seqs[:n], :, pos[:n]] = k[:n]
            values[i, seqs[:n], :, pos[:n]] = v[:n]
            out = self._attend(q, keys[i], values[i], seqs, pos, runs).to(x.dtype)
            x = x + linear(out, layer.o, layer.o_bias)
            x = x + gated_mlp(_rms_norm(x, layer.ln2, m.eps), layer)
        return x

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, seqs: torch.Tensor,
                pos: torch.Tensor, runs: int) -> torch.Tensor:
        """Each slot's attention over its sequence's cells 0..pos, in runs of CELLS cells combined in order
        (online softmax, float32); (BLOCK, heads * head dim). Query heads are kv-head-major, as transformers'
        repeat_kv orders them."""
        m = self.model
        kv_heads, d = m.kv_heads, m.head_dim
        qf = q.float().view(BLOCK, kv_heads, m.heads // kv_heads, d)
        cells = torch.arange(CELLS, device=q.device)
        top = l = acc = None
        for r in range(runs):
            span = slice(r * CELLS, (r + 1) * CELLS)
            k, v = keys[seqs, :, span].float(), values[seqs, :, span].float()  # (BLOCK, kv heads, CELLS, d)
            scores = torch.matmul(qf, k.transpose(-1, -2)) * m.scale
            masked = (cells[None, :] + r * CELLS > pos[:, None]).view(BLOCK, 1, 1, CELLS)
            scores = scores.masked_fill(masked, float("-inf"))
            run_top = scores.amax(-1, keepdim=True)  # run 0 always holds cell 0: finite from the start
            new_top = run_top if top is None else torch.maximum(top, run_top)
            p = torch.exp(scores - new_top)
            if top is None:
                l, acc = p.sum(-1, keepdim=True), torch.matmul(p, v)
            else:
                scale = _exp_lanes(top - new_top)  # 1 exactly when this run holds no larger score
                l = l * scale + p.sum(-1, keepdim=True)
                acc = acc * scale + torch.matmul(p, v)
            top = new_top
        return (acc / l).reshape(BLOCK, m.heads * d)


def _exp_lanes(x: torch.Tensor) -> torch.Tensor:
    """exp of a (..., 1) tensor with every element on the vector path: computed over LANES copies of it."""
    return x.expand(*x.shape[:-1], LANES).contiguous().exp()[..., :1]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

