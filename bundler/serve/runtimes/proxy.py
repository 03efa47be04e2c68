"""specbundle's front door before a third-party runtime: the same guard as `bundle serve` (the API key and
X-Bundle-Digest, bundler.serve.api_key; Host, Origin, Content-Type and the body bound, bundler.serve.request_guard),
our probes and model card, then every other /v1 (and /openai/v1) request passed to the runtime on 127.0.0.1
through one pool of async HTTP connections, its answer streamed back as it comes, chunk by chunk, never
buffered. The pool is aiohttp's, not httpx's: on a 2-core machine the front door's CPU is taken from the runtime,
and httpx spent about half of the relay's time per streamed token in its pure-Python HTTP parser and a timeout
scope per read (py-spy, governed llama-server at 1 client); aiohttp parses in C and re-arms one timer per read.
The runtime is given a key of its own that only this process knows, so a local user who finds its port cannot go
around the front door. A full queue answers 429, the runtime unreachable 502, as OpenAI errors."""

from __future__ import annotations

__all__ = ["Governed", "build_proxy"]

import asyncio
import json
import secrets
import threading
import time
from typing import Any, AsyncIterator, Callable

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, Gauge
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from bundler.serve.api_error import ApiError
from bundler.serve.api_key import METRICS_AUTHENTICATED, OPEN_PROBE_PATHS, ApiKeyMiddleware
from bundler.serve.metrics import Metrics
from bundler.serve.request_guard import RequestGuard
from bundler.serve.runtimes.counters import Mirror
from bundler.serve.settings import ServeSettings

HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"te", b"trailer", b"upgrade",
              b"proxy-authenticate", b"proxy-authorization", b"server", b"date"}
USAGE_BYTES = 1 << 20  # of an answer kept to read its `usage` (the whole answer still streams)
SCRAPE_TIMEOUT_S = 5.0


class Governed:
    """The front door's state, shared by the HTTP side (which reads it) and the supervising thread (which sets it)."""

    def __init__(self, settings: ServeSettings, name: str, runtime: str, sequences: int) -> None:
        self.settings, self.name, self.runtime, self.sequences = settings, name, runtime, sequences
        self.upstream_key = secrets.token_urlsafe(32)  # the runtime's own key: only the front door holds it
        self.upstream: str | None = None  # http://127.0.0.1:PORT once the runtime answers
        self.info: dict[str, str] | None = None  # specbundle_bundle_info's labels
        self.metrics: Metrics | None = None
        self.mirror: Mirror | None = None
        self.shown: dict[str, Any] = {}  # the translation (bundler.serve.runtimes.flags.Launch.shown)
        self.checks: list[str] = []
        self.min_acceptance = 0.0
        self.metrics_path: str | None = None
        self.on_request: Callable[[dict[str, Any]], None] | None = None  # the run record's per-request hook
        self.error: BaseException | None = None
        self.dead: str | None = None  # why the runtime is gone (health fails from the moment it is seen)
        self.stopping = threading.Event()
        self.inflight = 0
        self.pid: int | None = None  # the runtime's process
        self.loading = f"the bundle is checked and the runtime {runtime} starts"  # /health's reason until ready
        self.client: aiohttp.ClientSession | None = None

    def become_ready(self, upstream: str, info: dict[str, str], shown: dict[str, Any], metrics_path: str | None) -> None:
        self.metrics = Metrics(info)
        runtime_info = Gauge("specbundle_runtime_info", "The runtime behind the front door: always 1.",
                             ["runtime", "version", "speculation"], registry=self.metrics.registry)
        runtime_info.labels(runtime=self.runtime, version=str(shown.get("version")),
                            speculation=str(shown.get("speculation", {}).get("method"))).set(1)
        self.metrics.sequences.set(self.sequences)
        self.mirror = Mirror(self.runtime, self.metrics)
        self.shown, self.metrics_path, self.info = shown, metrics_path, info
        self.upstream = upstream  # last: the routes read it as "ready"

    def readiness(self) -> tuple[int, dict[str, Any]]:
        """/health: 503 while the bundle is checked and the runtime loads, and from the moment the runtime is
        gone; else ok, or degraded while the runtime's acceptance is below the bundle's min_acceptance."""
        ref = self.info["ref"] if self.info else self.name
        digest = self.info["digest"] if self.info else None
        if self.dead or self.error is not None:
            reason = self.dead or f"loading failed: {self.error}"
            return 503, {"status": "failed", "reason": reason, "acceptance_rate": None, "bundle": {"ref": ref, "digest": digest}}
        if self.upstream is None or self.mirror is None:
            return 503, {"status": "loading", "reason": self.loading,
                         "acceptance_rate": None, "bundle": {"ref": ref, "digest": digest}}
        rate = self.mirror.acceptance()
        if rate is not None and rate < self.min_acceptance:
            return 200, {"status": "degraded", "reason": f"the runtime's acceptance {rate:.2f} is below the bundle's min_acceptance "
                                                          f"{self.min_acceptance:.2f}", "acceptance_rate": rate,
                         "bundle": {"ref": ref, "digest": digest}}
        return 200, {"status": "ok", "reason": None, "acceptance_rate": rate, "bundle": {"ref": ref, "digest": digest}}

    def liveness(self) -> tuple[int, dict[str, Any]]:
        if self.dead and not self.stopping.is_set():
            return 503, {"status": "dead", "reason": self.dead}
        return 200, {"status": "alive", "reason": None}

    def pool(self) -> aiohttp.ClientSession:
        """The connection pool to the runtime, made in the event loop that uses it. An answer's bytes pass as the
        runtime sent them (no decompression); --time-limit bounds each wait for the runtime's next bytes."""
        if self.client is None:
            room = self.sequences + self.settings.max_queue + 4
            self.client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=room),
                                                timeout=aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=self.settings.time_limit_s),
                                                auto_decompress=False, skip_auto_headers=("User-Agent", "Accept-Encoding"))
        return self.client

    def model_names(self) -> list[str]:
        assert self.info is not None
        extra = self.settings.served_model_name
        return [self.info["ref"], *([extra] if extra and extra != self.info["ref"] else [])]


def _card(g: Governed, name: str) -> dict[str, Any]:
    assert g.info is not None
    fields = {k: g.info[k] for k in ("digest", "signer", "tokenizer_fingerprint", "engine", "dtype")}
    return {"id": name, "object": "model", "owned_by": g.info["signer"] or "specbundle",
            "specbundle": {**fields, "runtime": {k: g.shown.get(k) for k in ("runtime", "version", "speculation")}}}


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _loading(g: Governed) -> JSONResponse | None:
    if g.dead:
        return _error(ApiError(503, f"the runtime is gone: {g.dead}", "server_error", code="runtime_failed"))
    if g.upstream is None:
        return _error(ApiError(503, "the model is loading; retry later", "server_error", code="model_loading", headers={"Retry-After": "5"}))
    return None


def _model_body(raw: bytes, ref: str) -> bytes:
    """The request body with `model` set to the name the runtime was started under (the reference): any name the
    front door answers to reaches the one model, as with `bundle serve`. A body that is not a JSON object goes
    on as it came (the runtime answers it)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(body, dict) or body.get("model") == ref:
        return raw
    body["model"] = ref
    return json.dumps(body).encode()


def _usage(kept: bytes) -> dict[str, int] | None:
    """The `usage` of an answer: a whole JSON body's, or the last server-sent event that carries one."""
    try:
        candidates = [json.loads(kept)]
    except ValueError:
        candidates = []
        for line in reversed(kept.splitlines()):
            if line.startswith(b"data: {") and b'"usage"' in line:
                try:
                    candidates.append(json.loads(line[6:]))
                except ValueError:
                    continue
                break
    for body in candidates:
        usage = body.get("usage") if isinstance(body, dict) else None
        if isinstance(usage, dict):
            return {k: int(usage.get(k) or 0) for k in ("prompt_tokens", "completion_tokens")}
    return None


def _count(g: Governed, status: str, started: float, first: float | None, kept: bytes) -> None:
    """One proxied request's end in our metrics and the run record."""
    metrics = g.metrics
    assert metrics is not None and g.mirror is not None
    metrics.requests.labels(status=status).inc()
    end = time.perf_counter()
    metrics.duration.observe(end - started)
    if first is not None:
        metrics.ttft.observe(first - started)
    usage = _usage(kept) if status == "ok" else None
    if usage and not g.mirror.counts_tokens:
        metrics.generated.inc(usage["completion_tokens"])
        metrics.prompt_tokens.inc(usage["prompt_tokens"])
    if g.on_request is not None and status == "ok":
        g.on_request({"new_tokens": (usage or {}).get("completion_tokens", 0), "drafted": 0, "accepted": 0, "fallback": False})


def _status_of(code: int) -> str:
    return "ok" if code < 400 else "rejected" if code == 429 else "invalid" if code < 500 else "error"


async def _forward(g: Governed, request: Request) -> Response:
    """One request through to the runtime; its answer streamed back as the runtime sends it."""
    waiting = _loading(g)
    if waiting is not None:
        return waiting
    assert g.metrics is not None and g.info is not None
    if g.inflight >= g.sequences + g.settings.max_queue:
        g.metrics.requests.labels(status="rejected").inc()
        return _error(ApiError(429, "the server is busy; retry later", "server_error", code="queue_full", headers={"Retry-After": "1"}))
    path = request.url.path.removeprefix("/openai")
    body = await request.body()
    if request.method == "POST":
        body = _model_body(body, g.info["ref"])
    headers = {"authorization": f"Bearer {g.upstream_key}", "accept": request.headers.get("accept", "*/*")}
    if "content-type" in request.headers:
        headers["content-type"] = request.headers["content-type"]
    url = f"{g.upstream}{path}" + (f"?{request.url.query}" if request.url.query else "")
    started = time.perf_counter()
    g.inflight += 1
    try:
        try:
            upstream = await _send(g.pool(), request.method, url, headers, body)
        except aiohttp.ServerDisconnectedError:
            # A kept-alive connection the runtime closed as the request went out (llama-server's HTTP library
            # closes one after a few requests): nothing was answered, so the request is sent once more on a fresh one.
            upstream = await _send(g.pool(), request.method, url, headers, body)
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        g.inflight -= 1
        _count(g, "timeout" if isinstance(err, asyncio.TimeoutError) else "error", started, None, b"")
        return _error(ApiError(502, f"the runtime did not answer ({type(err).__name__})", "server_error", code="runtime_unreachable"))
    return StreamingResponse(_relay(g, upstream, started), status_code=upstream.status,
                             headers={k.decode("latin-1"): v.decode("latin-1") for k, v in upstream.raw_headers if k.lower() not in HOP_BY_HOP})


async def _send(session: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str], body: bytes) -> aiohttp.ClientResponse:
    return await session.request(method, url, headers=headers, data=body or None, allow_redirects=False)


async def _relay(g: Governed, upstream: aiohttp.ClientResponse, started: float) -> AsyncIterator[bytes]:
    """The runtime's answer, chunk by chunk as it arrives; counted once it ends (or the client leaves)."""
    first: float | None = None
    kept = bytearray()
    status = "cancelled"
    try:
        async for chunk in upstream.content.iter_any():
            if first is None:
                first = time.perf_counter()
            kept += chunk
            if len(kept) > 2 * USAGE_BYTES:  # keep the end: the usage of a stream comes last
                del kept[:-USAGE_BYTES]
            yield chunk
        status = _status_of(upstream.status)
    except asyncio.TimeoutError:
        status = "timeout"
    except aiohttp.ClientError:
        status = "error"
    finally:
        g.inflight -= 1
        if status in ("cancelled", "timeout", "error"):
            upstream.close()  # a half-read answer: its connection cannot serve another request
        else:
            upstream.release()
        _count(g, status, started, first, bytes(kept))


async def _scrape(g: Governed) -> None:
    """The runtime's counters into ours (bundler.serve.runtimes.counters), where it has any."""
    if g.metrics_path is None or g.mirror is None or g.upstream is None:
        return
    try:
        async with g.pool().get(f"{g.upstream}{g.metrics_path}", headers={"authorization": f"Bearer {g.upstream_key}"},
                                timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as answer:
            if answer.status == 200:
                g.mirror.update(await answer.text())
    except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
        return


def _routes(g: Governed) -> list[Route]:
    async def health(_request: Request) -> Response:
        if g.upstream is not None and not g.dead:
            await _scrape(g)
        status, body = g.readiness()
        return JSONResponse(body, status_code=status)

    async def livez(_request: Request) -> Response:
        status, body = g.liveness()
        return JSONResponse(body, status_code=status)

    async def metrics(request: Request) -> Response:
        waiting = _loading(g)
        if waiting is not None:
            return waiting
        assert g.metrics is not None
        await _scrape(g)
        g.metrics.queue_depth.set(max(0, g.inflight - g.sequences))
        g.metrics.active.set(min(g.inflight, g.sequences))
        return Response(g.metrics.exposition(bool(request.scope.get(METRICS_AUTHENTICATED))), media_type=CONTENT_TYPE_LATEST)

    async def models(_request: Request) -> Response:
        return _loading(g) or JSONResponse({"object": "list", "data": [_card(g, n) for n in g.model_names()]})

    async def model(request: Request) -> Response:
        waiting = _loading(g)
        if waiting is not None:
            return waiting
        name = request.path_params["model_id"]
        if name not in g.model_names():
            return _error(ApiError(404, f"no model {name!r} here; this server runs {g.model_names()[0]}", code="model_not_found"))
        return JSONResponse(_card(g, name))

    async def status(_request: Request) -> Response:
        return _loading(g) or JSONResponse({"model": _card(g, g.model_names()[0]), "checks": g.checks, "runtime": {**g.shown, "pid": g.pid},
                                            "live": {"acceptance_rate": g.mirror.acceptance() if g.mirror else None,
                                                     "busy": g.inflight > 0, "health": g.readiness()[1]["status"]}})

    async def forward(request: Request) -> Response:
        return await _forward(g, request)

    routes = [Route("/health", health), Route("/livez", livez), Route("/metrics", metrics), Route("/status.json", status)]
    for prefix in ("/v1", "/openai/v1"):
        routes += [Route(prefix + "/models", models), Route(prefix + "/models/{model_id:path}", model),
                   Route(prefix + "/{rest:path}", forward, methods=["GET", "POST"])]
    return routes


def build_proxy(g: Governed) -> ASGIApp:
    """The front door's app, behind the API key and the request guard (as `bundle serve`'s own app)."""
    app = Starlette(routes=_routes(g))

    def refused(_status: int) -> None:
        if g.metrics is not None:
            g.metrics.requests.labels(status="invalid").inc()

    settings = g.settings
    digest = lambda: g.info["digest"] if g.info is not None else None  # noqa: E731
    return ApiKeyMiddleware(RequestGuard(app, settings.limits, on_refused=refused), digest, settings.api_key,
                            OPEN_PROBE_PATHS if settings.open_probes else (), metrics_key=settings.metrics_key)
