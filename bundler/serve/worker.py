"""`bundle serve`'s decoding worker: one request life cycle (`Requests`: the bounded queue, admit, finish,
fail), and the loop that drives it one request at a time (`SerialWorker`) where the pair's models cannot
decode in a batch; bundler.serve.batch_worker drives the same life cycle in a batch.

The HTTP side only submits jobs and reads figures; the worker thread owns the pair. Neither worker holds a
reference back to the server: each gets the `Requests` it serves.
"""

from __future__ import annotations

__all__ = ["OnRecord", "Requests", "SerialWorker", "Worker"]

import queue
import time
from typing import Any, Callable, Mapping, Protocol

from bundler.serve.api_error import ApiError
from bundler.serve.jobs import Job, JobStream, Progress
from bundler.serve.metrics import HealthWindow, Metrics
from runner.pair import LoadedPair

# A finished request's stats, prompt ids, text, and its output ids and settings (a run record's replay entry).
OnRecord = Callable[[dict, list[int], str, dict], None]


class Requests:
    """The life of each request: queued (submit; 429 when full), taken by the worker (skipped if its client
    went away meanwhile), admitted (its stream), then finished (its text, counts, health, record) or failed
    (a 500). It also keeps when the worker last made progress, which liveness reads."""

    def __init__(self, pair: LoadedPair, metrics: Metrics, max_queue: int, on_record: OnRecord | None = None) -> None:
        self.pair, self.metrics, self.on_record = pair, metrics, on_record
        self.health = HealthWindow(pair.settings.min_acceptance, metrics.acceptance, metrics.acceptance_rate)
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.progress = Progress()
        self.active = 0  # requests admitted and not yet finished

    # -- the HTTP side ------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queues a job, or refuses it with a 429 when the queue is full."""
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            self.metrics.requests.labels(status="rejected").inc()
            raise ApiError(429, f"the queue is full ({self.jobs.maxsize} requests waiting); retry later",
                           "rate_limit_error", code="queue_full", headers={"Retry-After": "1"}) from None
        waiting = self.jobs.qsize()
        if waiting == 1 and self.active == 0:  # the worker was idle: the stall clock starts with this work
            self.progress.mark()
        self.metrics.queue_depth.set(waiting)

    def stalled(self, limit_s: float) -> bool:
        """Whether work waits (admitted or queued) while the worker has not moved for `limit_s` seconds."""
        return (self.active > 0 or self.jobs.qsize() > 0) and self.progress.idle_for() > limit_s

    def stop(self) -> None:
        """Asks the worker to finish what it holds and return."""
        self.jobs.put(None)

    # -- the worker side ----------------------------------------------------------------------------
    def take(self, block: bool = True) -> Job | None:
        """The next job (None: stop); queue.Empty when not blocking and none waits. A job whose client went
        away while it waited is counted as cancelled and skipped."""
        while True:
            job = self.jobs.get(block=block)
            self.metrics.queue_depth.set(self.jobs.qsize())
            self.progress.mark()
            if job is None or not job.cancelled.is_set():
                return job
            self.metrics.requests.labels(status="cancelled").inc()

    def admit(self, job: Job) -> JobStream:
        """A job starts decoding: its stream (text, stop strings, finish reason)."""
        self.metrics.queue_wait.observe(time.perf_counter() - job.enqueued)
        self.active += 1
        self.metrics.active.set(self.active)
        return JobStream(job, self.pair.tokenizer, self.pair.eos_ids, self.metrics, self.progress)

    def finish(self, job: Job, stream: JobStream, tokens: list[int], stats: dict, positions: Mapping[str, list[int]]) -> str:
        """A generation's end: the rest of its text and the done event, its counts and health, its run record.
        Returns its status (ok, cancelled, timeout)."""
        text = stream.close()
        status = "cancelled" if job.cancelled.is_set() else "timeout" if stream.timed_out else "ok"
        self.metrics.count_request(status, len(job.prompt_ids), len(tokens), stats, positions)
        self.metrics.duration.observe(time.perf_counter() - job.enqueued)
        self.health.record(stats)
        self._leave()
        job.emit("done", {"text": text, "finish_reason": stream.finish_reason, "prompt_tokens": len(job.prompt_ids),
                          "completion_tokens": len(tokens), "stats": stats})
        if self.on_record is not None and status == "ok":
            self.on_record(stats, job.prompt_ids, text, {"tokens": list(tokens), "max_tokens": job.max_tokens, "temperature": job.temperature,
                                                         "top_p": job.top_p, "seed": job.seed, "chat": job.chat})
        return status

    def fail(self, job: Job, exc: Exception) -> None:
        """A generation that raised: a 500 to its client; the worker goes on."""
        self.metrics.requests.labels(status="error").inc()
        self._leave()
        job.emit("error", ApiError(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error"))

    def _leave(self) -> None:
        self.active = max(self.active - 1, 0)
        self.metrics.active.set(self.active)
        self.progress.mark()


class Worker(Protocol):
    """A decoding loop over Requests: `work` until stopped, `live` figures for the status page."""

    def work(self) -> None: ...

    def live(self) -> dict[str, Any]: ...


class SerialWorker:
    """One request at a time, through runner.run.generate (a torch model that runs through transformers)."""

    def __init__(self, requests: Requests) -> None:
        self.requests = requests

    def live(self) -> dict[str, Any]:
        return {}

    def work(self) -> None:
        """The decoding loop over the queue, until Requests.stop()."""
        from runner.run import generate  # torch: imported by the thread that loaded the pair

        requests, pair = self.requests, self.requests.pair
        while (job := requests.take()) is not None:
            stream = requests.admit(job)
            try:
                result = generate(pair, job.prompt_ids, max_new_tokens=job.max_tokens, temperature=job.temperature,
                                  top_p=job.top_p, seed=job.seed, on_tokens=stream.on_tokens)
                requests.finish(job, stream, result["tokens"], result["stats"], result["positions"])
            except Exception as exc:  # noqa: BLE001 - reported to the client as a 500, the worker goes on
                requests.fail(job, exc)

