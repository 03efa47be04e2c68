"""Errors as values with a code: raised once where the problem is known, shown once by the CLI."""

from __future__ import annotations

__all__ = ["BundleError"]

from core import display

# Exit code families of CONTRACT.md section 3.
INTERNAL, USAGE, INTEGRITY, POLICY, REGISTRY, INVALID = 1, 2, 3, 4, 5, 6
RUNTIME = 7  # beyond CONTRACT.md: a governed runtime (serve --runtime) failed or died

# Every code name the project raises, with its exit code. A new code is added here first.
CODES: dict[str, int] = {
    "internal": INTERNAL,
    "interrupted": 130,  # Ctrl-C: the shell convention 128 + SIGINT
    "usage": USAGE,
    "not-found": USAGE,
    "runtime-unsupported": USAGE,  # serve --runtime: a signed setting the chosen runtime cannot honour
    "missing-input": USAGE,
    # integrity or signature
    "integrity": INTEGRITY,
    "digest-mismatch": INTEGRITY,
    "tampered": INTEGRITY,
    "missing-file": INTEGRITY,
    "extra-file": INTEGRITY,
    "unsafe-archive": INTEGRITY,
    "signature-missing": INTEGRITY,
    "signature-invalid": INTEGRITY,
    "untrusted-signer": INTEGRITY,
    "signature-mismatch": INTEGRITY,
    "expired": INTEGRITY,
    "rollback": INTEGRITY,
    "key-error": INTEGRITY,
    "replay-mismatch": INTEGRITY,  # bundle replay: the tokens decoded again are not the ones the record signed
    # policy
    "tokenizer-mismatch": POLICY,
    "pairing": POLICY,
    "size-ratio": POLICY,
    "model-family": POLICY,
    "memory-budget": POLICY,
    "pickle-weights": POLICY,
    # registry or network
    "registry": REGISTRY,
    "registry-unreachable": REGISTRY,
    "registry-auth": REGISTRY,
    "registry-not-found": REGISTRY,
    # invalid Kitfile or bundle content
    "invalid-kitfile": INVALID,
    "invalid-bundle": INVALID,
    # serve --runtime: the third-party runtime failed to start, or ended by itself (docs/contract-additions.md)
    "runtime-failed": RUNTIME,
}


class BundleError(Exception):
    """A failure with a CONTRACT.md code name; its exit code follows from the name."""

    def __init__(self, code: str, message: str) -> None:
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def exit_code(self) -> int:
        return CODES[self.code]

    def line(self) -> str:
        """The one line shown on stderr; a message may echo bundle metadata, so its control characters are escaped."""
        return f"error: [{self.code}] {display.line(self.message)}"

    def as_json(self) -> dict:
        return {"code": self.code, "exit_code": self.exit_code, "message": self.message}
