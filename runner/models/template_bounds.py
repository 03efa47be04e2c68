"""What one chat-template render may spend, and the checks that hold it to that: steps, time, and the size of
every value before it is made. `template_sandbox.py` calls these from inside jinja2; `chat_template.render` sets a
render's `Bounds` in force on its thread.

- steps: every loop iteration and every call the template makes (macros and recursive loops included) is
  counted (`Bounds.tick`); over MAX_STEPS, or over the time limit, the render stops;
- sizes: what `*`, `**`, `%`, `+`, `~`, filters, method calls and printed values would make is estimated
  (`size_of`, `Bounds.estimate_call`) and checked *before* they run (a single C-level operation cannot be
  interrupted once started), and so are format widths (`check_percent`, `check_format`).

Over a bound, `OverBound` is raised inside the render; `chat_template` turns it into TemplateRefused.
"""

from __future__ import annotations

__all__ = [
    "MAX_INT_BITS", "MAX_STEPS", "OUTPUT_BASE_CHARS", "TIME_LIMIT_S", "Bounds", "OverBound", "check_format",
    "check_percent", "current", "in_force", "size_of",
]

import contextlib
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

# Why these numbers: a real chat template (Llama 3, Qwen, SmolLM) runs a few dozen lines per message and a
# few kB of its own text; the bounds sit orders of magnitude above that and orders below what hurts a server.
MAX_STEPS = 2_000_000  # loop iterations and calls
TIME_LIMIT_S = 5.0
OUTPUT_BASE_CHARS = 1 << 20  # the template's own text; the messages are added (twice: a template may repeat them)
MAX_INT_BITS = 1 << 16  # integers a template computes (2**65536 is far past any count a template needs)
MAX_FORMAT_WIDTH = 10_000  # a width or precision in a format string (`%9999999d`, `{:>9999999}`)


class OverBound(Exception):
    """Raised inside a render when a bound is crossed; becomes TemplateRefused outside it. Not a subclass of
    the errors jinja2's runtime catches (AttributeError, TypeError, LookupError), so nothing swallows it."""


def _children(item: Any) -> list[Any] | None:
    """The parts str() of a container prints; None for a leaf."""
    if isinstance(item, Mapping):
        return [*item.keys(), *item.values()]
    if isinstance(item, (list, tuple, set, frozenset)):
        return list(item)
    attrs = getattr(item, "_Namespace__attrs", None)  # jinja2's namespace() prints its dict
    return [*attrs.keys(), *attrs.values()] if isinstance(attrs, dict) else None


def _leaf(item: Any) -> int:
    if isinstance(item, str):
        return len(item) + 2
    if isinstance(item, int):
        return item.bit_length() // 3 + 1
    return 8


def size_of(value: Any, limit: int) -> int:
    """The characters `str(value)` would have, roughly, counting shared parts each time they are printed
    (`[x, x]` nested 60 deep prints 2**60 leaves). Each object is sized once (memo by id), so a structure
    that is exponential in print is linear here; stops past limit. Iterative: no recursion to exhaust."""
    children = _children(value)
    if children is None:
        return _leaf(value)
    memo: dict[int, int] = {}
    stack: list[tuple[Any, list[Any] | None]] = [(value, None)]
    while stack:
        item, kids = stack[-1]
        if kids is None:  # first visit: size the children first
            kids = _children(item) or []
            stack[-1] = (item, kids)
            memo[id(item)] = 5  # in progress: a cycle prints as `[...]`
            stack.extend((k, None) for k in kids if _children(k) is not None and id(k) not in memo)
            continue
        stack.pop()
        total = 2 + 2 * len(kids)
        for k in kids:
            total += memo[id(k)] if id(k) in memo else _leaf(k)
            if total > limit:
                return total
        memo[id(item)] = total
    return memo[id(value)]


# A printf-style conversion (`%-08.3f`, `%*d`): its width and precision.
_PERCENT = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")


def _check_widths(widths: Iterable[str | None]) -> None:
    for width in widths:
        if width and (width == "*" or int(width) > MAX_FORMAT_WIDTH):
            raise OverBound(f"a format width over {MAX_FORMAT_WIDTH} (or taken from an argument)")


def check_percent(fmt: str) -> None:
    """`fmt % args`: a width or precision over MAX_FORMAT_WIDTH, or one taken from an argument (`*`), makes
    any length from one short argument."""
    _check_widths(w for m in _PERCENT.finditer(fmt) for w in m.groups())


def check_format(fmt: str) -> None:
    """`fmt.format(...)`: the same, for the widths in its format specs (`{:>999999999}`, `{:{}}`)."""
    import string

    try:
        specs = [spec for _, _, spec, _ in string.Formatter().parse(fmt) if spec]
    except ValueError:
        return  # format() itself refuses it
    for spec in specs:
        if "{" in spec:
            raise OverBound("a format width taken from an argument")
        _check_widths(re.findall(r"\d+", spec))


class Bounds:
    """The budget of one render: steps, deadline and the largest value it may make."""

    def __init__(self, value_limit: int, max_steps: int, time_limit_s: float) -> None:
        self.value_limit, self.max_steps = value_limit, max_steps
        self.deadline = time.monotonic() + time_limit_s
        self.steps = 0

    def check_size(self, estimate: int, what: str) -> None:
        if estimate > self.value_limit:
            raise OverBound(f"{what} would make more than {self.value_limit} characters")

    def estimate_call(self, subject: Any, args: Iterable[Any]) -> int:
        """An upper bound on what a call on subject with args makes: padding, indenting, replacing and
        joining all grow at most by subject length x (1 + the numbers and lengths of the arguments)."""
        grow = 1
        for arg in args:
            if isinstance(arg, bool):
                continue
            if isinstance(arg, int):
                if arg.bit_length() > 62:
                    raise OverBound("an integer argument too large")
                grow += abs(arg)
            else:
                grow += size_of(arg, self.value_limit)
            if grow > self.value_limit:
                break
        return (size_of(subject, self.value_limit) + 1) * grow

    def tick(self) -> None:
        """One step (a loop iteration, a call): over MAX_STEPS or the deadline, the render stops."""
        self.steps += 1
        if self.steps > self.max_steps:
            raise OverBound(f"more than {self.max_steps} steps (a loop too long)")
        if not self.steps & 1023 and time.monotonic() > self.deadline:
            raise OverBound("over the time limit")


_CURRENT = threading.local()  # the bounds of the render running on this thread (serve renders on several)


def current() -> Bounds:
    """The bounds of the render running on this thread (a fresh default budget outside a render)."""
    bounds = getattr(_CURRENT, "bounds", None)
    return bounds if bounds is not None else Bounds(OUTPUT_BASE_CHARS, MAX_STEPS, TIME_LIMIT_S)


@contextlib.contextmanager
def in_force(bounds: Bounds) -> Iterator[None]:
    """`bounds` are the current render's on this thread while the block runs, and none after it."""
    _CURRENT.bounds = bounds
    try:
        yield
    finally:
        _CURRENT.bounds = None
