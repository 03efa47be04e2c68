"""`bundle unpack`: verify, then extract every layer into a fresh directory (bundler.trust.extract), renamed into
place when whole."""

from __future__ import annotations

__all__ = ["UnpackResult", "unpack"]

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from bundler.store.refs import Ref
from bundler.store.layout import Store
from bundler.trust.extract import check_dest, extract_verified
from bundler.trust.verify import verify_bundle
from bundler.trust.verify_report import VerifyReport


@dataclass(frozen=True)
class UnpackResult:
    dest: Path
    report: VerifyReport
    files: int


def unpack(store: Store, ref: Ref, dest: Path, trusted: Mapping[str, Any], allow_unsigned: bool = False, progress: Callable[[str, int], None] | None = None, allow_rollback: bool = False, allow_ref_mismatch: bool = False) -> UnpackResult:
    """Verify a bundle, then extract it into `dest`; nothing is written when verification fails."""
    check_dest(dest)
    report = verify_bundle(store, ref, trusted, allow_unsigned=allow_unsigned, allow_rollback=allow_rollback, allow_ref_mismatch=allow_ref_mismatch)
    report.raise_for_error()
    count = extract_verified(store, report, dest, progress=progress)
    return UnpackResult(dest, report, count)
