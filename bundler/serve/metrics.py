"""What `bundle serve` counts: the Prometheus metrics (CONTRACT.md section 4, plus vLLM-shaped speculative
decoding counters that add up across a fleet), and the health window /health judges.

Counters are exported, ratios are not (they cannot be summed across replicas): PromQL divides the counters
(docs/serving.md). The one gauge that is a ratio, the recent window /health judges, is named `_ratio`.

The prompt cache's figures (cached prompt tokens, the cache's bytes) go in a registry of their own, shown only
to a scrape that carries the separate metrics credential (`serve --metrics-key-file`; without one, to no
scrape): a counter of cached tokens tells whoever reads it, exactly, whether another client's prompt began as
theirs did, and every client holds the API key (docs/security.md).
"""

from __future__ import annotations

__all__ = ["HEALTH_WINDOW", "STATUSES", "HealthWindow", "Metrics", "dtype_name"]

import collections
import threading
from typing import Any, Mapping

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector,
                               generate_latest)

HEALTH_WINDOW = 16  # requests in the recent-acceptance window of /health
# specbundle_requests_total{status}: ok, stopped early by the client (cancelled), over the time limit (timeout),
# refused by a full queue (rejected), a bad request (invalid), a failure while generating (error).
STATUSES = ("ok", "cancelled", "timeout", "rejected", "invalid", "error")


def dtype_name(dtype: Any) -> str:
    """A readable dtype: a GGUF file type's number (general.file_type, e.g. 3) as its name (Q4_1)."""
    text = str(dtype)
    if not text.isdigit():
        return text
    from gguf import LlamaFileType

    try:
        name = LlamaFileType(int(text)).name
    except ValueError:
        return f"gguf-file-type-{text}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


class Metrics:
    """The server's metrics in registries of their own (so a test process can hold several): `registry` for
    every scrape, `private` added for a scrape that carries the metrics credential."""

    def __init__(self, info: Mapping[str, str]):
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.requests = Counter("specbundle_requests", "Requests answered, by outcome.", ["status"], registry=r)
        for status in STATUSES:
            self.requests.labels(status=status)
        self.prompt_tokens = Counter("specbundle_prompt_tokens", "Prompt tokens of the requests decoded.", registry=r)
        self.generated = Counter("specbundle_generated_tokens", "Tokens generated.", registry=r)
        self.drafted = Counter("specbundle_draft_tokens", "Tokens the draft proposed.", registry=r)
        self.accepted = Counter("specbundle_accepted_tokens", "Drafted tokens the target accepted.", registry=r)
        self.drafts = Counter("specbundle_spec_decode_num_drafts", "Drafts proposed (each one or more tokens).", registry=r)
        self.draft_tokens = Counter("specbundle_spec_decode_num_draft_tokens", "Tokens the draft proposed.", registry=r)
        self.accepted_tokens = Counter("specbundle_spec_decode_num_accepted_tokens", "Drafted tokens the target accepted.",
                                       registry=r)
        self.accepted_at = Counter("specbundle_spec_decode_num_accepted_tokens_per_pos",
                                   "Drafted tokens accepted at each draft position (1: a draft's first token).",
                                   ["position"], registry=r)
        self.drafted_at = Counter("specbundle_spec_decode_num_draft_tokens_per_pos",
                                  "Tokens drafted at each draft position (the draft length adapts, so each position "
                                  "has its own count).", ["position"], registry=r)
        self.acceptance = Gauge("specbundle_acceptance_ratio", f"Accepted/drafted over the last {HEALTH_WINDOW} requests "
                                "(what /health judges; for a fleet, divide the counters).", registry=r)
        # CONTRACT.md names the same gauge specbundle_acceptance_rate: kept for the dashboards that read it.
        self.acceptance_rate = Gauge("specbundle_acceptance_rate", "The same as specbundle_acceptance_ratio (the "
                                     "contract's name).", registry=r)
        self.fallbacks = Counter("specbundle_fallbacks", "Requests in which the guard fell back to plain decoding.", registry=r)
        self.queue_depth = Gauge("specbundle_queue_depth", "Requests waiting for the decoding worker.", registry=r)
        self.ttft = Histogram("specbundle_time_to_first_token_seconds", "From enqueue to the first token.", registry=r,
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.duration = Histogram("specbundle_request_duration_seconds", "From enqueue to the last token.", registry=r,
                                  buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
        self.inter_token = Histogram("specbundle_inter_token_latency_seconds", "Time per token after the first.", registry=r,
                                     buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
        self.batch_size = Histogram("specbundle_batch_size", "Sequences in each batched target pass.", registry=r,
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32))
        self.active = Gauge("specbundle_active_sequences", "Requests being decoded now.", registry=r)
        self.sequences = Gauge("specbundle_sequences", "Requests that may be decoded at once.", registry=r)
        self.queue_wait = Histogram("specbundle_queue_wait_seconds", "From enqueue to the start of decoding.", registry=r,
                                    buckets=(0.001, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.request_acceptance = Histogram("specbundle_request_acceptance_ratio", "Accepted/drafted of each request "
                                            "that drafted.", registry=r, buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0))
        self.info = Gauge("specbundle_bundle_info", "What runs: always 1.", list(info), registry=r)
        self.info.labels(**info).set(1)
        self.private = p = CollectorRegistry()
        self.cached_prompt = Counter("specbundle_cached_prompt_tokens", "Prompt tokens an earlier request's cache cells "
                                     "held, not prefilled again.", registry=p)
        self.prompt_cache = Gauge("specbundle_prompt_cache_bytes", "Host memory the prompt cache's copies of cache cells take.",
                                  registry=p)

    def exposition(self, private: bool) -> bytes:
        """The text format of a scrape: the private registry only for a scrape that carried the metrics credential
        (bundler.serve.api_key.METRICS_AUTHENTICATED)."""
        text = generate_latest(self.registry)
        return text + generate_latest(self.private) if private else text

    def count_request(self, status: str, prompt_tokens: int, tokens: int, stats: Mapping[str, Any],
                      positions: Mapping[str, list[int]]) -> None:
        """One request's end: its outcome, its tokens and its speculation's counts."""
        self.requests.labels(status=status).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generated.inc(tokens)
        drafted, accepted = int(stats.get("drafted", 0)), int(stats.get("accepted", 0))
        for counter, value in ((self.drafted, drafted), (self.draft_tokens, drafted), (self.accepted, accepted),
                               (self.accepted_tokens, accepted)):
            counter.inc(value)
        if drafted:
            self.request_acceptance.observe(accepted / drafted)
        if stats.get("fallback"):
            self.fallbacks.inc()
        drafted_at, accepted_at = positions.get("drafted", []), positions.get("accepted", [])
        if drafted_at:
            self.drafts.inc(drafted_at[0])  # every draft proposes a first token
        for i, (d, a) in enumerate(zip(drafted_at, accepted_at)):
            self.drafted_at.labels(position=str(i + 1)).inc(d)
            self.accepted_at.labels(position=str(i + 1)).inc(a)


class HealthWindow:
    """The last HEALTH_WINDOW requests' drafted, accepted, fallback and tokens/s: what /health judges and the
    status page shows."""

    def __init__(self, min_acceptance: float, *gauges: Gauge) -> None:
        self.min_acceptance, self.gauges = min_acceptance, gauges
        self.window: collections.deque[tuple[int, int, bool]] = collections.deque(maxlen=HEALTH_WINDOW)
        self.recent_tps: collections.deque[float] = collections.deque(maxlen=HEALTH_WINDOW)
        self.lock = threading.Lock()

    def record(self, stats: Mapping[str, Any]) -> None:
        with self.lock:
            self.window.append((int(stats.get("drafted", 0)), int(stats.get("accepted", 0)), bool(stats.get("fallback"))))
            if stats.get("tokens_per_second"):
                self.recent_tps.append(float(stats["tokens_per_second"]))
            rate = self._acceptance()
        for gauge in self.gauges:
            gauge.set(rate if rate is not None else 0.0)

    def _acceptance(self) -> float | None:
        drafted = sum(d for d, _, _ in self.window)
        return sum(a for _, a, _ in self.window) / drafted if drafted else None

    def acceptance(self) -> float | None:
        """Accepted/drafted over the window (None before anything was drafted)."""
        with self.lock:
            return self._acceptance()

    def tokens_per_second(self) -> float | None:
        with self.lock:
            return sum(self.recent_tps) / len(self.recent_tps) if self.recent_tps else None

    def judge(self) -> tuple[str, str | None, float | None]:
        """ok, or degraded with the reason (the output is still right, only slower); and the acceptance."""
        with self.lock:
            rate, window = self._acceptance(), list(self.window)
        fallbacks = sum(1 for *_, f in window if f)
        if rate is not None and rate < self.min_acceptance:
            return "degraded", (f"acceptance {rate:.2f} over the last {len(window)} requests is below the bundle's "
                                f"min_acceptance {self.min_acceptance:.2f}"), rate
        if window and fallbacks * 2 > len(window):
            return "degraded", f"the guard fell back to plain decoding in {fallbacks} of the last {len(window)} requests", rate
        return "ok", None, rate
