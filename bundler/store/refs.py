"""References: NAME[:TAG] or NAME@sha256:<hex>, NAME optionally starting with a registry host.

A reference with both, NAME:TAG@sha256:<hex>, has one meaning everywhere (verify, pull, fetch, unpack, run,
serve and serve --expect, and the admission policies): the digest names the content, and the tag is checked
too: the repository's last component must be the signed name and a version tag (`Ref.version`) the signed
version, else signature-mismatch. The tag is never dropped in silence (docs/registries.md)."""

from __future__ import annotations

__all__ = ["Ref", "STORAGE_SCHEMES", "parse_ref", "parse_storage_reference", "storage_reference", "without_userinfo"]

import re
from dataclasses import dataclass

from core.errors import BundleError

# Storage URI prefixes taken as a reference: ours, and KitOps' own (its KServe integration writes kit://).
STORAGE_SCHEMES = ("bundle://", "kit://")

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_HOST = re.compile(r"^(?:localhost|[A-Za-z0-9.-]+\.[A-Za-z0-9.-]+|[A-Za-z0-9.-]+:[0-9]+|\[[0-9a-fA-F:]+\](?::[0-9]+)?)$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# A version tag: `v` optional, `_` standing for SemVer's `+` (not allowed in OCI tags) and dropped with what follows.
_VERSION_TAG = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$")


@dataclass(frozen=True)
class Ref:
    """A parsed reference; `registry` is empty for a name that only lives in the local store."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    def __str__(self) -> str:
        if self.digest:
            return f"{self.name}@{self.digest}"
        return f"{self.name}:{self.tag}"

    @property
    def version(self) -> str | None:
        """The version a version tag names (`1.0.0`, `v1.0.0`, `1.0.0_build` -> `1.0.0`); None for another tag
        (`latest`) or none. Compared with the signed version less its `+build`."""
        version = (self.tag or "").split("_", 1)[0].removeprefix("v")
        return version if self.tag and _VERSION_TAG.match(version) else None

    @property
    def full(self) -> str:
        """The reference with everything it pins: NAME:TAG@DIGEST where it has both (str() is what the store
        and the registry API key it by: the digest alone then)."""
        return f"{self.name}:{self.tag}@{self.digest}" if self.tag and self.digest else str(self)

    @property
    def reference(self) -> str:
        """What the registry API calls the reference: the digest if given, else the tag."""
        return self.digest or self.tag or "latest"


def without_userinfo(text: str, *, storage: bool = False) -> str:
    """`text` with any `user:password@` before its host replaced by `***@` (with or without a `scheme://`):
    what a reference or storage URI may be shown as. In a plain reference with no `/`, the `@` is taken for
    NAME@DIGEST's, unless `storage`: a storage URI as the user gave it, where `user:password@HOST` needs no `/`
    and cannot be told from NAME@DIGEST, so it is masked all the same."""
    scheme, sep, rest = text.rpartition("://") if "://" in text else ("", "", text)
    host, slash, path = rest.partition("/")
    if "@" in host and (slash or sep or storage):
        rest = "***@" + host.rpartition("@")[2] + slash + path
    return scheme + sep + rest


def storage_reference(text: str) -> str | None:
    """The reference in a `bundle://` / `kit://` storage URI or a plain reference, the scheme and any
    `user:password@` before the host dropped (registry credentials come from DOCKER_CONFIG, never from here);
    None for another `scheme://`, which each caller refuses in its own words."""
    rest = text
    for scheme in STORAGE_SCHEMES:
        if text.startswith(scheme):
            rest = text[len(scheme):]
            break
    else:
        if "://" in text:
            return None
    host, slash, path = rest.partition("/")
    if slash and "@" in host:  # without a `/` the `@` is NAME@DIGEST's
        rest = host.rpartition("@")[2] + slash + path
    return rest


def parse_storage_reference(text: str) -> Ref | None:
    """storage_reference(text) parsed (None for another `scheme://`, as there). A bad reference's error quotes
    `text` as given, whatever ends in an `@` before the host shown as `***@`, with a `/` after the host or not."""
    rest = storage_reference(text)
    if rest is None:
        return None
    return parse_ref(rest, shown=without_userinfo(text, storage=True))


def parse_ref(text: str, *, shown: str | None = None) -> Ref:
    """Parse a reference, or raise a usage error that says what a reference looks like, quoting `shown` (by
    default `text` without its userinfo)."""
    shown = without_userinfo(text) if shown is None else shown
    bad = BundleError("usage", f"bad reference {shown!r}: expected NAME[:TAG] or NAME@sha256:<hex> (NAME lowercase, optionally HOST[:PORT]/ first)")
    digest = None
    rest = text
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise bad
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG.match(tag):
            raise bad
    registry = ""
    parts = rest.split("/", 1)
    if len(parts) == 2 and _HOST.match(parts[0]):
        registry, rest = parts
    if not _NAME.match(rest):
        raise bad
    if digest is None and tag is None:
        tag = "latest"
    return Ref(registry=registry, repository=rest, tag=tag, digest=digest)
