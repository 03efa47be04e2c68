"""What stands between `bundle serve` and a hostile client, before any request reaches the app's routes.

- `RequestGuard` (ASGI middleware): serves only the Host names the server was bound for (DNS rebinding),
  refuses a browser's cross-origin requests (an `Origin` that is not one of those names), takes POST bodies
  only as `application/json` (415: no form or text/plain "simple request" from a web page), and reads a body
  to at most `max_body` bytes within `body_timeout_s` (413 and 408), before any JSON parsing.
- `protocol_class` (uvicorn's h11 protocol, bounded): a header read timeout (a connection that has not sent a
  whole request head in `header_timeout_s` is closed, keep-alive or not) and at most `max_connections` open
  connections, below the process's file limit. At the bound, the oldest connection that is idle or still
  sending its request is closed to make room, so a new client (/health) is still answered while slow or idle
  clients hold the rest; connections with a request being answered are never closed for room.
"""

from __future__ import annotations

__all__ = ["DEFAULT_HOST", "RequestGuard", "ServeLimits", "connection_room", "described", "protocol_class"]

import asyncio
import ipaddress
import json
import resource
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

from starlette.types import ASGIApp

from bundler.serve.api_error import ApiError
from bundler.serve.openai_requests import DEFAULT_MAX_BODY

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_HOST = "127.0.0.1"  # loopback unless the user says otherwise


def described(default: Any, help: str) -> Any:
    """A settings field whose default and help text `bundle serve`'s option takes from it (bundler.cli.serving):
    each default is written once."""
    return field(default=default, metadata={"help": help})
DEFAULT_BODY_TIMEOUT_S = 30.0  # 1 MiB at 35 kB/s: a slow client is served, a stalled one is not held open
MAX_CONNECTIONS_CEILING = 1024
RESERVED_FILES = 64  # the model files, the store, logs, pipes: what the process opens besides sockets


def default_max_connections() -> int:
    """Half the process's soft file limit (the rest for its own files), at most MAX_CONNECTIONS_CEILING."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS_CEILING
    return max(1, min(MAX_CONNECTIONS_CEILING, soft // 2, soft - RESERVED_FILES))


def connection_room() -> int:
    """Connections the process's soft file limit leaves room for, after RESERVED_FILES of its own."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 30 if soft == resource.RLIM_INFINITY else max(1, soft - RESERVED_FILES)


def _host_name(value: str) -> str:
    """A Host header's or an address's name: lowercased, without port, brackets or a trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8000
        value = value[1 : value.find("]")] if "]" in value else value[1:]
    elif value.count(":") == 1:  # name:port (an IPv6 address without brackets has several colons)
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass
class ServeLimits:
    """The bounds of one server: bound address, extra host names, body size and the connection bounds."""

    host: str = DEFAULT_HOST
    allowed_hosts: tuple[str, ...] = ()
    max_body: int = described(DEFAULT_MAX_BODY, "Largest request body (413 above it): 64KiB, 1MiB or bytes.")
    header_timeout_s: float = described(DEFAULT_HEADER_TIMEOUT_S, "Seconds a client has to send a request's headers.")
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = field(default_factory=default_max_connections)

    def __post_init__(self) -> None:
        extra = {_host_name(h) for h in self.allowed_hosts}
        self.any_host = "*" in extra
        self.names = {*LOOPBACK_NAMES, _host_name(self.host), *extra} - {"*", ""}
        # Bound to every address: any of the machine's addresses may be asked for by number; a name (the
        # DNS-rebinding case) still has to be allowed.
        self.any_ip = _host_name(self.host) in WILDCARD_HOSTS

    def host_allowed(self, name: str) -> bool:
        name = _host_name(name)
        return bool(name) and (self.any_host or name in self.names or (self.any_ip and _is_ip(name)))

    def origin_allowed(self, origin: str) -> bool:
        try:
            parts = urlsplit(origin.strip())
            name = parts.hostname
        except ValueError:
            return False
        return parts.scheme in ("http", "https") and name is not None and self.host_allowed(name)


class RequestGuard:
    """Pure ASGI middleware: Host, Origin, Content-Type and the body bound (see the module docstring)."""

    def __init__(self, app: ASGIApp, limits: ServeLimits, on_refused: Callable[[int], None] | None = None):
        self.app, self.limits, self.on_refused = app, limits, on_refused

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[bytes, list[bytes]] = {}
        for name, value in scope.get("headers") or []:
            headers.setdefault(name.lower(), []).append(value)
        hosts = headers.get(b"host", [])
        # No Host at all is an HTTP/1.0 client such as a load balancer's health check (haproxy's `option
        # httpchk`); a browser always sends one, so DNS rebinding is judged on the Host a request carries.
        if len(hosts) > 1 or (hosts and not self.limits.host_allowed(hosts[0].decode("latin-1"))):
            return await self._refuse(send, ApiError(400, "this server does not answer for that Host (allow it with "
                                                          "--allowed-host)", code="invalid_host"))
        origins = headers.get(b"origin", [])
        if len(origins) > 1 or (origins and not self.limits.origin_allowed(origins[0].decode("latin-1"))):
            return await self._refuse(send, ApiError(403, "requests from other origins (web pages) are refused",
                                                     "permission_error", code="invalid_origin"))
        if scope["method"] != "POST":
            return await self.app(scope, receive, send)
        ctype = headers.get(b"content-type", [b""])
        if len(ctype) != 1 or not _is_json(ctype[0].decode("latin-1")):
            return await self._refuse(send, ApiError(415, "the body must be JSON (Content-Type: application/json)",
                                                     code="unsupported_media_type"))
        body = await self._read_body(headers, receive, send)
        if body is None:
            return None
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: http.disconnect when the client goes away

        await self.app(scope, replay, send)

    async def _read_body(self, headers: dict[bytes, list[bytes]], receive: Callable, send: Callable) -> bytes | None:
        """The whole body, or None once a refusal is sent (too large, too slow) or the client has gone."""
        limit = self.limits.max_body
        too_large = ApiError(413, f"the body is larger than this server takes ({limit} bytes; see --max-body)",
                             code="request_too_large")
        lengths = headers.get(b"content-length", [])
        if lengths and (not lengths[0].isdigit() or int(lengths[0]) > limit):  # h11 checked it is one number
            await self._refuse(send, too_large)
            return None
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.limits.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                await self._refuse(send, ApiError(408, f"the body did not arrive within {self.limits.body_timeout_s:g} s",
                                                  code="request_timeout"))
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:  # counted while reading: a chunked body of any length stops here
                await self._refuse(send, too_large)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, send: Callable, err: ApiError) -> None:
        if self.on_refused is not None:
            self.on_refused(err.status)
        body = json.dumps(err.body()).encode()
        # Connection: close, since a refused body may still be arriving and is not read.
        await send({"type": "http.response.start", "status": err.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _is_json(content_type: str) -> bool:
    media, _, params = content_type.partition(";")
    if media.strip().lower() != "application/json":
        return False
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


def protocol_class(limits: ServeLimits) -> type:
    """uvicorn's h11 protocol with the header read timeout and the connection bound of `limits`."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            self.opened = time.monotonic()
            self.header_timer: asyncio.TimerHandle | None = None
            full = len(self.connections) >= limits.max_connections
            super().connection_made(transport)
            if full:  # make room: the oldest connection with nothing being answered (this one if no other)
                victim = min((c for c in self.connections if _evictable(c)), key=lambda c: c.opened)
                victim.transport.close()
                self.connections.discard(victim)
                if victim is self:
                    return
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:  # a request head not complete yet (the first, or after keep-alive)
                self._arm_header_timer()
            elif self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()  # the next request's head is due within the timeout too

        def connection_lost(self, exc: Exception | None) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            if self.header_timer is None and not self.transport.is_closing():
                self.header_timer = self.loop.call_later(limits.header_timeout_s, self._header_timeout)

        def _header_timeout(self) -> None:
            self.header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    def _evictable(conn: Any) -> bool:
        """Idle, still sending its request head, or still sending its body: nothing answered yet."""
        cycle = getattr(conn, "cycle", None)
        return cycle is None or cycle.response_complete or (cycle.more_body and not cycle.response_started)

    return BoundedH11Protocol
