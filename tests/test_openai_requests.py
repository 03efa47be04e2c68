"""bundler.serve.openai_requests on its own: what a body may be, every field checked for type and range, the
prompt measured in bytes before it is tokenized, and its ids checked against the context. Each refusal is an
ApiError 400 in OpenAI's shape, naming the field; nothing here needs a server."""

from __future__ import annotations

import pytest

from bundler.serve.api_error import ApiError
from bundler.serve.openai_requests import CompletionRequest, check_prompt_bytes, parse_body, parse_request, prompt_ids
from runner.checks.context_window import prompt_byte_limit
from tests.tinymodels import train_tokenizer, write_tokenizer

CHAT = {"messages": [{"role": "user", "content": "hello"}]}


def _parse(body: dict, chat: bool = True) -> CompletionRequest:
    return parse_request(body, chat=chat, max_new_tokens=1024, default_max_tokens=256 if chat else 16)


def _refused(call, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as refused:
        call(*args, **kwargs)
    assert refused.value.status == 400 and set(refused.value.body()["error"]) == {"message", "type", "param", "code"}
    return refused.value


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"[1, 2]", b"{\"a\": NaN}", b"{\"a\": 1e999}", b"{\"a\": \"\\ud800\"}",
                                 b"{" * 40 + b"}" * 40, b"{\"a\": " + b"[" * 40 + b"]" * 40 + b"}", b"not json"])
def test_a_body_that_is_not_a_bounded_utf8_json_object_is_refused(raw: bytes) -> None:
    _refused(parse_body, raw)


def test_a_body_within_the_bounds_parses() -> None:
    assert parse_body(b"{\"prompt\": \"caf\\u00e9\", \"max_tokens\": 3}") == {"prompt": "café", "max_tokens": 3}


def test_defaults_are_openais() -> None:
    chat, completion = _parse(CHAT), _parse({"prompt": "hi"}, chat=False)
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.seed, chat.stop, chat.stream) == (256, 1.0, 1.0, None, [], False)
    assert completion.max_tokens == 16 and completion.prompt == "hi" and completion.model is None


@pytest.mark.parametrize("field, param", [
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 1025}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
    ({"max_completion_tokens": 2000}, "max_completion_tokens"), ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"seed": -1}, "seed"), ({"seed": 2**63}, "seed"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": [""]}, "stop"), ({"stream": "yes"}, "stream"), ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"n": 2}, "n"), ({"logprobs": True}, "logprobs"), ({"tools": [{}]}, "tools"), ({"model": 3}, "model"),
    ({"presence_penalty": 3}, "presence_penalty"), ({"logit_bias": {"1": 2}}, "logit_bias"),
])
def test_each_field_out_of_type_or_range_is_a_400_naming_it(field: dict, param: str) -> None:
    assert _refused(_parse, {**CHAT, **field}).param == param


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "robot", "content": "x"}], [{"role": "user", "content": 3}],
                                      [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
                                      [{"role": "user", "content": "x", "name": 5}]])
def test_messages_must_be_text_with_a_known_role(messages) -> None:
    assert _refused(_parse, {"messages": messages}).param == "messages"


def test_text_content_parts_are_joined_and_the_model_name_is_kept() -> None:
    parts = [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]
    req = _parse({"messages": [{"role": "user", "content": parts}], "model": "my-isvc", "stop": "\n", "stream": True,
                  "stream_options": {"include_usage": True}})
    assert req.messages == [{"role": "user", "content": "hello"}] and req.model == "my-isvc"
    assert req.stop == ["\n"] and req.stream and req.include_usage


def test_a_prompt_is_one_string() -> None:
    assert _parse({"prompt": ["one"]}, chat=False).prompt == "one"
    for prompt in (["a", "b"], [1, 2], None):
        assert _refused(_parse, {"prompt": prompt}, chat=False).param == "prompt"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    """A LoadedPair holding a real tokenizer (the tiny models' byte-level BPE with a chat template); the requests'
    functions read only its tokenizer."""
    from transformers import AutoTokenizer

    from runner.pair import LoadedPair

    directory = write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer", train_tokenizer())
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    return LoadedPair(tokenizer=tokenizer, target=None, draft=None, params={}, fingerprint="sha256:0", eos_ids=set(),
                      vocab_size=None, device="cpu", dtype="float32", draft_tokens=3, pairing={}, memory={}, context_tokens=64)


def test_a_prompt_longer_than_any_fitting_one_is_refused_by_its_bytes_untokenized(pair) -> None:
    limit = prompt_byte_limit(pair.tokenizer, 8)
    assert limit is not None and limit >= 8
    check_prompt_bytes(_parse({"prompt": "x" * limit}, chat=False), limit, 8)
    refused = _refused(check_prompt_bytes, _parse({"prompt": "x" * (limit + 1)}, chat=False), limit, 8)
    assert refused.code == "context_length_exceeded"


def test_prompt_ids_follow_the_chat_template_and_the_token_limit(pair) -> None:
    raw = prompt_ids(pair, _parse({"prompt": "hello there"}, chat=False), 64)
    assert raw == pair.tokenizer("hello there", add_special_tokens=False)["input_ids"]
    chat = prompt_ids(pair, _parse(CHAT), 64)
    assert len(chat) > len(pair.tokenizer("hello", add_special_tokens=False)["input_ids"])  # the template's own tokens
    assert _refused(prompt_ids, pair, _parse({"prompt": "hello there, " * 20}, chat=False), 8).code == "context_length_exceeded"
    assert _refused(prompt_ids, pair, _parse({"prompt": ""}, chat=False), 8).param == "prompt"

