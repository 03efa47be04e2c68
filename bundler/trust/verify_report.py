"""What `verify` reports: each check by name with what it found, every signature looked at, the first failure.

The report is a value, never raised, so a failed one can still be printed whole (`verify --json`, `run`,
`serve`'s `/status.json`). `verify.py` fills it with the bundle's checks, `signature_checks.py` with the
signature's.
"""

from __future__ import annotations

__all__ = ["Check", "VerifyReport"]

from dataclasses import dataclass, field
from typing import Any

from bundler.store.modelkit import ModelKit
from bundler.trust import signature
from core.errors import BundleError


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class VerifyReport:
    """The outcome of verify: never raised, so a failed report can still be printed whole."""

    ref: str
    digest: str | None = None
    signer: str | None = None  # key id of the trusted signer
    checks: list[Check] = field(default_factory=list)
    error: BundleError | None = None
    modelkit: ModelKit | None = None
    files: dict[str, int] = field(default_factory=dict)  # path -> size, every file of every layer
    claims: signature.SignedClaims | None = None
    signature_json: bytes | None = None  # the Sigstore bundle that verified
    tokenizer_hashes: dict[str, str] = field(default_factory=dict)
    unsigned: bool = False

    @property
    def signed_by(self) -> str | None:
        """Who signed, as a person reads it: a certificate's identity (its name), else the key id."""
        return (self.claims.signer_name if self.claims is not None and self.claims.signer_name else None) or self.signer
    skipped_signatures: list[dict[str, Any]] = field(default_factory=list)  # candidates that did not pass, and why
    signature_digest: str | None = None  # the signature artifact that verified
    # Every signature artifact looked at: {"kind": model-signing | cosign, "digest", "key_id", "verified"}
    # (an addition to CONTRACT.md's verify --json, see docs/cosign.md).
    signatures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verified_signatures(self) -> list[str]:
        """Digests of the signature artifacts that held, of every kind."""
        return [s["digest"] for s in self.signatures if s["verified"]]

    @property
    def ok(self) -> bool:
        return self.error is None

    def raise_for_error(self) -> None:
        if self.error is not None:
            raise self.error

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "ref": self.ref,
            "digest": self.digest,
            "signer": ({"key_id": self.signer, **({"name": self.signed_by} if self.signed_by != self.signer else {})}
                       if self.signer else None),
            "unsigned": self.unsigned,
            "checks": [c.as_dict() for c in self.checks],
            "skipped_signatures": self.skipped_signatures,
            "signatures": self.signatures,
            "signature_kinds": sorted({s["kind"] for s in self.signatures if s["verified"]}),
            "error": {"code": self.error.code, "message": self.error.message} if self.error else None,
        }
