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
tried, fused rows are the separate products' rows, and the packed product is faster. Elsewhere (another CPU, a
torch without oneDNN) the bf16 weights stay as they are, and so do the numbers.

float32 weights have a layout of their own (`transposed_pays`): each projection kept in memory as its transpose
(in, out), still passed to `F.linear` as an (out, in) view, so MKL's product reads it without a transpose, and
q/k/v and gate/up fused. Measured on an Intel Xeon with AVX-512 and no native bf16 (Ice Lake class), 2 threads,
30 layers of the demo target's shapes: 8 rows 27.0 -> 20.0 ms, 16 rows 54.4 -> 23.9 ms, 1 row 10.9 -> 8.9 ms,
and the same bits as `torch.matmul` on that layout. Where MKL's packed product serves any row count from one
packed weight and beats that layout (`mkl_pays`), each projection is instead packed once for it (`MklPacked`):
a step of 8 sequences of the demo's shapes 65.6 -> 55.0 ms, of 1 sequence 32.8 -> 35.0 ms. No bits are promised
to move or stay here: float32's `F.linear` already changes a row's bits with the row count
(runner.models.invariant), and tests compare float32 logits within a tolerance. Chosen by measurement too, on
weights larger than the caches.
"""

from __future__ import annotations

__all__ = ["MklPacked", "SMALL_BYTES", "float32_pays", "gated_mlp", "head", "linear", "mkl_pays", "pack", "packed",
           "pays", "qkv", "transposed", "transposed_pays"]

import functools
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

_STEP_ROWS = (1, 2, 5, 8, 16)  # rows per pass the probe checks bit for bit against F.linear (decode, verify, batch)
_PASS_ROWS = (1, 3, 8, 33, 100)  # row counts over which a row's bits must not move
# float32 layers smaller than this are left as they are: they stay in the caches, where no layout streams them
# faster, and the probe (0.2-0.3 s) would cost more than it could gain (the tests' tiny models).
SMALL_BYTES = 16 << 20


class MklPacked:
    """A float32 weight (out, in) packed once in the layout of MKL's packed product (`cblas_sgemm_compute`, reached
    through `torch.ops.mkl._mkl_linear`, the op torch's compiler emits for a frozen float32 linear), for `linear`.

    Why: from 2 rows MKL's plain product packs the panel of the weight it reads at every call; packed once at load,
    a product of a few rows reads it as it lies. Measured on the Ice Lake Xeon, 2 threads, 15 layers of the demo's
    projections (gate/up fused, down, q/k/v fused, o), against the transposed layout: 2 rows 17.0 -> 12.7 ms, 8
    rows 21.1 -> 15.0, 16 rows 19.3 -> 14.9, 40 rows 34.7 -> 27.0, 64 rows 51.1 -> 29.7; 1 row 12.1 -> 12.9.
    Packed for 64 rows (MKL's layout depends on the row count it is packed for: packed for 1 or 8 rows it was
    slower from 16 rows), and called with each pass's own row count: torch's op falls back to a plain weight only
    when the two differ, and MKL's packed weight serves any row count (checked at load, `mkl_pays`). Its buffer
    is sized above the weight's bytes (3x here) but only the weight's bytes are ever touched (resident memory
    grows by 1x: measured). Not a tensor: `shape`, `dtype`, `numel()` and `element_size()` are the weight's."""

    __slots__ = ("data", "dtype", "shape", "_sizes")
    ROWS = 64  # the row count MKL packs for

    def __init__(self, weight: torch.Tensor) -> None:
        self.shape, self.dtype = weight.shape, weight.dtype
        self.data = torch.ops.mkl._mkl_reorder_linear_weight(weight.contiguous(), self.ROWS)
        self._sizes = weight.new_zeros(1, 1).expand(weight.shape)  # the op reads the weight's sizes off this

    @staticmethod
    def available() -> bool:
        """Whether this torch has MKL's packed float32 product (x86 builds do; others fall back to `transposed`)."""
        return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")

    def numel(self) -> int:
        return self.shape.numel()

    def element_size(self) -> int:
        return self._sizes.element_size()

    def product(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.mkl._mkl_linear(x, self.data, self._sizes, bias, x.numel() // x.shape[-1])


def linear(x: torch.Tensor, weight: torch.Tensor | MklPacked, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, on a packed weight (`pack`) as on a plain one."""
    if isinstance(weight, MklPacked):
        return weight.product(x, bias)
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


def transposed(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in) as a view of its transpose laid out in memory: `F.linear` reads it untransposed."""
    return weight.t().contiguous().t()


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


@functools.cache
def transposed_pays(dtype: torch.dtype, threads: int) -> bool:
    """Whether float32 weights laid out `transposed` (and fused) are faster here than as stored: faster by a
    twentieth at eight rows (a batch's step) and no more than a tenth slower at one (a sequence's step, where both
    stream the weights at about the same speed: 6.6-7.9 ms against 6.9-9.7 ms for the probe's 24 weights on the
    Ice Lake Xeon, so a bound at one row decides by noise), on weights that do not fit in the caches (the step
    streams them from memory); measured once per process. Not for bf16: there the packed layout (`pays`) keeps
    the bits."""
    if dtype != torch.float32:
        return False
    stored, laid = _probe_weights(torch.float32, laid_out=False), _probe_weights(torch.float32, laid_out=True)
    return _beats(stored, laid, ((8, 0.95), (1, 1.1)))


@functools.cache
def float32_pays(threads: int) -> bool:
    """Whether bf16 weights decode faster computed in float32 here: a CPU without native bf16 products (no
    AVX-512 BF16, no AMX) converts every bf16 element it multiplies, so its bf16 products run at about a quarter
    of float32's arithmetic (measured on an Intel Xeon with AVX-512 and no BF16, Ice Lake class: 60 against 236
    GFLOP/s, and a step of 8 sequences 114 against 77 ms), while float32 reads twice the bytes. Measured once per
    process: bf16 as it would run (packed where `pays`) against float32 as it would run (`transposed` or
    `MklPacked` where those pay) at eight rows and at one, on weights beyond the caches: float32 must be faster
    by a tenth at eight rows (a batch) and at most 60% slower at one. Why so loose at one row: there the probe's
    products read 1.19-1.22x bf16's time on that Xeon with float32 `transposed`, 1.29-1.33x `MklPacked` (both stream
    the weights; bf16 reads half the bytes and converts them), while the whole step of one sequence, attention and
    norms included, is faster in float32 (46.6 ms transposed, 40.1 ms MKL-packed, against 49.7 ms in bf16): the
    probe overstates float32's cost at one row by 1.3-1.6x, and a bound inside its spread decides by noise. The
    bound this replaced (1.15, each side timed alone) did so in one start of five on an idle machine; one server of
    the demo pair ran 8 clients at 61-66 tok/s where another start of it ran 95. On a machine oversubscribed while
    it starts (two busy processes on two cores) no probe here decides reliably: every measured ratio reads about 1.
    runner.run's `load_pair` asks only for a bundle that names bf16 and a user who named no --dtype."""
    if pays(torch.bfloat16, threads):  # exact packed bf16 products, faster than F.linear's: a bf16-native CPU
        return False
    bf16 = _probe_weights(torch.bfloat16, laid_out=False)
    laid = transposed_pays(torch.float32, threads)
    f32 = ([MklPacked(w) for w in _probe_weights(torch.float32, laid_out=False)] if laid and mkl_pays(threads)
           else _probe_weights(torch.float32, laid_out=laid))
    return _beats(bf16, f32, ((8, 0.9), (1, 1.6)))


@functools.cache
def mkl_pays(threads: int) -> bool:
    """Whether float32 weights packed for MKL's product (`MklPacked`) beat the `transposed` layout here: the packed
    product must give F.linear's results (within float32's rounding) at every row count tried on one weight packed
    once (torch's op reads the packed weight only when a pass's row count equals the one it is handed and falls
    back to a plain weight otherwise; `MklPacked` hands it each pass's own, so MKL's packed weight must serve every
    row count: checked here, not assumed), be faster by a tenth at eight rows and at most 40% slower at one. At
    one row the probe's 24 weights read 1.10-1.25x the transposed layout's time on the Ice Lake Xeon, the whole
    step of one sequence 1.07x (35.0 against 32.8 ms): a bound inside the probe's spread would decide by noise.
    Measured once per process, on weights beyond the caches."""
    if not MklPacked.available():
        return False
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(3072, 576, generator=gen)
    try:
        laid = MklPacked(weight)
        for rows in _PASS_ROWS + _STEP_ROWS:
            x = torch.randn(1, rows, 576, generator=gen)
            if not torch.allclose(linear(x, laid), F.linear(x, weight), rtol=1e-4, atol=1e-4):
                return False
    except RuntimeError:  # a torch without MKL's packed product for float32
        return False
    transposed_w = _probe_weights(torch.float32, laid_out=True)
    mkl_w = [MklPacked(w) for w in _probe_weights(torch.float32, laid_out=False)]
    return _beats(transposed_w, mkl_w, ((8, 0.9), (1, 1.4)))


def _probe_weights(dtype: torch.dtype, laid_out: bool) -> list[torch.Tensor]:
    """The probes' weights: 24 of the demo's MLP shape (3072 x 576), 170 MB in float32, beyond this machine's L3 (the
    values do not matter); `laid_out`: as `transposed` lays them out."""
    if laid_out:
        return list(torch.full((24, 576, 3072), 0.01, dtype=dtype).transpose(1, 2))
    return list(torch.full((24, 3072, 576), 0.01, dtype=dtype))


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


def _beats(baseline: list, candidate: list, bounds: tuple[tuple[int, float], ...]) -> bool:
    """Whether the products of `rows` rows with the `candidate` weights take less than `bound` times those with the
    `baseline` weights, at every (rows, bound) of `bounds`, the two timed in turns (`_turns`); each side's input in
    its own weights' dtype."""
    for rows, bound in bounds:
        x, y = (torch.full((1, rows, 576), 0.5, dtype=weights[0].dtype) for weights in (baseline, candidate))
        baseline_s, candidate_s = _turns(lambda: [linear(x, w) for w in baseline],
                                         lambda: [linear(y, w) for w in candidate])
        if candidate_s >= bound * baseline_s:
            return False
    return True


def _turns(first, second, rounds: int = 5) -> tuple[float, float]:
    """The best time of each of two calls over `rounds` rounds, the two taking turns in every round: a load that
    comes and goes (another process starting) weighs on both alike, where timing one and then the other let it
    decide the comparison."""
    first(), second()
    best = [float("inf")] * 2
    for _ in range(rounds):
        for i, call in enumerate((first, second)):
            start = time.perf_counter()
            call()
            best[i] = min(best[i], time.perf_counter() - start)
    return best[0], best[1]


def pack(weights: SimpleNamespace) -> SimpleNamespace:
    """`weights` (runner.models.compact_llama's namespace) with every layer's projections laid out for this CPU's
    product and q/k/v and gate/up fused, in place (the plain tensors are dropped: one copy in memory), when that
    pays here: float32 packed for MKL's product (`MklPacked`, where `mkl_pays` too) or else `transposed`
    (`transposed_pays`), bf16 `packed` (`pays`); else unchanged. The head is laid out by the model that scores
    with it (`head`; its rows may be a subset). The tensors left as they are are copied out of the checkpoint's
    buffer, so that buffer is freed once loading ends."""
    if getattr(weights, "packed", False):
        return weights
    threads = torch.get_num_threads()
    if _bytes(weights) >= SMALL_BYTES and transposed_pays(weights.embed.dtype, threads):
        lay, weights.transposed = (MklPacked if mkl_pays(threads) else transposed), True  # the head: transposed
    elif pays(weights.embed.dtype, threads):
        lay = packed
    else:
        return weights
    tied = weights.lm_head is weights.embed
    weights.embed, weights.norm = weights.embed.clone(), weights.norm.clone()
    weights.lm_head = weights.embed if tied else weights.lm_head.clone()
    for layer in weights.layers:
        layer.ln1, layer.ln2 = layer.ln1.clone(), layer.ln2.clone()
        layer.o_bias = None if layer.o_bias is None else layer.o_bias.clone()
        layer.qkv = lay(torch.cat([layer.q, layer.k, layer.v]))
        layer.qkv_bias = _fused(layer.q_bias, layer.k_bias, layer.v_bias)
        layer.gate_up = lay(torch.cat([layer.gate, layer.up]))
        layer.o, layer.down = lay(layer.o), lay(layer.down)
        for name in ("q", "k", "v", "q_bias", "k_bias", "v_bias", "gate", "up"):
            delattr(layer, name)
    weights.packed = True
    return weights


def _bytes(weights: SimpleNamespace) -> int:
    return sum(t.numel() * t.element_size() for layer in weights.layers for t in vars(layer).values() if t is not None)


def head(weights: SimpleNamespace, weight: torch.Tensor) -> torch.Tensor:
    """A head (the whole vocabulary's or a subset's rows) in the layout of `weights`' packed projections."""
    return transposed(weight) if getattr(weights, "transposed", False) else packed(weight)
