"""A request on its way through serve's decoding worker: the job the HTTP side queues, and its text as the
tokens come (stop strings, held-back pieces, time to first token, inter-token latency). Both workers, one
request at a time and batched (bundler.serve.worker, bundler.serve.batch_worker), use these."""

from __future__ import annotations

__all__ = ["Job", "JobStream", "Outbox", "Progress"]

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bundler.serve.metrics import Metrics


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
    outbox: "Outbox | None" = None  # set by the batched worker: events wait there for its next pass
    chat: bool = False  # a chat completion (its prompt through the chat template): what a run record's entry says

    def emit(self, kind: str, value: Any) -> None:
        if self.outbox is not None:
            self.outbox.put(self, kind, value)
        else:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Outbox:
    """Jobs' events the batched worker holds and hands to the event loop all at once (`send`), right before its
    next pass (runner.decoding.batching's `before_pass`) or before it waits for work.

    Why: waking the event loop wakes a thread that wants the GIL at once; the worker, still in the step's Python
    (the other sequences' tokens, the guard, the next step's rows), then waited for it to finish its own share of
    Python. Woken just before a pass, the loop has the GIL while llama.cpp (or torch) computes without it (the figure:
    docs/benchmarks.md). One wake-up per step also serves all the step's requests instead of one each."""

    def __init__(self) -> None:
        self.pending: list[tuple[Job, str, Any]] = []

    def put(self, job: Job, kind: str, value: Any) -> None:
        self.pending.append((job, kind, value))

    def send(self) -> None:
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, tuple[str, Any]]]] = {}
        for job, kind, value in pending:
            by_loop.setdefault(job.loop, []).append((job.events, (kind, value)))
        for loop, events in by_loop.items():
            loop.call_soon_threadsafe(_deliver, events)


def _deliver(events: list[tuple[asyncio.Queue, tuple[str, Any]]]) -> None:
    for queue, event in events:
        queue.put_nowait(event)


class Progress:
    """When the decoding worker last moved (a step, a token, a request in or out): what liveness reads."""

    def __init__(self) -> None:
        self.at = time.monotonic()

    def mark(self) -> None:
        self.at = time.monotonic()

    def idle_for(self) -> float:
        return time.monotonic() - self.at


class JobStream:
    """A job's text as its tokens come: decoded, cut at a stop string, held back while a piece may begin
    one, with its time to first token and inter-token latencies observed; `on_tokens` returns True to stop.
    It sees every token, so it is what reports how the generation ended (`finish_reason`, `text`)."""

    def __init__(self, job: Job, tokenizer: Any, eos_ids: set[int], metrics: Metrics, progress: Progress):
        self.job, self.tokenizer, self.eos_ids, self.metrics, self.progress = job, tokenizer, eos_ids, metrics, progress
        self.tokens: list[int] = []
        self.text = ""  # the text so far, cut at a stop string
        self.shown, self.stopped, self.hit_eos, self.timed_out, self.last = 0, False, False, False, None
        self.deadline = job.enqueued + job.time_limit_s
        self.hold = max((len(s) for s in job.stop), default=1) - 1

    @property
    def finish_reason(self) -> str:
        """OpenAI's: "stop" at a stop string or the end-of-sequence token, else "length"."""
        return "stop" if self.stopped or self.hit_eos else "length"

    def on_tokens(self, new: list[int]) -> bool:
        job, now = self.job, time.perf_counter()
        self.progress.mark()
        if self.last is None:
            self.metrics.ttft.observe(now - job.enqueued)
        elif new:
            for _ in new:
                self.metrics.inter_token.observe((now - self.last) / len(new))
        self.last = now
        self.tokens.extend(new)
        self.hit_eos = self.hit_eos or bool(new and new[-1] in self.eos_ids)  # the generator stops after it
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in job.stop) if i >= 0), default=-1)
        if cut >= 0:
            text, self.stopped = text[:cut], True
        self.text = text
        if not text.endswith("\ufffd"):  # an incomplete UTF-8 character waits for its rest
            # A piece that may begin a stop string waits until it is known not to.
            safe = len(text) if self.stopped else max(len(text) - self.hold, self.shown)
            if safe > self.shown:
                job.emit("text", text[self.shown : safe])
                self.shown = safe
        if now > self.deadline:
            self.timed_out = True
        return self.stopped or self.timed_out or job.cancelled.is_set()

    def close(self) -> str:
        """The whole text; what was held back goes to the client now (unless it went away)."""
        if len(self.text) > self.shown and not self.job.cancelled.is_set():
            self.job.emit("text", self.text[self.shown :])
            self.shown = len(self.text)
        return self.text
