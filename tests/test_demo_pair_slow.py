"""On the real demo pair (opt-in: `pytest -m slow`; converts the target first if needed): greedy speculative
decoding in fp32 gives the target's own output token for token, with and without the draft vocabulary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pair():
    import torch
    from transformers import AutoTokenizer

    from runner.models.loading import load_model

    if not (ROOT / "demo/work/target/model.safetensors").exists():
        subprocess.run([sys.executable, str(ROOT / "demo/convert_target.py")], check=True)
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "demo/work/tokenizer")
    target = load_model(ROOT / "demo/work/target", "float32", "cpu")
    draft = load_model(ROOT / "demo/draft", "float32", "cpu")
    return tokenizer, target, draft


@pytest.mark.parametrize("with_vocab", [False, True])
def test_greedy_fp32_speculative_equals_the_target_alone_on_the_demo_pair(pair, with_vocab: bool) -> None:
    from runner.models.draft_vocab import SubsetHeadDraft
    from runner.decoding.speculative import generate_plain, generate_speculative

    tokenizer, target, draft = pair
    if with_vocab:
        draft = SubsetHeadDraft(draft, json.loads((ROOT / "demo/draft/draft_vocab.json").read_text())["ids"])
    prompts = [json.loads(line)["prompt"] for line in (ROOT / "runner/bench/prompts.jsonl").read_text().splitlines()[:3]]
    for prompt in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        expected = generate_plain(target, ids, 64, eos_ids={tokenizer.eos_token_id}).tokens
        got = generate_speculative(target, draft, ids, 64, draft_tokens=4, eos_ids={tokenizer.eos_token_id}, guard=False)
        assert got.tokens == expected
        assert got.stats.drafted > 0
