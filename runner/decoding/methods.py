"""The ways a sequence's tokens may be proposed, as values: a `Method` says whether it runs the draft model
and whether it looks the text up (runner.decoding.ngram). Settings and Kitfiles name methods; everything past
`methods_named` holds the values, so no code compares method names. Torch-free (settings import it)."""

from __future__ import annotations

__all__ = ["ALL_METHODS", "DRAFT", "DRAFT_FREE_METHODS", "METHODS", "Method", "NGRAM", "NGRAM_DRAFT", "default_methods",
           "methods_named"]

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Method:
    """A way to propose tokens: by the draft model (`uses_draft`), by prompt lookup (`uses_lookup`), or
    lookup first with the draft model where it finds no match (both)."""

    name: str
    uses_draft: bool
    uses_lookup: bool

    def __str__(self) -> str:
        return self.name


DRAFT = Method("draft", uses_draft=True, uses_lookup=False)
NGRAM = Method("ngram", uses_draft=False, uses_lookup=True)
NGRAM_DRAFT = Method("ngram+draft", uses_draft=True, uses_lookup=True)
METHODS = {m.name: m for m in (DRAFT, NGRAM, NGRAM_DRAFT)}
# Every method a bundle with a draft model allows, in the order that breaks the guard's ties; and without one.
ALL_METHODS = (NGRAM_DRAFT.name, DRAFT.name, NGRAM.name)
DRAFT_FREE_METHODS = (NGRAM.name,)


def default_methods(has_draft: bool) -> tuple[str, ...]:
    """Every method a bundle's parts allow: all three with a draft model, prompt lookup alone without."""
    return ALL_METHODS if has_draft else DRAFT_FREE_METHODS


def methods_named(names: Iterable[str | Method], has_draft: bool) -> tuple[Method, ...]:
    """The methods a pair can run, in the order named: those needing the draft model only where it has one
    ("ngram+draft" is then "ngram"); ValueError for an unknown name."""
    out: list[Method] = []
    for name in names:
        method = name if isinstance(name, Method) else METHODS.get(name)
        if method is None:
            raise ValueError(f"unknown drafting method {name!r} (known: {', '.join(METHODS)})")
        if not has_draft:
            if not method.uses_lookup:
                continue
            method = NGRAM
        out.append(method)
    return tuple(dict.fromkeys(out))
