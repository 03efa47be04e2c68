"""The one place chat templates are rendered: jinja2's sandbox, as transformers renders them, within bounds.

A chat template comes from a bundle someone else signed (tokenizer_config.json, chat_template.jinja, a GGUF
file's `tokenizer.chat_template`), so it is untrusted code. jinja2's sandbox keeps it away from Python's
internals but not from the machine's time and memory: `{% for a in range(99999) %}{% for b in range(99999) %}`
runs for hours, `{{ 'x' * 10**10 }}` takes 10 GB. Here every render is bounded: its steps, time and the size of
each value it makes (`template_bounds.py`, checked from inside the sandbox, `template_sandbox.py`), and its
output, at most `output_limit` characters, counted as the template yields them. With no loop or call, a template
runs a number of operations bounded by its own length.

Over a bound, and on any sandbox violation or template error, `render` raises TemplateRefused (a
BundleError `invalid-bundle`: exit 6 for run, a 400 in serve).
"""

from __future__ import annotations

__all__ = ["MAX_TEMPLATE_CHARS", "TemplateRefused", "chat_ids", "render"]

import functools
from collections.abc import Mapping
from typing import Any

from core.errors import BundleError
from runner.models.template_bounds import MAX_STEPS, OUTPUT_BASE_CHARS, TIME_LIMIT_S, Bounds, OverBound, in_force, size_of
from runner.models.template_sandbox import environment

# A real chat template is a few kB of its own text; this sits orders of magnitude above that.
MAX_TEMPLATE_CHARS = 256 << 10


class TemplateRefused(BundleError):
    """A chat template that failed to render, broke the sandbox or went over a bound."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid-bundle", f"chat template: {message}")


@functools.lru_cache(maxsize=8)
def _compiled(source: str) -> tuple[Any, Any]:
    """The environment and the compiled template (cached: serve renders the same template for every request)."""
    import jinja2

    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateRefused(f"{len(source)} characters, more than the {MAX_TEMPLATE_CHARS} allowed")
    env = environment()
    try:
        template = env.from_string(source)
    except jinja2.exceptions.TemplateError as exc:
        raise TemplateRefused(f"does not compile: {type(exc).__name__}: {exc}"[:300]) from None
    except OverBound as exc:  # jinja2 folds constant parts while compiling: a bound may be crossed there
        raise TemplateRefused(str(exc)) from None
    except (RecursionError, MemoryError, ValueError, OverflowError) as exc:
        raise TemplateRefused(f"does not compile: {type(exc).__name__}") from None
    return env, template


def output_limit(messages: list[dict[str, Any]]) -> int:
    """Characters a render may make: room for the messages twice over, plus the template's own text."""
    return OUTPUT_BASE_CHARS + 2 * sum(size_of(m, 1 << 40) for m in messages)


def render(source: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
           variables: Mapping[str, Any] | None = None, max_steps: int = MAX_STEPS,
           time_limit_s: float = TIME_LIMIT_S) -> str:
    """The template rendered for messages as transformers' apply_chat_template renders it (tools and
    documents None, the named special tokens in `variables`), or TemplateRefused."""
    import jinja2

    env, template = _compiled(source)
    limit = output_limit(messages)
    bounds = Bounds(4 * limit, max_steps, time_limit_s)
    context = {**(variables or {}), "messages": messages, "tools": None, "documents": None,
               "add_generation_prompt": add_generation_prompt}
    pieces: list[str] = []
    made = 0
    with in_force(bounds):
        try:
            for piece in template.generate(**context):
                made += len(piece)
                if made > limit:
                    raise OverBound(f"more than {limit} characters of output")
                pieces.append(piece)
        except OverBound as exc:
            raise TemplateRefused(str(exc)) from None
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateRefused(f"refused by the sandbox: {exc}"[:300]) from None
        except jinja2.exceptions.TemplateError as exc:
            raise TemplateRefused(f"{type(exc).__name__}: {exc}"[:300]) from None
        except (RecursionError, MemoryError, OverflowError) as exc:
            raise TemplateRefused(f"{type(exc).__name__} while rendering") from None
        except Exception as exc:  # noqa: BLE001 - any error a template raises is the template's, not ours
            raise TemplateRefused(f"{type(exc).__name__} while rendering: {exc}"[:300]) from None
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
