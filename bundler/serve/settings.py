"""`bundle serve`'s settings, in one typed value the CLI builds: where it listens and who may ask, the queue and
time limit, how the pair is loaded (as `bundle run` loads it) and how its batch is sized."""

from __future__ import annotations

__all__ = ["BatchSettings", "LoadOptions", "ServeSettings"]

from dataclasses import dataclass, field
from typing import Any

from bundler.serve.request_guard import DEFAULT_HOST, ServeLimits, described

REQUEST_TIME_LIMIT_S = 300.0


@dataclass(frozen=True)
class LoadOptions:
    """How the pair is loaded, as `bundle run` takes it (runner.run.load_pair's options); None: the bundle's or
    the machine's default."""

    draft_tokens: int | None = None
    device: str | None = None
    dtype: str | None = None
    memory_budget: int | None = None  # bytes the pair (and the batch's caches) may use
    reproducible: bool = False  # --reproducible: the batch-invariant forward (runner.models.invariant)

    def as_kwargs(self) -> dict[str, Any]:
        return {"draft_tokens": self.draft_tokens, "device": self.device, "dtype": self.dtype, "memory_budget": self.memory_budget,
                "reproducible": self.reproducible}


@dataclass(frozen=True)
class BatchSettings:
    """The batch, where the pair's models decode in one (bundler.serve.batch_worker)."""

    sequences: int | None = None  # requests decoded at once (None: as many KV caches as fit, at most 8)
    speculate: bool = True  # False: the target alone (a baseline for benchmarks)
    prompt_cache: int | None = None  # bytes for copies of cache cells (0: none; None: runner.checks.memory's default)
    memory_budget: int | None = None
    runs: dict[str, int] | None = None  # the store's run history counts for the bundle here (None: start afresh)


@dataclass(frozen=True)
class ServeSettings:
    """Everything `serve_bundle` takes besides the bundle's source and the trusted keys."""

    host: str = described(DEFAULT_HOST, "Address to listen on (loopback unless you say otherwise).")
    port: int = described(8000, "Port to listen on.")
    api_key: str | None = None  # clients send `Authorization: Bearer <key>`; None: no key asked
    open_probes: bool = False  # /health, /livez and /metrics answer without the key (/metrics then without the prompt cache's figures)
    metrics_key: str | None = None  # a /metrics scrape with `Bearer <metrics key>` also gets the prompt cache's figures; None: none does
    served_model_name: str | None = None  # a name the model also answers to (KServe's InferenceService name)
    max_queue: int = described(16, "Requests that may wait; more answer 429.")
    # A request's, queue included; also the worker's stall limit (/livez).
    time_limit_s: float = described(REQUEST_TIME_LIMIT_S, "Seconds a request may take (queue included).")
    # serve --runtime: whether the runtime speculates (bundler.serve.runtimes.guard)
    runtime_speculation: str = described("auto", "With --runtime: auto measures at start-up whether the runtime's speculation "
                                                 "beats its plain decoding on this machine and serves the faster (remembered for "
                                                 "later starts); on: the signed speculation; off: the target alone. A bundle "
                                                 "whose signed settings turn the guard off speculates as signed.")
    runtime_probe_limit_s: float = described(120.0, "With --runtime-speculation auto: seconds each probe may take; a longer "
                                                    "one keeps the signed speculation.")
    limits: ServeLimits = field(default_factory=ServeLimits)
    load: LoadOptions = field(default_factory=LoadOptions)
    batch: BatchSettings = field(default_factory=BatchSettings)
