"""How many run records a bundle carries between stores and registries, and which.

Anyone who can push to a repository can attach referrers to a bundle in it: thousands of run records, or a
few large ones. `pull` therefore keeps at most MAX_RECORDS records of MAX_RECORDS_BYTES in all per bundle (the
records already in the store count), each at most MAX_RECORD_BYTES (its manifest and blobs), preferring those
that verify with a trusted key, then the newest; it looks at no more than MAX_CANDIDATES of those a registry
lists. `push` passes on only what the same rule keeps, so a store never publishes what a pull would drop.
"""

from __future__ import annotations

__all__ = ["Candidate", "MAX_CANDIDATES", "MAX_RECORDS", "MAX_RECORD_BYTES", "choose", "local"]

from dataclasses import dataclass
from typing import Any, Mapping

from bundler.trust import runrecord
from core.errors import BundleError
from bundler.format.manifest import Descriptor, parse_descriptor
from bundler.store.layout import Store
from bundler.store.referrers import find_records

MAX_RECORDS = 32  # per bundle: a serve record per hour for more than a day, or a few dozen runs
MAX_RECORD_BYTES = 64 << 10  # one record's manifest, config and envelope: a real one is about 3 kB
MAX_RECORDS_BYTES = 1 << 20  # all the records of one bundle
MAX_CANDIDATES = 4 * MAX_RECORDS  # records of one bundle a pull reads before choosing


@dataclass(frozen=True)
class Candidate:
    """A record as found: its manifest descriptor and the blobs that manifest names."""

    desc: Descriptor
    blobs: list[Descriptor]

    @property
    def size(self) -> int:
        return self.desc.size + sum(b.size for b in self.blobs)


def record_blobs(store: Store, desc: Descriptor) -> list[Descriptor]:
    """The config and layer descriptors of a record manifest in the store, each blob's bytes checked against
    its digest and size (a record's blobs are small JSON): raises BundleError for a damaged or missing one."""
    _, manifest = store.read_json_blob(desc)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list):
        raise BundleError("invalid-bundle", f"run record {desc.digest[:19]}…: not a record manifest")
    blobs = [parse_descriptor(item, f"run record {desc.digest[:19]}…") for item in [manifest.get("config"), *manifest["layers"]]]
    for blob in blobs:
        store.read_json_blob(blob)
    return blobs


def choose(store: Store, subject: str, candidates: list[Candidate], trusted: Mapping[str, Any],
           already: int = 0, already_bytes: int = 0) -> list[Candidate]:
    """The candidates to keep (their blobs in `store`): at most MAX_RECORDS - `already` of them and
    MAX_RECORDS_BYTES - `already_bytes` bytes, none over MAX_RECORD_BYTES, trusted-verified first, then newest."""
    checked = []
    for cand in candidates:
        if cand.size > MAX_RECORD_BYTES:
            continue
        check = runrecord.check_record(store, cand.desc, subject, trusted)
        checked.append((not check.verified, _negated(_started(check)), cand.desc.digest, cand))
    kept: list[Candidate] = []
    room, byte_room = MAX_RECORDS - already, MAX_RECORDS_BYTES - already_bytes
    for *_, cand in sorted(checked, key=lambda item: item[:3]):
        if len(kept) >= room:
            break
        if cand.size <= byte_room:
            kept.append(cand)
            byte_room -= cand.size
    return kept


def _started(check: runrecord.RecordCheck) -> str:
    """When the record says its window started ('' if it does not say)."""
    predicate = check.statement.get("predicate") if isinstance(check.statement, dict) else None
    started = predicate.get("started") if isinstance(predicate, dict) else None
    return started if isinstance(started, str) else ""


def _negated(text: str) -> tuple[int, ...]:
    """A sort key that orders strings from the greatest (the newest RFC 3339 time) down."""
    return tuple(-ord(c) for c in text) + (1,)


def local(store: Store, subject: str, trusted: Mapping[str, Any]) -> list[Candidate]:
    """The records of `subject` in the store that a pull of the bundle would keep: intact, within the bounds."""
    found = []
    for desc in find_records(store, subject):
        try:
            found.append(Candidate(desc, record_blobs(store, desc)))
        except BundleError:
            continue  # damaged or missing: it stays behind (`bundle attestations` reports it)
    return choose(store, subject, found, trusted)
