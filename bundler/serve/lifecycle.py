"""The served model's life: loading (the port is open, /health answers 503), ready (the pair loaded, its requests
and worker), failed (a refusal while loading, raised again by serve_bundle), stopping. And the probes that read
it: readiness (/health) and liveness (/livez: the decoding worker moves whenever work waits)."""

from __future__ import annotations

__all__ = ["Ready", "Serving"]

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bundler.serve.metrics import Metrics, dtype_name
from bundler.serve.settings import ServeSettings
from bundler.serve.sources import Loaded
from bundler.serve.worker import Requests, Worker


@dataclass
class Ready:
    """A loaded pair being served: what the routes read once loading is done."""

    loaded: Loaded
    requests: Requests
    worker: Worker
    metrics: Metrics
    info: dict[str, str]  # ref, digest, signer, tokenizer_fingerprint, engine, dtype (specbundle_bundle_info's labels)
    prompt_bytes: int | None = None  # bytes past which a prompt is refused untokenized (runner.checks.context_window.prompt_byte_limit)
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def describe(cls, loaded: Loaded) -> dict[str, str]:
        """The labels of specbundle_bundle_info and the model card's `specbundle` fields."""
        pair, bundle = loaded.pair, loaded.info
        return {"ref": str(bundle["ref"]), "digest": str(bundle["digest"]), "signer": str(bundle.get("signer") or ""),
                "tokenizer_fingerprint": pair.fingerprint, "engine": pair.engine, "dtype": dtype_name(pair.dtype)}


class Serving:
    """The server's state, shared by the HTTP side (which reads it) and the decoding thread (which sets it)."""

    def __init__(self, settings: ServeSettings, name: str) -> None:
        self.settings, self.name = settings, name
        self.ready: Ready | None = None
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None  # the decoding thread (it loads, then works)

    def model_names(self) -> list[str]:
        """The names the model answers to: its reference, and the served name when one is given."""
        assert self.ready is not None
        extra = self.settings.served_model_name
        return [self.ready.info["ref"], *([extra] if extra and extra != self.ready.info["ref"] else [])]

    def readiness(self) -> tuple[int, dict[str, Any]]:
        """/health: 503 while loading (or after a refusal), else 200 with ok or degraded and the reason."""
        ready = self.ready
        if ready is None:
            status, reason = ("failed", f"loading failed: {self.error}") if self.error else ("loading", "the pair is loading")
            return 503, {"status": status, "reason": reason, "acceptance_rate": None, "bundle": {"ref": self.name, "digest": None}}
        status, reason, rate = ready.requests.health.judge()
        return 200, {"status": status, "reason": reason, "acceptance_rate": rate,
                     "bundle": {"ref": ready.info["ref"], "digest": ready.info["digest"]}}

    def liveness(self) -> tuple[int, dict[str, Any]]:
        """/livez: 503 when the decoding worker has not moved for a request's time limit while work waits, or
        its thread is gone; 200 otherwise (loading included: a long load is not a dead process)."""
        ready, limit = self.ready, self.settings.time_limit_s
        if ready is not None and not self.stopping.is_set():
            if self.thread is not None and not self.thread.is_alive():
                return 503, {"status": "dead", "reason": "the decoding worker has stopped"}
            if ready.requests.stalled(limit):
                idle = ready.requests.progress.idle_for()
                return 503, {"status": "stalled", "reason": f"the decoding worker has not moved for {idle:.0f} s while "
                                                            f"work waits (limit {limit:g} s)"}
        return 200, {"status": "alive", "reason": None}

    def live(self) -> dict[str, Any]:
        """The status page's figures."""
        assert self.ready is not None
        requests = self.ready.requests
        return {"acceptance_rate": requests.health.acceptance(), "tokens_per_second": requests.health.tokens_per_second(),
                "queue_depth": requests.jobs.qsize(), "busy": requests.active > 0, "health": requests.health.judge()[0],
                "threads": self.ready.loaded.pair.engine_fields().get("threads"), **self.ready.worker.live()}
