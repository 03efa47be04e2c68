"""`bundle serve` against a hostile client, on a real server process on 127.0.0.1 (issue #24 item 2): the body
bound, malformed bodies, browsers (Host, Origin, Content-Type), clients that go away, slow and idle
connections. Every loop is bounded in count and time; the server is stopped by its pid (SIGTERM)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import httpx
import pytest

from test_serve import REF, Server, _pack

MAX_BODY = 64 << 10
MAX_CONNECTIONS = 16
HEADER_TIMEOUT_S = 2.0
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]):
    store = _pack(tmp_path_factory.mktemp("serve-hostile"), keypair, speculative={"draft_tokens": 3})
    srv = Server(store, keypair[1], "--max-queue", "2", "--max-body", str(MAX_BODY), "--max-connections",
                 str(MAX_CONNECTIONS), "--header-timeout", str(HEADER_TIMEOUT_S), "--allowed-host", "bundle.example")
    yield srv
    srv.stop()


def _raw(server: Server, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes on a fresh connection; everything the server answers until it closes (bounded)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(data)
        chunks, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks) and _complete(b"".join(chunks)):
                break
    return b"".join(chunks)


def _complete(response: bytes) -> bool:
    head, _, body = response.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def _generated(server: Server) -> float:
    return server.metrics()[("specbundle_generated_tokens_total", ())]


def _post(server: Server, path: str, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(server.url + path, content=content, headers={"content-type": "application/json", **headers}, timeout=30)


# -- the body bound ---------------------------------------------------------------------------------------
def test_a_declared_body_over_max_body_is_413_before_it_is_sent(server: Server) -> None:
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {100 * MAX_BODY}\r\n\r\n").encode()
    response = _raw(server, head)  # no body follows: the answer cannot have waited for it
    assert _status(response) == 413
    assert json.loads(response.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_too_large"


def test_a_chunked_body_is_counted_while_it_is_read_and_stopped_at_max_body(server: Server) -> None:
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\n\r\n").encode()
    chunk = b"%x\r\n" % (16 << 10) + b"[" * (16 << 10) + b"\r\n"
    answer, sent = b"", 0
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head)
        s.setblocking(False)
        for sent in range(1, 65):  # up to 64 x 16 KiB = 16x the limit, if the server read it all
            try:
                s.sendall(chunk)
            except (BlockingIOError, OSError):
                break
            time.sleep(0.02)
            try:
                answer = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                break
            if answer:
                break
        if not answer:
            s.setblocking(True)
            answer = s.recv(65536)
    assert _status(answer) == 413
    assert sent < 64  # answered while the body was still coming: counted as read, not after
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_body_just_under_max_body_is_read_and_parsed(server: Server) -> None:
    body = json.dumps({"prompt": "x" * (MAX_BODY - 100), "max_tokens": 1}).encode()
    assert len(body) <= MAX_BODY
    r = _post(server, "/v1/completions", body)
    assert r.status_code in (200, 400) and r.status_code != 413  # read and judged by what it says, not its size


def test_a_prompt_too_long_for_the_context_is_refused_by_its_bytes(server: Server) -> None:
    r = _post(server, "/v1/completions", json.dumps({"prompt": "ab " * 20_000, "max_tokens": 1}).encode())
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "bytes" in r.json()["error"]["message"]  # measured before it was tokenized


# -- malformed bodies: all 400, none reaches the queue ------------------------------------------------------
MALFORMED = {
    "array nesting bomb": b'{"prompt": ' + b"[" * 30_000 + b"]" * 30_000 + b"}",
    "object nesting bomb": b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
    "nesting past the depth bound": b'{"prompt": "x", "user": ' + b"[" * 40 + b"]" * 40 + b"}",
    "escaped lone surrogate": b'{"prompt": "\\ud800", "max_tokens": 1}',
    "escaped lone surrogate in a message": b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}',
    "raw invalid UTF-8": b'{"prompt": "\xed\xa0\x80\xff", "max_tokens": 1}',
    "NaN": b'{"prompt": "x", "temperature": NaN}',
    "Infinity": b'{"prompt": "x", "temperature": Infinity}',
    "1e999": b'{"prompt": "x", "temperature": 1e999}',
    "an integer of 5000 digits": b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
    "not JSON": b'{"prompt": ',
    "empty": b"",
    "an array": b"[]",
    "a string": b'"x"',
    "null": b"null",
}
WRONG_FIELDS = [
    {"prompt": 1}, {"prompt": None}, {"prompt": ["a", "b"]}, {"prompt": [1, 2, 3]}, {"prompt": {"text": "x"}},
    {"prompt": ""}, {"prompt": [""]}, {"prompt": "x", "max_tokens": "5"}, {"prompt": "x", "max_tokens": 1.5}, {"prompt": "x", "max_tokens": True},
    {"prompt": "x", "max_tokens": 0}, {"prompt": "x", "max_tokens": -1}, {"prompt": "x", "max_tokens": 10**6},
    {"prompt": "x", "max_completion_tokens": []}, {"prompt": "x", "temperature": "hot"}, {"prompt": "x", "temperature": True},
    {"prompt": "x", "temperature": -1}, {"prompt": "x", "temperature": [0]}, {"prompt": "x", "top_p": 0},
    {"prompt": "x", "top_p": "1"}, {"prompt": "x", "seed": 2**64}, {"prompt": "x", "seed": -1}, {"prompt": "x", "seed": 1.5},
    {"prompt": "x", "seed": "7"}, {"prompt": "x", "seed": False}, {"prompt": "x", "stop": [1]}, {"prompt": "x", "stop": {"a": 1}},
    {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, {"prompt": "x", "stop": ""}, {"prompt": "x", "stream": "yes"},
    {"prompt": "x", "stream": 1}, {"prompt": "x", "stream": True, "stream_options": "x"},
    {"prompt": "x", "stream": True, "stream_options": {"include_usage": "yes"}},
    {"prompt": "x", "stream": True, "stream_options": {"include_usage": True, "other": 1}},
    {"prompt": "x", "stream": True, "stream_options": []}, {"prompt": "x", "stream_options": {"include_usage": True}},
    {"prompt": "x", "n": "2"}, {"prompt": "x", "n": 2}, {"prompt": "x", "model": 5}, {"prompt": "x", "user": {}},
    {"prompt": "x", "presence_penalty": "a"}, {"prompt": "x", "frequency_penalty": 9}, {"prompt": "x", "logit_bias": {"1": 5}},
    {"messages": "hi"}, {"messages": []}, {"messages": [1]}, {"messages": [None]}, {"messages": [{"content": "hi"}]},
    {"messages": [{"role": "tool", "content": "hi"}]}, {"messages": [{"role": ["user"], "content": "hi"}]},
    {"messages": [{"role": "user", "content": 1}]}, {"messages": [{"role": "user", "content": None}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    {"messages": [{"role": "user", "content": ["hi"]}]}, {"messages": [{"role": "user", "content": "hi", "name": 3}]},
]


def test_every_malformed_body_is_a_400_with_an_openai_error_and_never_reaches_the_queue(server: Server) -> None:
    before = _generated(server)
    for name, body in MALFORMED.items():
        for path in ("/v1/completions", "/v1/chat/completions"):
            r = _post(server, path, body)
            assert r.status_code == 400, (name, path, r.status_code, r.text[:200])
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}, name
    for fields in WRONG_FIELDS:
        path = "/v1/chat/completions" if "messages" in fields else "/v1/completions"
        r = _post(server, path, json.dumps(fields).encode())
        assert r.status_code == 400, (fields, r.status_code, r.text[:200])
        assert r.json()["error"]["type"] == "invalid_request_error", fields
    assert _generated(server) == before  # none of them was decoded
    assert httpx.get(server.url + "/health").status_code == 200


def test_well_formed_edge_values_are_served(server: Server) -> None:
    for fields in ({"prompt": "x", "seed": 2**63 - 1}, {"prompt": ["x"], "max_tokens": 1},
                   {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 1},
                   {"prompt": "x", "temperature": 0, "top_p": 1, "max_tokens": 1, "n": 1, "user": "u"},
                   {"prompt": "x", "temperature": 1e-300, "max_tokens": 3, "seed": 1},  # 0 in float32: the greedy limit
                   {"prompt": "x", "temperature": 2, "top_p": 5e-324, "max_tokens": 3, "seed": 1}):  # the top token only
        r = _post(server, "/v1/completions", json.dumps(fields).encode())
        assert r.status_code == 200, (fields, r.text[:200])
    r = _post(server, "/v1/chat/completions",
              json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 1}).encode(),
              **{"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200


# -- browsers: Host, Origin, Content-Type -----------------------------------------------------------------
def test_a_request_without_host_such_as_a_load_balancers_health_check_is_answered(server: Server) -> None:
    """HTTP/1.0 without a Host header, as haproxy's `option httpchk` sends it: answered; two Host headers are not."""
    import socket

    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    for request, status in ((b"GET /health HTTP/1.0\r\n\r\n", b" 200 "),
                            (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n", b" 400 ")):
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(request)
            head = conn.recv(64)
        assert head.startswith(b"HTTP/1.1") and status in head.split(b"\r\n", 1)[0], (request, head)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "localhost.evil.example", "10.0.0.1"])
def test_a_host_the_server_was_not_bound_for_is_refused_dns_rebinding(server: Server, host: str) -> None:
    for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions")):
        r = httpx.request(method, server.url + path, headers={"host": host, "content-type": "application/json"},
                          content=b'{"prompt": "x", "max_tokens": 1}' if method == "POST" else None)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host", (host, path)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]", "bundle.example"])
def test_the_bound_names_and_allowed_hosts_are_served(server: Server, host: str) -> None:
    r = httpx.get(server.url + "/health", headers={"host": f"{host}:{server.port}"})
    assert r.status_code == 200


@pytest.mark.parametrize("origin", ["http://evil.example", "https://evil.example:8000", "null", "file://", "http://localhost.evil.example"])
def test_a_request_from_another_origin_is_refused(server: Server, origin: str) -> None:
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers={"origin": origin})
    assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_origin"
    assert httpx.get(server.url + "/v1/models", headers={"origin": origin}).status_code == 403


def test_a_request_from_the_servers_own_origin_is_served(server: Server) -> None:
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers={"origin": server.url})
    assert r.status_code == 200


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                   "application/json; charset=latin-1", "application/jsonx"])
def test_a_post_body_that_is_not_application_json_is_415(server: Server, ctype: str | None) -> None:
    headers = {"content-type": ctype} if ctype else {}
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "x", "max_tokens": 1}', headers=headers)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert r.headers["x-bundle-digest"].startswith("sha256:")


# -- clients that go away ---------------------------------------------------------------------------------
def _wait_busy(server: Server, busy: bool, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while httpx.get(server.url + "/status.json").json()["live"]["busy"] != busy:
        assert time.monotonic() < deadline, f"the worker did not become {'busy' if busy else 'idle'}"
        time.sleep(0.02)


def test_a_client_that_goes_away_before_a_non_streamed_answer_stops_its_decoding(server: Server) -> None:
    before = server.metrics()
    body = json.dumps({"prompt": "hello", "max_tokens": 1024, "temperature": 0}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(head + body)
    _wait_busy(server, True)
    s.close()
    _wait_busy(server, False)
    after = server.metrics()
    cancelled = ("specbundle_requests_total", (("status", "cancelled"),))
    assert after[cancelled] == before[cancelled] + 1
    generated = after[("specbundle_generated_tokens_total", ())] - before[("specbundle_generated_tokens_total", ())]
    assert generated < 1024


# -- slow and idle connections ----------------------------------------------------------------------------
def test_a_connection_that_does_not_finish_its_headers_is_closed_after_the_header_timeout(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=HEADER_TIMEOUT_S * 5) as slow, \
            socket.create_connection(("127.0.0.1", server.port), timeout=HEADER_TIMEOUT_S * 5) as silent:
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        for _ in range(int(HEADER_TIMEOUT_S * 2)):  # keep dripping header bytes: the timeout is for the whole head
            time.sleep(0.5)
            try:
                slow.sendall(b"X-Drip: 1\r\n")
            except OSError:
                break
        assert _closed(slow) and _closed(silent)
        assert time.monotonic() - started < HEADER_TIMEOUT_S * 5


def test_a_keep_alive_connection_cannot_drip_its_next_request_forever(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=HEADER_TIMEOUT_S * 5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = s.recv(65536)
        while not _complete(first):  # bounded by the socket timeout
            first += s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /health HTTP/1.1\r\n")
        for _ in range(int(HEADER_TIMEOUT_S * 2)):
            time.sleep(0.5)
            try:
                s.sendall(b"X-Drip: 1\r\n")
            except OSError:
                break
        assert _closed(s)


def _closed(s: socket.socket) -> bool:
    """The server closed the connection (end of stream or reset), without an answer."""
    try:
        return s.recv(1024) == b""
    except ConnectionResetError:
        return True


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_health_is_answered_while_idle_connections_hold_the_connection_bound(server: Server) -> None:
    baseline = _open_fds(server.proc.pid)
    held = []
    try:
        for _ in range(MAX_CONNECTIONS * 4):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # a head never finished
            held.append(s)
        time.sleep(0.2)
        assert _open_fds(server.proc.pid) <= baseline + MAX_CONNECTIONS + 2  # bounded, far below the file limit
        started = time.monotonic()
        r = httpx.get(server.url + "/health", timeout=5)
        assert r.status_code == 200 and time.monotonic() - started < 1.0
        assert httpx.get(server.url + "/metrics", timeout=5).status_code == 200
    finally:
        for s in held:
            s.close()


def test_bound_to_every_address_any_ip_is_served_but_a_name_must_still_be_allowed() -> None:
    from bundler.serve.request_guard import ServeLimits

    wildcard = ServeLimits(host="0.0.0.0", allowed_hosts=("svc.cluster.local",))
    assert wildcard.host_allowed("10.1.2.3:8000") and wildcard.host_allowed("[fe80::1]:8000")
    assert wildcard.host_allowed("svc.cluster.local:8000") and wildcard.host_allowed("localhost")
    assert not wildcard.host_allowed("rebound.evil.example") and not wildcard.host_allowed("")
    assert ServeLimits(allowed_hosts=("*",)).host_allowed("anything.example")
    assert not ServeLimits().origin_allowed("null") and ServeLimits().origin_allowed("http://[::1]:8000")


def test_max_connections_above_the_file_limit_is_a_usage_error(tmp_path: Path) -> None:
    import resource
    import subprocess
    import sys

    def low_file_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.run([sys.executable, "-m", "bundler", "serve", REF, "--store", str(tmp_path), "--max-connections", "1000"],
                          capture_output=True, text=True, preexec_fn=low_file_limit, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: [usage] --max-connections 1000 is above")
