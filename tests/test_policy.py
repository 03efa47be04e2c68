"""The speculation policy (runner.decoding.policy and its parts): when a sequence proposes and when it falls back
(runner.decoding.guard), which method proposes (runner.decoding.choice), what a step's plan is, and the rules
`Policy.for_sequence` applies for both drivers (guard off, no method, the cost table's verdict, the run
history's advice, a seeded sample)."""

from __future__ import annotations

import pytest
import torch

from runner.decoding.choice import TRY_EACH, MethodChoice
from runner.decoding.guard import LOSS_BUDGET, LOSS_FLOOR, PATIENCE, RETRY_AFTER, TRIAL_ITERATIONS, WARMUP_ITERATIONS, Guard
from runner.decoding.methods import ALL_METHODS, DRAFT, NGRAM, NGRAM_DRAFT, methods_named
from runner.decoding.ngram import NgramProposer
from runner.decoding.policy import PairFacts, Plan, Policy, Unguarded, is_seeded
from runner.decoding.sampling import Sampler
from runner.decoding.settings import DecodingSettings
from runner.decoding.stats import Stats
from runner.decoding.step import SequenceState
from tests.tinymodels import tiny_llama

V = 320

def _feed(guard: Guard, stats: Stats, produced: int, accepted: int, drafted: int = 3) -> int:
    """One iteration as the loop runs it: ask the guard, then record a verify pass or a plain step."""
    if guard.drafting(produced):
        stats.record_verify(drafted, accepted)
        guard.observe(drafted, accepted, 0.0, produced + accepted + 1)
        return produced + accepted + 1
    stats.steps_timed += 1
    return produced + 1


def test_guard_retries_after_a_fallback_with_a_growing_wait_and_resumes_when_the_draft_agrees_again():
    stats = Stats()
    guard = Guard(stats, max_k=6, min_acceptance=0.0, costs=(0.05, 1.05))  # clock-free costs
    produced = 0
    while stats.fallback is None:
        produced = _feed(guard, stats, produced, accepted=0)
    fell_back_at = produced
    assert stats.speculative_iterations == WARMUP_ITERATIONS + PATIENCE - 1
    # Plain decoding for RETRY_AFTER tokens, a trial of TRIAL_ITERATIONS that fails, twice the wait, ...
    waits, plain_run, iterations = [], 0, stats.speculative_iterations
    while len(waits) < 3:
        before = stats.speculative_iterations
        produced = _feed(guard, stats, produced, accepted=0)
        if stats.speculative_iterations == before:
            plain_run += 1
        elif plain_run:
            waits.append(plain_run)
            plain_run = 0
    assert waits == [RETRY_AFTER, 2 * RETRY_AFTER, 4 * RETRY_AFTER]
    assert stats.speculative_iterations - iterations == 2 * TRIAL_ITERATIONS + 1
    assert stats.fallback == {"at_token": fell_back_at, "reason": stats.fallback["reason"], "retries": 3, "resumed": 0}
    # The draft agrees again: the running trial resumes speculation, which then continues.
    while stats.fallback["resumed"] == 0:
        produced = _feed(guard, stats, produced, accepted=3)
    assert stats.fallback["retries"] == 3
    iterations = stats.speculative_iterations
    for _ in range(40):
        produced = _feed(guard, stats, produced, accepted=3)
    assert stats.speculative_iterations - iterations >= 38  # drafting, but for the occasional timed probe


def test_guard_drafts_shorter_instead_of_falling_back_where_a_verify_pass_grows_with_its_length():
    # bf16 on an AVX2-only CPU: a verify pass over k drafts costs about 1 + 0.5 k single steps. With 2 of 4
    # drafts accepted, 4-token drafts lose (0.82x predicted, 0.95x realized) but 1-token drafts pay (1.08x).
    stats, step, produced = Stats(), 0.010, 0
    guard = Guard(stats, max_k=8, min_acceptance=0.0, costs=None)  # timed costs, as bundle run judges
    while stats.speculative_iterations < WARMUP_ITERATIONS + PATIENCE:
        if not guard.drafting(produced):  # a timed plain step (a probe)
            stats.step_time_s, stats.steps_timed, produced = stats.step_time_s + step, stats.steps_timed + 1, produced + 1
            continue
        k = min(4, guard.k_cap)
        accepted = min(2, k)
        verify_s, draft_s = step * (1 + 0.5 * k), k * 0.04 * step
        stats.record_verify(k, accepted)
        stats.draft_time_s, stats.draft_steps_timed = stats.draft_time_s + draft_s, stats.draft_steps_timed + k
        stats.verify_time_s, stats.verifies_timed = stats.verify_time_s + verify_s, stats.verifies_timed + 1
        stats.verify_time_by_k[k] = stats.verify_time_by_k.get(k, 0.0) + verify_s
        stats.verifies_by_k[k] = stats.verifies_by_k.get(k, 0) + 1
        produced += accepted + 1
        guard.observe(k, accepted, verify_s + draft_s, produced)
    assert stats.verify_slope == pytest.approx(0.5)
    assert guard.k_cap == 1 and stats.fallback is None


def _timed_iteration(guard: Guard, stats: Stats, produced: int, step: float, k: int, accepted: int, verify_steps: float) -> int:
    """One iteration with a clock: a timed plain step when the guard says so, else a timed verify pass."""
    if not guard.drafting(produced):
        stats.step_time_s, stats.steps_timed = stats.step_time_s + step, stats.steps_timed + 1
        return produced + 1
    seconds = step * (verify_steps + 0.05 * k)
    stats.record_verify(k, accepted)
    stats.verify_time_s, stats.verifies_timed = stats.verify_time_s + step * verify_steps, stats.verifies_timed + 1
    stats.spec_time_s, stats.spec_tokens = stats.spec_time_s + seconds, stats.spec_tokens + accepted + 1
    guard.observe(k, accepted, seconds, produced + accepted + 1)
    return produced + accepted + 1


def test_what_a_useless_draft_costs_stays_within_the_guards_budget():
    # A verify pass of 3 drafts costs 2.5 steps and yields 1 token: each iteration loses 1.65 steps.
    stats, step, produced, guard = Stats(), 0.010, 0, None
    guard = Guard(stats, max_k=6, min_acceptance=0.0, costs=None)
    while produced < 256:
        produced = _timed_iteration(guard, stats, produced, step, k=3, accepted=0, verify_steps=2.5)
    assert stats.fallback is not None and stats.fallback["reason"].startswith("speculation cost")
    assert stats.fallback["at_token"] < 8  # within a few iterations, not after the warm-up and patience
    assert stats.fallback["retries"] == 0  # no trial: the budget has no room for another losing iteration yet
    lost = guard.lost_steps()
    assert lost <= LOSS_FLOOR + LOSS_BUDGET * produced + 1.65  # at most one iteration past the budget
    # over 256 tokens: the first (uncounted) iteration plus the rest, under 3% of plain decoding's time
    assert (lost + 1.65) / produced < 0.03


def test_no_iteration_starts_that_the_budget_has_no_room_for():
    # One-token drafts, always rejected, each iteration losing 0.6 steps: after the first, a second would
    # take the loss to 1.2 steps, past the floor, so the guard falls back before it rather than after.
    stats, step, produced = Stats(), 0.010, 0
    guard = Guard(stats, max_k=6, min_acceptance=0.0, costs=None)
    while produced < 32:  # (a trial fits the budget from about token 40: 1.2 <= 1 + 0.5% of the tokens)
        produced = _timed_iteration(guard, stats, produced, step, k=1, accepted=0, verify_steps=1.55)
    assert stats.fallback is not None and "another iteration would pass the budget" in stats.fallback["reason"]
    assert stats.speculative_iterations == 1
    assert guard.lost_steps() == pytest.approx(0.6) and guard.lost_steps() <= LOSS_FLOOR


def _state(policy: Unguarded, proposer: NgramProposer | None = None) -> SequenceState:
    sampler = Sampler(0.0, 1.0, None, torch.device("cpu"), vocab_size=V)
    return SequenceState(seq=2, sampler=sampler, max_new_tokens=10, k=2, policy=policy, proposer=proposer)


def test_a_steps_plan_is_a_value_saying_who_proposes_what():
    proposer = NgramProposer(2, 3)
    proposer.extend([5, 6, 7, 8, 5, 6])
    looked_up = _state(Unguarded(Stats(), (NGRAM,), max_k=4, ngram_tokens=3), proposer)
    assert looked_up.policy.plan(looked_up) == Plan(2, NGRAM, 3, (7, 8, 5))
    no_method = _state(Unguarded(Stats(), (), max_k=4, ngram_tokens=3))
    assert no_method.policy.plan(no_method) == Plan(2)  # no method: plain
    proposer.extend([1, 2])  # (1, 2) never occurred before: no match, a plain step
    assert looked_up.policy.plan(looked_up) == Plan(2)


def test_the_guard_chooses_among_the_allowed_methods_by_measured_acceptance_and_cost():
    """Clock-free costs (a draft step 0.3 target steps, a verify pass one): each kind is tried first; then a
    draft model that is rarely right loses to prompt lookup, and one that is mostly right wins where the
    lookup seldom matches. A pair without a draft model can run the lookup alone."""

    def choice(methods: tuple, draft_accepts: int, ngram_accepts: int, matches: float) -> MethodChoice:
        stats = Stats()
        assert MethodChoice(stats, (DRAFT, NGRAM), 8, costs=(0.3, 1.0)).choose(False) is DRAFT  # untried: the first allowed
        c = MethodChoice(stats, methods, 8, costs=(0.3, 1.0))
        for kind, accepts in ((DRAFT, draft_accepts), (NGRAM, ngram_accepts)):
            for _ in range(TRY_EACH + 2):
                stats.record_iteration(4, accepts, 0.0, 0.0, catch_up=False, method=kind)
                c.observe(kind, 4, accepts)
        for i in range(20):
            c.looked_up(i % 10 < 10 * matches)
        return c

    everything = methods_named(("ngram+draft", "draft", "ngram"), has_draft=True)
    assert choice(everything, draft_accepts=0, ngram_accepts=4, matches=0.5).choose(False) is NGRAM
    assert choice(everything, draft_accepts=4, ngram_accepts=4, matches=0.5).choose(False) is NGRAM_DRAFT
    assert choice((DRAFT, NGRAM), draft_accepts=3, ngram_accepts=0, matches=0.9).choose(False) is DRAFT
    assert methods_named(("ngram+draft", "draft", "ngram"), has_draft=False) == (NGRAM,)
    assert methods_named(("draft",), has_draft=False) == ()


def test_methods_are_values_and_an_unknown_name_is_refused():
    assert [(m.name, m.uses_draft, m.uses_lookup) for m in methods_named(ALL_METHODS, has_draft=True)] == [
        ("ngram+draft", True, True), ("draft", True, False), ("ngram", False, True)]
    with pytest.raises(ValueError, match="unknown drafting method 'beam'"):
        methods_named(("draft", "beam"), has_draft=True)


@pytest.fixture(scope="module")
def pair() -> tuple:
    return tiny_llama(V, seed=0, hidden=64, layers=2), tiny_llama(V, seed=7, hidden=16, layers=1, heads=2, kv_heads=1)


def test_for_sequence_without_the_guard_is_the_null_policy_whatever_the_prior_and_advice(pair):
    stats = Stats()
    policy = Policy.for_sequence(DecodingSettings(guard=False), stats, PairFacts(*pair, prior="table"), seeded=False,
                                 advice="advised")
    assert type(policy) is Unguarded and policy.methods == (NGRAM_DRAFT, DRAFT, NGRAM)
    assert stats.fallback is None and stats.model_dropped is None


def test_for_sequence_with_no_method_decodes_plainly_and_reports_nothing(pair):
    stats = Stats()  # serve --no-draft: no method, no draft model
    policy = Policy.for_sequence(DecodingSettings().without_proposals(), stats, PairFacts(pair[0], None), seeded=False)
    assert type(policy) is Unguarded and policy.methods == () and stats.fallback is None


def test_for_sequence_where_the_cost_table_rules_the_draft_out(pair):
    stats = Stats()  # no lookup allowed: plain from the first token, the table's reason as the fallback, no trial
    policy = Policy.for_sequence(DecodingSettings(methods=("draft",)), stats, PairFacts(*pair, prior="the table says no"),
                                 seeded=False)
    assert policy.methods == () and stats.fallback == {"at_token": 0, "reason": "the table says no", "retries": 0, "resumed": 0}
    stats = Stats()  # lookup allowed: it proposes alone, nothing reported
    policy = Policy.for_sequence(DecodingSettings(), stats, PairFacts(*pair, prior="the table says no"), seeded=False)
    assert policy.methods == (NGRAM,) and isinstance(policy, Policy) and stats.fallback is None


def test_for_sequence_takes_the_run_historys_advice_and_seeds_decide_on_the_cost_model(pair):
    stats = Stats()
    policy = Policy.for_sequence(DecodingSettings(), stats, PairFacts(*pair), seeded=False, advice="advised")
    assert stats.model_dropped == {"at_token": 0, "reason": "advised"} and policy.method() is NGRAM
    assert policy.guard.costs is None and policy.lengths.memory is not None  # timed, with the process's memory
    seeded = Policy.for_sequence(DecodingSettings(), Stats(), PairFacts(*pair), seeded=True)
    assert seeded.guard.costs == PairFacts(*pair).costs and seeded.lengths.memory is None


def test_seeded_means_what_the_sampler_calls_sampled():
    tiny = torch.finfo(torch.float32).tiny
    for temperature in (0.0, tiny / 2, tiny, 0.7):
        sampled = not Sampler(temperature, 1.0, 1, torch.device("cpu"), V).greedy
        assert is_seeded(temperature, 1) == sampled and not is_seeded(temperature, None)


def test_no_method_name_is_compared_outside_the_policys_room():
    """Method names are read once (runner.decoding.methods.methods_named); the decoding path holds Method values,
    so no module outside the policy's parts compares a name (a role named "draft" is not a method)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    names = r'"(?:draft|ngram|ngram\+draft|plain)"'
    compared = re.compile(rf'(?:==|!=)\s*{names}|{names}\s*(?:==|!=)|"(?:ngram|ngram\+draft|plain)"\s+(?:not\s+)?in\b')
    room = {"methods.py"}  # where the names are written, once
    files = [*(root / "runner" / "decoding").glob("*.py"), *(root / "runner").glob("*.py"), *(root / "bundler" / "serve").glob("*.py")]
    found = [f"{path.relative_to(root)}:{i}" for path in files if path.name not in room
             for i, line in enumerate(path.read_text().splitlines(), 1) if compared.search(line.split("#")[0])]
    assert found == []
