"""Where prompt lookup may propose, a draft model that does not pay is dropped, not all speculation
(runner.decoding.guard.Guard._drop_model), and the run history's advice leaves the draft model out only."""

from runner.decoding.methods import DRAFT, NGRAM, methods_named
from runner.decoding.policy import Policy
from runner.decoding.run_history import UNPAID_RUNS, RunHistory
from runner.decoding.stats import Stats

ALL = methods_named(("ngram+draft", "draft", "ngram"), has_draft=True)


def policy(methods: tuple, costs: tuple[float, float] | None) -> Policy:
    return Policy(Stats(), methods, max_k=8, min_acceptance=0.0, costs=costs)


def losing_draft(policy: Policy, iterations: int = 12) -> None:
    """Draft model iterations that are never accepted, as the step reports them."""
    for i in range(iterations):
        policy.method()
        policy.stats.record_iteration(4, 0, 0.0, 0.0, catch_up=False, method=DRAFT)
        policy.observe(DRAFT, 4, 0, 0.0, i + 1)


def test_a_losing_draft_model_is_dropped_and_prompt_lookup_goes_on():
    p = policy(ALL, costs=(0.2, 1.0))
    losing_draft(p)
    assert p.guard.model_dropped and p.stats.fallback is None
    assert p.stats.model_dropped["reason"].startswith("predicted speed-up")
    assert p.method() is NGRAM
    for _ in range(2):  # the guard's probes of a plain step's time, then lookup proposes again
        p.stats.record_step(0.01)
    assert p.guard.drafting(20)


def test_without_prompt_lookup_a_losing_draft_model_falls_back_to_plain():
    p = policy((DRAFT,), costs=(0.2, 1.0))
    losing_draft(p)
    assert not p.guard.model_dropped and p.stats.fallback is not None


def test_the_next_verdict_after_the_drop_falls_back():
    p = policy(ALL, costs=(0.0, 3.0))
    losing_draft(p)
    assert p.guard.model_dropped
    for i in range(12):  # lookup's proposals rejected too, each pass costing 3 steps
        p.stats.record_iteration(4, 0, 0.0, 0.0, catch_up=False, method=NGRAM)
        p.observe(NGRAM, 4, 0, 0.0, 20 + i)
    assert p.stats.fallback is not None


def test_the_run_history_advice_leaves_only_the_draft_model_out_where_lookup_is_allowed():
    p = policy(ALL, costs=None)
    p.start_plain("advised")
    assert p.guard.model_dropped and p.stats.fallback is None and p.method() is NGRAM
    plain = policy((DRAFT,), costs=None)
    plain.start_plain("advised")
    assert plain.stats.fallback["at_token"] == 0 and not plain.guard.drafting(0)


def test_a_run_that_dropped_the_draft_model_counts_as_unpaid():
    history = RunHistory()
    for _ in range(UNPAID_RUNS):
        history.record({"speculative_iterations": 5, "fallback": None,
                        "draft_model_dropped": {"at_token": 3, "reason": "r"}}, advised=False, seeded=False)
    assert history.unpaid == UNPAID_RUNS and history.advice(seeded=False)
