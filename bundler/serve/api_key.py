"""The API key check of `bundle serve`, as pure ASGI middleware (so streams and disconnects pass through
untouched): `Authorization: Bearer <key>` compared in constant time and never logged, and the X-Bundle-Digest
header on every response once the pair is loaded."""

from __future__ import annotations

__all__ = ["AUTHENTICATED", "ApiKeyMiddleware", "OPEN_PROBE_PATHS"]

import hmac
import json
from typing import Callable

from starlette.types import ASGIApp

from bundler.serve.api_error import ApiError

OPEN_PROBE_PATHS = ("/health", "/livez", "/metrics")  # with --open-probes: what probes and Prometheus read
AUTHENTICATED = "specbundle.authenticated"  # scope key: the request carried the API key (or none is asked)
# The status page itself holds no data (it fetches it with the key), so it loads without one.
ALWAYS_OPEN = ("/", "/favicon.ico")


class ApiKeyMiddleware:
    """Asks for the API key on every path but the status page and, with open_paths, the probes; marks in the
    scope whether the request carried it (/metrics shows more to a request that did)."""

    def __init__(self, app: ASGIApp, digest: Callable[[], str | None], api_key: str | None, open_paths: tuple[str, ...] = ()):
        self.app, self.digest, self.api_key, self.open_paths = app, digest, api_key, open_paths

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
        if not carried and path not in (*ALWAYS_OPEN, *self.open_paths) and not path.startswith("/static/"):
            body = json.dumps(ApiError(401, "a valid API key is required (Authorization: Bearer <key>)",
                                       "authentication_error", code="invalid_api_key").body()).encode()
            await send_with_digest({"type": "http.response.start", "status": 401,
                                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
            await send_with_digest({"type": "http.response.body", "body": body})
            return None
        scope[AUTHENTICATED] = carried
        return await self.app(scope, receive, send_with_digest)
