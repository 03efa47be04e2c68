"""The prompt sets bench and tune read: the shipped ones by name (open questions; input-grounded tasks,
held out and for tuning, kept apart) or a user's file (JSON lines with "prompt" and an optional
"category", or plain text with one prompt a line)."""

from __future__ import annotations

__all__ = ["PROMPT_SETS", "Prompt", "categories", "read_prompts"]

import importlib.resources
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import BundleError

# name -> data file in this package. "grounded" is held out: tune never reads it unless asked to check.
PROMPT_SETS = {
    "open": "prompts.jsonl",  # open questions and requests: the text to come is not in the prompt
    "grounded": "grounded.jsonl",  # edit, rewrite, extract, answer from a text, quote earlier turns
    "grounded-tuning": "grounded-tuning.jsonl",  # the same kinds of task, other texts: tune's default
}
DEFAULT_CATEGORY = "user"  # a prompt of a user's file that names none


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
    path = Path(name_or_path)
    if not path.is_file():
        raise BundleError("usage", f"--prompts {name_or_path!r} is neither a prompt set ({', '.join(PROMPT_SETS)}) nor a file")
    try:
        return str(path), path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BundleError("usage", f"{path} is not UTF-8 text") from None


def _json_line(raw: str, where: str) -> Prompt:
    """A JSON line {"prompt": ..., "category": ...} (category optional)."""
    try:
        row = json.loads(raw)
    except ValueError:
        row = None
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
        raise BundleError("usage", f"{where}: expected a JSON line {{\"prompt\": \"...\", \"category\": \"...\"}}")
    return Prompt(row["prompt"], str(row.get("category") or DEFAULT_CATEGORY))


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
