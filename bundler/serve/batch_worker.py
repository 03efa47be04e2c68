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
is about to lose (runner.decoding.prompt_cache; `--prompt-cache`, as llama-server's `--cache-ram`).
"""

from __future__ import annotations

__all__ = ["BatchWorker", "PROMPT_CACHE_MAX", "default_prompt_cache"]

import collections
import queue
import time
from typing import Any

from core.errors import BundleError
from bundler.serve.jobs import Job, JobStream, Outbox
from bundler.serve.openai_requests import ApiError
from runner.decoding.batching import BatchedGenerator, Sequence, default_sequences
from runner.checks.pairing import available_memory, cgroup_room, check_memory
from runner.decoding.run_history import RunHistory


BATCH_WINDOW = 64  # recent steps whose mean batch size the status page shows
PROMPT_CACHE_MAX = 8 << 30  # the prompt cache's default size at most (llama-server's --cache-ram default)


def default_prompt_cache(left: int, room: int | None) -> int:
    """The prompt cache's default size: half the memory left once the pair and its sequences' caches are
    counted (`left`; `room`: what the container's memory limit still allows besides those caches, None without
    a limit), at most PROMPT_CACHE_MAX. MemAvailable is the node's: a pod with a 1 GiB limit on a 64 GiB node
    would otherwise be given a cache of gigabytes, and killed when it filled."""
    return max(0, min(PROMPT_CACHE_MAX, left // 2, room // 2 if room is not None else left))


class BatchWorker:
    """The batched decoding loop of one serve Engine (its pair, queue and metrics)."""

    def __init__(self, engine: Any, sequences: int | None = None, speculate: bool = True,
                 memory_budget: int | None = None, runs: dict[str, int] | None = None, prompt_cache: int | None = None) -> None:
        """runs: the counts of the store's run history for this bundle on this machine (None: start afresh).
        prompt_cache: bytes of host memory for the prompt cache (0: none; None: default_prompt_cache)."""
        pair = engine.pair
        memory, kv = pair.memory, int(pair.memory["kv_cache_bytes"])  # kv: both models' caches of one sequence
        left = (memory_budget if memory_budget is not None else available_memory("cpu")) - int(memory["total_bytes"])
        if sequences is None:  # as many KV caches of the full context as fit beside what is loaded
            sequences = default_sequences(kv, left)
        else:  # the memory preflight, for the batch's caches beside the loaded pair's own
            check_memory({**memory, "kv_cache_bytes": kv * (1 + sequences), "total_bytes": int(memory["total_bytes"]) + kv * sequences,
                          "max_tokens": f"{sequences} x {pair.context_tokens}"}, memory_budget, "cpu")
        self.engine = engine
        self.outbox = Outbox()  # the requests' events, handed to the event loop right before each pass
        try:
            self.generator = BatchedGenerator(
                pair.target, pair.draft if speculate else None, sequences=sequences, n_ctx_seq=pair.context_tokens,
                **pair.settings.loop_args(), eos_ids=pair.eos_ids, vocab_size=pair.vocab_size, cache_prompts=True,
                prompt_cache_bytes=self._cache_bytes(prompt_cache, left - kv * sequences, kv * sequences),
                before_pass=self.outbox.send,
            )
        except RuntimeError as exc:  # llama.cpp could not allocate the contexts
            raise BundleError("memory-budget", f"--sequences {sequences}: {exc}") from None
        self.sequences = sequences
        self.history = RunHistory.from_counts(runs)  # no save: nothing is written
        self.live_jobs: dict[int, tuple[Job, JobStream, Sequence, bool]] = {}
        self.recent_batches: collections.deque[int] = collections.deque(maxlen=BATCH_WINDOW)
        engine.metrics.sequences.set(sequences)

    @staticmethod
    def _cache_bytes(asked: int | None, left: int, kv_caches: int) -> int:
        """--prompt-cache as given, else its default (the batch's KV caches counted against the cgroup's room
        too: they are allocated, not yet written)."""
        if asked is not None:
            return asked
        room = cgroup_room()
        return default_prompt_cache(left, room - kv_caches if room is not None else None)

    def live(self) -> dict[str, Any]:
        """Figures for the status page."""
        recent = list(self.recent_batches)
        cache = self.generator.prompt_cache
        return {"active_sequences": len(self.live_jobs), "sequences": self.sequences,
                "batch_size": sum(recent) / len(recent) if recent else None,
                "prompt_cache_bytes": cache.size if cache else 0}

    def work(self) -> None:
        """Until serve puts None in the queue: admit, step, finish; then the active requests are finished."""
        engine, generator, metrics = self.engine, self.generator, self.engine.metrics
        stopping = False
        while True:
            while not stopping and generator.free():
                idle = not generator.active()
                if idle:  # no pass will come: what the requests have to hear goes now
                    self.outbox.send()
                try:  # wait for work only when nothing is being decoded
                    job = engine.jobs.get(block=idle)
                except queue.Empty:
                    break
                metrics.queue_depth.set(engine.jobs.qsize())
                if job is None:
                    stopping = True
                elif job.cancelled.is_set():  # its client went away while it waited
                    metrics.requests.labels(status="cancelled").inc()
                else:
                    self._admit(job)
            for seq, (job, stream, s, _) in list(self.live_jobs.items()):
                if job.cancelled.is_set():  # its client went away: its sequence leaves before the next step
                    generator.cancel(s)
                    self._finish(seq)
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
            for size in generator.batch_sizes:
                metrics.batch_size.observe(size)
                self.recent_batches.append(size)
            generator.batch_sizes.clear()
            for s in finished:
                self._finish(s.seq)
            metrics.active.set(len(self.live_jobs))

    def _admit(self, job: Job) -> None:

        engine = self.engine
        engine.metrics.queue_wait.observe(time.perf_counter() - job.enqueued)
        seeded = job.seed is not None and job.temperature > 0.0
        advice = self.history.advice(seeded) if engine.pair.settings.guard else None
        job.outbox = self.outbox
        stream = JobStream(job, engine.pair.tokenizer, engine.metrics)
        s = self.generator.add(job.prompt_ids, job.max_tokens, temperature=job.temperature, top_p=job.top_p,
                               seed=job.seed, on_tokens=stream.on_tokens, start_plain=advice)
        engine.metrics.cached_prompt.inc(s.cached)
        if self.generator.prompt_cache is not None:
            engine.metrics.prompt_cache.set(self.generator.prompt_cache.size)
        self.live_jobs[s.seq] = (job, stream, s, advice is not None)
        engine.busy = True
        engine.metrics.active.set(len(self.live_jobs))
        if s.done:  # nothing to generate
            self._finish(s.seq)

    def _finish(self, seq: int) -> None:
        job, stream, s, advised = self.live_jobs.pop(seq)
        stats = s.stats.as_dict()
        result = {"text": self.engine.pair.tokenizer.decode(s.tokens, skip_special_tokens=True), "tokens": s.tokens,
                  "stats": stats, "positions": {"drafted": list(s.stats.drafted_at), "accepted": list(s.stats.accepted_at)}}
        finished = not job.cancelled.is_set()  # read before `done` is sent: the client's side then sets it
        try:
            self.engine.finish(job, stream, result)
        finally:
            if finished:
                self.history.record(stats, advised=advised, seeded=job.seed is not None and job.temperature > 0.0)
            self.engine.busy = bool(self.live_jobs)
            self.engine.metrics.active.set(len(self.live_jobs))

    def _fail(self, exc: Exception) -> None:
        for job, _, s, _ in self.live_jobs.values():
            self.generator.cancel(s)
            self.engine.metrics.requests.labels(status="error").inc()
            job.emit("error", ApiError(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error"))
        self.live_jobs.clear()
        self.engine.busy = False
        self.engine.metrics.active.set(0)
