"""The one place chat templates are rendered: jinja2's sandbox, as transformers renders them, within bounds.

A chat template comes from a bundle someone else signed (tokenizer_config.json, chat_template.jinja, a GGUF
file's `tokenizer.chat_template`), so it is untrusted code. jinja2's sandbox keeps it away from Python's
internals but not from the machine's time and memory: `{% for a in range(99999) %}{% for b in range(99999) %}`
runs for hours, `{{ 'x' * 10**10 }}` takes 10 GB. Here every render is bounded:

- steps: every loop iteration and every call the template makes (macros and recursive loops included) is
  counted; the template's syntax tree is rewritten at compile time so that each `for` iterates through a
  counter; over MAX_STEPS, or over the time limit, the render stops. With no loop or call, a template runs
  a number of operations bounded by its own length;
- sizes: `*`, `**`, `%`, `+`, `~`, filters, method calls and printed values are checked for the size of what
  they would make *before* they run (a single C-level operation cannot be interrupted once started);
- output: at most `output_limit` characters, counted as the template yields them.

Over a bound, and on any sandbox violation or template error, `render` raises TemplateRefused (a
BundleError `invalid-bundle`: exit 6 for run, a 400 in serve). The environment matches transformers'
(trim_blocks, lstrip_blocks, loopcontrols, raise_exception, strftime_now, its tojson, `{% generation %}`).
"""

from __future__ import annotations

__all__ = ["MAX_TEMPLATE_CHARS", "TemplateRefused", "chat_ids", "render"]

import functools
import json
import re
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from core.errors import BundleError

# Why these numbers: a real chat template (Llama 3, Qwen, SmolLM) runs a few dozen lines per message and a
# few kB of its own text; the bounds sit orders of magnitude above that and orders below what hurts a server.
MAX_TEMPLATE_CHARS = 256 << 10
MAX_STEPS = 2_000_000  # loop iterations and calls
TIME_LIMIT_S = 5.0
OUTPUT_BASE_CHARS = 1 << 20  # the template's own text; the messages are added (twice: a template may repeat them)
MAX_INT_BITS = 1 << 16  # integers a template computes (2**65536 is far past any count a template needs)
MAX_FORMAT_WIDTH = 10_000  # a width or precision in a format string (`%9999999d`, `{:>9999999}`)


class TemplateRefused(BundleError):
    """A chat template that failed to render, broke the sandbox or went over a bound."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid-bundle", f"chat template: {message}")


class _OverBound(Exception):
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


def _size(value: Any, limit: int) -> int:
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
            raise _OverBound(f"a format width over {MAX_FORMAT_WIDTH} (or taken from an argument)")


def _check_percent(fmt: str) -> None:
    """`fmt % args`: a width or precision over MAX_FORMAT_WIDTH, or one taken from an argument (`*`), makes
    any length from one short argument."""
    _check_widths(w for m in _PERCENT.finditer(fmt) for w in m.groups())


def _check_format(fmt: str) -> None:
    """`fmt.format(...)`: the same, for the widths in its format specs (`{:>999999999}`, `{:{}}`)."""
    import string

    try:
        specs = [spec for _, _, spec, _ in string.Formatter().parse(fmt) if spec]
    except ValueError:
        return  # format() itself refuses it
    for spec in specs:
        if "{" in spec:
            raise _OverBound("a format width taken from an argument")
        _check_widths(re.findall(r"\d+", spec))


class _Bounds:
    """The budget of one render: steps, deadline and the largest value it may make."""

    def __init__(self, value_limit: int, max_steps: int, time_limit_s: float) -> None:
        self.value_limit, self.max_steps = value_limit, max_steps
        self.deadline = time.monotonic() + time_limit_s
        self.steps = 0

    def check_size(self, estimate: int, what: str) -> None:
        if estimate > self.value_limit:
            raise _OverBound(f"{what} would make more than {self.value_limit} characters")

    def estimate_call(self, subject: Any, args: Iterable[Any]) -> int:
        """An upper bound on what a call on subject with args makes: padding, indenting, replacing and
        joining all grow at most by subject length x (1 + the numbers and lengths of the arguments)."""
        grow = 1
        for arg in args:
            if isinstance(arg, bool):
                continue
            if isinstance(arg, int):
                if arg.bit_length() > 62:
                    raise _OverBound("an integer argument too large")
                grow += abs(arg)
            else:
                grow += _size(arg, self.value_limit)
            if grow > self.value_limit:
                break
        return (_size(subject, self.value_limit) + 1) * grow

    def tick(self) -> None:
        """One step (a loop iteration, a call): over MAX_STEPS or the deadline, the render stops."""
        self.steps += 1
        if self.steps > self.max_steps:
            raise _OverBound(f"more than {self.max_steps} steps (a loop too long)")
        if not self.steps & 1023 and time.monotonic() > self.deadline:
            raise _OverBound("over the time limit")


_CURRENT = threading.local()  # the bounds of the render running on this thread (serve renders on several)
COUNTED, CONCAT = "_bounded_iteration", "_bounded_concat"  # filter names of the rewritten tree


def _current() -> _Bounds:
    bounds = getattr(_CURRENT, "bounds", None)
    return bounds if bounds is not None else _Bounds(OUTPUT_BASE_CHARS, MAX_STEPS, TIME_LIMIT_S)


def _counted(iterable: Any) -> Any:
    """What every `for` of a template iterates through (see _counting): one step per item."""
    bounds = _current()
    for item in iterable:
        bounds.tick()
        yield item


def _concat(parts: list[Any]) -> str:
    """`a ~ b ~ c` (jinja2's str_join), sized before it is made: doubling a string in a loop stops here."""
    bounds = _current()
    bounds.check_size(sum(_size(p, bounds.value_limit) for p in parts), "a `~` concatenation")
    return "".join(map(str, parts))


def _counting() -> Any:
    """A syntax-tree pass: each `for` iterates through `_counted`, each `~` is `_concat` (both as filters)."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    class Counting(NodeTransformer):
        def visit_For(self, node: Any) -> Any:  # noqa: N802 - jinja2's visitor names
            self.generic_visit(node)
            node.iter = nodes.Filter(node.iter, COUNTED, [], [], None, None, lineno=node.lineno)
            return node

        def visit_Concat(self, node: Any) -> Any:  # noqa: N802
            self.generic_visit(node)
            return nodes.Filter(nodes.List(node.nodes, lineno=node.lineno), CONCAT, [], [], None, None, lineno=node.lineno)

    return Counting()


def _generation() -> type:
    """transformers' `{% generation %}...{% endgeneration %}` (it marks assistant tokens for a training mask):
    here the body renders as it is."""
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return Generation


@functools.lru_cache(maxsize=1)
def _environment_class() -> type:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """transformers' sandboxed environment, with every operation that could make a large value checked
        against the current render's bounds first."""

        intercepted_binops = frozenset(["*", "**", "%", "+"])

        def _bounds(self) -> _Bounds:
            return _current()

        def _parse(self, source: str, name: str | None, filename: str | None) -> Any:
            return _counting().visit(super()._parse(source, name, filename))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            b = self._bounds()
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
                if max(left.bit_length(), 1) * right > MAX_INT_BITS:
                    raise _OverBound(f"an integer power over {MAX_INT_BITS} bits")
            elif operator == "*":
                if isinstance(left, int) and isinstance(right, int):
                    if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                        raise _OverBound(f"an integer product over {MAX_INT_BITS} bits")
                elif isinstance(left, int) or isinstance(right, int):
                    count, seq = (left, right) if isinstance(left, int) else (right, left)
                    b.check_size(_size(seq, b.value_limit) * max(count, 0), "a repetition (`*`)")
            elif operator == "%" and isinstance(left, str):
                _check_percent(left)
                b.check_size(b.estimate_call(left, right if isinstance(right, tuple) else [right]), "a `%` format")
            elif operator == "+" and not (isinstance(left, (int, float)) and isinstance(right, (int, float))):
                b.check_size(_size(left, b.value_limit) + _size(right, b.value_limit), "a `+`")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja2's signature
            b = __self._bounds()
            b.tick()  # a macro calling itself twice runs 2**n calls with no loop
            # str.format comes wrapped by the sandbox (its format_string); the method itself is __wrapped__
            subject = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
            if isinstance(subject, str):  # a str method: 'x'.center(10**9), fmt.format(...), sep.join(...)
                if getattr(getattr(__obj, "__wrapped__", __obj), "__name__", "") in ("format", "format_map"):
                    _check_format(subject)
                b.check_size(b.estimate_call(subject, [*args, *kwargs.values()]), f"str.{getattr(__obj, '__name__', '?')}")
            return super().call(__context, __obj, *args, **kwargs)

    return BoundedEnvironment


def _bounded_filter(environment: Any, name: str, f: Any) -> Any:
    """A builtin filter checked before it runs: `|center(10**9)`, `|indent`, `|replace('', s)`, `|string` on a
    list that nests shared parts: the estimate of what it makes is within the render's value limit."""
    pass_arg = getattr(f, "jinja_pass_arg", None)

    @functools.wraps(f)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        b = environment._bounds()
        values = args[1:] if pass_arg is not None else args
        if values:
            if name == "format" and isinstance(values[0], str):  # `fmt|format(...)` is `fmt % (...)`
                _check_percent(values[0])
            b.check_size(b.estimate_call(values[0], [*values[1:], *kwargs.values()]), f"the filter {name}")
        return f(*args, **kwargs)

    return bounded


def _finalize(environment: Any) -> Any:
    def finalize(value: Any) -> Any:
        b = environment._bounds()
        if not isinstance(value, str):  # a printed container: str() of it must stay within the limit
            b.check_size(_size(value, b.value_limit), "a printed value")
        return value

    return finalize


@functools.lru_cache(maxsize=8)
def _compiled(source: str) -> tuple[Any, Any]:
    """The environment and the compiled template (cached: serve renders the same template for every request)."""
    import jinja2.ext

    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateRefused(f"{len(source)} characters, more than the {MAX_TEMPLATE_CHARS} allowed")
    env = _environment_class()(trim_blocks=True, lstrip_blocks=True,
                               extensions=[jinja2.ext.loopcontrols, _generation()])
    env.finalize = _finalize(env)

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(str(message)[:500])

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.filters = {name: _bounded_filter(env, name, f) for name, f in env.filters.items()}
    env.filters.update({COUNTED: _counted, CONCAT: _concat})  # they bound themselves
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(str(fmt)[:100])
    env.globals.pop("lipsum", None)  # lorem ipsum of any length; no chat template needs it
    try:
        template = env.from_string(source)
    except jinja2.exceptions.TemplateError as exc:
        raise TemplateRefused(f"does not compile: {type(exc).__name__}: {exc}"[:300]) from None
    except _OverBound as exc:  # jinja2 folds constant parts while compiling: a bound may be crossed there
        raise TemplateRefused(str(exc)) from None
    except (RecursionError, MemoryError, ValueError, OverflowError) as exc:
        raise TemplateRefused(f"does not compile: {type(exc).__name__}") from None
    return env, template


def output_limit(messages: list[dict[str, Any]]) -> int:
    """Characters a render may make: room for the messages twice over, plus the template's own text."""
    return OUTPUT_BASE_CHARS + 2 * sum(_size(m, 1 << 40) for m in messages)


def render(source: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
           variables: Mapping[str, Any] | None = None, max_steps: int = MAX_STEPS,
           time_limit_s: float = TIME_LIMIT_S) -> str:
    """The template rendered for messages as transformers' apply_chat_template renders it (tools and
    documents None, the named special tokens in `variables`), or TemplateRefused."""
    import jinja2

    env, template = _compiled(source)
    limit = output_limit(messages)
    bounds = _Bounds(4 * limit, max_steps, time_limit_s)
    context = {**(variables or {}), "messages": messages, "tools": None, "documents": None,
               "add_generation_prompt": add_generation_prompt}
    pieces: list[str] = []
    made = 0
    _CURRENT.bounds = bounds
    try:
        for piece in template.generate(**context):
            made += len(piece)
            if made > limit:
                raise _OverBound(f"more than {limit} characters of output")
            pieces.append(piece)
    except _OverBound as exc:
        raise TemplateRefused(str(exc)) from None
    except jinja2.exceptions.SecurityError as exc:
        raise TemplateRefused(f"refused by the sandbox: {exc}"[:300]) from None
    except jinja2.exceptions.TemplateError as exc:
        raise TemplateRefused(f"{type(exc).__name__}: {exc}"[:300]) from None
    except (RecursionError, MemoryError, OverflowError) as exc:
        raise TemplateRefused(f"{type(exc).__name__} while rendering") from None
    except Exception as exc:  # noqa: BLE001 - any error a template raises is the template's, not ours
        raise TemplateRefused(f"{type(exc).__name__} while rendering: {exc}"[:300]) from None
    finally:
        _CURRENT.bounds = None
    return "".join(pieces)


def template_of(tokenizer: Any) -> str | None:
    """The tokenizer's chat template source (transformers keeps several under names: "default" is the one
    apply_chat_template takes), or None."""
    source = getattr(tokenizer, "chat_template", None)
    if isinstance(source, Mapping):
        source = source.get("default")
    return source if isinstance(source, str) and source else None


def chat_ids(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
    """What `tokenizer.apply_chat_template(messages, add_generation_prompt=..., tokenize=True)` gives, for a
    transformers tokenizer or a LeanTokenizer, with the template rendered here (bounded) instead: the text
    rendered with the tokenizer's named special tokens, then encoded without special tokens added."""
    source = template_of(tokenizer)
    if source is None:
        raise TemplateRefused("this tokenizer has no chat template")
    special = getattr(tokenizer, "special_tokens_map", None) or {}
    variables = {k: v for k, v in special.items() if isinstance(v, (str, list))}
    text = render(source, [{k: v for k, v in m.items() if v is not None} for m in messages],
                  add_generation_prompt=add_generation_prompt, variables=variables)
    ids = tokenizer(text, add_special_tokens=False)
    if isinstance(ids, Mapping) or hasattr(ids, "keys"):  # transformers returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
