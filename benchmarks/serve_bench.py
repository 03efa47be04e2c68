"""The serving benchmark, one entry point in modes (each a module of benchmarks/serving/; `--mode M --help`
lists its options); it prints one JSON object, and writes it to `--out` too:

    python benchmarks/serve_bench.py --mode load [--build] [--clients 1,4,8] [--rounds 2] [--prompts grounded]
        [--servers bundle,bundle-plain,bundle-1,llama,llama-draft,llama-ngram-simple,llama-ngram-map-k]
    python benchmarks/serve_bench.py --mode load --ref smollm2-spec:1.0.0 [--vllm-python .venv-vllm/bin/python]
        --servers bundle,bundle-plain,vllm-fp32-bind,vllm-bf16-bind,vllm-fp32,vllm-bf16[,vllm-draft-bind]
    python benchmarks/serve_bench.py --mode ab [--a "--sequences 1 --no-draft"] [--b llama-server] [--stream]
    python benchmarks/serve_bench.py --mode vs-run [--limit 4] [--rounds 2]
    python benchmarks/serve_bench.py --mode batch-cost --target TARGET.gguf|MODEL_DIR [--sequences 1,2,4,8] [--k 0,2,4]
    python benchmarks/serve_bench.py --mode profile --target MODEL_DIR [--sequences 1,4,8,16] [--dtype bfloat16]
    python benchmarks/serve_bench.py --mode guard-cost [--limit 24]
    python benchmarks/serve_bench.py --mode fleet [--tiny]

The modes that send prompts take the set by name as `bundle bench` does: `--prompts open|grounded|FILE`.
Bundle modes default to the demo's bundles, store and key (`make demo`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

MODES = {"load": "serving.load", "ab": "serving.ab", "vs-run": "serving.vs_run", "batch-cost": "serving.batch_cost",
         "guard-cost": "serving.guard_cost", "fleet": "serving.fleet", "profile": "serving.step_profile"}


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, object]:
    """The mode's module and the options parsed for it (`--mode` first picks the module that adds them)."""
    first = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
    first.add_argument("--mode", choices=MODES)
    known, _ = first.parse_known_args(argv)
    if known.mode is None:
        first.add_argument("-h", "--help", action="help")
        first.error("--mode is required: one of " + ", ".join(MODES))
    module = importlib.import_module(MODES[known.mode])
    parser = argparse.ArgumentParser(prog=f"serve_bench.py --mode {known.mode}", description=module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--out", help="also write the JSON here")
    module.add_options(parser)
    return parser.parse_args(argv), module


def main(argv: list[str] | None = None) -> None:
    from serving.common import emit, stop_servers_on_sigterm

    stop_servers_on_sigterm()
    args, module = parse(argv)
    emit({"mode": args.mode, **module.run(args)}, args.out)


if __name__ == "__main__":
    main()
