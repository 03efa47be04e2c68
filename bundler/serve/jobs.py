"""A request on its way through serve's decoding worker: the job the HTTP side queues, and its text as the
tokens come (stop strings, held-back pieces, time to first token, inter-token latency). Both workers, one
request at a time (bundler.serve.app) and batched (bundler.serve.batch_worker), use these."""

from __future__ import annotations

__all__ = ["Job", "JobStream"]

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Job:
    """One request as the worker sees it."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    time_limit_s: float
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.perf_counter)

    def emit(self, kind: str, value: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class JobStream:
    """A job's text as its tokens come: decoded, cut at a stop string, held back while a piece may begin
    one, with its time to first token and inter-token latencies observed. `on_tokens` returns True to stop."""

    def __init__(self, job: Job, tokenizer: Any, metrics: Any):  # metrics: bundler.serve.app.Metrics
        self.job, self.tokenizer, self.metrics = job, tokenizer, metrics
        self.tokens: list[int] = []
        self.shown, self.stopped, self.timed_out, self.last = 0, False, False, None
        self.deadline = job.enqueued + job.time_limit_s
        self.hold = max((len(s) for s in job.stop), default=1) - 1

    def on_tokens(self, new: list[int]) -> bool:
        job, now = self.job, time.perf_counter()
        if self.last is None:
            self.metrics.ttft.observe(now - job.enqueued)
        elif new:
            for _ in new:
                self.metrics.inter_token.observe((now - self.last) / len(new))
        self.last = now
        self.tokens.extend(new)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in job.stop) if i >= 0), default=-1)
        if cut >= 0:
            text, self.stopped = text[:cut], True
        if not text.endswith("\ufffd"):  # an incomplete UTF-8 character waits for its rest
            # A piece that may begin a stop string waits until it is known not to.
            safe = len(text) if self.stopped else max(len(text) - self.hold, self.shown)
            if safe > self.shown:
                job.emit("text", text[self.shown : safe])
                self.shown = safe
        if now > self.deadline:
            self.timed_out = True
        return self.stopped or self.timed_out or job.cancelled.is_set()
