"""A hostile registry for the tests: a small HTTP server on 127.0.0.1 whose answers each test writes.

It is no mock of docker-registry: it plays the attacker's server (or the other host an attacker's
redirect names), and it records every request it sees, headers included, so a test can assert what
reached it (for example: never an Authorization header).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator

import contextlib


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    trickle: float = 0.0  # seconds between bytes of the body (a slow-loris blob); 0: all at once
    drop: bool = False  # close the connection without answering
    content_length: int | None = None  # announce this length instead of the body's (a body cut short)


Route = Callable[[Seen, bytes], Reply]


class HostileServer:
    """ThreadingHTTPServer on 127.0.0.1 (a free port) answering every request with `route(request, body)`."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.seen: list[Seen] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                req = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
                server.seen.append(req)
                reply = server.route(req, body)
                if reply.drop:
                    self.close_connection = True
                    return
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(reply.body) if reply.content_length is None else reply.content_length))
                if reply.content_length is not None:
                    self.close_connection = True
                self.end_headers()
                if self.command == "HEAD":
                    return
                if reply.trickle:
                    import time

                    for i in range(len(reply.body)):
                        try:
                            self.wfile.write(reply.body[i : i + 1])
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(reply.trickle)
                else:
                    self.wfile.write(reply.body)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def authorization_seen(self) -> list[str]:
        return [r.headers["authorization"] for r in self.seen if "authorization" in r.headers]


@contextlib.contextmanager
def hostile(route: Route) -> Iterator[HostileServer]:
    """A running hostile server, stopped when the block ends."""
    server = HostileServer(route)
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
