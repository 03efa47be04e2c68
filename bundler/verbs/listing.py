"""`bundle list`: each tag in the store with what its bundle is and who claims to have signed it (the claims
read, not verified: `bundle verify` checks them)."""

from __future__ import annotations

__all__ = ["Row", "rows"]

import datetime as dt
from dataclasses import dataclass

from core.errors import BundleError
from bundler.store.layout import Store
from bundler.store.referrers import find_signatures
from bundler.trust import signature


@dataclass(frozen=True)
class Row:
    """One tag in `bundle list` (CONTRACT.md section 3, `list --json`)."""

    ref: str
    digest: str
    name: str
    version: str
    size: int  # bytes of the manifest, its config and layers
    created: str  # the newest signature's time, else when the manifest came into the store (UTC, ISO 8601)
    signers: list[str]  # key ids the signatures name (unverified: `bundle verify` checks them)


def rows(store: Store) -> list[Row]:
    """Every tag in the store, sorted by reference."""
    out = []
    for entry in store.entries():
        name = version = ""
        size = entry.size
        try:
            _, manifest = store.read_json_blob({"digest": entry.digest, "size": entry.size})
            items = [manifest.get("config") or {}, *(manifest.get("layers") or [])]
            size += sum(i.get("size", 0) for i in items if isinstance(i, dict) and isinstance(i.get("size"), int))
            _, config = store.read_json_blob(manifest["config"])
            package = config.get("package") or {}
            name, version = str(package.get("name", "")), str(package.get("version", ""))
        except (BundleError, KeyError, TypeError, AttributeError):
            name = version = "?"  # a damaged entry still gets its row; `bundle verify` says what is wrong
        signers: list[str] = []
        created = ""
        for _, data in find_signatures(store, entry.digest):
            claims = signature.read_unverified(data)
            if claims is None:
                continue
            if claims.key_id and claims.key_id not in signers:
                signers.append(claims.key_id)
            created = max(created, str(claims.bundle.get("created", "")))
        if not created:
            try:
                mtime = store.blob_path(entry.digest).stat().st_mtime
                created = dt.datetime.fromtimestamp(mtime, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            except (OSError, BundleError):
                created = ""
        out.append(Row(entry.ref, entry.digest, name, version, size, created, signers))
    return out
