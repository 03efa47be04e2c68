"""The speculative decoder: greedy identical to the target alone, sampling lossless, the guard falls back."""

from __future__ import annotations

import pytest
import torch

from runner.decoding.stats import best_predicted_speedup, predicted_speedup
from runner.decoding.guard import PATIENCE, TRIAL_ITERATIONS, WARMUP_ITERATIONS
from runner.decoding.sampling import Sampler, verify_sampled
from runner.decoding.speculative import generate_plain, generate_speculative
from tests.tinymodels import layer_skip_draft, tiny_llama

torch.set_num_threads(1)
V = 320


def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * (counts / counts.sum() - probs).abs().sum().item()


@pytest.fixture(scope="module")
def target():
    return tiny_llama(V, seed=0, hidden=64, layers=2, init_std=0.1)


@pytest.fixture(scope="module")
def drafts(target):
    """A draft that agrees now and then (the target's first layer) and one that disagrees almost always."""
    return {
        "layer-skip": layer_skip_draft(target, 1),
        "random": tiny_llama(V, seed=7, hidden=16, layers=1, heads=2, kv_heads=1, init_std=0.1),
    }


def prompts(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(3, V, (1 + i % 6,), generator=g) for i in range(n)]


def test_greedy_speculative_equals_greedy_target_for_many_prompts_and_draft_lengths(target, drafts):
    acceptance = {}
    for prompt in prompts(6):
        expected = generate_plain(target, prompt, 24).tokens
        for name, draft in drafts.items():
            for k in (1, 2, 4, 7):
                result = generate_speculative(target, draft, prompt, 24, draft_tokens=k, adaptive=False, guard=False)
                assert result.tokens == expected, (name, k, prompt.tolist())
                acceptance.setdefault(name, []).append(result.stats.acceptance_rate)
            adaptive = generate_speculative(target, draft, prompt, 24, draft_tokens=3, guard=False)
            assert adaptive.tokens == expected
    # Both accept and reject paths ran: the layer-skip draft is right sometimes, the random one seldom.
    assert 0.1 < sum(acceptance["layer-skip"]) / len(acceptance["layer-skip"]) < 0.9
    assert sum(acceptance["random"]) / len(acceptance["random"]) < 0.1


def test_greedy_stops_at_eos_accepted_inside_a_draft(target):
    prompt = prompts(1)[0]
    reference = generate_plain(target, prompt, 30).tokens
    eos = next(t for i, t in enumerate(reference) if i >= 2 and t not in reference[:i])
    expected = reference[: reference.index(eos) + 1]
    assert len(expected) < 7  # inside the first 7-token draft
    same_model_draft = layer_skip_draft(target, 2)  # agrees on every token: eos comes mid-draft
    result = generate_speculative(
        target, same_model_draft, prompt, 30, draft_tokens=7, adaptive=False, guard=False, eos_ids=[eos]
    )
    assert result.tokens == expected
    assert generate_plain(target, prompt, 30, eos_ids=[eos]).tokens == expected
    assert result.stats.accepted > len(expected)  # the draft ran past the eos; the output stopped at it


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 6, 11])
def test_output_has_exactly_max_new_tokens(target, drafts, max_new_tokens):
    prompt = prompts(2)[1]
    expected = generate_plain(target, prompt, max_new_tokens).tokens
    for draft in (drafts["layer-skip"], layer_skip_draft(target, 2)):
        result = generate_speculative(target, draft, prompt, max_new_tokens, draft_tokens=4, guard=False)
        assert result.tokens == expected
        assert result.stats.new_tokens == len(expected) == max_new_tokens


def test_target_embedding_padded_past_the_vocabulary_is_compared_on_the_vocabulary(target):
    padded = tiny_llama(V + 64, seed=3, hidden=64, layers=2, init_std=0.1)
    with torch.no_grad():  # make the padding rows win every argmax, unless logits are cut to the vocabulary
        padded.lm_head.weight[V:] = padded.model.norm.weight.sign() * 5.0
    draft = layer_skip_draft(padded, 1)
    draft_small = tiny_llama(V, seed=4, hidden=16, layers=1, heads=2, kv_heads=1, init_std=0.1)
    prompt = prompts(3)[2]
    assert max(generate_plain(padded, prompt, 8).tokens) >= V  # the rows really would be picked
    expected = generate_plain(padded, prompt, 20, vocab_size=V).tokens
    assert max(expected) < V
    assert generate_speculative(padded, draft_small, prompt, 20, guard=False).tokens == expected  # smaller embedding
    assert generate_speculative(padded, draft, prompt, 20, guard=False, vocab_size=V).tokens == expected


def test_acceptance_step_emits_tokens_distributed_as_the_target_whatever_the_draft():
    """Accept with min(1, p/q), else resample from max(p - q, 0): the first token follows p_1 and, once
    the first draft is accepted, the second follows p_2. 20000 trials; tolerance 0.02 total variation
    (sampling noise is about 0.006 here)."""
    torch.manual_seed(0)
    vocab, k, trials = 8, 3, 20000
    target_logits = torch.randn(k + 1, vocab) * 1.5
    draft_logits = torch.randn(k, vocab) * 1.5
    sampler = Sampler(1.0, 1.0, seed=11, device=torch.device("cpu"), vocab_size=vocab)
    p, q = sampler.probs(target_logits), sampler.probs(draft_logits)
    assert 0.5 * (p[:k] - q).abs().sum(-1).min() > 0.2  # the draft is far from the target
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    for _ in range(trials):
        drafts = sampler.sample(q)
        n, _next, new = verify_sampled(target_logits, drafts, q, sampler)
        first[new[0]] += 1
        if n >= 1:
            second[new[1]] += 1
    assert total_variation(first, p[0]) < 0.02
    assert second.sum() > trials / 4
    assert total_variation(second, p[1]) < 0.03


def test_sampled_tokens_follow_the_target_distribution_end_to_end():
    """1500 seeded runs, 3 tokens each, k=2: each of the first three tokens' marginal matches the target's
    own softmax within 0.08 total variation (sampling noise is about 0.03), while the draft's first-token
    distribution is more than 0.3 away from the target's."""
    vocab, runs = 16, 1500
    shape = dict(hidden=16, layers=1, heads=2, kv_heads=1, init_std=0.3)
    target, draft = tiny_llama(vocab, seed=0, **shape), tiny_llama(vocab, seed=1, **shape)
    prompt = torch.tensor([3, 5, 7])
    counts = torch.zeros(3, vocab)
    for seed in range(runs):
        tokens = generate_speculative(
            target, draft, prompt, 3, draft_tokens=2, adaptive=False, guard=False, temperature=1.0, seed=seed
        ).tokens
        for position, token in enumerate(tokens):
            counts[position, token] += 1
    with torch.no_grad():  # exact marginals: sum over every prefix of the target's own probabilities
        p1 = torch.softmax(target(prompt[None]).logits[0, -1], -1)
        q1 = torch.softmax(draft(prompt[None]).logits[0, -1], -1)
        firsts = torch.arange(vocab)[:, None]
        seqs1 = torch.cat([prompt.expand(vocab, -1), firsts], 1)
        p2_given = torch.softmax(target(seqs1).logits[:, -1], -1)  # (t1, t2)
        seqs2 = torch.cat([seqs1.repeat_interleave(vocab, 0), firsts.repeat(vocab, 1)], 1)
        p3_given = torch.softmax(target(seqs2).logits[:, -1], -1).view(vocab, vocab, vocab)
    joint2 = p1[:, None] * p2_given
    p2, p3 = joint2.sum(0), (joint2[:, :, None] * p3_given).sum((0, 1))
    assert 0.5 * (p1 - q1).abs().sum() > 0.3
    for position, exact in enumerate((p1, p2, p3)):
        assert total_variation(counts[position], exact) < 0.08, position


def test_seeded_sampling_is_reproducible(target, drafts):
    prompt = prompts(1)[0]
    run = lambda seed: generate_speculative(  # noqa: E731
        target, drafts["layer-skip"], prompt, 20, temperature=0.8, top_p=0.9, seed=seed
    ).tokens
    assert run(5) == run(5)
    assert run(5) != run(6)


def test_guard_falls_back_from_a_draft_that_never_agrees_and_output_stays_the_targets(target):
    never = tiny_llama(V, seed=9, hidden=16, layers=1, heads=2, kv_heads=1, init_std=0.1)
    with torch.no_grad():
        never.model.norm.weight.zero_()  # all logits 0: the draft always proposes token 0
    prompt = prompts(2)[0]
    expected = generate_plain(target, prompt, 60).tokens
    assert 0 not in expected
    result = generate_speculative(target, never, prompt, 60, draft_tokens=4)
    assert result.tokens == expected
    assert result.stats.accepted == 0
    fallback = result.stats.fallback
    # By the prediction, or sooner by the clock (what the failed drafts cost is over the guard's budget).
    assert fallback is not None and fallback["reason"].startswith(("predicted speed-up", "speculation cost"))
    assert 0 < fallback["at_token"] < 30
    # After the fallback at most one short trial drafted (after 16 plain tokens, once within the budget
    # again), and it did not resume speculation.
    assert fallback["retries"] <= 1 and fallback["resumed"] == 0
    assert result.stats.speculative_iterations <= WARMUP_ITERATIONS + PATIENCE + TRIAL_ITERATIONS


def test_best_predicted_speedup_with_a_verify_cost_that_grows_with_the_draft():
    # a = 2/3, c = 0.04: k = 4 with v = 3 predicts 0.82x, k = 1 with v = 1.5 predicts 1.08x
    speedup, k = best_predicted_speedup(2 / 3, 0.04, 3.0, 8, verify_slope=0.5)
    assert k == 1 and speedup == pytest.approx((1 - (2 / 3) ** 2) / ((1 / 3) * 1.54))
    assert best_predicted_speedup(2 / 3, 0.04, 1.0, 8)[1] == 5  # a flat verify cost favours longer drafts


def test_guard_falls_back_when_acceptance_is_below_the_kitfile_minimum(target, drafts):
    prompt = prompts(2)[0]
    result = generate_speculative(target, drafts["random"], prompt, 40, min_acceptance=0.99)
    assert result.tokens == generate_plain(target, prompt, 40).tokens
    assert result.stats.fallback is not None


def test_predicted_speedup_is_leviathans_formula():
    # (1 - 0.8^5) / ((1 - 0.8) * (4 * 0.1 + 1)) = 0.67232 / 0.28
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx(2.4011, abs=1e-4)
    assert predicted_speedup(1.0, 4, 0.1) == pytest.approx(5 / 1.4)
    assert predicted_speedup(0.0, 1, 0.3, 1.2) == pytest.approx(1 / 1.5)


def test_stats_count_what_happened(target, drafts):
    prompt = prompts(3)[1]
    stats = generate_speculative(target, drafts["layer-skip"], prompt, 30, draft_tokens=3, guard=False).stats
    assert stats.new_tokens == 30
    assert stats.accepted <= stats.drafted == stats.draft_passes
    assert stats.acceptance_rate == pytest.approx(stats.accepted / stats.drafted)
    # Every verify pass yields its accepted drafts plus one token of the target's own; a plain step one token.
    assert stats.accepted + stats.speculative_iterations + stats.plain_steps == stats.new_tokens
    assert stats.target_passes == 1 + stats.speculative_iterations + stats.plain_steps  # 1: the prompt's prefill
    assert sum(stats.accepted_at) == stats.accepted and len(stats.per_position_acceptance) <= 6  # k <= 2 * 3
    assert stats.tokens_per_second > 0


def test_draft_confidence_stops_drafts_early_and_output_stays_the_targets(target, drafts):
    draft = drafts["layer-skip"]
    for prompt in prompts(4):
        expected = generate_plain(target, prompt, 30).tokens
        full = generate_speculative(target, draft, prompt, 30, draft_tokens=6, adaptive=False, guard=False)
        sure = generate_speculative(target, draft, prompt, 30, draft_tokens=6, adaptive=False, guard=False,
                                    draft_confidence=0.5)
        assert full.tokens == sure.tokens == expected
        assert sure.stats.drafted < full.stats.drafted
        # What the draft was unsure of it proposed less; what it did propose, the target kept more often.
        assert sure.stats.acceptance_rate >= full.stats.acceptance_rate
    seeded = lambda c: generate_speculative(target, draft, prompts(1)[0], 20, temperature=0.8, seed=3,  # noqa: E731
                                            draft_confidence=c).tokens
    assert seeded(0.5) == seeded(0.5)


REPEATING = torch.tensor([5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7])  # an n-gram of it matches from the first step


def test_ngram_proposals_need_no_draft_model_and_greedy_output_is_the_targets(target, drafts):
    for prompt in [REPEATING, *prompts(3)]:
        expected = generate_plain(target, prompt, 40).tokens
        alone = generate_speculative(target, None, prompt, 40, methods=("ngram",), guard=False)
        assert alone.tokens == expected, prompt.tolist()
        both = generate_speculative(target, drafts["layer-skip"], prompt, 40, draft_tokens=3, methods=("ngram+draft",), guard=False)
        assert both.tokens == expected, prompt.tolist()
        assert set(both.stats.by_method) <= {"draft", "ngram"}
    stats = generate_speculative(target, None, REPEATING, 40, methods=("ngram",), guard=False).stats
    assert stats.by_method["ngram"][1] > 0 and stats.draft_passes == 0  # proposed by lookup alone


def test_a_draft_model_catches_up_on_accepted_ngram_tokens(target, drafts):
    """n-gram first, the draft model where no n-gram matches: the draft's cache skips what the lookup proposed, so
    its next pass runs the accepted tokens first; the output stays the target's with both kinds of iteration."""
    prompt = torch.cat([REPEATING, torch.tensor([40, 41, 42])])
    expected = generate_plain(target, prompt, 48).tokens
    result = generate_speculative(target, drafts["layer-skip"], prompt, 48, draft_tokens=2, methods=("ngram+draft",), guard=False)
    assert result.tokens == expected
    assert result.stats.by_method.get("draft", [0])[0] and result.stats.by_method.get("ngram", [0])[0]


def test_a_deterministic_proposal_is_accepted_with_p_and_otherwise_resampled_from_p_without_it():
    """An n-gram's token x verified with a one-hot q: accepted with probability p(x); the first token still
    follows p_1 exactly, and after a rejection it is never x. 20000 trials, 0.02 total variation."""
    from runner.decoding.sampling import one_hot

    torch.manual_seed(0)
    vocab, trials = 8, 20000
    logits = torch.randn(3, vocab) * 1.5
    sampler = Sampler(1.0, 1.0, seed=5, device=torch.device("cpu"), vocab_size=vocab)
    p = sampler.probs(logits)
    proposal = [int(p[0].argmax()), int(p[1].argmin())]
    q = one_hot(proposal, vocab, torch.device("cpu"))
    first, accepted, rejected_as_x = torch.zeros(vocab), 0, 0
    for _ in range(trials):
        n, _next, new = verify_sampled(logits, torch.tensor(proposal), q, sampler)
        first[new[0]] += 1
        accepted += n >= 1
        rejected_as_x += n == 0 and new[0] == proposal[0]
    assert total_variation(first, p[0]) < 0.02
    assert abs(accepted / trials - float(p[0, proposal[0]])) < 0.02 and rejected_as_x == 0


def test_sampled_tokens_follow_the_target_distribution_with_ngram_proposals():
    """1500 seeded runs of a prompt whose n-grams match at once, 3 tokens each: the tokens verified against
    n-gram proposals follow the target's own marginals within 0.08 total variation, and proposals were
    both accepted and rejected."""
    vocab, runs = 16, 1500
    target = tiny_llama(vocab, seed=0, hidden=16, layers=1, heads=2, kv_heads=1, init_std=0.3)
    prompt = torch.tensor([3, 5, 3, 5, 3])
    counts, drafted, accepted = torch.zeros(2, vocab), 0, 0
    for seed in range(runs):
        result = generate_speculative(target, None, prompt, 3, methods=("ngram",), guard=False, temperature=1.0, seed=seed)
        for position, token in enumerate(result.tokens[:2]):
            counts[position, token] += 1
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
    with torch.no_grad():
        p1 = torch.softmax(target(prompt[None]).logits[0, -1], -1)
        seqs1 = torch.cat([prompt.expand(vocab, -1), torch.arange(vocab)[:, None]], 1)
        p2 = (p1[:, None] * torch.softmax(target(seqs1).logits[:, -1], -1)).sum(0)
    assert 0 < accepted < drafted
    for position, exact in enumerate((p1, p2)):
        assert total_variation(counts[position], exact) < 0.08, position


def test_the_settings_pass_as_one_value_and_a_keyword_overrides_one_field(target, drafts):
    from runner.decoding.settings import DRIVER_DEFAULTS, DecodingSettings

    prompt = prompts(2)[1]
    settings = DecodingSettings(draft_tokens=2, methods=("ngram+draft",), guard=False)
    as_value = generate_speculative(target, drafts["layer-skip"], prompt, 24, settings=settings)
    as_keywords = generate_speculative(target, drafts["layer-skip"], prompt, 24, draft_tokens=2, methods=("ngram+draft",),
                                       guard=False)
    assert as_value.tokens == as_keywords.tokens and as_value.stats.by_method == as_keywords.stats.by_method
    assert DRIVER_DEFAULTS.methods == ("draft",) and DRIVER_DEFAULTS.updated(draft_tokens=3).draft_tokens == 3
    with pytest.raises(TypeError):
        generate_speculative(target, drafts["layer-skip"], prompt, 4, draft_tokenz=3)
