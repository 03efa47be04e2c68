"""The registry HTTP client (distribution API v2) for one repository: requests with bounds and retries, auth
challenges answered (Basic, or Bearer through oras's token exchange), failures mapped to error codes.

Push (bundler.registry.push) and pull (bundler.registry.pull) speak through it; what both need of the
protocol beyond single requests lives here too: the referrers tag schema and transfers run a few at a time.
"""

from __future__ import annotations

__all__ = ["Client", "MANIFEST_ACCEPT", "Progress", "READ", "SIG_TYPE", "client_for", "failure_reason", "fallback_tag", "redact", "run_all"]

import contextlib
import json
import os
import re
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import oras.auth
import oras.auth.utils
import requests

from bundler.format import mediatypes
from bundler.format.mediatypes import OCI_INDEX, OCI_MANIFEST
from bundler.registry import credentials
from bundler.store.refs import Ref
from core.errors import BundleError

Progress = Callable[[str, int], None]

READ = 1 << 20  # streaming read size
WORKERS = 4  # blobs in flight at once (hashlib and socket I/O release the GIL)
CONNECT_TIMEOUT = 10
BACKOFF = 0.25
SIG_TYPE = mediatypes.SIGSTORE_BUNDLE
MANIFEST_ACCEPT = f"{OCI_MANIFEST}, {OCI_INDEX}"


def _env_number(name: str, default: float) -> float:
    """A positive number from the environment (a bad value is a usage error, not a silent default)."""
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise BundleError("usage", f"${name} must be a number >= 0, not {text!r}")
    return value


@dataclass(frozen=True)
class Bounds:
    """Bounds on a registry that stalls or trickles: a read waits at most `read_timeout` s; after the first
    `min_rate_grace` s a download must average at least `min_rate` bytes/s; GET and HEAD are retried
    `retries` times on a 5xx or a dropped connection, with exponential backoff, then exit 5."""

    read_timeout: float = 60
    min_rate: float = 10 << 10
    min_rate_grace: float = 30
    retries: int = 3

    @classmethod
    def from_env(cls) -> "Bounds":
        """The bounds as the environment sets them now (read when a client is made, not at import)."""
        return cls(_env_number("BUNDLE_READ_TIMEOUT", cls.read_timeout), _env_number("BUNDLE_MIN_RATE", cls.min_rate),
                   _env_number("BUNDLE_MIN_RATE_GRACE", cls.min_rate_grace), int(_env_number("BUNDLE_RETRIES", cls.retries)))


def failure_reason(exc: BaseException) -> str:
    """The useful end of a requests exception ("[Errno 111] Connection refused"), never a header."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    if found:
        return found.group(0).strip()
    return type(exc).__name__


MAX_REGISTRY_MESSAGE = 300  # characters of a registry's error text quoted in an error line
ERROR_BODY = 64 << 10  # bytes of an error body read: an OCI error is a few hundred
# Credentials as a registry might echo them back (a header, a token, a password field): never quoted.
_SCHEME_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_FIELD_CREDENTIAL = re.compile(r"(?i)\b(authorization|password|passwd|secret|token|access_token|refresh_token)([\s:=\"']{1,4})"
                               r"(?!\[redacted\]|(?:bearer|basic)\s)[^\s,;&}\]\"'\[:=][^\s,;&}\]\"'\[]*")


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """`text` with each of `secrets` (what this client sent) and every credential-like run replaced by [redacted]."""
    for secret in sorted((s for s in secrets if s and len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "[redacted]")
    text = _SCHEME_CREDENTIAL.sub(lambda m: f"{m.group(1)} [redacted]", text)
    return _FIELD_CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}[redacted]", text)


def _registry_message(resp: requests.Response, secrets: tuple[str, ...] = ()) -> str:
    """The first message of an OCI error body, if the registry sent one; credentials redacted, bounded."""
    with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError, IndexError, RecursionError,
                             requests.exceptions.RequestException):
        body = b""
        for chunk in resp.iter_content(4096):  # bounded: a hostile registry's error body may never end
            body += chunk
            if len(body) >= ERROR_BODY:
                break
        err = json.loads(body)["errors"][0]
        code, message = err.get("code", ""), err.get("message", "")
        text = f"{code if isinstance(code, str) else ''} {message if isinstance(message, str) else ''}".strip()
        text = redact(text, secrets)
        return f": {text[:MAX_REGISTRY_MESSAGE]}" if text else ""
    return ""


def _loopback(host: str) -> bool:
    """Whether HOST[:PORT] names this machine (localhost, 127.0.0.0/8, ::1)."""
    import ipaddress

    name = urllib.parse.urlsplit(f"//{host}").hostname or ""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Client:
    """One repository on one registry: requests with auth challenges answered (Basic or Bearer) and errors as codes.

    The plain HTTP API is spoken with requests: oras 0.2.43 re-serialises manifests (their digest changes),
    reads whole blobs into memory, retries for a minute on a refused connection, and cannot answer a Basic
    challenge with its token backend. From oras we take the bearer-token exchange.
    """

    def __init__(self, ref: Ref, plain_http: bool = False, creds: credentials.Credentials | None = None, bounds: Bounds | None = None) -> None:
        if not ref.registry:
            raise BundleError("usage", f"{ref} names no registry: use HOST[:PORT]/NAME:TAG (for example 127.0.0.1:5000/org/model:v1)")
        self.ref = ref
        self.host = ref.registry
        if plain_http and not _loopback(self.host):
            # Over plain HTTP anyone on the path reads the credentials and swaps the bytes: loopback only.
            raise BundleError("usage", f"--plain-http is only for a registry on loopback (localhost, 127.0.0.0/8, ::1), not {self.host}")
        self.plain_http = plain_http
        self.scheme = "http" if plain_http else "https"
        self.base = f"{self.scheme}://{self.host}/v2/{ref.repository}"
        self.creds = creds
        self.bounds = bounds or Bounds.from_env()
        self._auth: str | None = None  # the Authorization value that last worked
        self._lock = threading.Lock()
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.trust_env = False  # no proxies or .netrc: the registry named is the one we talk to
            self._local.session = session
        return session

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base + path

    def is_registry(self, url: str) -> bool:
        """Whether `url` is on the registry host the user named (same scheme, host and port).

        Credentials go only there: an upload Location or a redirect may name any host, and that host
        must never see them (nor choose a token service to send them to).
        """
        parts = urllib.parse.urlsplit(url)
        return parts.scheme == self.scheme and parts.netloc.lower() == self.host.lower()

    def request(
        self,
        method: str,
        path: str,
        what: str,
        ok: tuple[int, ...] = (200,),
        headers: Mapping[str, str] | None = None,
        body: Callable[[], Any] | None = None,
        params: Mapping[str, str] | None = None,
        stream: bool = False,
        not_found_ok: bool = False,
    ) -> requests.Response:
        """Send; answer up to two auth challenges; map failures to error codes. `body` makes the data anew per try."""
        url = self.url(path)
        for attempt in range(3):
            hdrs = dict(headers or {})
            if self._auth and self.is_registry(url):
                hdrs["Authorization"] = self._auth
            resp = self._send(method, url, hdrs, body, params, stream, what)
            # A challenge is answered only when the registry itself sent it, never a redirect target
            # (requests drops Authorization on a cross-host redirect; its 401 must not win it back).
            if resp.status_code == 401 and attempt < 2 and self.is_registry(resp.url) and self._answer(resp, hdrs.get("Authorization"), what):
                resp.close()
                continue
            break
        if resp.status_code in ok or (not_found_ok and resp.status_code == 404):
            return resp
        self._fail(resp, what)
        raise AssertionError("unreachable")

    def _send(self, method: str, url: str, hdrs: dict[str, str], body: Callable[[], Any] | None, params: Mapping[str, str] | None, stream: bool, what: str) -> requests.Response:
        """One request; GET and HEAD retried on a 5xx or a dropped connection (bounded, with backoff)."""
        retries = self.bounds.retries if method in ("GET", "HEAD") else 0
        for n in range(retries + 1):
            try:
                resp = self._session().request(
                    method, url, headers=hdrs, data=body() if body else None, params=params, stream=stream,
                    timeout=(CONNECT_TIMEOUT, self.bounds.read_timeout), allow_redirects=True,
                )
            except requests.exceptions.SSLError as exc:
                raise BundleError("registry-unreachable", f"TLS to {self.host} failed ({failure_reason(exc)}); for a plain-HTTP registry on loopback pass --plain-http") from None
            except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
                if n < retries:
                    time.sleep(BACKOFF * 2**n)
                    continue
                tries = f" after {retries + 1} tries" if retries else ""
                raise BundleError("registry-unreachable", f"cannot reach registry {self.host} ({failure_reason(exc)}) during {what}{tries}") from None
            except requests.exceptions.RequestException as exc:  # a redirect loop, a Location that is no URL
                raise BundleError("registry", f"{self.host}: {what} failed ({type(exc).__name__})") from None
            if resp.status_code >= 500 and n < retries:
                resp.close()
                time.sleep(BACKOFF * 2**n)
                continue
            return resp
        raise AssertionError("unreachable")

    def _secrets(self) -> tuple[str, ...]:
        """What this client may have sent the registry: the Authorization value, its token or encoded pair, the password."""
        sent = [self._auth or ""]
        sent += [value.split(" ", 1)[-1] for value in sent if " " in value]
        if self.creds is not None:
            sent += [self.creds.password, self.creds.basic().split(" ", 1)[1]]
        return tuple(sent)

    def _fail(self, resp: requests.Response, what: str) -> None:
        status, detail = resp.status_code, _registry_message(resp, self._secrets())
        resp.close()
        if status in (401, 403):
            hint = (
                f"credentials from {self.creds.source} were refused"
                if self.creds
                else f"no credentials: run `docker login {self.host}` or set {credentials.USER_ENV} and {credentials.PASSWORD_ENV}"
            )
            raise BundleError("registry-auth", f"{self.host} denied {what} ({status}{detail}); {hint}")
        if status == 404:
            raise BundleError("registry-not-found", f"{what}: not found on {self.host} ({status}{detail})")
        raise BundleError("registry", f"{self.host} answered {status} to {what}{detail}")

    def _answer(self, resp: requests.Response, sent: str | None, what: str) -> bool:
        """Set the Authorization header a 401 challenge asks for; False when it is what `sent` already was."""
        challenge = resp.headers.get("WWW-Authenticate", "")
        scheme = challenge.split(" ", 1)[0].lower()
        with self._lock:
            if scheme == "basic":
                if self.creds is None or sent == self.creds.basic():
                    return False
                self._auth = self.creds.basic()
                return True
            if scheme == "bearer":
                token = self._token(oras.auth.utils.parse_auth_header(challenge), what)
                if token is None or sent == f"Bearer {token}":
                    return False
                self._auth = f"Bearer {token}"
                return True
        return False

    def _token(self, header: Any, what: str) -> str | None:
        """A bearer token for the challenge's scope, from its realm (with our credentials if we have any)."""
        backend = oras.auth.get_auth_backend("token", requests.Session(), insecure=self.plain_http)
        if self.creds is not None:
            backend.set_basic_auth(self.creds.username, self.creds.password)
        try:
            if self.creds is None:
                return backend.request_anonymous_token(header)
            return backend.request_token(header)
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            raise BundleError("registry-unreachable", f"cannot reach the token service of {self.host} ({failure_reason(exc)}) during {what}") from None


def client_for(ref: Ref, plain_http: bool) -> Client:
    """The client for `ref`'s repository, with the credentials found for its registry."""
    return Client(ref, plain_http, credentials.lookup(ref.registry))


def fallback_tag(digest: str) -> str:
    """The referrers tag schema: `sha256-<hex>` for subject `sha256:<hex>`."""
    return digest.replace(":", "-", 1)


def run_all(jobs: list[Callable[[], None]], stop: threading.Event) -> None:
    """Run jobs on a few threads; the first failure sets `stop` and is raised once the others have stopped."""
    if not jobs:
        return
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(jobs))) as pool:
        futures = [pool.submit(job) for job in jobs]
        try:
            for fut in futures:
                fut.result()
        except BaseException:
            stop.set()
            for fut in futures:
                fut.cancel()
            raise
