"""The seeded fuzz campaign of benchmarks/fuzz.py, 300 cases: no crash, no hang, no changed blob that verifies.

(`python benchmarks/fuzz.py` runs the full 10,000; its numbers are in README.md.)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from fuzz import campaign  # noqa: E402


def test_300_seeded_store_mutations_are_refused_cleanly_never_crash_hang_or_pass() -> None:
    result = campaign(300, seed=7, workers=2, timeout=60)
    outcomes = result["outcomes"]
    assert sum(outcomes.values()) == 300
    assert outcomes.get("crash", 0) == 0, result["bad"]
    assert outcomes.get("hang", 0) == 0, result["bad"]
    assert outcomes.get("bypass", 0) == 0, result["bad"]
    assert outcomes.get("refused", 0) > 250, outcomes  # almost every change is noticed; the rest changed nothing that matters


def test_200_seeded_gguf_header_mutations_are_refused_cleanly_never_crash_or_hang() -> None:
    """`bundle pack` on a GGUF pair whose header was changed (`python benchmarks/fuzz.py --surface gguf`
    runs 10,000): every case exits 0 or with one `error: [code]` line; llama.cpp aborting kills no worker."""
    from fuzz import gguf_campaign

    result = gguf_campaign(200, seed=7, workers=2, timeout=120)
    outcomes = result["outcomes"]
    assert sum(outcomes.values()) == 200
    assert outcomes.get("crash", 0) == 0, result["bad"]
    assert outcomes.get("hang", 0) == 0, result["bad"]
    assert outcomes.get("refused", 0) > 150, outcomes  # almost every header change is noticed
