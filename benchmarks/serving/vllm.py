"""vLLM's CPU engine as a peer of `bundle serve` in `--mode load` (benchmarks/serving/load.py), on a safetensors
bundle's own verified files.

Servers, each vLLM's OpenAI server from its own venv's Python (`--vllm-python`, default .venv-vllm/bin/python,
made by `make vllm`), in the set-ups that matter on a small CPU (../shared/ENVIRONMENT.md):

- `vllm-fp32-bind`, `vllm-bf16-bind`: float32 / bfloat16, the engine on every CPU this process may use
  (`VLLM_CPU_OMP_THREADS_BIND=0-<n-1>`, `OMP_NUM_THREADS=n`); on 2 cores fp32 bound to both is vLLM's best;
- `vllm-fp32`, `vllm-bf16`: vLLM's own thread defaults (its CPU engine leaves one core to the front end and binds
  itself to the rest): neither variable set;
- `vllm-draft-bind` (optional): as `vllm-fp32-bind`, with the bundle's draft as its speculative model
  (`--speculative-config` draft_model at the bundle's signed draft length).

The command line is the one `bundle serve --runtime vllm` gives vLLM (bundler.serve.runtimes.flags.translate) on
the same checked files (common.checked_bundle: the target with the tokenizer's files beside its config.json,
`--served-model-name` the bundle reference, `--kv-cache-memory-bytes` from the memory preflight), with only the
dtype, the speculation and the threads set as above, `--max-num-seqs` the largest client count, and no API key.
vLLM takes 2-3 minutes to start on 2 cores, so each is started once for the whole run (not once per concurrency,
as the other servers are), waited for on /health for at most START_TIMEOUT_S, and stopped by its pid.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from serving.common import ROOT, Process, free_port

# name -> (dtype, engine bound to every CPU, the bundle's draft as speculative model)
VLLM_SERVERS = {"vllm-fp32-bind": ("float32", True, False), "vllm-bf16-bind": ("bfloat16", True, False),
                "vllm-fp32": ("float32", False, False), "vllm-bf16": ("bfloat16", False, False),
                "vllm-draft-bind": ("float32", True, True)}
DEFAULT_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
START_TIMEOUT_S = 600.0
KEY_ENV = "VLLM_API_KEY"  # the key a front door would hold: vLLM started here asks for none


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm-python", default=str(DEFAULT_PYTHON),
                        help="the Python of vLLM's own venv (`make vllm`) that starts the vllm-* servers")
    parser.add_argument("--vllm-context", type=int, default=2048,
                        help="vLLM's --max-model-len (prompt and answer of one request; KV room for it x the most clients)")


def check_python(args: argparse.Namespace) -> Path:
    """vLLM's Python, or the one-line reason the vllm-* servers cannot run (before anything starts)."""
    python = Path(args.vllm_python)
    if not python.exists():
        raise SystemExit(f"no vLLM Python at {python}: `make vllm` makes .venv-vllm, or give --vllm-python")
    return python


def cpu_list(cpus: list[int]) -> str:
    """CPUs as VLLM_CPU_OMP_THREADS_BIND takes them: a range where they are consecutive (0-1), else a comma list."""
    cpus = sorted(cpus)
    if cpus == list(range(cpus[0], cpus[-1] + 1)):
        return f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else str(cpus[0])
    return ",".join(str(c) for c in cpus)


def footprint(args: argparse.Namespace, sequences: int) -> dict[str, Any]:
    """What the memory preflight sizes vLLM's KV room for: the context x the most clients, in fp32 (the larger)."""
    return {"context": args.vllm_context, "sequences": sequences, "dtype": "float32"}


def launch(checked: Any, name: str, args: argparse.Namespace, sequences: int, port: int) -> tuple[Any, dict[str, str | None]]:
    """The server `name`'s Launch (argv, what it runs) and the environment to start it with (None: unset)."""
    from bundler.serve.runtimes.flags import RuntimeOptions, translate
    from core.errors import BundleError

    dtype, bind, draft = VLLM_SERVERS[name]
    cpus = sorted(os.sched_getaffinity(0))
    opts = RuntimeOptions("vllm", binary=str(args.vllm_python), speculate=draft, dtype=dtype, sequences=sequences,
                          context=args.vllm_context, threads=len(cpus))
    try:
        started = translate(checked, opts, port)
    except BundleError as err:
        raise SystemExit(f"{name}: {err.line()}") from None
    if draft and started.plan["method"] != "draft":
        raise SystemExit(f"{name}: {args.ref} offers vLLM no draft model (its speculation: {started.plan['method']})")
    env: dict[str, str | None] = {k: v for k, v in started.env.items() if k != KEY_ENV}
    if bind:
        env |= {"OMP_NUM_THREADS": str(len(cpus)), "VLLM_CPU_OMP_THREADS_BIND": cpu_list(cpus)}
    else:  # vLLM's defaults: whatever this shell set is removed too
        env |= {"OMP_NUM_THREADS": None, "VLLM_CPU_OMP_THREADS_BIND": None}
    env["PYTHONPATH"] = None  # vLLM's venv imports its own packages, nothing of this tree
    return started, env


def start(checked: Any, name: str, args: argparse.Namespace, sequences: int) -> tuple[Process, dict[str, Any]]:
    """vLLM as the server `name`, up (its /health 200) with room for `sequences` requests at once, and what it
    runs as the result records it (version, argv, environment, speculation)."""
    port = free_port()
    started, env = launch(checked, name, args, sequences, port)
    proc = Process(started.argv, port, env=env, ready_path="/health", timeout_s=START_TIMEOUT_S, model=checked.info["ref"],
                   own_session=getattr(args, "pause_idle", False))
    shown = started.shown()
    shown["env"] = {k: v for k, v in sorted(env.items()) if v is not None}
    return proc, shown
