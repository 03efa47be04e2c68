"""What a benchmark ran on: the CPU model, the vector extensions that decide decoding speed, engine versions.

Numbers from a CPU with AMX (a bf16 verify pass of 5 tokens costs about one step) and from an AVX2-only CPU
(it costs about 2) differ in kind, so every bench result says which it came from.
"""

from __future__ import annotations

__all__ = ["cpu_info", "machine_info"]

import os
import platform
from pathlib import Path

# /proc/cpuinfo flag -> the name the README uses
EXTENSIONS = {"amx_tile": "AMX", "amx_bf16": "AMX-BF16", "avx512_bf16": "AVX-512 BF16", "avx512f": "AVX-512",
              "avx2": "AVX2", "fma": "FMA", "f16c": "F16C"}


def cpu_info() -> dict:
    """{"model", "extensions": [...], "cores"} from /proc/cpuinfo (platform's name elsewhere)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "extensions": [name for flag, name in EXTENSIONS.items() if flag in flags],
            "cores": os.cpu_count()}


def engine_versions() -> dict:
    """torch, transformers and llama-cpp-python versions (None when not installed)."""
    versions = {}
    for name, module in (("torch", "torch"), ("transformers", "transformers"), ("llama-cpp-python", "llama_cpp")):
        try:
            versions[name] = __import__(module).__version__
        except ImportError:
            versions[name] = None
    return versions


def machine_info(threads: int) -> dict:
    """The "machine" block of bench --json."""
    return {"cpu": cpu_info(), "threads": threads, "engines": engine_versions()}
