"""The prompt-lookup proposer: longest suffix first, latest earlier occurrence, nothing when nothing matches."""

from __future__ import annotations

import random
import time

import pytest

from runner.decoding.ngram import NgramProposer


def proposer(tokens: list[int], min_n: int = 2, max_n: int = 4) -> NgramProposer:
    p = NgramProposer(min_n, max_n)
    p.extend(tokens)
    return p


def test_proposes_what_followed_the_earlier_occurrence_of_the_suffix():
    assert proposer([1, 2, 3, 4, 5, 9, 1, 2]).propose(3) == [3, 4, 5]


def test_proposal_is_at_most_k_tokens():
    assert proposer([1, 2, 3, 4, 5, 6, 7, 9, 1, 2]).propose(2) == [3, 4]


def test_no_match_proposes_nothing():
    assert proposer([1, 2, 3, 4, 5, 6]).propose(4) == []
    assert NgramProposer(2, 4).propose(4) == []


def test_a_suffix_shorter_than_min_n_does_not_match():
    # only the 1-gram [2] occurred before; min_n 2 needs two tokens
    assert proposer([2, 7, 5, 2]).propose(3) == []
    assert proposer([2, 7, 5, 2], min_n=1, max_n=3).propose(2) == [7, 5]


def test_longest_matching_suffix_wins_over_a_later_shorter_one():
    # the 3-gram [1, 2, 3] occurred at the start (followed by 10); the 2-gram [2, 3] occurred later (followed by 20)
    tokens = [1, 2, 3, 10, 8, 2, 3, 20, 9, 1, 2, 3]
    assert proposer(tokens).propose(1) == [10]
    assert proposer(tokens, min_n=2, max_n=2).propose(1) == [20]


def test_latest_earlier_occurrence_wins():
    tokens = [1, 2, 30, 31, 1, 2, 40, 41, 1, 2]
    assert proposer(tokens).propose(2) == [40, 41]


def test_the_suffix_itself_is_not_its_own_match():
    assert proposer([5, 6, 7, 8]).propose(2) == []


def test_a_match_running_into_the_end_repeats_its_pattern():
    assert proposer([1, 2, 1, 2]).propose(5) == [1, 2, 1, 2, 1]
    assert proposer([7, 7, 7]).propose(3) == [7, 7, 7]


def test_extend_one_token_at_a_time_equals_extend_at_once():
    rng = random.Random(3)
    tokens = [rng.randrange(6) for _ in range(300)]
    whole = proposer(tokens)
    stepwise = NgramProposer(2, 4)
    for t in tokens:
        stepwise.extend([t])
    assert stepwise.propose(6) == whole.propose(6)
    assert list(stepwise.tokens) == tokens


def test_proposals_follow_the_accepted_tokens():
    p = proposer([1, 2, 3, 4, 9, 1])
    assert p.propose(3) == []
    p.extend([2])
    assert p.propose(3) == [3, 4, 9]
    p.extend([3, 4])
    assert p.propose(2) == [9, 1]


def test_zero_k_proposes_nothing():
    assert proposer([1, 2, 1, 2]).propose(0) == []


@pytest.mark.parametrize("min_n,max_n", [(0, 2), (3, 2)])
def test_bad_sizes_are_refused(min_n, max_n):
    with pytest.raises(ValueError):
        NgramProposer(min_n, max_n)


def test_indexing_and_proposing_over_10k_tokens_is_fast():
    rng = random.Random(0)
    tokens = [rng.randrange(500) for _ in range(10_000)]
    start = time.perf_counter()
    p = NgramProposer(2, 4)
    p.extend(tokens[:2000])
    for t in tokens[2000:]:
        p.propose(8)
        p.extend([t])
    elapsed = time.perf_counter() - start
    # ~10 us a token on an idle core; the bound leaves room for a loaded shared machine
    assert elapsed < 2.0, elapsed
