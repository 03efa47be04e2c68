"""What the CPU is: its model, core count and the vector extensions that decide an engine's decoding speed.

Numbers from a CPU with AMX (a bf16 verify pass of 5 tokens costs about one step) and from an AVX2-only CPU
(it costs about 2) differ in kind, so bench results and the guard's run history name the CPU they came from.
"""

from __future__ import annotations

__all__ = ["EXTENSIONS", "cpu_info", "repack_weights"]

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


def repack_weights() -> bool:
    """Whether llama.cpp may repack weights into its extra CPU buffer types. Not on a CPU with AMX: llama.cpp
    0.3.36's AMX buffer type crashes the process (SIGSEGV) on the first decode of the demo's Q4_1 target on a
    2-core Xeon with AMX (2026-12-06), the same file decodes with repacking off; llama-server's `--no-repack`."""
    return "AMX" not in cpu_info()["extensions"]
