"""The lean tokenizer is transformers, or it is not used (issue #24 item 7): seeded random tokenizer
directories (added tokens with random rstrip/lstrip/single_word/normalized/special flags in tokenizer.json
and in tokenizer_config.json's added_tokens_decoder, named and additional special tokens, a
special_tokens_map.json, other config keys) each give the lean path's ids equal to AutoTokenizer's on plain
text and on chat prompts, or the lean path is not taken.

SPECBUNDLE_TOKENIZER_CASES=2000 runs more cases than the default 60 (each with its own seed).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer
from transformers import AutoTokenizer

from core.errors import BundleError
from runner.models.lean_tokenizer import LeanTokenizer, load_tokenizer
from runner.pair import prompt_ids as _prompt_ids
from tests.tinymodels import BOS, EOS, PAD, SPECIAL_TOKENS, train_tokenizer, write_tokenizer

CASES = int(os.environ.get("SPECBUNDLE_TOKENIZER_CASES", "60"))
# candidate added tokens: a marker, one that looks like words, one with a space, one inside a word
CANDIDATES = ["<tool>", "quick", " [sep]", "ox", "<|x|>", "def"]
# keys transformers reads that change nothing here, and some that may change ids
OTHER_KEYS = [("model_max_length", 64), ("clean_up_tokenization_spaces", True), ("clean_up_tokenization_spaces", False),
              ("padding_side", "left"), ("add_prefix_space", True), ("add_prefix_space", False), ("vocab_size", 7),
              ("local_files_only", True), ("do_lower_case", True), ("legacy", False),
              ("image_token", "<tool>"), ("split_special_tokens", False)]
TEXTS = ["the quick brown fox", "a <tool> b<tool>c <tool>", "x [sep] y [sep]z", " quick quickly quick ",
         "box fox ox ox", "def add(a, b):\n    return a + b\n", f"{BOS}user\nhi{EOS} <|x|> {PAD}", "  ", ""]
CHATS = [[{"role": "user", "content": "the <tool> quick [sep] ox"}],
         [{"role": "system", "content": " def quick "}, {"role": "user", "content": f"hi {EOS}<|x|>"}]]


@pytest.fixture(scope="module")
def base() -> Tokenizer:
    return train_tokenizer(320)


def _flags(rng: random.Random) -> dict:
    return {"single_word": rng.random() < 0.25, "lstrip": rng.random() < 0.25, "rstrip": rng.random() < 0.25,
            "normalized": rng.random() < 0.5, "special": rng.random() < 0.5}


def make_case(base: Tokenizer, directory: Path, seed: int) -> dict:
    """A random tokenizer directory from `seed`; returns what was chosen (for the failure message)."""
    rng = random.Random(seed)
    tokenizer = Tokenizer.from_str(base.to_str())
    chosen: dict = {"seed": seed}
    if rng.random() < 0.5:  # the file's own special tokens with other flags
        for content in rng.sample(SPECIAL_TOKENS, rng.randint(1, 3)):
            flags = _flags(rng) | {"special": True}
            tokenizer.add_special_tokens([AddedToken(content, **{k: v for k, v in flags.items() if k != "special"})])
            chosen.setdefault("respecial", []).append((content, flags))
    for content in rng.sample(CANDIDATES, rng.randint(0, 3)):
        flags = _flags(rng)
        token = AddedToken(content, **{k: v for k, v in flags.items() if k != "special"})
        (tokenizer.add_special_tokens if flags["special"] else tokenizer.add_tokens)([token])
        chosen.setdefault("added", []).append((content, flags))
    write_tokenizer(directory, tokenizer)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
    decoder = {str(i): {"content": t.content, "single_word": t.single_word, "lstrip": t.lstrip, "rstrip": t.rstrip,
                        "normalized": t.normalized, "special": t.special}
               for i, t in backend.get_added_tokens_decoder().items()}
    if rng.random() < 0.6:  # added_tokens_decoder as transformers saves it, perhaps with one entry changed
        if decoder and rng.random() < 0.5:
            key = rng.choice(sorted(decoder))
            field = rng.choice(["single_word", "lstrip", "rstrip", "normalized", "special"])
            decoder[key][field] = not decoder[key][field]
            chosen["decoder_changed"] = (decoder[key]["content"], field)
        config["added_tokens_decoder"] = decoder
    added = [t.content for t in backend.get_added_tokens_decoder().values()]
    pool = added + rng.sample(CANDIDATES, 2)
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        roll = rng.random()
        if roll < 0.1:
            config[name] = rng.choice(pool)
        elif roll < 0.15:
            config[name] = {"__type": "AddedToken", "content": rng.choice(pool), **_flags(rng)}
        elif roll < 0.2:
            config.pop(name, None)
    if rng.random() < 0.4:
        key = rng.choice(["additional_special_tokens", "extra_special_tokens"])
        config[key] = rng.sample(added if rng.random() < 0.7 else pool, rng.randint(1, 2))
    if rng.random() < 0.2:
        name, value = rng.choice(OTHER_KEYS)
        config[name] = value
    config = {k: v for k, v in config.items() if v is not None}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    if rng.random() < 0.4:
        side = {name: config.get(name) for name in ("bos_token", "eos_token", "pad_token") if isinstance(config.get(name), str)}
        if rng.random() < 0.3:
            side[rng.choice(["eos_token", "unk_token", "additional_special_tokens"])] = (
                [rng.choice(pool)] if rng.random() < 0.3 else rng.choice(pool))
        (directory / "special_tokens_map.json").write_text(json.dumps(side))
        chosen["special_tokens_map"] = side
    chosen["config"] = {k: v for k, v in config.items() if k not in ("chat_template", "added_tokens_decoder")}
    return chosen


def check_case(base: Tokenizer, directory: Path, seed: int) -> bool:
    """Asserts the lean tokenizer of the case gives AutoTokenizer's ids, or is not used; whether it was used."""
    chosen = make_case(base, directory, seed)
    try:
        lean = load_tokenizer(directory)
    except BundleError as err:  # transformers itself refuses the directory: refused, cleanly
        assert err.code == "invalid-bundle" and "transformers cannot load the tokenizer" in err.message
        return False
    if not isinstance(lean, LeanTokenizer):
        return False
    try:
        theirs = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - transformers refuses what the lean path took
        raise AssertionError(f"the lean path took a directory transformers refuses ({err}): {chosen}") from err
    for text in TEXTS:
        for raw in (True, False):
            assert _prompt_ids(lean, text, raw) == _prompt_ids(theirs, text, raw), (text, raw, chosen)
        ids = lean(text)["input_ids"]
        for skip in (True, False):
            assert lean.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip), (text, chosen)
    for chat in CHATS:
        want = list(theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"])
        assert lean.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"] == want, (chat, chosen)
    assert lean.eos_token_id == theirs.eos_token_id, chosen
    return True


def test_random_tokenizer_directories_give_transformers_ids_or_are_not_taken_lean(base: Tokenizer, tmp_path: Path) -> None:
    lean = sum(check_case(base, tmp_path / f"case-{seed}", seed) for seed in range(CASES))
    # the generator is tuned so a fair share of cases is one the lean path takes: the check is not vacuous
    assert lean >= CASES // 5, f"only {lean} of {CASES} cases took the lean path"
