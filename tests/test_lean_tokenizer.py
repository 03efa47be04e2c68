"""runner.models.lean_tokenizer: the tokenizer `bundle run` uses without transformers gives transformers' own ids,
chat ids and text; anything transformers would change while loading goes to AutoTokenizer instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import processors
from transformers import AutoTokenizer

from runner.models.lean_tokenizer import LeanTokenizer, load_tokenizer
from runner.pair import prompt_ids as _prompt_ids
from runner.run import eos_ids as _eos_ids
from tests.tinymodels import BOS, EOS, SPECIAL_TOKENS, train_tokenizer, write_tokenizer

PROMPTS = [
    "the quick brown fox",
    "  two leading spaces\n\nnew lines, <|im_start|> and <|im_end|> typed in the prompt",
    "caf\u00e9 na\u00efve \u6771\u4eac \U0001f44d and an unseen \u2603",
    "",
    "x" * 200,
]
CHATS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again <|im_end|>", "name": None}],
]
# SmolLM2's template (the demo tokenizer's): loop.first, a default system prompt, string concatenation
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def trained():
    return train_tokenizer(320)


def _dir(tmp_path: Path, tokenizer, name: str = "tok", **config_changes) -> Path:
    directory = write_tokenizer(tmp_path / name, tokenizer)
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    for key, value in config_changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
    return directory


def _same_as_transformers(directory: Path) -> None:
    lean, theirs = load_tokenizer(directory), AutoTokenizer.from_pretrained(directory, local_files_only=True)
    assert isinstance(lean, LeanTokenizer)
    for prompt in PROMPTS:
        for raw in (False, True):
            ids = _prompt_ids(lean, prompt, raw)
            assert ids == _prompt_ids(theirs, prompt, raw), (prompt, raw)
            for skip in (True, False):
                assert lean.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    for chat in CHATS:
        want = theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"]
        assert lean.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"] == list(want)
        assert lean.apply_chat_template(chat, tokenize=False) == theirs.apply_chat_template(chat, tokenize=False)
    assert lean.eos_token_id == theirs.eos_token_id
    assert lean.special_tokens_map == theirs.special_tokens_map
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))  # the stop ids read it too
    assert _eos_ids(lean, directory) == _eos_ids(theirs, directory) == {SPECIAL_TOKENS.index(EOS)}


def test_the_test_tokenizer_gives_transformers_ids_chat_ids_and_text(tmp_path: Path, trained) -> None:
    _same_as_transformers(_dir(tmp_path, trained))


def test_the_demo_style_tokenizer_and_template_give_transformers_ids(tmp_path: Path, trained) -> None:
    """TokenizersBackend (as transformers 5 saves SmolLM2's), its chat template, an unk token, a special
    tokens map beside the config."""
    directory = _dir(tmp_path, trained, tokenizer_class="TokenizersBackend", chat_template=SMOL_TEMPLATE,
                     unk_token=SPECIAL_TOKENS[0], pad_token=EOS)
    (directory / "special_tokens_map.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS}))
    _same_as_transformers(directory)


def test_a_post_processor_that_adds_bos_is_applied_as_transformers_applies_it(tmp_path: Path, trained) -> None:
    bos = SPECIAL_TOKENS.index(BOS)
    with_bos = _with_post_processor(trained, processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]))
    directory = _dir(tmp_path, with_bos)
    _same_as_transformers(directory)
    assert load_tokenizer(directory)("hi")["input_ids"][0] == bos


def _with_post_processor(tokenizer, processor):
    """A copy of `tokenizer` with another post-processor."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.post_processor = processor
    return copy


def test_no_chat_template_encodes_the_prompt_as_it_is(tmp_path: Path, trained) -> None:
    directory = _dir(tmp_path, trained, chat_template=None)
    lean = load_tokenizer(directory)
    assert isinstance(lean, LeanTokenizer) and lean.chat_template is None
    assert _prompt_ids(lean, "the fox", raw=False) == _prompt_ids(AutoTokenizer.from_pretrained(directory), "the fox", raw=False)


@pytest.mark.parametrize("change", [
    {"tokenizer_class": "LlamaTokenizer"},
    {"add_bos_token": True},
    {"add_eos_token": False},
    {"split_special_tokens": True},
    {"eos_token": "<|not-in-the-file|>"},
    {"chat_template": [{"name": "default", "template": "{{ messages }}"}]},
    {"added_tokens_decoder": {"3": {"content": "<|extra|>", "special": True}}},
], ids=lambda c: next(iter(c)))
def test_what_transformers_would_change_goes_to_autotokenizer(tmp_path: Path, trained, change: dict) -> None:
    assert not isinstance(load_tokenizer(_dir(tmp_path, trained, **change)), LeanTokenizer)


@pytest.mark.parametrize("where", ["chat_template.jinja", "special_tokens_map.json", "truncation"])
def test_files_beside_the_config_that_transformers_reads_go_to_autotokenizer(tmp_path: Path, trained, where: str) -> None:
    directory = _dir(tmp_path, trained)
    if where == "chat_template.jinja":
        (directory / where).write_text("{{ messages[0]['content'] }}")
    elif where == "special_tokens_map.json":
        (directory / where).write_text(json.dumps({"eos_token": SPECIAL_TOKENS[0]}))
    else:
        data = json.loads((directory / "tokenizer.json").read_text())
        data["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
        (directory / "tokenizer.json").write_text(json.dumps(data))
    assert not isinstance(load_tokenizer(directory), LeanTokenizer)


def test_a_chat_template_cannot_reach_pythons_internals(tmp_path: Path, trained) -> None:
    from runner.models.chat_template import TemplateRefused

    lean = load_tokenizer(_dir(tmp_path, trained, chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}"))
    assert isinstance(lean, LeanTokenizer)
    with pytest.raises(TemplateRefused) as err:  # the sandbox's refusal, as a clean [invalid-bundle]
        lean.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert err.value.code == "invalid-bundle" and "sandbox" in err.value.message
