"""The prompt sets bench and tune read: the shipped ones by name (open questions; input-grounded tasks,
held out and for tuning, kept apart) or a user's file (JSON lines with "prompt" and an optional
"category", or plain text with one prompt a line)."""

from __future__ import annotations

__all__ = ["MAX_PROMPT_FILE_BYTES", "PROMPT_SETS", "Prompt", "categories", "read_prompts"]

import importlib.resources
import json
from collections.abc import Sequence
from dataclasses import dataclass

from core.boundedread import NotReadable, read_bounded
from core.errors import BundleError

# name -> data file in this package. "grounded" is held out: tune never reads it unless asked to check.
PROMPT_SETS = {
    "open": "prompts.jsonl",  # open questions and requests: the text to come is not in the prompt
    "grounded": "grounded.jsonl",  # edit, rewrite, extract, answer from a text, quote earlier turns
    "grounded-tuning": "grounded-tuning.jsonl",  # the same kinds of task, other texts: tune's default
}
DEFAULT_CATEGORY = "user"  # a prompt of a user's file that names none
# A prompt file is read whole, from a regular file (never a FIFO or device: they block or never end), at most this
# many bytes: the shipped sets are under 100 kB, and no prompt longer than a model's window is ever run.
MAX_PROMPT_FILE_BYTES = 16 << 20


@dataclass(frozen=True)
class Prompt:
    """One prompt and the kind of task it is."""

    text: str
    category: str


def _source(name_or_path: str) -> tuple[str, str]:
    """(where, text) of a shipped set by name, else of the file at that path."""
    if name_or_path in PROMPT_SETS:
        data = importlib.resources.files("runner.bench") / PROMPT_SETS[name_or_path]
        return f"runner/bench/{PROMPT_SETS[name_or_path]}", data.read_text(encoding="utf-8")
    try:
        data = read_bounded(name_or_path, MAX_PROMPT_FILE_BYTES)
    except NotReadable as why:
        raise BundleError("usage", f"--prompts {name_or_path!r} is neither a prompt set ({', '.join(PROMPT_SETS)}) "
                                   f"nor a file of prompts: it {why}") from None
    try:
        return name_or_path, data.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError("usage", f"{name_or_path} is not UTF-8 text") from None


def _json_line(raw: str, where: str) -> Prompt:
    """A JSON line {"prompt": ..., "category": ...} (category optional)."""
    try:
        row = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: a nesting bomb deeper than the parser allows
        row = None
    category = row.get("category") if isinstance(row, dict) else None
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip() \
            or not isinstance(category, (str, type(None))):
        raise BundleError("usage", f"{where}: expected a JSON line {{\"prompt\": \"...\", \"category\": \"...\"}} (strings)")
    try:  # "\ud800" parses to a lone surrogate, which no tokenizer takes
        row["prompt"].encode("utf-8"), (category or "").encode("utf-8")
    except UnicodeEncodeError:
        raise BundleError("usage", f"{where}: a string holds a lone surrogate (not UTF-8 text)") from None
    return Prompt(row["prompt"], category or DEFAULT_CATEGORY)


def read_prompts(name_or_path: str | None = None, default: str = "open") -> list[Prompt]:
    """The prompts of a shipped set (by name) or of a file; None: the `default` set."""
    where, text = _source(name_or_path or default)
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    # JSON lines by name (.jsonl) or by look (a first line that opens an object); else one prompt a line
    json_lines = where.endswith(".jsonl") or bool(lines and lines[0][1].lstrip().startswith("{"))
    prompts = [_json_line(line, f"{where}:{n}") if json_lines else Prompt(line.strip(), DEFAULT_CATEGORY) for n, line in lines]
    if not prompts:
        raise BundleError("usage", f"{where} holds no prompts")
    return prompts


def categories(prompts: Sequence[Prompt]) -> dict[str, list[int]]:
    """category -> the indexes of its prompts, in first-seen order."""
    out: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        out.setdefault(p.category, []).append(i)
    return out
