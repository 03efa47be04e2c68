"""Text from bundles, registries and records made safe to show on a terminal (core: the CLI's tables and every
coded error's line use it).

Anything a bundle or a registry says (a Kitfile field, a signature's claims, a run record's statement, a
reference, an error that echoes one of them) may hold a newline, a carriage return, an ANSI escape or a
bidirectional override: shown raw, it could draw a forged row ("ok  ... signed by ...") or rewrite the
screen. `shown` escapes every such character the way Python writes it in a string literal, so one value
stays one visible run of printable text, and cuts what is too long to read.
"""

from __future__ import annotations

__all__ = ["MAX_SHOWN", "line", "shown"]

import re
from typing import Any

MAX_SHOWN = 256  # characters of one value on a terminal line; longer values are cut (JSON output keeps them whole)

# C0 and C1 controls, DEL, line/paragraph separators, zero-width and bidirectional format characters, BOM,
# and lone surrogates (which a terminal cannot even encode).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """`value` as one line of printable text: control and format characters escaped, cut at `limit` characters."""
    text = _UNSAFE.sub(_escape, value if isinstance(value, str) else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def line(text: str) -> str:
    """A whole message (errors: one line by contract) with the same escapes, not cut."""
    return _UNSAFE.sub(_escape, text)
