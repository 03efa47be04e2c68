"""`bundle serve`: one verified, loaded pair behind an OpenAI-compatible HTTP API (FastAPI on uvicorn), with
Prometheus metrics (prometheus_client), a health state driven by the acceptance rate, and a status page.

One decoding worker thread owns the models (it loads them too, see _start_worker); requests wait in a bounded
FIFO queue. Where the pair's models can decode in a batch (llama.cpp; torch through our compact forward) the
worker decodes several requests at once (bundler.serve.batch_worker); otherwise (a torch model that runs through
transformers) one at a time. The HTTP side is asyncio: the worker hands text back to the request's event loop
with `call_soon_threadsafe`.
"""

from __future__ import annotations

__all__ = ["Engine", "serve_bundle"]

import asyncio
import collections
import hmac
import json
import queue
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from bundler.serve import openai_requests as serve_requests
from bundler.serve.guard import RequestGuard, ServeLimits, protocol_class
from bundler.serve.jobs import Job, JobStream
from bundler.serve.openai_requests import ApiError

# The context a served pair is sized for (memory preflight) and the longest generation a request may ask.
SERVE_MAX_NEW_TOKENS = 1024
SERVE_PROMPT_TOKENS = 3072
DEFAULT_MAX_TOKENS = 256  # when a request names no max_tokens
HEALTH_WINDOW = 16  # requests in the recent-acceptance window of /health
REQUEST_TIME_LIMIT_S = 300.0
STATIC = Path(__file__).with_name("static")
TEXT_MARK = "\x00text\x00"  # stands for a chunk's text while the rest of the chunk is encoded (no ref holds a NUL)
# specbundle_requests_total{status}: ok, stopped early by the client (cancelled), over the time limit (timeout),
# refused by a full queue (rejected), a bad request (invalid), a failure while generating (error).
STATUSES = ("ok", "cancelled", "timeout", "rejected", "invalid", "error")


class Metrics:
    """The metrics of CONTRACT.md section 4 in their own registry (so a test process can hold several)."""

    def __init__(self, info: Mapping[str, str]):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("specbundle_requests", "Requests answered, by outcome.", ["status"], registry=r)
        for status in STATUSES:
            self.requests.labels(status=status)
        self.generated = Counter("specbundle_generated_tokens", "Tokens generated.", registry=r)
        self.drafted = Counter("specbundle_draft_tokens", "Tokens the draft proposed.", registry=r)
        self.accepted = Counter("specbundle_accepted_tokens", "Drafted tokens the target accepted.", registry=r)
        self.acceptance = Gauge("specbundle_acceptance_rate", f"Accepted/drafted over the last {HEALTH_WINDOW} requests.", registry=r)
        self.fallbacks = Counter("specbundle_fallbacks", "Requests in which the guard fell back to plain decoding.", registry=r)
        self.queue_depth = Gauge("specbundle_queue_depth", "Requests waiting for the decoding worker.", registry=r)
        self.ttft = Histogram("specbundle_time_to_first_token_seconds", "From enqueue to the first token.", registry=r,
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.duration = Histogram("specbundle_request_duration_seconds", "From enqueue to the last token.", registry=r,
                                  buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
        self.inter_token = Histogram("specbundle_inter_token_latency_seconds", "Time per token after the first.", registry=r,
                                     buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
        self.position = Gauge("specbundle_position_acceptance_rate", "Acceptance at each draft position, since start.",
                              ["position"], registry=r)
        # continuous batching (bundler.serve.batch_worker)
        self.batch_size = Histogram("specbundle_batch_size", "Sequences in each batched target pass.", registry=r,
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32))
        self.active = Gauge("specbundle_active_sequences", "Requests being decoded now.", registry=r)
        self.sequences = Gauge("specbundle_sequences", "Requests that may be decoded at once.", registry=r)
        self.cached_prompt = Counter("specbundle_cached_prompt_tokens", "Prompt tokens an earlier request's cache cells "
                                     "held, not prefilled again.", registry=r)
        self.prompt_cache = Gauge("specbundle_prompt_cache_bytes", "Host memory the prompt cache's copies of cache cells take.",
                                  registry=r)
        self.queue_wait = Histogram("specbundle_queue_wait_seconds", "From enqueue to the start of decoding.", registry=r,
                                    buckets=(0.001, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.request_acceptance = Histogram("specbundle_request_acceptance_rate", "Accepted/drafted of each request that drafted.",
                                            registry=r, buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0))
        self.info = Gauge("specbundle_bundle_info", "What runs: always 1.", list(info), registry=r)
        self.info.labels(**info).set(1)


class Engine:
    """The loaded pair, the queue, the single decoding worker, the metrics and the health window."""

    def __init__(self, pair: Any, bundle: Mapping[str, Any], checks: list[str], max_queue: int,
                 time_limit_s: float = REQUEST_TIME_LIMIT_S, on_record: Callable[[dict, list[int], str], None] | None = None,
                 batching: Mapping[str, Any] | None = None):
        self.pair, self.bundle, self.checks = pair, dict(bundle), checks
        self.time_limit_s, self.on_record = time_limit_s, on_record
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.info = {
            "ref": str(bundle["ref"]), "digest": str(bundle["digest"]), "signer": str(bundle.get("signer") or ""),
            "tokenizer_fingerprint": pair.fingerprint, "engine": getattr(pair, "engine", "torch"), "dtype": pair.dtype,
        }
        self.metrics = Metrics(self.info)
        self.min_acceptance = pair.settings.min_acceptance
        self.window: collections.deque[tuple[int, int, bool]] = collections.deque(maxlen=HEALTH_WINDOW)
        self.positions: list[list[int]] = [[], []]  # drafted, accepted per position, summed
        self.busy = False
        self.totals = {"tokens": 0, "seconds": 0.0}
        self.recent_tps: collections.deque[float] = collections.deque(maxlen=HEALTH_WINDOW)
        self.lock = threading.Lock()
        self.loaded = True
        self.worker = threading.current_thread()  # the thread that built the engine runs work()
        self.batch = None  # continuous batching where the models have it (bundler.serve.batch_worker)
        from runner.decoding.batching import batchable  # here: it imports torch, which `bundle --help` never needs

        speculate = (batching or {}).get("speculate", True)  # False: the draft is never used, batchable or not
        if batchable(pair.target) and (pair.draft is None or not speculate or batchable(pair.draft)):
            from bundler.serve.batch_worker import BatchWorker

            self.batch = BatchWorker(self, **(batching or {}))

    # -- the worker ---------------------------------------------------------------------------------
    def work(self) -> None:
        """The decoding loop over the queue, until stop(); run by the thread that loaded the pair."""
        if self.batch is not None:
            return self.batch.work()
        while True:
            job = self.jobs.get()
            self.metrics.queue_depth.set(self.jobs.qsize())
            if job is None:
                return
            if job.cancelled.is_set():  # its client went away while it waited
                self.metrics.requests.labels(status="cancelled").inc()
                continue
            self.busy = True
            try:
                self._run(job)
            except Exception as exc:  # noqa: BLE001 - reported to the client as a 500, the worker goes on
                self.metrics.requests.labels(status="error").inc()
                job.emit("error", ApiError(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error"))
            finally:
                self.busy = False

    def _run(self, job: Job) -> None:
        from runner.run import generate

        stream = JobStream(job, self.pair.tokenizer, self.metrics)
        result = generate(self.pair, job.prompt_ids, max_new_tokens=job.max_tokens, temperature=job.temperature,
                          top_p=job.top_p, seed=job.seed, on_tokens=stream.on_tokens)
        self.finish(job, stream, result)

    def finish(self, job: Job, stream: "JobStream", result: dict) -> None:
        """A generation's end (result: runner.run.generate's): the rest of its text, its accounting, its record."""
        text = result["text"]
        cut = min((i for i in (text.find(s) for s in job.stop) if i >= 0), default=-1)
        if cut >= 0:
            text = text[:cut]
        if len(text) > stream.shown and not job.cancelled.is_set():
            job.emit("text", text[stream.shown :])
        stats = result["stats"]
        hit_eos = bool(result["tokens"]) and len(result["tokens"]) < job.max_tokens and not stream.timed_out \
            and not job.cancelled.is_set()
        finish = "stop" if stream.stopped or hit_eos else "length"
        status = "cancelled" if job.cancelled.is_set() else "timeout" if stream.timed_out else "ok"
        self._account(result, status, job)
        job.emit("done", {"text": text, "finish_reason": finish, "prompt_tokens": len(job.prompt_ids),
                          "completion_tokens": len(result["tokens"]), "stats": stats})
        if self.on_record is not None and status == "ok":
            self.on_record(stats, job.prompt_ids, text)

    def _account(self, result: dict, status: str, job: Job) -> None:
        m, stats = self.metrics, result["stats"]
        m.requests.labels(status=status).inc()
        m.generated.inc(len(result["tokens"]))
        m.drafted.inc(stats.get("drafted", 0))
        m.accepted.inc(stats.get("accepted", 0))
        m.duration.observe(time.perf_counter() - job.enqueued)
        if stats.get("drafted"):
            m.request_acceptance.observe(stats["accepted"] / stats["drafted"])
        fell_back = bool(stats.get("fallback"))
        if fell_back:
            m.fallbacks.inc()
        with self.lock:
            self.window.append((int(stats.get("drafted", 0)), int(stats.get("accepted", 0)), fell_back))
            rate = self.window_acceptance()
            m.acceptance.set(rate if rate is not None else 0.0)
            drafted, accepted = self.positions
            for i, (d, a) in enumerate(zip(result["positions"]["drafted"], result["positions"]["accepted"])):
                if i >= len(drafted):
                    drafted.append(0), accepted.append(0)
                drafted[i] += d
                accepted[i] += a
                m.position.labels(position=str(i + 1)).set(accepted[i] / drafted[i] if drafted[i] else 0.0)
            if stats.get("tokens_per_second"):
                self.recent_tps.append(float(stats["tokens_per_second"]))

    # -- what the HTTP side asks --------------------------------------------------------------------
    def window_acceptance(self) -> float | None:
        drafted = sum(d for d, _, _ in self.window)
        return sum(a for _, a, _ in self.window) / drafted if drafted else None

    def health(self) -> dict[str, Any]:
        """ok, or degraded with the reason (the output is still right, only slower)."""
        with self.lock:
            rate, window = self.window_acceptance(), list(self.window)
        status, reason = "ok", None
        fallbacks = sum(1 for *_, f in window if f)
        if rate is not None and rate < self.min_acceptance:
            status, reason = "degraded", f"acceptance {rate:.2f} over the last {len(window)} requests is below the bundle's min_acceptance {self.min_acceptance:.2f}"
        elif window and fallbacks * 2 > len(window):
            status, reason = "degraded", f"the guard fell back to plain decoding in {fallbacks} of the last {len(window)} requests"
        return {"status": status, "reason": reason, "acceptance_rate": rate,
                "bundle": {"ref": self.info["ref"], "digest": self.info["digest"]}}

    def submit(self, job: Job) -> None:
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            self.metrics.requests.labels(status="rejected").inc()
            raise ApiError(429, f"the queue is full ({self.jobs.maxsize} requests waiting); retry later",
                           "rate_limit_error", code="queue_full", headers={"Retry-After": "1"}) from None
        self.metrics.queue_depth.set(self.jobs.qsize())

    def stop(self, timeout: float = 30.0) -> None:
        self.jobs.put(None)
        if self.worker is not threading.current_thread():
            self.worker.join(timeout)

    def live(self) -> dict[str, Any]:
        """Figures for the status page."""
        with self.lock:
            rate = self.window_acceptance()
            tps = sum(self.recent_tps) / len(self.recent_tps) if self.recent_tps else None
        batch = self.batch.live() if self.batch is not None else {}
        return {"acceptance_rate": rate, "tokens_per_second": tps, "queue_depth": self.jobs.qsize(), "busy": self.busy,
                "health": self.health()["status"], **batch}


# -- the app ------------------------------------------------------------------------------------------
class Guard:
    """Pure ASGI middleware: the X-Bundle-Digest header on every response, and the API key check (compared in
    constant time, never logged). Pure ASGI rather than BaseHTTPMiddleware so streams and disconnects pass
    through untouched."""

    def __init__(self, app: Any, digest: str, api_key: str | None, open_paths: tuple[str, ...] = ()):
        self.app, self.digest, self.api_key, self.open_paths = app, digest.encode(), api_key, open_paths

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_digest(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-bundle-digest", self.digest)]
            await send(message)

        # The status page itself holds no data (it fetches it with the key), so it loads without one.
        if self.api_key is not None and scope["path"] not in ("/", "/favicon.ico", *self.open_paths) and not scope["path"].startswith("/static/"):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            expected = b"Bearer " + self.api_key.encode()
            if not hmac.compare_digest(given, expected):
                body = json.dumps(ApiError(401, "a valid API key is required (Authorization: Bearer <key>)",
                                           "authentication_error", code="invalid_api_key").body()).encode()
                await send_with_digest({"type": "http.response.start", "status": 401,
                                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
                await send_with_digest({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send_with_digest)


OPEN_PROBE_PATHS = ("/health", "/metrics")  # with open_probes: what Kubernetes probes and Prometheus scrapes read


def build_app(engine: Engine, api_key: str | None = None, limits: ServeLimits | None = None, open_probes: bool = False) -> Any:
    """The FastAPI app over a running Engine, behind the request guard (bundler.serve.guard); open_probes lets
    GET /health and /metrics answer without the API key."""
    app = FastAPI(title="specbundle", docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app, engine)
    _add_status_routes(app, engine)
    _add_completion_routes(app, engine)

    def refused(status: int) -> None:
        engine.metrics.requests.labels(status="invalid").inc()

    limits = limits or ServeLimits()
    return Guard(RequestGuard(app, limits, on_refused=refused), engine.info["digest"], api_key, OPEN_PROBE_PATHS if open_probes else ())


def _add_error_handlers(app: FastAPI, engine: Engine) -> None:
    """Every error answered in OpenAI's shape; a bad request counted as invalid."""

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, err: ApiError) -> JSONResponse:
        if err.status == 400:
            engine.metrics.requests.labels(status="invalid").inc()
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, err: HTTPException) -> JSONResponse:
        return JSONResponse(ApiError(err.status_code, str(err.detail), code=None).body(), status_code=err.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse(ApiError(400, f"invalid request: {err.errors()[:1]}").body(), status_code=400)


def _model_card(engine: Engine, created: int) -> dict[str, Any]:
    info = engine.info
    return {"id": info["ref"], "object": "model", "created": created, "owned_by": info["signer"] or "specbundle",
            "specbundle": {k: info[k] for k in ("digest", "signer", "tokenizer_fingerprint", "engine", "dtype")}}


def _add_status_routes(app: FastAPI, engine: Engine) -> None:
    """What the server says about itself: health, metrics, the model, the status page and its figures."""
    created = int(time.time())

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.loaded:
            return JSONResponse({"status": "loading", "reason": "the pair is loading", "acceptance_rate": None,
                                 "bundle": {"ref": engine.info["ref"], "digest": engine.info["digest"]}}, status_code=503)
        return JSONResponse(engine.health())

    @app.get("/metrics")
    async def metrics() -> Response:
        engine.metrics.queue_depth.set(engine.jobs.qsize())
        return Response(generate_latest(engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(engine, created)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != engine.info["ref"]:
            raise ApiError(404, f"no model {model_id!r} here; this server runs {engine.info['ref']}", code="model_not_found")
        return _model_card(engine, created)

    @app.get("/status.json")
    async def status() -> dict[str, Any]:
        return {"model": _model_card(engine, created), "checks": engine.checks, "live": engine.live(),
                "pairing": engine.pair.pairing, "device": engine.pair.device}

    @app.get("/")
    async def page() -> FileResponse:
        return FileResponse(STATIC / "status.html", media_type="text/html")


def _add_completion_routes(app: FastAPI, engine: Engine) -> None:
    """POST /v1/completions and /v1/chat/completions: a checked request handed to the worker, its answer back."""
    prompt_bytes = serve_requests.prompt_byte_limit(engine.pair.tokenizer, SERVE_PROMPT_TOKENS)

    def prepare(raw: bytes, chat: bool) -> tuple[serve_requests.CompletionRequest, list[int]]:
        """The checked request and its prompt ids (parsing, tokenizing, the chat template): run in a thread."""
        req = serve_requests.parse_request(serve_requests.parse_body(raw), chat=chat, max_new_tokens=SERVE_MAX_NEW_TOKENS,
                                           default_max_tokens=DEFAULT_MAX_TOKENS if chat else 16)
        serve_requests.check_prompt_bytes(req, prompt_bytes, SERVE_PROMPT_TOKENS)
        return req, serve_requests.prompt_ids(engine.pair, req, SERVE_PROMPT_TOKENS)

    async def answer(request: Request, chat: bool) -> Response:
        # Only reading the body (bounded by the request guard) happens on the event loop.
        req, prompt_ids = await run_in_threadpool(prepare, await request.body(), chat)
        return await _generate(engine, request, req, prompt_ids, chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(request, chat=True)


class _Answer:
    """The OpenAI shapes of one request's answer: its id, object type, model and creation time."""

    def __init__(self, model_id: str, chat: bool):
        self.chat, self.model_id, self.created = chat, model_id, int(time.time())
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.object = "chat.completion" if chat else "text_completion"

    def chunk(self, text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        """One streamed event (the chat's first one carries the role)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {"id": self.id, "object": self.object + ".chunk" if self.chat else self.object, "created": self.created,
                "model": self.model_id, "choices": [choice]}

    def whole(self, done: dict) -> dict[str, Any]:
        """The answer not streamed, from the worker's done event."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": done["text"]}, "logprobs": None,
                      "finish_reason": done["finish_reason"]}
        else:
            choice = {"index": 0, "text": done["text"], "logprobs": None, "finish_reason": done["finish_reason"]}
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model_id, "choices": [choice],
                "usage": _usage(done), "specbundle": {"stats": done["stats"]}}


def _usage(done: dict) -> dict[str, int]:
    return {"prompt_tokens": done["prompt_tokens"], "completion_tokens": done["completion_tokens"],
            "total_tokens": done["prompt_tokens"] + done["completion_tokens"]}


async def _generate(engine: Engine, request: Request, req: serve_requests.CompletionRequest, prompt_ids: list[int],
                    chat: bool) -> Response:
    """The request handed to the worker; its text streamed as it comes, or answered whole."""
    job = Job(prompt_ids, req.max_tokens, req.temperature, req.top_p, req.seed, req.stop, asyncio.get_running_loop(),
              asyncio.Queue(), engine.time_limit_s)
    engine.submit(job)
    answer = _Answer(engine.info["ref"], chat)
    if req.stream:
        return StreamingResponse(_events(job, answer, req.include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return JSONResponse(answer.whole(await _done(request, job)))


async def _events(job: Job, answer: _Answer, include_usage: bool) -> AsyncIterator[str]:
    """The server-sent events of a streamed answer, from the worker's events."""
    # Text chunks differ only in their text: the rest is encoded once, not at every token.
    head, _, tail = json.dumps(answer.chunk(TEXT_MARK, None)).partition(json.dumps(TEXT_MARK))
    try:
        if answer.chat:
            yield f"data: {json.dumps(answer.chunk(None, None, first=True))}\n\n"
        while True:
            kind, value = await job.events.get()
            texts = []
            while kind == "text":  # what came while the last chunk was sent goes in one chunk
                texts.append(value)
                if job.events.empty():
                    break
                kind, value = job.events.get_nowait()
            if texts:
                yield f"data: {head}{json.dumps(''.join(texts))}{tail}\n\n"
            if kind == "text":
                continue
            if kind == "error":
                yield f"data: {json.dumps(value.body())}\n\n"
                break
            else:
                yield f"data: {json.dumps(answer.chunk(None, value['finish_reason']))}\n\n"
                if include_usage:
                    yield f"data: {json.dumps({**answer.chunk(None, None), 'choices': [], 'usage': _usage(value)})}\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:  # the client went away (the task is cancelled) or the stream ended: stop generating
        job.cancelled.set()


async def _done(request: Request, job: Job) -> dict:
    """The worker's done event of an answer not streamed; its error raised. A client that goes away
    (http.disconnect) cancels the job all the same."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        while True:
            kind, value = await job.events.get()
            if kind == "error":
                raise value
            if kind == "done":
                return value
    finally:
        job.cancelled.set()
        watcher.cancel()


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """Sets job.cancelled when the client closes the connection (the body has been read: the next ASGI
    message is http.disconnect); the worker stops at its next token."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancelled.set()
            return


def verify_checks(report: Any) -> list[str]:
    """The names of the checks the VerifyReport (bundler.trust.verify) passed, for the status page."""
    return [check.name for check in report.checks if check.ok]


def _server_class() -> type:
    """uvicorn's server, with its signal capture changed in two ways. uvicorn re-raises the signal that stopped it
    once it has shut down (so the process dies of SIGTERM); `bundle serve` treats SIGTERM/SIGINT as the ordinary
    way to stop and exits 0, so nothing is re-raised. And uvicorn gives SIGTERM back its default action when it
    stops, before the drain (serve_bundle): a supervisor repeating its SIGTERM then killed the drain (exit -15,
    seen once in a fresh-clone run, the test sending one every 10 ms); SIGTERM goes straight from uvicorn's
    handler to ignored instead, with no moment of the default between. SIGKILL still ends it."""
    import contextlib

    import uvicorn
    from uvicorn.server import HANDLED_SIGNALS

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
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


def _start_worker(load: Callable[[], Any], engine_for: Callable[[Any, Mapping[str, Any], Any], Engine]) -> Engine:
    """Starts the decoding thread: it loads the pair (`load()`: loaded_bundle or loaded_dir), hands back the
    Engine over it, then decodes until Engine.stop(). A refusal while loading is raised here, in the caller.

    Why the thread that decodes also loads: the OpenMP pool torch's (libgomp's) first parallel op creates stays
    with the thread that made it, and once more OpenMP threads exist than cores libgomp throttles every pool's
    spin-wait. A worker decoding beside the loader's idle pool ran 0.61x `bundle run` on 2 cores
    (benchmarks/serve.py). The main thread only runs the event loop."""
    handoff: queue.Queue = queue.Queue()

    def own_the_models() -> None:
        try:
            with load() as (pair, info, report):
                engine = engine_for(pair, info, report)
                handoff.put(engine)
                engine.work()
        except BaseException as exc:  # noqa: BLE001 - a refusal while loading is raised again by the main thread
            handoff.put(exc)

    threading.Thread(target=own_the_models, name="specbundle-decoder", daemon=True).start()
    engine = handoff.get()
    if isinstance(engine, BaseException):
        raise engine
    return engine


def serve_bundle(
    store: Any, ref: Any, trusted: Mapping[str, Any], *, host: str = "127.0.0.1", port: int = 8000,
    api_key: str | None = None, max_queue: int = 16, time_limit_s: float = REQUEST_TIME_LIMIT_S,
    limits: ServeLimits | None = None, on_ready: Callable[[dict[str, Any]], None] | None = None, on_record: Callable[..., Any] | None = None,
    from_dir: Path | None = None, open_probes: bool = False, sequences: int | None = None, speculate: bool = True,
    prompt_cache: int | None = None, **options: Any,
) -> None:
    """Verify, gate, pair, preflight and load exactly as `bundle run` does (raising the same BundleError before
    the port is opened), then serve until SIGTERM/SIGINT; in-flight requests are finished (bounded) first.

    from_dir: a directory `bundle fetch` filled, served instead of `ref` from the store once its evidence and
    every file's hash hold (bundler.verbs.fromdir). sequences: requests decoded at once where the models can decode
    in a batch (default: as many KV caches as fit, at most 8); speculate False: the target alone there (a
    baseline for benchmarks/serve_load.py); prompt_cache: bytes of host memory for copies of cache cells there
    (bundler.serve.batch_worker; None: its default)."""
    import uvicorn

    from bundler.verbs.fromdir import loaded_dir
    from bundler.verbs.run import loaded_bundle, run_history

    context = (SERVE_PROMPT_TOKENS, SERVE_MAX_NEW_TOKENS)

    def load() -> Any:
        return loaded_dir(from_dir, trusted, context, **options) if from_dir else loaded_bundle(store, ref, trusted, context, **options)

    def engine_for(pair: Any, info: Mapping[str, Any], report: Any) -> Engine:
        checks = report if from_dir else verify_checks(report)
        # What `bundle run` found on this machine, read, never written (bundler.serve.batch_worker)
        runs = None if from_dir else run_history(store, info["digest"]).counts()
        return Engine(pair, info, checks, max_queue, time_limit_s, on_record=on_record(report, pair) if on_record else None,
                      batching={"sequences": sequences, "speculate": speculate, "memory_budget": options.get("memory_budget"),
                                "runs": runs, "prompt_cache": prompt_cache})

    engine = _start_worker(load, engine_for)
    limits = limits or ServeLimits(host=host)
    app = build_app(engine, api_key, limits, open_probes)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, http=protocol_class(limits),
                            timeout_graceful_shutdown=int(min(time_limit_s, 60)), lifespan="off")
    server = _server_class()(config)
    if on_ready:
        on_ready({**engine.info, "url": f"http://{host}:{port}"})
    try:
        server.run()  # handles SIGTERM/SIGINT: stops accepting, waits for open requests, returns
    finally:
        # Already stopping: SIGTERM is ignored from here (_server_class), so a supervisor repeating itself does
        # not kill the drain below. SIGKILL still ends it.
        engine.stop()  # the decoder finishes its loop and leaves loaded_bundle (the checkout is released)
