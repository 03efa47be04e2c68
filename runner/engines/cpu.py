"""What the CPU is: its model, core count and the vector extensions that decide an engine's decoding speed.

Numbers from a CPU with AMX (a bf16 verify pass of 5 tokens costs about one step) and from an AVX2-only CPU
(it costs about 2) differ in kind, so bench results and the guard's run history name the CPU they came from.
"""

from __future__ import annotations

__all__ = ["EXTENSIONS", "cpu_info"]

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
