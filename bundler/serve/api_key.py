"""The API key check of `bundle serve`, as pure ASGI middleware (so streams and disconnects pass through
untouched): `Authorization: Bearer <key>` compared in constant time and never logged, and the X-Bundle-Digest
header on every response once the pair is loaded.

A second credential, the metrics key, opens /metrics only, and only it shows the prompt cache's figures (every
client holds the API key, and a cached-token counter tells a client whether another's prompt began as its own):
`METRICS_AUTHENTICATED` in the scope. Key files are read within bounds (`read_key_file`)."""

from __future__ import annotations

__all__ = ["AUTHENTICATED", "METRICS_AUTHENTICATED", "MAX_KEY_FILE_BYTES", "ApiKeyMiddleware", "OPEN_PROBE_PATHS", "read_key_file"]

import hmac
import json
from typing import Callable

from starlette.types import ASGIApp

from bundler.serve.api_error import ApiError
from core.boundedread import NotReadable, read_bounded
from core.errors import BundleError

OPEN_PROBE_PATHS = ("/health", "/livez", "/metrics")  # with --open-probes: what probes and Prometheus read
AUTHENTICATED = "specbundle.authenticated"  # scope key: the request carried the API key (or none is asked)
METRICS_AUTHENTICATED = "specbundle.metrics_authenticated"  # scope key: a /metrics request carried the metrics key
METRICS_PATH = "/metrics"
MAX_KEY_FILE_BYTES = 4096  # a key is a line; a file (FIFO, /dev/zero) that is more is refused


def read_key_file(path: str, option: str) -> str:
    """The key a key file holds (its text, stripped): a regular file of at most MAX_KEY_FILE_BYTES of UTF-8,
    not empty; anything else a usage error naming `option`."""
    try:
        key = read_bounded(path, MAX_KEY_FILE_BYTES).decode("utf-8").strip()
    except NotReadable as why:
        raise BundleError("usage", f"{option} {path}: it {why}") from None
    except UnicodeDecodeError:
        raise BundleError("usage", f"{option} {path}: not UTF-8 text") from None
    if not key:
        raise BundleError("usage", f"{option} {path} is empty")
    return key
# The status page itself holds no data (it fetches it with the key), so it loads without one.
ALWAYS_OPEN = ("/", "/favicon.ico")


class ApiKeyMiddleware:
    """Asks for the API key on every path but the status page and, with open_paths, the probes; marks in the
    scope whether the request carried it (/metrics shows more to a request that did)."""

    def __init__(self, app: ASGIApp, digest: Callable[[], str | None], api_key: str | None, open_paths: tuple[str, ...] = (),
                 metrics_key: str | None = None):
        if metrics_key is not None and metrics_key == api_key:
            raise BundleError("usage", "the metrics key must differ from the API key (every client holds that one)")
        self.app, self.digest, self.api_key, self.open_paths, self.metrics_key = app, digest, api_key, open_paths, metrics_key

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        digest = self.digest()

        async def send_with_digest(message: dict) -> None:
            if message["type"] == "http.response.start" and digest is not None:
                message["headers"] = [*message.get("headers", []), (b"x-bundle-digest", digest.encode())]
            await send(message)

        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        carried = self.api_key is None or hmac.compare_digest(given, b"Bearer " + self.api_key.encode())
        path = scope["path"]
        metrics = path == METRICS_PATH and self.metrics_key is not None and \
            hmac.compare_digest(given, b"Bearer " + self.metrics_key.encode())
        if not (carried or metrics) and path not in (*ALWAYS_OPEN, *self.open_paths) and not path.startswith("/static/"):
            body = json.dumps(ApiError(401, "a valid API key is required (Authorization: Bearer <key>)",
                                       "authentication_error", code="invalid_api_key").body()).encode()
            await send_with_digest({"type": "http.response.start", "status": 401,
                                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
            await send_with_digest({"type": "http.response.body", "body": body})
            return None
        scope[AUTHENTICATED], scope[METRICS_AUTHENTICATED] = carried, metrics
        return await self.app(scope, receive, send_with_digest)
