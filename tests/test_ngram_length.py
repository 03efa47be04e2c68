"""The policy's choice of how much of an n-gram match to verify (runner.decoding.match_length.MatchLength.ngram_length):
from the match length's acceptance so far and what verify passes cost by length."""

from runner.decoding.match_length import MatchLength
from runner.decoding.stats import Stats


def guard_with_costs(step_s: float, passes: dict[int, float]) -> MatchLength:
    """A guard whose statistics timed plain steps of step_s and verify passes over k drafts of passes[k] seconds."""
    stats = Stats()
    for _ in range(2):
        stats.record_step(step_s)
        for k, seconds in passes.items():
            stats.record_iteration(k, 0, 0.0, seconds, catch_up=False, method="ngram")
    return MatchLength(stats, costs=None)


def test_flat_verify_cost_verifies_the_whole_match():
    guard = guard_with_costs(0.01, {k: 0.0101 for k in range(1, 9)})  # torch bf16 with AVX-512 BF16: ~1 step
    assert guard.ngram_length(2, 8) == 8


def test_steep_verify_cost_takes_a_plain_step_for_a_doubtful_match_and_verifies_a_copy():
    # llama.cpp Q4_1, 135M, two cores: a pass over k drafts costs about 1 + 0.45 k steps
    guard = guard_with_costs(0.01, {k: 0.01 * (1.3 + 0.45 * k) for k in range(1, 9)})
    for _ in range(6):
        guard.ngram_observed(2, 4, 0)  # 2-token matches: chance repeats, rejected at once
        guard.ngram_observed(4, 8, 8)  # 4-token matches: copies, accepted whole
    assert guard.ngram_length(2, 8) == 0
    assert guard.ngram_length(4, 8) == 8
    assert guard.ngram_length(7, 8) == 8  # longer matches count with the longest kept


def test_a_match_not_verified_still_teaches_by_its_first_token():
    guard = guard_with_costs(0.01, {k: 0.01 * (1.3 + 0.45 * k) for k in range(1, 9)})
    for _ in range(6):
        guard.ngram_observed(3, 4, 0)
    assert guard.ngram_length(3, 8) == 0
    for _ in range(30):  # plain steps whose token the match had guessed right
        guard.ngram_observed(3, 1, 1)
    assert guard.ngram_length(3, 8) > 0


def test_a_cost_model_without_a_clock_decides_the_same_every_run():
    guard = MatchLength(Stats(), costs=(0.0, 1.0))
    assert guard.ngram_length(2, 5) == 5
    assert MatchLength(Stats(), costs=(0.0, 4.0)).ngram_length(2, 5) == 0  # a = 0.5 never pays 4 steps


def test_a_later_generation_starts_from_what_earlier_ones_learned_of_the_target():
    from runner.decoding.match_length import PassMemory

    memory = PassMemory()
    first = MatchLength(Stats(), costs=None, memory=memory)
    for _ in range(2):
        first.stats.record_step(0.01)
    for k in range(1, 9):  # passes about as cheap as a step (torch bf16 with AVX-512 BF16)
        for _ in range(2):
            first.timed_pass(k, 0.0102)
    for _ in range(10):
        first.ngram_observed(2, 4, 0)
    fresh = MatchLength(Stats(), costs=None)
    later = MatchLength(Stats(), costs=None, memory=memory)
    assert fresh.verify_steps(4) == 1.0 + 0.5 * 4  # nothing timed: the guess
    assert abs(later.verify_steps(4) - 1.02) < 1e-9  # the process's memory of the target
    assert fresh.ngram_length(2, 8) == 0 and later.ngram_length(2, 8) == 8
    accepted, rejections = later.by_match[2]
    assert accepted / (accepted + rejections) < 0.2  # 2-token matches were chance repeats before


def test_a_cost_model_never_reads_the_memory():
    from runner.decoding.match_length import PassMemory

    memory = PassMemory()
    memory.timed_pass(4, 9.0)
    memory.timed_pass(4, 9.0)
    assert MatchLength(Stats(), costs=(0.0, 1.0), memory=memory).verify_steps(4) == 1.0
