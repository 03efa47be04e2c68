"""The decoding benchmarks' quick prompt set: every third of the 24 held-out prompts of
runner/bench/prompts.jsonl (the one copy), in their order, so 4 chat and 4 code prompts.

    .venv/bin/python benchmarks/quick_prompts.py > quick.jsonl    # JSON lines, for `bundle bench --prompts`

benchmarks/decode.sh and benchmarks/draft_policy.py run on this set by default.
"""

from __future__ import annotations

import sys
from pathlib import Path

HELD_OUT = Path(__file__).resolve().parent.parent / "runner" / "bench" / "prompts.jsonl"
EVERY = 3  # the file holds 12 chat prompts, then 12 code prompts: every third keeps 4 of each


def quick_lines() -> list[str]:
    """The quick set's JSON lines ({"prompt": ...}), as the held-out file writes them."""
    lines = [line for line in HELD_OUT.read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines[::EVERY]


if __name__ == "__main__":
    sys.stdout.write("".join(line + "\n" for line in quick_lines()))
