"""What speculation costs at the sizes users run: random-weight Llama-shaped targets of about 135M (the demo's
shape), 1B, 3B and 8B parameters, each with a draft of 1/8 to 1/16 its size, timed on this machine through
both engines the way the decoding loop drives them, and through llama.cpp's own C++ (llama-bench: what
llama-server pays).

Models (built under --work, default ~/.cache/specbundle/spec-cost, outside the repository):
- shapes of SmolLM2-135M (and the demo's 2-layer draft), Llama-3.2-1B, Llama-3.2-3B and Llama-3.1-8B, with
  the real vocabularies (49152 tokens for the 135M pair, Llama 3's 128256 for the others, tokenizers taken
  from the vocab files vendored with llama.cpp), default RoPE (Llama 3's rope scaling changes no cost);
- GGUF: f16 written with the vendored gguf-py, quantized to Q4_0 and Q4_K_M with the vendored llama.cpp's
  `llama-quantize` (benchmarks/llamacpp_tools.py builds it); the f16 files are removed after;
- torch: bf16 safetensors, loaded the way `bundle run` loads them (runner.models.loading, compact forward):
  135M, 1B and 3B by default; 8B (16 GB in bf16) only when asked with --torch-sizes, as it needs most of 24 GiB.

Measured per model (engine "llama.cpp": runner.engines.llamacpp through llama-cpp-python; "torch":
runner.engines.torch_engine on the compact forward; "llama-bench": the C++ tool, -d for the context): the
prefill of --context tokens, a decode step after them, and a verify pass of k + 1 tokens (k = 1..8) after
them, each the median of --reps timings taken in alternating order. A target's draft is the smaller model of
its size; its draft step is that model's decode step. From the costs: Leviathan's speed-up per pair, k and
acceptance 0.4-0.8, the break-even acceptance per pair and k, and the target size from which the demo's
acceptance (0.4-0.5 a token) pays, per engine.

Acceptance at these sizes needs trained weights, which this machine cannot download: nothing here measures
or assumes one; the report gives the acceptance each pair needs instead.

    python benchmarks/spec_cost.py build   [--sizes 135m,1b,3b,8b] [--quants Q4_0,Q4_K_M] [--torch-sizes 135m,1b,3b]
    python benchmarks/spec_cost.py measure [same] [--engines llama.cpp,llama-bench,torch] [--reps 15]
        [--context 128] [--threads N] [--out FILE] [--write-table]
    python benchmarks/spec_cost.py report  FILE    # the tables again, from a measure's JSON

--write-table writes the guard's prior (runner/decoding/cost_tables/<cpu class>.json, read by
runner.decoding.cost_prior); take it on an idle machine only.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import llamacpp_tools  # noqa: E402
from runner.decoding import cost_prior  # noqa: E402
from runner.engines.cpu import cpu_info  # noqa: E402

WORK = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specbundle" / "spec-cost"
KS = tuple(range(1, 9))
ACCEPTANCES = (0.4, 0.45, 0.5, 0.6, 0.7, 0.8)
DEMO_ACCEPTANCE = (0.4, 0.45, 0.5)  # per token, the demo pair's on held-out prompts


@dataclass(frozen=True)
class Shape:
    """A Llama decoder's shape (transformers' config names)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    rope_theta: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def params(self) -> int:
        """Every weight (llama_model_n_params counts the same)."""
        h, d = self.hidden_size, self.head_dim
        attention = 2 * h * self.num_attention_heads * d + 2 * h * self.num_key_value_heads * d
        layer = attention + 3 * h * self.intermediate_size + 2 * h
        heads = 1 if self.tie_word_embeddings else 2
        return heads * self.vocab_size * h + self.num_hidden_layers * layer + h


MODELS = {
    "smollm2-135m-draft": Shape(256, 2, 4, 4, 1024, 49152, True, 1e5),  # the demo's draft
    "smollm2-135m": Shape(576, 30, 9, 3, 1536, 49152, True, 1e5),
    "llama-1b-draft": Shape(512, 8, 8, 4, 1536, 128256, True, 5e5),
    "llama-3.2-1b": Shape(2048, 16, 32, 8, 8192, 128256, True, 5e5),
    "llama-3b-draft": Shape(1024, 12, 16, 8, 4096, 128256, True, 5e5),
    "llama-3.2-3b": Shape(3072, 28, 24, 8, 8192, 128256, True, 5e5),
    "llama-8b-draft": Shape(1536, 16, 24, 8, 4096, 128256, True, 5e5),
    "llama-3.1-8b": Shape(4096, 32, 32, 8, 14336, 128256, False, 5e5),
}
SIZES = {"135m": ("smollm2-135m", "smollm2-135m-draft"), "1b": ("llama-3.2-1b", "llama-1b-draft"),
         "3b": ("llama-3.2-3b", "llama-3b-draft"), "8b": ("llama-3.1-8b", "llama-8b-draft")}
VOCAB_FILES = {49152: "ggml-vocab-starcoder.gguf", 128256: "ggml-vocab-llama-bpe.gguf"}


def gguf_module():
    """The gguf-py vendored with the llama.cpp the tools are built from (the file format they read)."""
    sys.path.insert(0, str(llamacpp_tools.convert_script()[1]))
    import gguf

    return gguf


@functools.lru_cache(maxsize=2)
def tokenizer_fields(vocab_size: int) -> list[tuple]:
    """(key, value, type, element type) of the tokenizer metadata in llama.cpp's vocab file of that size (read
    once: parsing 128256 tokens and their merges takes a minute)."""
    gguf = gguf_module()
    vocab = gguf.GGUFReader(llamacpp_tools.convert_script()[0].parent / "models" / VOCAB_FILES[vocab_size])
    return [(key, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
            for key, field in vocab.fields.items() if key.startswith("tokenizer.")]


def _tensor_shapes(s: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """GGUF tensor names and numpy shapes of a Llama of shape `s`."""
    q, kv = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    shapes = [("token_embd.weight", (s.vocab_size, s.hidden_size)), ("output_norm.weight", (s.hidden_size,))]
    if not s.tie_word_embeddings:
        shapes.append(("output.weight", (s.vocab_size, s.hidden_size)))
    for i in range(s.num_hidden_layers):
        shapes += [(f"blk.{i}.{name}", shape) for name, shape in (
            ("attn_norm.weight", (s.hidden_size,)), ("ffn_norm.weight", (s.hidden_size,)),
            ("attn_q.weight", (q, s.hidden_size)), ("attn_k.weight", (kv, s.hidden_size)),
            ("attn_v.weight", (kv, s.hidden_size)), ("attn_output.weight", (s.hidden_size, q)),
            ("ffn_gate.weight", (s.intermediate_size, s.hidden_size)),
            ("ffn_up.weight", (s.intermediate_size, s.hidden_size)),
            ("ffn_down.weight", (s.hidden_size, s.intermediate_size)))]
    return shapes


def write_gguf(name: str, s: Shape, path: Path, seed: int = 0) -> Path:
    """A random-weight f16 GGUF of shape `s` with a real tokenizer, written one tensor at a time (an 8B
    never sits in memory whole)."""
    import numpy as np

    gguf = gguf_module()
    partial = path.with_name(path.name + ".part")  # renamed once whole: an interrupted build leaves no model
    w = gguf.GGUFWriter(str(partial), "llama")
    w.add_name(name)
    w.add_context_length(8192)
    w.add_embedding_length(s.hidden_size)
    w.add_block_count(s.num_hidden_layers)
    w.add_feed_forward_length(s.intermediate_size)
    w.add_head_count(s.num_attention_heads)
    w.add_head_count_kv(s.num_key_value_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(s.rope_theta)
    w.add_rope_dimension_count(s.head_dim)
    w.add_vocab_size(s.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value, vtype, sub_type in tokenizer_fields(s.vocab_size):
        w.add_key_value(key, value, vtype, sub_type)
    shapes = _tensor_shapes(s)
    dtype = {1: np.float32, 2: np.float16}
    for tensor, shape in shapes:  # norms stay f32, as the converter writes them
        w.add_tensor_info(tensor, shape, np.dtype(dtype[len(shape)]), int(np.prod(shape)) * (4 if len(shape) == 1 else 2))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for tensor, shape in shapes:
        if len(shape) == 1:
            w.write_tensor_data(np.ones(shape, np.float32))
        else:
            w.write_tensor_data((rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16))
    w.close()
    return partial.rename(path)


def write_safetensors(name: str, s: Shape, folder: Path, seed: int = 0) -> Path:
    """A random-weight bf16 Llama checkpoint (config.json + model.safetensors) of shape `s`."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "dtype": "bfloat16",
              "attention_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
              "rope_parameters": {"rope_type": "default", "rope_theta": s.rope_theta}, "bos_token_id": 1,
              "eos_token_id": 2, "head_dim": s.head_dim, "pretraining_tp": 1, "use_cache": True,
              **{k: v for k, v in asdict(s).items() if k != "rope_theta"}}
    g = torch.Generator().manual_seed(seed)
    tensors = {"model.embed_tokens.weight": (s.vocab_size, s.hidden_size), "model.norm.weight": (s.hidden_size,)}
    if not s.tie_word_embeddings:
        tensors["lm_head.weight"] = (s.vocab_size, s.hidden_size)
    q, kv = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    for i in range(s.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors.update({p + "self_attn.q_proj.weight": (q, s.hidden_size), p + "self_attn.k_proj.weight": (kv, s.hidden_size),
                        p + "self_attn.v_proj.weight": (kv, s.hidden_size), p + "self_attn.o_proj.weight": (s.hidden_size, q),
                        p + "mlp.gate_proj.weight": (s.intermediate_size, s.hidden_size),
                        p + "mlp.up_proj.weight": (s.intermediate_size, s.hidden_size),
                        p + "mlp.down_proj.weight": (s.hidden_size, s.intermediate_size),
                        p + "input_layernorm.weight": (s.hidden_size,), p + "post_attention_layernorm.weight": (s.hidden_size,)})
    state = {key: torch.ones(shape, dtype=torch.bfloat16) if len(shape) == 1
             else torch.empty(shape, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=g) for key, shape in tensors.items()}
    (folder / "config.json").write_text(json.dumps({**config, "name_or_path": name}, indent=1))
    save_file(state, str(folder / "model.safetensors.part"))
    (folder / "model.safetensors.part").rename(folder / "model.safetensors")
    return folder


def build(work: Path, sizes: list[str], quants: list[str], torch_sizes: list[str], log=print) -> None:
    """Every file the measurement of `sizes` needs, under `work`, skipping those already there."""
    quantize = llamacpp_tools.tool("llama-quantize", build=True) if quants else None
    for size in sizes:
        for name in SIZES[size]:
            shape = MODELS[name]
            for quant in quants:
                if (work / f"{name}.{quant}.gguf").exists():
                    continue
                f16 = work / f"{name}.F16.gguf"
                if not f16.exists():
                    log(f"writing {f16.name} ({shape.params / 1e9:.2f}B parameters)")
                    write_gguf(name, shape, f16)
                if quant != "F16":
                    log(f"quantizing {name} to {quant}")
                    out = work / f"{name}.{quant}.gguf"
                    done = subprocess.run([str(quantize), str(f16), str(out) + ".part", quant], capture_output=True, text=True)
                    if done.returncode:
                        raise SystemExit(f"llama-quantize {name} {quant} failed: {done.stderr[-2000:]}")
                    Path(str(out) + ".part").rename(out)
            f16 = work / f"{name}.F16.gguf"
            if "F16" not in quants and f16.exists():
                f16.unlink()  # 2 bytes a parameter: only the quantized files are measured
            if size in torch_sizes and not (work / name / "model.safetensors").exists():
                log(f"writing {name}/model.safetensors (bf16)")
                write_safetensors(name, shape, work / name)


def time_passes(engine, context: int, reps: int, seed: int = 0) -> dict:
    """Through the engine interface, as the decoding loop calls it: the prefill of `context` tokens, then on
    top of them a decode step and verify passes of k + 1 tokens (each cropped off again), every kind timed
    `reps` times in an order that reverses each round; medians and minima in seconds."""
    import torch

    g = torch.Generator().manual_seed(seed)
    room = context + max(KS) + 1
    ids = torch.randint(300, engine.vocab_size - 300, (room,), generator=g)
    prefill = []
    for _ in range(max(3, reps // 4)):
        engine.reset(room)
        start = time.perf_counter()
        engine.forward(ids[:context], last_only=True)
        prefill.append(time.perf_counter() - start)
    sizes = [1, *(k + 1 for k in KS)]
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for round_ in range(reps + 1):  # round 0 warms every shape up and is not kept
        for n in sizes if round_ % 2 else sizes[::-1]:
            start = time.perf_counter()
            engine.forward(ids[context:context + n], last_only=n == 1)
            elapsed = time.perf_counter() - start
            engine.crop(n)
            if round_:
                times[n].append(elapsed)
    return {"prefill_s": statistics.median(prefill), "step_s": statistics.median(times[1]),
            "step_min_s": min(times[1]), "verify_s": {str(k): statistics.median(times[k + 1]) for k in KS},
            "verify_min_s": {str(k): min(times[k + 1]) for k in KS}, "reps": reps}


def measure_llamacpp(path: Path, context: int, reps: int, threads: int) -> dict:
    """The GGUF file through runner.engines.llamacpp (llama-cpp-python's decode of a token batch)."""
    from runner.engines.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine(path, n_ctx=context + 256, threads=threads)
    try:
        return {"params": engine.parameters, **time_passes(engine, context, reps)}
    finally:
        del engine
        gc.collect()


def measure_torch(folder: Path, context: int, reps: int, threads: int) -> dict:
    """The bf16 checkpoint loaded as `bundle run` loads it (compact forward), through runner.engines.torch_engine."""
    import torch

    from runner.engines.torch_engine import TorchEngine
    from runner.models.loading import ModelFiles, load_models

    torch.set_num_threads(threads)
    model = load_models([ModelFiles(folder, "target")], "bfloat16", "cpu", compact=True)[0]
    engine = TorchEngine(model)
    try:
        with torch.inference_mode():
            return {"params": engine.parameters, **time_passes(engine, context, reps)}
    finally:
        del engine, model
        gc.collect()


def measure_llama_bench(path: Path, context: int, reps: int, threads: int) -> dict:
    """llama-bench (llama.cpp's C++ alone, as llama-server runs it): -p over the verify sizes and -n 8 after a
    context of `context` tokens (-d), and the prefill of `context` tokens from empty."""
    bench = llamacpp_tools.tool("llama-bench", build=True)
    common = [str(bench), "-m", str(path), "-t", str(threads), "-r", str(reps), "-o", "json", "-b", "512", "-ub", "512"]
    passes = json.loads(subprocess.run(
        [*common, "-p", ",".join(str(k + 1) for k in KS), "-n", "8", "-d", str(context)],
        check=True, capture_output=True, text=True).stdout)
    prefill = json.loads(subprocess.run([*common, "-p", str(context), "-n", "0", "-d", "0", "-r", str(max(3, reps // 4))],
                                        check=True, capture_output=True, text=True).stdout)
    step = next(t for t in passes if t["n_gen"] > 0)
    verify = {t["n_prompt"]: t for t in passes if t["n_prompt"] > 0}
    return {"params": int(step["model_n_params"]), "prefill_s": prefill[0]["avg_ns"] / 1e9,
            "step_s": step["avg_ns"] / 1e9 / step["n_gen"],
            "verify_s": {str(k): verify[k + 1]["avg_ns"] / 1e9 for k in KS}, "reps": reps}


def _versions() -> dict:
    import llama_cpp
    import torch

    return {"llama-cpp-python": llama_cpp.__version__, "torch": torch.__version__, "python": platform.python_version()}


def measure(work: Path, sizes: list[str], engines: list[str], quants: list[str], torch_sizes: list[str],
            context: int, reps: int, threads: int, log=print) -> dict:
    """Builds what is missing, then times every model of `sizes` on every engine; the results as one dict."""
    build(work, sizes, quants if {"llama.cpp", "llama-bench"} & set(engines) else [],
          torch_sizes if "torch" in engines else [], log)
    names = [name for size in sizes for name in SIZES[size]]
    results: dict = {"cpu": cpu_info(), "cpu_class": cost_prior.cpu_class(), "threads": threads, "context": context,
                     "reps": reps, "versions": _versions(), "load_before": os.getloadavg(),
                     "models": {n: {**asdict(MODELS[n]), "params": MODELS[n].params} for n in names},
                     "pairs": {size: dict(zip(("target", "draft"), SIZES[size])) for size in sizes}, "engines": {}}
    runs = [(engine, quant, name) for engine in engines for quant in (["BF16"] if engine == "torch" else quants)
            for name in names if engine != "torch" or next(s for s in sizes if name in SIZES[s]) in torch_sizes]
    for engine, quant, name in runs:
        started = time.monotonic()
        if engine == "torch":
            row = measure_torch(work / name, context, reps, threads)
        elif engine == "llama.cpp":
            row = measure_llamacpp(work / f"{name}.{quant}.gguf", context, reps, threads)
        else:
            row = measure_llama_bench(work / f"{name}.{quant}.gguf", context, reps, threads)
        results["engines"].setdefault(engine, {}).setdefault(quant, {})[name] = row
        log(f"{engine} {quant} {name}: step {row['step_s'] * 1e3:.1f} ms, verify k=4 "
            f"{row['verify_s']['4'] / row['step_s']:.2f} steps ({time.monotonic() - started:.0f} s)")
    results["load_after"] = os.getloadavg()
    return results


def cost_table(results: dict) -> dict:
    """The guard's prior (runner.decoding.cost_prior's format) from measure's results."""
    engines = {engine: {quant: [{"name": name, "params": row["params"], "step_s": row["step_s"],
                                 "prefill_s": row["prefill_s"], "context": results["context"],
                                 "verify_steps": {k: round(v / row["step_s"], 4) for k, v in row["verify_s"].items()}}
                                for name, row in rows.items()]
                        for quant, rows in quants.items()}
               for engine, quants in results["engines"].items()}
    return {"cpu_class": results["cpu_class"], "cpu": results["cpu"], "threads": results["threads"],
            "context": results["context"], "versions": results["versions"], "load": [results["load_before"], results["load_after"]],
            "measured_by": "benchmarks/spec_cost.py measure --write-table", "engines": engines}


def pays_from(table: dict, engine: str, quant: str, acceptance: float, ratio: float, max_k: int = 8) -> float | None:
    """The smallest target size (parameters, on a log grid of the measured range) whose best k pays at
    `acceptance` with a draft 1/ratio its size; None when no measured size pays."""
    models = sorted(m["params"] for m in table["engines"][engine][quant])
    low, high = math.log(max(models[0] * ratio, models[0])), math.log(models[-1])
    for i in range(121):
        size = math.exp(low + (high - low) * i / 120)
        best = cost_prior.best_prior_speedup(engine, quant, int(size), int(size / ratio), acceptance, max_k, table)
        if best is not None and best[0] >= 1.0:
            return size
    return None


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else "never" if math.isinf(x) else f"{x:.{digits}f}"


def _model_rows(rows: list[dict]) -> list[str]:
    lines = ["| model | parameters | step ms | prefill ms | " + " | ".join(f"v k={k}" for k in KS) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(KS)]
    for m in sorted(rows, key=lambda m: m["params"]):
        lines.append(f"| {m['name']} | {m['params'] / 1e6:,.0f}M | {m['step_s'] * 1e3:.1f} | {m['prefill_s'] * 1e3:.0f} | "
                     + " | ".join(f"{m['verify_steps'][str(k)]:.2f}" for k in KS) + " |")
    return lines


def _pair_rows(table: dict, engine: str, quant: str, pairs: dict, models: dict) -> list[str]:
    measured = {m["name"] for m in table["engines"][engine][quant]}
    lines = ["| pair | c | " + " | ".join(f"a* k={k}" for k in KS) + " | "
             + " | ".join(f"a={a}" for a in ACCEPTANCES) + " |", "|---|---:|" + "---:|" * (len(KS) + len(ACCEPTANCES))]
    for size, pair in pairs.items():
        if not {pair["target"], pair["draft"]} <= measured:
            continue
        tp, dp = models[pair["target"]]["params"], models[pair["draft"]]["params"]
        c = cost_prior.pair_costs(engine, quant, tp, dp, 1, table)[0]
        even = [cost_prior.break_even_acceptance(engine, quant, tp, dp, k, table) for k in KS]
        best = [cost_prior.best_prior_speedup(engine, quant, tp, dp, a, max(KS), table) for a in ACCEPTANCES]
        lines.append(f"| {size} ({tp / dp:.0f}:1) | {c:.3f} | " + " | ".join(_fmt(e) for e in even) + " | "
                     + " | ".join(f"{s:.2f}x (k={k})" for s, k in best) + " |")
    return lines


def report(results: dict, ratio: float = 12.0) -> list[str]:
    """Markdown: per engine and quantization, the measured costs, and per pair the break-even acceptance a* per
    k and the best predicted speed-up per acceptance; then where the demo's acceptance starts to pay."""
    table = cost_table(results)
    cpu = results["cpu"]
    lines = [f"CPU: {cpu['model']} ({', '.join(cpu['extensions'])}; class {results['cpu_class']}), {results['threads']} threads, "
             f"context {results['context']} tokens, {results['reps']} repetitions, load average before/after "
             f"{results['load_before'][0]:.2f}/{results['load_after'][0]:.2f}. Verify costs (v) in single decode steps; "
             "acceptance is per token; nothing here measured an acceptance (random weights)."]
    for engine, quants in table["engines"].items():
        for quant, rows in quants.items():
            lines += ["", f"### {engine}, {quant}", "", *_model_rows(rows), "",
                      *_pair_rows(table, engine, quant, results["pairs"], results["models"]), ""]
            sizes = [pays_from(table, engine, quant, a, ratio) for a in DEMO_ACCEPTANCE]
            pays = [f"a={a}: " + ("-" if s is None else f"{s / 1e9:.2f}B") for a, s in zip(DEMO_ACCEPTANCE, sizes)]
            lines.append(f"Demo acceptance pays (best k, draft 1/{ratio:g} of the target) from a target of: "
                         + "; ".join(pays) + " (- : no measured size pays).")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("build", "measure", "report"))
    parser.add_argument("results", nargs="?", help="report: a measure's JSON")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--sizes", default="135m,1b,3b,8b")
    parser.add_argument("--quants", default="Q4_0,Q4_K_M", help="llama-quantize types (F16 keeps the f16 file)")
    parser.add_argument("--torch-sizes", default="135m,1b,3b", help="sizes measured on torch (bf16)")
    parser.add_argument("--engines", default="llama.cpp,llama-bench,torch")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--draft-ratio", type=float, default=12.0, help="target/draft size for the pays-from line")
    parser.add_argument("--out", type=Path, help="measure's JSON (default WORK/results-<cpu class>.json)")
    parser.add_argument("--write-table", action="store_true", help="write runner/decoding/cost_tables/<cpu class>.json")
    args = parser.parse_args()
    split = lambda text: [x for x in text.split(",") if x]  # noqa: E731
    unknown = set(split(args.sizes)) - set(SIZES)
    if unknown:
        parser.error(f"unknown sizes {sorted(unknown)}: {', '.join(SIZES)}")
    if args.action == "report":
        if not args.results:
            parser.error("report needs a measure's JSON")
        print("\n".join(report(json.loads(Path(args.results).read_text()), args.draft_ratio)))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    if args.action == "build":
        build(args.work, split(args.sizes), split(args.quants), split(args.torch_sizes))
        return 0
    results = measure(args.work, split(args.sizes), split(args.engines), split(args.quants), split(args.torch_sizes),
                      args.context, args.reps, args.threads)
    out = args.out or args.work / f"results-{results['cpu_class']}.json"
    out.write_text(json.dumps(results, indent=1))
    print("\n".join(report(results, args.draft_ratio)))
    print(f"\nresults: {out}")
    if args.write_table:
        path = cost_prior.TABLES / f"{results['cpu_class']}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(cost_table(results), indent=1) + "\n")
        print(f"cost table: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
