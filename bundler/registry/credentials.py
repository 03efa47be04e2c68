"""Registry credentials: BUNDLE_REGISTRY_USER/PASSWORD, else what `docker login` wrote to config.json.

Lookup order: the two environment variables (both set), then `$DOCKER_CONFIG/config.json` or
`~/.docker/config.json`: an inline `auths` entry, a `credHelpers` entry, then `credsStore`. A password
never appears in a repr, a message or a log line.
"""

from __future__ import annotations

__all__ = ["Credentials", "PASSWORD_ENV", "USER_ENV", "docker_config_path", "login", "logout", "lookup"]

import base64
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundler.format import boundedjson
from bundler.format.atomicfile import write_atomically
from core.errors import BundleError

USER_ENV = "BUNDLE_REGISTRY_USER"
PASSWORD_ENV = "BUNDLE_REGISTRY_PASSWORD"
MAX_CONFIG_BYTES = 4 << 20  # a docker config.json is a few kB; read whole and parsed, so bounded


@dataclass(frozen=True)
class Credentials:
    """A user name and secret for one registry; `source` says where they came from (for messages)."""

    username: str
    password: str = field(repr=False)
    source: str = ""

    def basic(self) -> str:
        """The value of a Basic Authorization header."""
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def docker_config_path() -> Path:
    """Where docker keeps config.json: $DOCKER_CONFIG, else ~/.docker."""
    base = os.environ.get("DOCKER_CONFIG")
    return (Path(base) if base else Path.home() / ".docker") / "config.json"


def _host_keys(registry: str) -> list[str]:
    """The spellings `docker login` may have used for a host in `auths`."""
    hosts = [registry]
    if registry.startswith("localhost"):
        hosts.append(registry.replace("localhost", "127.0.0.1", 1))
    elif registry.startswith("127.0.0.1"):
        hosts.append(registry.replace("127.0.0.1", "localhost", 1))
    if registry in ("docker.io", "registry-1.docker.io", "index.docker.io"):
        hosts.append("https://index.docker.io/v1/")
    return [k for h in hosts for k in (h, f"https://{h}", f"http://{h}", f"https://{h}/v1/")]


def _from_inline(entry: Any, where: str) -> Credentials | None:
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k) or "", str) for k in ("auth", "username", "password", "identitytoken")):
        raise BundleError("registry-auth", f"{where}: not a map of strings (auth, username, password, identitytoken); log in again")
    if entry.get("auth"):
        try:
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            raise BundleError("registry-auth", f"{where}: the 'auth' entry is not base64 of user:password") from None
        return Credentials(user, password, where)
    if entry.get("username") and entry.get("password"):
        return Credentials(entry["username"], entry["password"], where)
    if entry.get("identitytoken"):
        # An OAuth2 refresh token goes to the token server as the password of the reserved user "<token>".
        return Credentials("<token>", entry["identitytoken"], where)
    return None


def _from_helper(helper: str, registry: str) -> Credentials | None:
    """Ask `docker-credential-<helper> get`; a missing or failing helper means no credentials."""
    try:
        proc = subprocess.run([f"docker-credential-{helper}", "get"], input=registry.encode(), capture_output=True, timeout=30, check=True)
        payload = json.loads(proc.stdout)
    except (OSError, subprocess.SubprocessError, ValueError, RecursionError):
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("Secret"), str) or not payload["Secret"]:
        return None
    user = payload.get("Username")
    return Credentials(user if isinstance(user, str) and user else "<token>", payload["Secret"], f"docker-credential-{helper}")


def lookup(registry: str) -> Credentials | None:
    """Credentials for a registry host (`host[:port]`), or None to try anonymously."""
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if user and password:
        return Credentials(user, password, f"${USER_ENV}/${PASSWORD_ENV}")
    path = docker_config_path()
    if not path.is_file():
        return None
    # Read directly: oras's load_configs ignores $DOCKER_CONFIG and merges ~/.docker/config.json in.
    config = _read_config(path)
    auths = config.get("auths") or {}
    for key in _host_keys(registry):
        if key in auths:
            found = _from_inline(auths[key] or {}, f"{path} ({key})")
            if found:
                return found
    helpers = config.get("credHelpers") or {}
    for key in _host_keys(registry):
        if key in helpers:
            return _from_helper(helpers[key], registry) if isinstance(helpers[key], str) else None
    store = config.get("credsStore")
    return _from_helper(store, registry) if isinstance(store, str) and store else None


def _read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        config = boundedjson.read_json(path, "docker config", "registry-auth", max_bytes=MAX_CONFIG_BYTES)
    except BundleError as exc:
        raise BundleError("registry-auth", f"cannot read {exc.message}; fix or move it, then log in again") from None
    if not isinstance(config, dict) or not all(isinstance(config.get(k) or {}, dict) for k in ("auths", "credHelpers")):
        raise BundleError("registry-auth", f"{path} is not a docker config.json ('auths' and 'credHelpers' must be maps)")
    return config


def _write_config(path: Path, config: dict) -> None:
    """Replace config.json atomically, readable by its owner only (it holds a password)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomically(path, json.dumps(config, indent="\t").encode(), 0o600)


def login(registry: str, username: str, password: str) -> Path:
    """Store credentials for `registry` as `docker login` does (an inline base64 `auth` entry); returns the file."""
    if not username or not password:
        raise BundleError("usage", "login needs a user name and a non-empty password")
    if ":" in username:
        raise BundleError("usage", f"user name {username!r} contains ':', which the docker 'auth' format cannot hold")
    path = docker_config_path()
    config = _read_config(path)
    auths = config.setdefault("auths", {})
    prior = auths.get(registry)
    auths[registry] = {**(prior if isinstance(prior, dict) else {}), "auth": base64.b64encode(f"{username}:{password}".encode()).decode()}
    _write_config(path, config)
    return path


def logout(registry: str) -> bool:
    """Remove every stored spelling of `registry` from config.json; False when there was nothing to remove."""
    path = docker_config_path()
    config = _read_config(path)
    auths = config.get("auths") or {}
    found = [k for k in _host_keys(registry) if k in auths]
    if not found:
        return False
    for key in found:
        del auths[key]
    _write_config(path, config)
    return True
