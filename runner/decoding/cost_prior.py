"""The guard's prior: what speculation costs on this class of CPU before a single step is timed, read off
cost tables measured by benchmarks/spec_cost.py (runner/decoding/cost_tables/<cpu class>.json).

A table holds, per engine ("llama.cpp", "torch", "llama-bench": llama.cpp's C++ alone, what llama-server
pays) and quantization ("Q4_0", "Q4_K_M", "BF16", ...), models of several sizes: each one's parameter count,
the time of one decode step at a short context, and the cost of a verify pass of k + 1 tokens in single steps
(`verify_steps`, k = 1..8). A pair's costs are interpolated between the measured sizes, linearly in
log-parameters (log step time; verify cost in steps): the draft's step over the target's (Leviathan's cost
ratio c) and the target's verify pass (v). The speed-up is Leviathan's formula (runner.decoding.stats).
Without a table for this CPU class, engine and quantization, or for a model outside the measured sizes,
there is no prior (None): the guard then times its own trial steps.
"""

from __future__ import annotations

__all__ = [
    "CPU_CLASSES", "SIZE_SLACK", "TABLES", "TABLES_ENV", "best_prior_speedup", "break_even_acceptance", "cpu_class", "load_table",
    "pair_costs", "prior_speedup", "quant_name", "read_table",
]

import functools
import json
import logging
import math
import os
from collections.abc import Iterable
from pathlib import Path

from core.boundedread import NotReadable, read_bounded
from runner.decoding.stats import predicted_speedup
from runner.engines.cpu import cpu_info

TABLES = Path(__file__).with_name("cost_tables")
TABLES_ENV = "SPECBUNDLE_COST_TABLES"  # another directory of tables (a test's, or a site's own measurements)
# Fastest first: the first a CPU has names its class (AMX: batched bf16 passes nearly free; AVX-512 BF16:
# cheap; AVX2: a verify pass grows with its length).
CPU_CLASSES = {"amx": "AMX-BF16", "avx512_bf16": "AVX-512 BF16", "avx2": "AVX2"}
# A model may lie this factor past the smallest or largest measured size and still take the end's costs.
SIZE_SLACK = 1.25
# A table file is read only as a regular file of at most this many bytes (the shipped one is 14 kB), and only
# with the shape read_table checks: anything else is no table.
MAX_TABLE_BYTES = 1 << 20
MAX_TABLE_K = 64  # verify_steps' keys: proposal lengths 1..this
_QUANT_ALIASES = {"BFLOAT16": "BF16", "FLOAT16": "F16", "FP16": "F16", "FLOAT32": "F32", "FP32": "F32"}


def cpu_class(extensions: Iterable[str] | None = None) -> str | None:
    """The cost class of a CPU from its extensions as runner.engines.cpu names them (this CPU's when None):
    "amx", "avx512_bf16", "avx2", or None for a CPU without AVX2."""
    if extensions is None:
        return _this_cpu_class()
    have = set(extensions)
    return next((name for name, extension in CPU_CLASSES.items() if extension in have), None)


@functools.lru_cache(maxsize=1)
def _this_cpu_class() -> str | None:
    return cpu_class(cpu_info()["extensions"])


def quant_name(quant: str | int) -> str:
    """A quantization or dtype as the tables key it: "Q4_K_M", "Q4_0", "BF16", "F16", "F32"; also gguf's
    LlamaFileType names ("MOSTLY_Q4_K_M") and numbers (general.file_type, as the GGUF run's dtype holds it:
    15 or "15") and torch's "bfloat16"."""
    text = str(quant)
    if text.isdigit():
        from gguf import LlamaFileType

        try:
            text = LlamaFileType(int(text)).name
        except ValueError:
            return f"GGUF-FILE-TYPE-{text}"
    name = text.upper().removeprefix("TORCH.").removeprefix("MOSTLY_").removeprefix("ALL_")
    return _QUANT_ALIASES.get(name, name)


def load_table(cls: str | None = None, directory: Path | None = None) -> dict | None:
    """The cost table of CPU class `cls` (this CPU's when None) from `directory` (default $SPECBUNDLE_COST_TABLES,
    else the shipped TABLES); None when there is none, or when the file is not a table (`read_table`)."""
    cls = cls or cpu_class()
    if cls is None:
        return None
    directory = directory or Path(os.environ.get(TABLES_ENV) or TABLES)
    path = directory / f"{cls}.json"
    try:
        st = path.stat()
    except (OSError, ValueError):
        return None
    return _read_table(path, (st.st_mtime_ns, st.st_size, st.st_ino))


@functools.lru_cache(maxsize=8)
def _read_table(path: Path, version: tuple[int, int, int]) -> dict | None:
    """read_table, once per version of the file (its mtime, size and inode); a file that is not a table is
    said once, on one line, and counts as none: the guard then times the pair itself."""
    try:
        return read_table(path)
    except ValueError as why:
        logging.getLogger(__name__).warning("warning: cost table %s ignored (%s): the guard times the pair itself", path, why)
        return None


def read_table(path: Path | str) -> dict:
    """A cost table file: a regular file (never a FIFO or device) of at most MAX_TABLE_BYTES, JSON of the shape the module docstring describes ({"engines": {ENGINE: {QUANT: [model]}}},
    each model's "params" a positive integer, "step_s" and every "verify_steps" value finite and positive);
    ValueError saying what is wrong otherwise."""
    try:
        data = read_bounded(path, MAX_TABLE_BYTES)
    except NotReadable as why:
        raise ValueError(f"it {why}") from None
    try:
        table = json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("it nests too deep") from None
    except (UnicodeDecodeError, ValueError):  # JSONDecodeError, NaN or Infinity
        raise ValueError("it is not JSON (finite numbers only)") from None
    engines = table.get("engines") if isinstance(table, dict) else None
    if not isinstance(engines, dict) or not engines:
        raise ValueError('it has no "engines" object')
    for engine, quants in engines.items():
        if not isinstance(quants, dict):
            raise ValueError(f"engines.{engine} is not an object of quantizations")
        for quant, models in quants.items():
            if not isinstance(models, list) or not all(_is_model(m) for m in models):
                raise ValueError(f"engines.{engine}.{quant} is not a list of measured models "
                                 '({"params": N > 0, "step_s": S > 0, "verify_steps": {"K": V > 0}})')
    return table


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a measurement")


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _is_model(model: object) -> bool:
    """One measured model of a table: positive integer params, a positive finite step time and verify costs."""
    if not isinstance(model, dict) or not isinstance(model.get("params"), int) or not _positive(model["params"]):
        return False
    verify = model.get("verify_steps")
    return _positive(model.get("step_s")) and isinstance(verify, dict) and \
        all(k.isascii() and k.isdigit() and 0 < int(k) <= MAX_TABLE_K and _positive(v) for k, v in verify.items())


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise linear through `points` (sorted by x), held flat past either end."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return points[-1][1]


def _models(table: dict | None, engine: str, quant: str) -> list[dict]:
    """The table's measured models of `engine` and `quant`, smallest first ([] when none)."""
    if not table:
        return []
    models = table.get("engines", {}).get(engine, {}).get(quant_name(quant), [])
    return sorted(models, key=lambda m: m["params"])


def _inside(models: list[dict], params: int) -> bool:
    return models[0]["params"] / SIZE_SLACK <= params <= models[-1]["params"] * SIZE_SLACK


def pair_costs(engine: str, quant: str, target_params: int, draft_params: int, k: int,
               table: dict | None = None) -> tuple[float, float] | None:
    """(c, v): a draft step's cost and a verify pass of k + 1 tokens' cost, both in target steps, for a pair of
    these sizes on `engine` in `quant`; None when the table (this CPU's when None) does not cover them."""
    models = _models(table if table is not None else load_table(), engine, quant)
    if not models or not _inside(models, target_params) or not _inside(models, draft_params):
        return None
    verify = [(math.log(m["params"]), m["verify_steps"][str(k)]) for m in models if str(k) in m["verify_steps"]]
    if len(verify) != len(models):
        return None
    steps = [(math.log(m["params"]), math.log(m["step_s"])) for m in models]
    draft_step = math.exp(_interpolate(steps, math.log(draft_params)))
    target_step = math.exp(_interpolate(steps, math.log(target_params)))
    return draft_step / target_step, max(_interpolate(verify, math.log(target_params)), 1.0)


def prior_speedup(engine: str, quant: str, target_params: int, draft_params: int, k: int, acceptance: float,
                  table: dict | None = None) -> float | None:
    """Leviathan's predicted speed-up over plain decoding of drafting k tokens a step at per-token
    `acceptance`, with the table's costs for a pair of these sizes; None when no table fits."""
    costs = pair_costs(engine, quant, target_params, draft_params, k, table)
    return None if costs is None else predicted_speedup(acceptance, k, *costs)


def best_prior_speedup(engine: str, quant: str, target_params: int, draft_params: int, acceptance: float,
                       max_k: int, table: dict | None = None) -> tuple[float, int] | None:
    """The best prior speed-up over k = 1..max_k and its k; None when no table fits."""
    found = [(s, k) for k in range(1, max(max_k, 1) + 1)
             if (s := prior_speedup(engine, quant, target_params, draft_params, k, acceptance, table)) is not None]
    return max(found) if found else None


def break_even_acceptance(engine: str, quant: str, target_params: int, draft_params: int, k: int,
                          table: dict | None = None) -> float | None:
    """The per-token acceptance at which drafting k tokens a step breaks even (speed-up 1); math.inf when none
    below 1 does (a verify pass and k draft steps cost more than k + 1 steps); None when no table fits."""
    costs = pair_costs(engine, quant, target_params, draft_params, k, table)
    if costs is None:
        return None
    if predicted_speedup(1.0, k, *costs) < 1.0:
        return math.inf
    low, high = 0.0, 1.0
    for _ in range(40):  # the speed-up grows with acceptance: bisection to ~1e-12
        mid = (low + high) / 2
        low, high = (mid, high) if predicted_speedup(mid, k, *costs) < 1.0 else (low, mid)
    return high
