"""The seeded request-body fuzz campaign of benchmarks/fuzz_requests.py, 300 cases against a real `bundle serve`:
no 5xx, no hang, no answer dropped or malformed, and the server still healthy and exiting 0 on SIGTERM.

(`python benchmarks/fuzz.py --surface requests` runs the full 10,000; its numbers are in docs/security.md.)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from fuzz_requests import campaign  # noqa: E402


def test_300_seeded_request_bodies_are_answered_never_5xx_hang_or_drop() -> None:
    result = campaign(300, seed=7, workers=2, timeout=60)
    outcomes = result["outcomes"]
    assert outcomes.get("answered", 0) == 300, result["bad"]
    assert result["health_after"] == 200 and result["serve_exit"] == 0, result
    statuses = result["statuses"]
    assert int(statuses.get("400", 0)) > 100 and int(statuses.get("200", 0)) > 10, statuses  # both kinds were exercised
