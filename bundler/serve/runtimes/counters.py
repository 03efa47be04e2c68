"""A runtime's own counters read into our metric names, so `/metrics`, `/health` and a fleet's PromQL stay the same
whatever runs behind the front door (bundler.serve.metrics names them).

vLLM exports `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens` and its token
counters; llama-server (`--metrics`) the same speculative counters under `llamacpp:` and its token counters
(`llamacpp:prompt_tokens_total`, `llamacpp:tokens_predicted_total`). Each scrape adds to our counters what the runtime's grew by since the last;
what a runtime does not export stays at zero, and tokens are then counted from the answers' `usage`
(bundler.serve.runtimes.proxy)."""

from __future__ import annotations

__all__ = ["RUNTIME_COUNTERS", "Mirror"]

import threading
from typing import Mapping

from prometheus_client import Counter
from prometheus_client.parser import text_string_to_metric_families

from bundler.serve.metrics import Metrics

# runtime -> {their sample name: our counter attributes (bundler.serve.metrics.Metrics)}
RUNTIME_COUNTERS: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "vllm:spec_decode_num_drafts_total": ("drafts",),
        "vllm:spec_decode_num_draft_tokens_total": ("drafted", "draft_tokens"),
        "vllm:spec_decode_num_accepted_tokens_total": ("accepted", "accepted_tokens"),
        "vllm:generation_tokens_total": ("generated",),
        "vllm:prompt_tokens_total": ("prompt_tokens",),
    },
    "llama-server": {
        "llamacpp:spec_decode_num_drafts_total": ("drafts",),
        "llamacpp:spec_decode_num_draft_tokens_total": ("drafted", "draft_tokens"),
        "llamacpp:spec_decode_num_accepted_tokens_total": ("accepted", "accepted_tokens"),
        "llamacpp:tokens_predicted_total": ("generated",),
        "llamacpp:prompt_tokens_total": ("prompt_tokens",),
    },
}


class Mirror:
    """Our counters following a runtime's cumulative ones (summed over label sets, e.g. vLLM's per model)."""

    def __init__(self, runtime: str, metrics: Metrics) -> None:
        self.names = RUNTIME_COUNTERS.get(runtime, {})
        self.metrics = metrics
        self.last: dict[str, float] = {}
        self.lock = threading.Lock()

    @property
    def counts_tokens(self) -> bool:
        """Whether the runtime's own counters give the generated tokens (else the proxy counts `usage`)."""
        return any("generated" in ours for ours in self.names.values())

    def totals(self) -> dict[str, float]:
        """The runtime's counters as last read, by their names."""
        with self.lock:
            return dict(self.last)

    def update(self, exposition: str) -> None:
        """Add to our counters what the runtime's grew by since the last scrape (a restarted runtime's counters
        start again from their new value)."""
        seen: dict[str, float] = {}
        for family in text_string_to_metric_families(exposition):
            for sample in family.samples:
                if sample.name in self.names:
                    seen[sample.name] = seen.get(sample.name, 0.0) + float(sample.value)
        with self.lock:
            for name, value in seen.items():
                grown = value - self.last.get(name, 0.0)
                if grown < 0:  # counters went back: a new process; count from zero again
                    grown = value
                self.last[name] = value
                for attr in self.names[name]:
                    counter: Counter = getattr(self.metrics, attr)
                    if grown > 0:
                        counter.inc(grown)

    def acceptance(self) -> float | None:
        """Accepted over drafted since the runtime started (None before anything was drafted)."""
        totals = self.totals()
        drafted = sum(v for k, v in totals.items() if "draft_tokens" in self.names.get(k, ()))
        accepted = sum(v for k, v in totals.items() if "accepted_tokens" in self.names.get(k, ()))
        return accepted / drafted if drafted else None

    @staticmethod
    def as_mapping(totals: Mapping[str, float]) -> dict[str, int]:
        return {k: int(v) for k, v in sorted(totals.items())}
