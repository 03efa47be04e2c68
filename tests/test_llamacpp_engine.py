"""The llama.cpp engine under the one decoding loop: greedy identical to llama.cpp's own plain decoding,
sampling lossless, on a tiny GGUF pair written by the test (tests/tinygguf.py)."""

from __future__ import annotations

import pytest
import torch

from runner.engines.llamacpp import Pieces, load
from runner.decoding.speculative import generate_plain, generate_speculative
from tests.tinygguf import write_gguf

PROMPT = [261, 223, 83, 87, 75, 307, 270]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    target = load(write_gguf(d / "target.gguf", seed=0, logit_scale=3), n_ctx=256, threads=1)
    small = dict(hidden=32, layers=1, heads=2, kv_heads=1)
    draft = load(write_gguf(d / "draft.gguf", seed=1, logit_scale=3, **small), n_ctx=256, threads=1)
    same = load(d / "target.gguf", n_ctx=256, threads=1)  # a draft that always agrees
    return target, draft, same


def test_plain_decoding_equals_llama_cpp_own_greedy_generation(pair):
    target, _, _ = pair
    ours = generate_plain(target, PROMPT, 32).tokens
    target.llm.reset()
    theirs = []
    for token in target.llm.generate(PROMPT, temp=0.0, top_k=1, reset=True):
        theirs.append(token)
        if len(theirs) == 32:
            break
    assert ours == theirs


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculative_equals_plain_with_rejections_and_full_acceptance(pair, k):
    target, draft, same = pair
    expected = generate_plain(target, PROMPT, 40).tokens
    rejected = generate_speculative(target, draft, PROMPT, 40, draft_tokens=k, adaptive=False, guard=False)
    accepted = generate_speculative(target, same, PROMPT, 40, draft_tokens=k, adaptive=False, guard=False)
    assert rejected.tokens == expected and accepted.tokens == expected
    assert rejected.stats.acceptance_rate < 1.0 and accepted.stats.acceptance_rate == 1.0


def test_sampled_first_tokens_follow_the_target_distribution(pair):
    """800 seeded runs, k=2: the first two tokens' marginals match the target's own softmax (computed
    exactly through the engine) within 0.1 total variation, while the draft's first-token distribution is
    more than 0.3 away from the target's."""
    target, draft, _ = pair
    runs, vocab = 800, target.vocab_size
    counts = torch.zeros(2, vocab)
    for seed in range(runs):
        tokens = generate_speculative(target, draft, PROMPT, 2, draft_tokens=2, adaptive=False, guard=False,
                                      temperature=1.0, seed=seed).tokens
        for position, token in enumerate(tokens):
            counts[position, token] += 1
    target.reset(len(PROMPT) + 2)
    p1 = torch.softmax(target.forward(torch.tensor(PROMPT), last_only=True)[0], -1)
    draft.reset(len(PROMPT) + 1)
    q1 = torch.softmax(draft.forward(torch.tensor(PROMPT), last_only=True)[0], -1)
    p2 = torch.zeros(vocab)
    for first in torch.nonzero(p1 > 1e-4).view(-1).tolist():  # the rest weighs < 0.03 in all
        p2 += p1[first] * torch.softmax(target.forward(torch.tensor([first]), last_only=True)[0], -1)
        target.crop(1)
    assert 0.5 * (p1 - q1).abs().sum() > 0.3
    for position, exact in enumerate((p1, p2)):
        assert 0.5 * (counts[position] / runs - exact / exact.sum()).abs().sum() < 0.1, position


def test_cached_pieces_join_as_llama_cpp_python_detokenizes(pair):
    """Every token alone, and sequences led by bos or not (with special tokens among them): the same bytes."""
    target, _, _ = pair
    llm, pieces = target.llm, Pieces(target.llm)
    for token in range(target.vocab_size):
        assert pieces.join([token]) == llm.detokenize([token])
    rng = torch.Generator().manual_seed(0)
    for _ in range(200):
        ids = torch.randint(0, target.vocab_size, (12,), generator=rng).tolist()
        for seq in (ids, [llm.token_bos(), *ids]):
            assert pieces.join(seq) == llm.detokenize(seq)
