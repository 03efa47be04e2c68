"""The OpenAI requests `bundle serve` takes: the body parsed within bounds, every field checked, the prompt
measured and turned into ids. A request that fails here is a 400 and never reaches the decoding queue.

What a body may be: UTF-8 (no lone surrogates, escaped or not), JSON nesting at most MAX_DEPTH deep, finite
numbers, integers within the ranges below, the fields OpenAI names with the types OpenAI documents. A prompt
is measured in bytes before it is tokenized: no prompt longer than the context can hold is tokenized at all;
its ids and max_tokens together fit the model's own window (its config's or GGUF header's), whatever the server
was sized for.
"""

from __future__ import annotations

__all__ = [
    "CompletionRequest", "DEFAULT_MAX_BODY", "check_prompt_bytes", "parse_body", "parse_request",
    "prompt_ids", "prompt_token_limit",
]

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from bundler.serve.api_error import ApiError
from runner.pair import LoadedPair

DEFAULT_MAX_BODY = 1 << 20  # `--max-body`: 1 MiB holds any prompt the served context takes
MAX_DEPTH = 32  # a chat body nests 6 deep (body, messages, message, content, part, text)
MAX_SEED = 2**63 - 1  # OpenAI's seed is an int64; torch and llama.cpp take it as such
ROLES = ("system", "user", "assistant")
UNSUPPORTED = {"logprobs": "logprobs", "top_logprobs": "logprobs", "tools": "tools", "tool_choice": "tools",
               "functions": "tools", "function_call": "tools", "best_of": "best_of", "suffix": "suffix", "echo": "echo"}


@dataclass
class CompletionRequest:
    """A checked request: exactly one of prompt (completions) and messages (chat) is set."""

    chat: bool
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    prompt: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    model: str | None = None  # as the client named it (any name is served: one model runs)

    def prompt_bytes(self) -> int:
        if not self.chat:
            return len(self.prompt.encode("utf-8"))
        return sum(len(m["content"].encode("utf-8")) for m in self.messages)


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("a number out of range")
    return value


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object: strict UTF-8, finite numbers, no lone surrogates, at most MAX_DEPTH deep."""
    try:
        text = raw.decode("utf-8")
        body = json.loads(text, parse_constant=_reject_constant, parse_float=_finite)
    except UnicodeDecodeError:
        raise _bad("the body is not UTF-8") from None
    except RecursionError:
        raise _bad(f"the body nests more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, 1e999, an integer of more than 4300 digits
        raise _bad(f"the body is not valid JSON: {str(exc)[:120]}") from None
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    _check_tree(body)
    return body


def _check_tree(value: Any) -> None:
    """Depth and strings of a parsed body, iteratively: `"\\ud800"` parses to a lone surrogate, which no
    tokenizer or response encoder takes."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise _bad("a string holds a lone surrogate (not UTF-8 text)") from None
        elif isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise _bad(f"the body nests more than {MAX_DEPTH} levels deep")
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _optional(body: Mapping[str, Any], key: str, check: Any, what: str) -> Any:
    value = body.get(key)
    if value is not None and not check(value):
        raise _bad(f"{key} must be {what}", param=key)
    return value


def parse_request(body: Mapping[str, Any], *, chat: bool, max_new_tokens: int, default_max_tokens: int) -> CompletionRequest:
    """Every field the server reads or refuses, checked for type and range; the request, or ApiError 400."""
    for key, what in UNSUPPORTED.items():
        value = body.get(key)
        if value not in (None, False, [], 0) and not (key == "best_of" and value == 1):
            raise ApiError(400, f"{what} is not supported by this server", param=key, code="unsupported_parameter")
    n = _optional(body, "n", _is_int, "an integer")
    if n not in (None, 1):
        raise ApiError(400, "n > 1 is not supported: one choice per request", param="n", code="unsupported_parameter")
    model = _optional(body, "model", lambda v: isinstance(v, str), "a string")
    _optional(body, "user", lambda v: isinstance(v, str), "a string")
    for key in ("presence_penalty", "frequency_penalty"):
        _optional(body, key, lambda v: _is_number(v) and -2 <= v <= 2, "a number from -2 to 2")
    _optional(body, "logit_bias", lambda v: isinstance(v, dict) and not v, "empty (logit_bias is not supported)")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _optional(body, key, lambda v: _is_int(v) and 1 <= v <= max_new_tokens, f"an integer from 1 to {max_new_tokens}")
    temperature = _optional(body, "temperature", lambda v: _is_number(v) and 0 <= v <= 2, "a number from 0 to 2")
    top_p = _optional(body, "top_p", lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]")
    seed = _optional(body, "seed", lambda v: _is_int(v) and 0 <= v <= MAX_SEED, f"an integer from 0 to {MAX_SEED}")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise _bad("stop must be a string or a list of up to 4 non-empty strings", param="stop")
    stream = bool(_optional(body, "stream", lambda v: isinstance(v, bool), "true or false"))
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise _bad("stream_options is only allowed with stream: true", param="stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"} \
                or not all(isinstance(v, bool) for v in options.values()):
            raise _bad("stream_options must be an object like {\"include_usage\": true}", param="stream_options")
    request = CompletionRequest(chat, max_tokens or default_max_tokens, 1.0 if temperature is None else float(temperature),
                                1.0 if top_p is None else float(top_p), seed, stop, stream,
                                bool((options or {}).get("include_usage")), model=model)
    if chat:
        request.messages = _messages(body.get("messages"))
    else:
        request.prompt = _prompt(body.get("prompt"))
    return request


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _bad("prompt must be one string (batches of prompts and token ids are not supported)", param="prompt")
    return prompt


def _messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", param="messages")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _bad(f"messages[{i}] needs a role ({', '.join(ROLES)})", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise _bad(f"messages[{i}]: only text content parts ({{\"type\": \"text\", \"text\": ...}}) are supported",
                           param="messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise _bad(f"messages[{i}] needs text content", param="messages")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise _bad(f"messages[{i}].name must be a string", param="messages")
        plain.append({"role": m["role"], "content": content})
    return plain


# -- the prompt, measured then tokenized (off the event loop: the caller runs prompt_ids in a thread) --------
def prompt_token_limit(pair: LoadedPair, cap: int) -> int:
    """The most tokens a prompt may have on this pair: `cap` (what the server was sized for), and at most the
    model's own window less one token to generate (runner.checks.context_window)."""
    window = pair.context_window
    return cap if window is None else max(1, min(cap, window - 1))


def check_prompt_bytes(request: CompletionRequest, byte_limit: int | None, max_prompt_tokens: int) -> None:
    """A 400 for a prompt too long to fit, found by its length alone (before any tokenizing)."""
    if byte_limit is not None and request.prompt_bytes() > byte_limit:
        raise ApiError(400, f"the prompt is {request.prompt_bytes()} bytes: more than {max_prompt_tokens} tokens "
                       f"whatever it says (at most {byte_limit} bytes are tokenized)", param="prompt",
                       code="context_length_exceeded")


def prompt_ids(pair: LoadedPair, request: CompletionRequest, max_prompt_tokens: int) -> list[int]:
    """The request's prompt as ids (chat through the bundle's bounded chat template), checked against the
    context. Slow (tokenizing, rendering): run it in a thread, never on the event loop."""
    from core.errors import BundleError

    try:
        ids = pair.chat_ids(request.messages) if request.chat else pair.prompt_ids(request.prompt, raw=True)
    except BundleError as exc:  # the bundle's chat template refused (runner.models.chat_template): the request's fault or the template's
        raise ApiError(400, exc.message, param="messages", code="invalid_chat_template") from None
    if not ids:  # an empty prompt (without a chat template): nothing to condition on
        raise ApiError(400, "the prompt has no tokens", param="prompt")
    if len(ids) > max_prompt_tokens:
        raise ApiError(400, f"the prompt has {len(ids)} tokens; this server takes at most {max_prompt_tokens}",
                       param="prompt", code="context_length_exceeded")
    window = pair.context_window
    if window is not None and len(ids) + request.max_tokens > window:
        raise ApiError(400, f"this model's maximum context length is {window} tokens; the prompt has {len(ids)} and "
                       f"max_tokens asks {request.max_tokens} more", param="max_tokens", code="context_length_exceeded")
    return ids
