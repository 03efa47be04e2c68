"""What a run record keeps of each request so that `bundle replay` can decode it again and compare: the sha256 of
its prompt's and its output's token ids, their counts, and the request's decoding settings; never a token or a word.

A digest lets whoever holds a prompt show that it was the one served, and lets a replay check its tokens; it
also lets anyone confirm a guessed short prompt by trying candidates, so a record carries these entries only
when asked (`run --attest-prompts`, `serve --attest-prompts`), as it does the text hashes. A serve window keeps
the first MAX_LOGGED requests and counts the rest, so a record stays within recordlimits.MAX_RECORD_BYTES.
"""

from __future__ import annotations

__all__ = ["MAX_LOGGED", "RequestLog", "entry", "ids_sha256", "mode_of"]

import hashlib
import json
from typing import Any, Mapping, Sequence

# An entry is about 330 bytes of JSON, some 450 in the envelope's base64: 64 of them leave a record (a few kB
# besides) well inside the 64 KiB recordlimits.MAX_RECORD_BYTES a pull keeps.
MAX_LOGGED = 64


def ids_sha256(ids: Sequence[int]) -> str:
    """The hex sha256 of token ids written as compact JSON (`[1,2,3]`): what a record signs instead of text."""
    return hashlib.sha256(json.dumps([int(i) for i in ids], separators=(",", ":")).encode("ascii")).hexdigest()


def mode_of(settings: Mapping[str, Any]) -> str:
    """Which forward ran: "reproducible" (the batch-invariant one, `--reproducible`) or "default"."""
    return "reproducible" if settings.get("reproducible") else "default"


def entry(prompt_ids: Sequence[int], output_ids: Sequence[int], *, max_tokens: int, temperature: float, top_p: float,
          seed: int | None, chat: bool) -> dict[str, Any]:
    """One request as a record keeps it. chat: the prompt went through the chat template (run without --raw, a
    chat completion), else it was tokenized as it is (run --raw, a completion)."""
    return {
        "prompt": {"tokens": len(prompt_ids), "sha256": ids_sha256(prompt_ids)},
        "output": {"tokens": len(output_ids), "sha256": ids_sha256(output_ids)},
        "max_tokens": int(max_tokens), "temperature": float(temperature), "top_p": float(top_p),
        "seed": None if seed is None else int(seed), "chat": bool(chat),
    }


class RequestLog:
    """The entries of one record's window: the first MAX_LOGGED, and how many more were left out."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.omitted = 0

    def add(self, item: Mapping[str, Any]) -> None:
        if len(self.entries) < MAX_LOGGED:
            self.entries.append(dict(item))
        else:
            self.omitted += 1

    def predicate(self) -> dict[str, Any]:
        """The predicate's fields: `requests` (the entries) and `requests_omitted`."""
        return {"requests": list(self.entries), "requests_omitted": self.omitted}
