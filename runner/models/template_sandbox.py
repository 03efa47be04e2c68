"""jinja2's sandbox as transformers sets it up for chat templates, with every operation that could run long or
make a large value checked against the current render's bounds (`template_bounds.py`) before it runs.

The template's syntax tree is rewritten at compile time so that each `for` iterates through a step counter and
each `~` is sized first; `*`, `**`, `%`, `+`, calls (str methods included), filters and printed values are
checked as they come. The environment matches transformers' (trim_blocks, lstrip_blocks, loopcontrols,
raise_exception, strftime_now, its tojson, `{% generation %}`); jinja2's `lipsum` is left out.
"""

from __future__ import annotations

__all__ = ["environment"]

import functools
import json
from datetime import datetime
from typing import Any

from runner.models.template_bounds import (
    MAX_INT_BITS, Bounds, OverBound, check_format, check_percent, current, size_of,
)

COUNTED, CONCAT = "_bounded_iteration", "_bounded_concat"  # filter names of the rewritten tree


def _counted(iterable: Any) -> Any:
    """What every `for` of a template iterates through (see _counting): one step per item."""
    bounds = current()
    for item in iterable:
        bounds.tick()
        yield item


def _concat(parts: list[Any]) -> str:
    """`a ~ b ~ c` (jinja2's str_join), sized before it is made: doubling a string in a loop stops here."""
    bounds = current()
    bounds.check_size(sum(size_of(p, bounds.value_limit) for p in parts), "a `~` concatenation")
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

        def _bounds(self) -> Bounds:
            return current()

        def _parse(self, source: str, name: str | None, filename: str | None) -> Any:
            return _counting().visit(super()._parse(source, name, filename))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            b = self._bounds()
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
                if max(left.bit_length(), 1) * right > MAX_INT_BITS:
                    raise OverBound(f"an integer power over {MAX_INT_BITS} bits")
            elif operator == "*":
                if isinstance(left, int) and isinstance(right, int):
                    if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                        raise OverBound(f"an integer product over {MAX_INT_BITS} bits")
                elif isinstance(left, int) or isinstance(right, int):
                    count, seq = (left, right) if isinstance(left, int) else (right, left)
                    b.check_size(size_of(seq, b.value_limit) * max(count, 0), "a repetition (`*`)")
            elif operator == "%" and isinstance(left, str):
                check_percent(left)
                b.check_size(b.estimate_call(left, right if isinstance(right, tuple) else [right]), "a `%` format")
            elif operator == "+" and not (isinstance(left, (int, float)) and isinstance(right, (int, float))):
                b.check_size(size_of(left, b.value_limit) + size_of(right, b.value_limit), "a `+`")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja2's signature
            b = __self._bounds()
            b.tick()  # a macro calling itself twice runs 2**n calls with no loop
            # str.format comes wrapped by the sandbox (its format_string); the method itself is __wrapped__
            subject = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
            if isinstance(subject, str):  # a str method: 'x'.center(10**9), fmt.format(...), sep.join(...)
                if getattr(getattr(__obj, "__wrapped__", __obj), "__name__", "") in ("format", "format_map"):
                    check_format(subject)
                b.check_size(b.estimate_call(subject, [*args, *kwargs.values()]), f"str.{getattr(__obj, '__name__', '?')}")
            return super().call(__context, __obj, *args, **kwargs)

    return BoundedEnvironment


def _bounded_filter(env: Any, name: str, f: Any) -> Any:
    """A builtin filter checked before it runs: `|center(10**9)`, `|indent`, `|replace('', s)`, `|string` on a
    list that nests shared parts: the estimate of what it makes is within the render's value limit."""
    pass_arg = getattr(f, "jinja_pass_arg", None)

    @functools.wraps(f)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        b = env._bounds()
        values = args[1:] if pass_arg is not None else args
        if values:
            if name == "format" and isinstance(values[0], str):  # `fmt|format(...)` is `fmt % (...)`
                check_percent(values[0])
            b.check_size(b.estimate_call(values[0], [*values[1:], *kwargs.values()]), f"the filter {name}")
        return f(*args, **kwargs)

    return bounded


def _finalize(env: Any) -> Any:
    def finalize(value: Any) -> Any:
        b = env._bounds()
        if not isinstance(value, str):  # a printed container: str() of it must stay within the limit
            b.check_size(size_of(value, b.value_limit), "a printed value")
        return value

    return finalize


def environment() -> Any:
    """A bounded sandboxed environment with transformers' extensions, filters and globals, every builtin
    filter checked before it runs."""
    import jinja2.ext

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
    return env
