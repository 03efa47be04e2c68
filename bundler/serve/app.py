"""`bundle serve`'s routes: the OpenAI-compatible API (under /v1 and, as KServe routes it, /openai/v1), the
probes (/health for readiness, /livez for liveness), /metrics, and the status page. The app reads the server's
state (bundler.serve.lifecycle.Serving): while the pair loads, every route but the probes and the page answers 503.

Behind it, outermost first: the API key (bundler.serve.api_key), then the request guard's bounds on Host,
Origin, Content-Type and the body (bundler.serve.request_guard).
"""

from __future__ import annotations

__all__ = ["SERVE_MAX_NEW_TOKENS", "SERVE_PROMPT_TOKENS", "build_app"]

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp

from bundler.serve import answers
from bundler.serve import openai_requests as serve_requests
from bundler.serve.api_error import ApiError
from bundler.serve.api_key import METRICS_AUTHENTICATED, OPEN_PROBE_PATHS, ApiKeyMiddleware
from bundler.serve.lifecycle import Ready, Serving
from bundler.serve.request_guard import RequestGuard

# The context a served pair is sized for (memory preflight) and the longest generation a request may ask.
SERVE_MAX_NEW_TOKENS = 1024
SERVE_PROMPT_TOKENS = 3072
DEFAULT_MAX_TOKENS = 256  # when a chat request names no max_tokens (completions: 16, as OpenAI's)
STATIC = Path(__file__).with_name("static")
API_PREFIXES = ("/v1", "/openai/v1")  # OpenAI's, and KServe's for the same routes


def build_app(serving: Serving) -> ASGIApp:
    """The FastAPI app over the server's state, behind the API key and the request guard."""
    app = FastAPI(title="specbundle", docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app, serving)
    _add_probe_routes(app, serving)
    _add_status_routes(app, serving)
    _add_completion_routes(app, serving)

    def refused(_status: int) -> None:
        if serving.ready is not None:
            serving.ready.metrics.requests.labels(status="invalid").inc()

    settings = serving.settings
    digest = lambda: serving.ready.info["digest"] if serving.ready is not None else None  # noqa: E731
    return ApiKeyMiddleware(RequestGuard(app, settings.limits, on_refused=refused), digest, settings.api_key,
                            OPEN_PROBE_PATHS if settings.open_probes else (), metrics_key=settings.metrics_key)


def _loaded(serving: Serving) -> Ready:
    """The loaded pair, or a 503 while it loads."""
    if serving.ready is None:
        raise ApiError(503, "the model is loading; retry later", "server_error", code="model_loading",
                       headers={"Retry-After": "5"})
    return serving.ready


def _add_error_handlers(app: FastAPI, serving: Serving) -> None:
    """Every error answered in OpenAI's shape; a bad request counted as invalid."""

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, err: ApiError) -> JSONResponse:
        if err.status == 400 and serving.ready is not None:
            serving.ready.metrics.requests.labels(status="invalid").inc()
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, err: HTTPException) -> JSONResponse:
        return JSONResponse(ApiError(err.status_code, str(err.detail), code=None).body(), status_code=err.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse(ApiError(400, f"invalid request: {err.errors()[:1]}").body(), status_code=400)


def _add_probe_routes(app: FastAPI, serving: Serving) -> None:
    """Readiness (/health: 503 from the port's opening until the pair is loaded), liveness (/livez) and /metrics."""

    @app.get("/health")
    async def health() -> JSONResponse:
        status, body = serving.readiness()
        return JSONResponse(body, status_code=status)

    @app.get("/livez")
    async def livez() -> JSONResponse:
        status, body = serving.liveness()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        ready = _loaded(serving)
        ready.metrics.queue_depth.set(ready.requests.jobs.qsize())
        # The prompt cache's figures only to the metrics credential: every client holds the API key (docs/security.md).
        return Response(ready.metrics.exposition(bool(request.scope.get(METRICS_AUTHENTICATED))), media_type=CONTENT_TYPE_LATEST)


def _model_card(ready: Ready, name: str) -> dict[str, Any]:
    info = ready.info
    return {"id": name, "object": "model", "created": ready.created, "owned_by": info["signer"] or "specbundle",
            "specbundle": {k: info[k] for k in ("digest", "signer", "tokenizer_fingerprint", "engine", "dtype")}}


def _add_status_routes(app: FastAPI, serving: Serving) -> None:
    """What the server says about itself: the model (under every name it answers to), the status page and its figures."""

    async def models() -> dict[str, Any]:
        ready = _loaded(serving)
        return {"object": "list", "data": [_model_card(ready, name) for name in serving.model_names()]}

    async def model(model_id: str) -> dict[str, Any]:
        ready = _loaded(serving)
        if model_id not in serving.model_names():
            raise ApiError(404, f"no model {model_id!r} here; this server runs {ready.info['ref']}", code="model_not_found")
        return _model_card(ready, model_id)

    for prefix in API_PREFIXES:
        app.add_api_route(prefix + "/models", models, methods=["GET"])
        app.add_api_route(prefix + "/models/{model_id:path}", model, methods=["GET"])

    @app.get("/status.json")
    async def status() -> dict[str, Any]:
        ready = _loaded(serving)
        pair = ready.loaded.pair
        return {"model": _model_card(ready, ready.info["ref"]), "checks": ready.loaded.checks, "live": serving.live(),
                "pairing": pair.pairing, "device": pair.device}

    @app.get("/")
    async def page() -> FileResponse:
        return FileResponse(STATIC / "status.html", media_type="text/html")


def _add_completion_routes(app: FastAPI, serving: Serving) -> None:
    """POST .../completions and .../chat/completions: a checked request handed to the worker, its answer back."""

    def prepare(ready: Ready, raw: bytes, chat: bool) -> tuple[serve_requests.CompletionRequest, list[int]]:
        """The checked request and its prompt ids (parsing, tokenizing, the chat template): run in a thread."""
        req = serve_requests.parse_request(serve_requests.parse_body(raw), chat=chat, max_new_tokens=SERVE_MAX_NEW_TOKENS,
                                           default_max_tokens=DEFAULT_MAX_TOKENS if chat else 16)
        limit = serve_requests.prompt_token_limit(ready.loaded.pair, SERVE_PROMPT_TOKENS)  # the model's window bounds it too
        serve_requests.check_prompt_bytes(req, ready.prompt_bytes, limit)
        return req, serve_requests.prompt_ids(ready.loaded.pair, req, limit)

    async def answer(request: Request, chat: bool) -> Response:
        ready = _loaded(serving)
        # Only reading the body (bounded by the request guard) happens on the event loop.
        req, prompt_ids = await run_in_threadpool(prepare, ready, await request.body(), chat)
        name = req.model if req.model in serving.model_names() else ready.info["ref"]
        return await answers.generate(ready.requests, request, req, prompt_ids, name, serving.settings.time_limit_s)

    async def completions(request: Request) -> Response:
        return await answer(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await answer(request, chat=True)

    for prefix in API_PREFIXES:
        app.add_api_route(prefix + "/completions", completions, methods=["POST"])
        app.add_api_route(prefix + "/chat/completions", chat_completions, methods=["POST"])
