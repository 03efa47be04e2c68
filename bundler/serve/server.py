"""`bundle serve` from start to stop: the port opens at once (/health answers 503 while the pair loads), the
decoding thread loads the pair and then decodes, SIGTERM/SIGINT drain the open requests, and a refusal while
loading stops the server and is raised to the caller (the CLI's exit code)."""

from __future__ import annotations

__all__ = ["DRAIN_LIMIT_S", "serve_bundle", "server_class"]

import contextlib
import dataclasses
import signal
import threading
from typing import Any, Callable, Iterator, Mapping

from bundler.serve import openai_requests
from bundler.serve.app import SERVE_MAX_NEW_TOKENS, SERVE_PROMPT_TOKENS, build_app
from bundler.serve.lifecycle import Ready, Serving
from bundler.serve.metrics import Metrics
from bundler.serve.request_guard import protocol_class
from bundler.serve.settings import BatchSettings, ServeSettings
from bundler.serve.sources import Loaded, Source
from bundler.serve.worker import OnRecord, Requests, SerialWorker, Worker
from bundler.trust.verify_report import VerifyReport
from runner.checks.context_window import prompt_byte_limit
from runner.pair import LoadedPair

DRAIN_LIMIT_S = 60  # open requests finish within this after SIGTERM
LOADER_JOIN_S = 30.0  # how long stopping waits for the decoding thread

OnReady = Callable[[dict[str, Any]], None]
RecordFactory = Callable[[VerifyReport, LoadedPair], OnRecord]


def _server_class() -> type:
    """uvicorn's server, with its signal capture changed in two ways. uvicorn re-raises the signal that stopped it
    once it has shut down (so the process dies of SIGTERM); `bundle serve` treats SIGTERM/SIGINT as the ordinary
    way to stop and exits 0, so nothing is re-raised. And uvicorn gives SIGTERM back its default action when it
    stops, before the drain: a supervisor repeating its SIGTERM then killed the drain; SIGTERM goes straight from
    uvicorn's handler to ignored instead, with no moment of the default between. SIGKILL still ends it."""
    import uvicorn
    from uvicorn.server import HANDLED_SIGNALS

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
                yield
                return
            originals = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in originals.items():
                    signal.signal(sig, signal.SIG_IGN if sig == signal.SIGTERM else handler)

    return Server


def server_class() -> type:
    """uvicorn's server with `bundle serve`'s signal handling (SIGTERM drains, then exits 0): the front door
    before a third-party runtime stops the same way (bundler.serve.runtimes.server)."""
    return _server_class()


def make_worker(requests: Requests, batch: BatchSettings) -> Worker:
    """The batched worker where the pair's models decode in a batch (llama.cpp; torch through our compact
    forward), else the serial one."""
    from runner.decoding.batching import batchable  # here: it imports torch, which `bundle --help` never needs

    pair = requests.pair
    if batchable(pair.target) and (pair.draft is None or not batch.speculate or batchable(pair.draft)):
        from bundler.serve.batch_worker import BatchWorker

        return BatchWorker(requests, batch)
    return SerialWorker(requests)


def _ready(serving: Serving, loaded: Loaded, on_record: RecordFactory | None) -> Ready:
    """The loaded pair's requests, worker (its batch sized here) and metrics."""
    settings = serving.settings
    info = Ready.describe(loaded)
    metrics = Metrics(info)
    record = on_record(loaded.report, loaded.pair) if on_record is not None and loaded.report is not None else None
    requests = Requests(loaded.pair, metrics, settings.max_queue, on_record=record)
    batch = dataclasses.replace(settings.batch, memory_budget=settings.load.memory_budget, runs=loaded.runs)
    worker = make_worker(requests, batch)
    prompt_bytes = prompt_byte_limit(loaded.pair.tokenizer, openai_requests.prompt_token_limit(loaded.pair, SERVE_PROMPT_TOKENS))
    return Ready(loaded, requests, worker, metrics, info, prompt_bytes=prompt_bytes)


def _decoding_thread(serving: Serving, source: Source, trusted: Mapping[str, Any], on_ready: Callable[[Ready], None],
                     on_error: Callable[[], None], on_record: RecordFactory | None) -> threading.Thread:
    """The thread that loads the pair, then decodes with it until stopped.

    Why the thread that decodes also loads: the OpenMP pool torch's (libgomp's) first parallel op creates stays
    with the thread that made it, and once more OpenMP threads exist than cores libgomp throttles every pool's
    spin-wait; a worker decoding beside the loader's idle pool ran far slower. The main thread runs the event loop."""

    def own_the_models() -> None:
        try:
            with source.load(trusted, (SERVE_PROMPT_TOKENS, SERVE_MAX_NEW_TOKENS), serving.settings.load) as loaded:
                if serving.stopping.is_set():
                    return
                ready = _ready(serving, loaded, on_record)
                serving.ready = ready
                if serving.stopping.is_set():  # stopped while the batch was sized: nothing more comes
                    ready.requests.stop()
                on_ready(ready)
                ready.worker.work()
        except BaseException as exc:  # noqa: BLE001 - a refusal while loading is raised again by the main thread
            if serving.ready is None:
                serving.error = exc
                on_error()
            else:
                raise

    thread = threading.Thread(target=own_the_models, name="specbundle-decoder", daemon=True)
    serving.thread = thread
    return thread


def serve_bundle(source: Source, trusted: Mapping[str, Any], settings: ServeSettings, *, on_ready: OnReady | None = None,
                 on_record: RecordFactory | None = None) -> None:
    """Open the port, then verify, gate, pair, preflight and load exactly as `bundle run` does (a refusal stops
    the server and is raised here, the same BundleError), then serve until SIGTERM/SIGINT; in-flight requests
    are finished (bounded) first. on_record: a run record's hook for the loaded pair (store bundles only)."""
    import uvicorn

    serving = Serving(settings, source.name())
    app = build_app(serving)
    # asyncio's loop, not uvloop (a dependency for serve --runtime's front door): here uvloop saved under 5% of the
    # loop's CPU a token and nothing in tokens/s (docs/serving.md), so the loop every test of this server ran on stays.
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                            http=protocol_class(settings.limits), lifespan="off", loop="asyncio",
                            timeout_graceful_shutdown=int(min(settings.time_limit_s, DRAIN_LIMIT_S)))
    server = _server_class()(config)
    url = f"http://{settings.host}:{settings.port}"

    def ready(r: Ready) -> None:
        if on_ready:
            on_ready({**r.info, "url": url})

    def failed() -> None:
        server.should_exit = True

    thread = _decoding_thread(serving, source, trusted, ready, failed, on_record)
    thread.start()
    try:
        server.run()  # handles SIGTERM/SIGINT: stops accepting, waits for open requests, returns
    finally:
        # Already stopping: SIGTERM is ignored from here (_server_class), so a supervisor repeating itself does
        # not kill the drain below. SIGKILL still ends it.
        serving.stopping.set()
        if serving.ready is not None:
            serving.ready.requests.stop()  # the decoder finishes its loop and leaves the load (the checkout is released)
        if thread is not threading.current_thread():
            thread.join(LOADER_JOIN_S)
    if serving.error is not None:
        raise serving.error

