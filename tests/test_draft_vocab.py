"""A draft head cut to part of the vocabulary: cheaper draft steps, output unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import runner.models.loading
from core.errors import BundleError
from runner.models.compact_llama import CompactLlama
from runner.models.draft_vocab import SubsetHeadDraft, read_draft_vocab
from runner.run import run_unpacked
from runner.decoding.speculative import generate_plain, generate_speculative
from tests.tinymodels import layer_skip_draft, make_pair, tiny_llama

torch.set_num_threads(1)
V = 320
ROLES = {"target": "target", "draft": "draft", "tokenizer": "tokenizer"}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(V, seed=0, hidden=64, layers=2, init_std=0.1)


def test_subset_head_scores_the_listed_ids_like_the_full_head_and_nothing_else(target) -> None:
    draft = layer_skip_draft(target, 1)
    ids = list(range(0, V, 3))
    x = torch.tensor([[5, 9, 17, 33]])
    with torch.inference_mode():
        full = draft(input_ids=x).logits
        cut = SubsetHeadDraft(draft, ids)(input_ids=x).logits
    assert torch.allclose(cut[..., ids], full[..., ids], atol=1e-5)
    others = sorted(set(range(V)) - set(ids))
    assert torch.isinf(cut[..., others]).all()


@pytest.mark.parametrize("wrap", [SubsetHeadDraft, CompactLlama], ids=["transformers", "compact"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_output_with_a_subset_head_equals_the_target_alone(target, k: int, wrap) -> None:
    draft = wrap(layer_skip_draft(target, 1), list(range(0, V, 2)))  # half the ids: some drafts impossible
    g = torch.Generator().manual_seed(7)
    for n in range(5):
        prompt = torch.randint(3, V, (2 + n,), generator=g)
        expected = generate_plain(target, prompt, 24).tokens
        result = generate_speculative(target, draft, prompt, 24, draft_tokens=k, guard=False)
        assert result.tokens == expected
        assert result.stats.drafted > 0


def test_sampling_with_a_subset_head_follows_the_target() -> None:
    """First two sampled tokens over 1500 seeds, 16-token vocabulary: total variation to the target's own
    distribution below 0.08 (sampling noise alone is about 0.04 here), while the draft alone is far off."""
    small = tiny_llama(16, seed=3, hidden=32, layers=2, init_std=0.5)
    draft = SubsetHeadDraft(tiny_llama(16, seed=4, hidden=16, layers=1, heads=2, kv_heads=1, init_std=0.5), list(range(0, 16, 2)))
    prompt = torch.tensor([3, 9, 5])
    with torch.inference_mode():
        p = torch.softmax(small(input_ids=prompt.view(1, -1)).logits[0, -1].float(), -1)
        q = torch.softmax(draft(input_ids=prompt.view(1, -1)).logits[0, -1].float(), -1)
    assert 0.5 * (p - q).abs().sum().item() > 0.3
    counts = torch.zeros(16)
    for seed in range(1500):
        counts[generate_speculative(small, draft, prompt, 2, draft_tokens=2, temperature=1.0, seed=seed, guard=False).tokens[0]] += 1
    assert 0.5 * (counts / counts.sum() - p).abs().sum().item() < 0.08


@pytest.mark.parametrize(
    "content, code",
    [({"ids": []}, "invalid-bundle"), ({"ids": [1, 1]}, "invalid-bundle"), ({"ids": [1, 10**6]}, "tokenizer-mismatch"), ([1, 2], "invalid-bundle")],
)
def test_a_bad_draft_vocabulary_is_refused(tmp_path: Path, content, code: str) -> None:
    path = tmp_path / "draft_vocab.json"
    path.write_text(json.dumps(content))
    with pytest.raises(BundleError) as err:
        read_draft_vocab(path, V)
    assert err.value.code == code


def test_run_unpacked_uses_the_bundles_draft_vocabulary(tmp_path: Path) -> None:
    paths = make_pair(tmp_path / "ctx")
    (paths["draft"] / "draft_vocab.json").write_text(json.dumps({"ids": list(range(0, 200))}))
    params = {"draft_tokens": 3, "draft_vocab": "draft_vocab.json", "guard": False}
    with_vocab = run_unpacked(paths["root"], ROLES, params, "hello there", max_new_tokens=16, raw=True)
    without = run_unpacked(paths["root"], ROLES, {"draft_tokens": 3, "guard": False}, "hello there", max_new_tokens=16, raw=True)
    assert with_vocab["tokens"] == without["tokens"]


def test_a_draft_vocabulary_outside_the_draft_directory_is_refused_before_loading(tmp_path: Path) -> None:
    paths = make_pair(tmp_path / "ctx")
    (paths["root"] / "elsewhere.json").write_text(json.dumps({"ids": [1, 2]}))
    before = runner.models.loading.LOADS
    with pytest.raises(BundleError) as err:
        run_unpacked(paths["root"], ROLES, {"draft_vocab": "../elsewhere.json"}, "hi", max_new_tokens=4, raw=True)
    assert err.value.code == "invalid-bundle"
    assert runner.models.loading.LOADS == before
