"""`bundle serve`'s decoding worker where the pair's models decode in a batch (llama.cpp; torch models that run our
compact forward): continuous batching (runner.decoding.batching).

Requests wait in serve's bounded queue as before; the worker takes one in whenever a sequence id is free
(at the next step), runs one batched step for every active request, and lets each leave when it is done,
stopped, over its time limit or cancelled by its client (a cancelled request's cache cells are removed before
the next step; a finished one's stay as a prefix the next request with the same start reuses, as llama-server
does: a chat template's preamble, an earlier turn of the conversation).
Each request keeps its own draft state and guard (runner.decoding.batching); the server remembers, as `bundle run`
does across runs (runner.decoding.run_history), whether the draft paid in its recent requests, so that once it has
stopped paying requests decode plainly from their first token, with a rare exploring request. It starts from what
`bundle run` found for the bundle on this machine (the store's run history, read and never written): a draft that
does not pay a single stream pays a batch of them even less (each drafted token's share of a pass only grows), so
a server need not find it out again in its first requests; its own requests then decide, as they come.
Beside the cells finished requests leave in their ids, a prompt cache in host memory keeps copies of cells an id
is about to lose (runner.decoding.prompt_cache; `--prompt-cache`, as llama-server's `--cache-ram`). The batch's
KV caches and the prompt cache are sized under the memory left and the cgroup's limit (runner.checks.memory).
"""

from __future__ import annotations

__all__ = ["BatchWorker"]

import collections
import queue
from typing import Any

from core.errors import BundleError
from bundler.serve.jobs import Job, JobStream, Outbox
from bundler.serve.settings import BatchSettings
from bundler.serve.worker import Requests
from runner.checks.memory import size_serving
from runner.decoding.batching import BatchedGenerator, Sequence
from runner.decoding.run_history import RunHistory


BATCH_WINDOW = 64  # recent steps whose mean batch size the status page shows


class BatchWorker:
    """The batched decoding loop over serve's Requests (their queue, life cycle and metrics)."""

    def __init__(self, requests: Requests, batch: BatchSettings) -> None:
        pair = requests.pair
        sized = size_serving(pair.memory, pair.context_tokens, sequences=batch.sequences, prompt_cache=batch.prompt_cache,
                             budget=batch.memory_budget)
        self.requests, self.sized = requests, sized
        self.outbox = Outbox()  # the requests' events, handed to the event loop right before each pass
        try:
            self.generator = BatchedGenerator(
                pair.target, pair.draft if batch.speculate else None, sequences=sized.sequences, n_ctx_seq=pair.context_tokens,
                **{**pair.settings.loop_args(), **({} if batch.speculate else {"methods": ()})},  # --no-draft: plain
                eos_ids=pair.eos_ids, vocab_size=pair.vocab_size, cache_prompts=True,
                prompt_cache_bytes=sized.prompt_cache_bytes, before_pass=self.outbox.send,
            )
        except RuntimeError as exc:  # llama.cpp could not allocate the contexts
            raise BundleError("memory-budget", f"--sequences {sized.sequences}: {exc}") from None
        self.sequences = sized.sequences
        self.history = RunHistory.from_counts(batch.runs)  # no save: nothing is written
        self.live_jobs: dict[int, tuple[Job, JobStream, Sequence, bool]] = {}
        self.recent_batches: collections.deque[int] = collections.deque(maxlen=BATCH_WINDOW)
        requests.metrics.sequences.set(sized.sequences)

    def live(self) -> dict[str, Any]:
        """Figures for the status page (not the prompt cache's fill: only the metrics credential sees it, bundler.serve.metrics)."""
        recent = list(self.recent_batches)
        return {"active_sequences": len(self.live_jobs), "sequences": self.sequences,
                "batch_size": sum(recent) / len(recent) if recent else None,
                "prompt_cache_limit_bytes": self.sized.prompt_cache_bytes}

    def work(self) -> None:
        """Until serve stops the requests: admit, step, finish; then the active requests are finished."""
        generator, stopping = self.generator, False
        while True:
            stopping = self._take_in(stopping)
            for job, _, s, _ in list(self.live_jobs.values()):
                if job.cancelled.is_set():  # its client went away: its sequence leaves before the next step
                    generator.cancel(s)
                    self._finish(s.seq)
            if not generator.active():
                if stopping:
                    self.outbox.send()
                    return
                continue
            try:
                finished = generator.step()
            except Exception as exc:  # noqa: BLE001 - reported to each client as a 500, the worker goes on
                self._fail(exc)
                continue
            self.requests.progress.mark()
            for size in generator.batch_sizes:
                self.requests.metrics.batch_size.observe(size)
                self.recent_batches.append(size)
            generator.batch_sizes.clear()
            for s in finished:
                self._finish(s.seq)

    def _take_in(self, stopping: bool) -> bool:
        """Admits queued jobs while a sequence is free (waiting for one only when nothing decodes); returns
        whether the queue said stop."""
        while not stopping and self.generator.free():
            idle = not self.generator.active()
            if idle:  # no pass will come: what the requests have to hear goes now
                self.outbox.send()
            try:
                job = self.requests.take(block=idle)
            except queue.Empty:
                break
            if job is None:
                return True
            self._admit(job)
        return stopping

    def _admit(self, job: Job) -> None:
        requests, metrics = self.requests, self.requests.metrics
        seeded = job.seed is not None and job.temperature > 0.0
        advice = self.history.advice(seeded) if requests.pair.settings.guard else None
        job.outbox = self.outbox
        stream = requests.admit(job)
        s = self.generator.add(job.prompt_ids, job.max_tokens, temperature=job.temperature, top_p=job.top_p,
                               seed=job.seed, on_tokens=stream.on_tokens, start_plain=advice)
        metrics.cached_prompt.inc(s.cached)
        if self.generator.prompt_cache is not None:
            metrics.prompt_cache.set(self.generator.prompt_cache.size)
        self.live_jobs[s.seq] = (job, stream, s, advice is not None)
        if s.done:  # nothing to generate
            self._finish(s.seq)

    def _finish(self, seq: int) -> None:
        job, stream, s, advised = self.live_jobs.pop(seq)
        stats = s.stats.as_dict()
        positions = {"drafted": list(s.stats.drafted_at), "accepted": list(s.stats.accepted_at)}
        status = self.requests.finish(job, stream, s.tokens, stats, positions)
        if status != "cancelled":
            self.history.record(stats, advised=advised, seeded=job.seed is not None and job.temperature > 0.0)

    def _fail(self, exc: Exception) -> None:
        for job, _, s, _ in self.live_jobs.values():
            self.generator.cancel(s)
            self.requests.fail(job, exc)
        self.live_jobs.clear()
