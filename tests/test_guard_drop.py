"""Where prompt lookup may propose, a draft model that does not pay is dropped, not all speculation
(runner.decoding.guard.Guard._drop_model), and the run history's advice leaves the draft model out only."""

from runner.decoding.guard import Guard
from runner.decoding.run_history import UNPAID_RUNS, RunHistory
from runner.decoding.stats import Stats

ALL = ("ngram+draft", "draft", "ngram")


def losing_draft(guard: Guard, methods: tuple[str, ...], iterations: int = 12) -> None:
    """Draft model iterations that are never accepted, as the step reports them."""
    for i in range(iterations):
        guard.method(methods)
        guard.stats.record_iteration(4, 0, 0.0, 0.0, catch_up=False, method="draft")
        guard.observe(4, 0, 0.0, i + 1, "draft")


def test_a_losing_draft_model_is_dropped_and_prompt_lookup_goes_on():
    guard = Guard(Stats(), max_k=8, min_acceptance=0.0, costs=(0.2, 1.0), methods=ALL)
    losing_draft(guard, ALL)
    assert guard.model_dropped and guard.stats.fallback is None
    assert guard.stats.model_dropped["reason"].startswith("predicted speed-up")
    assert guard.method(ALL) == "ngram"
    for _ in range(2):  # the guard's probes of a plain step's time, then lookup proposes again
        guard.stats.record_step(0.01)
    assert guard.drafting(20)


def test_without_prompt_lookup_a_losing_draft_model_falls_back_to_plain():
    guard = Guard(Stats(), max_k=8, min_acceptance=0.0, costs=(0.2, 1.0), methods=("draft",))
    losing_draft(guard, ("draft",))
    assert not guard.model_dropped and guard.stats.fallback is not None


def test_the_next_verdict_after_the_drop_falls_back():
    guard = Guard(Stats(), max_k=8, min_acceptance=0.0, costs=(0.0, 3.0), methods=ALL)
    losing_draft(guard, ALL)
    assert guard.model_dropped
    for i in range(12):  # lookup's proposals rejected too, each pass costing 3 steps
        guard.stats.record_iteration(4, 0, 0.0, 0.0, catch_up=False, method="ngram")
        guard.observe(4, 0, 0.0, 20 + i, "ngram")
    assert guard.stats.fallback is not None


def test_the_run_history_advice_leaves_only_the_draft_model_out_where_lookup_is_allowed():
    guard = Guard(Stats(), max_k=8, min_acceptance=0.0, costs=None, methods=ALL)
    guard.start_plain("advised")
    assert guard.model_dropped and guard.stats.fallback is None and guard.method(ALL) == "ngram"
    plain = Guard(Stats(), max_k=8, min_acceptance=0.0, costs=None, methods=("draft",))
    plain.start_plain("advised")
    assert plain.stats.fallback["at_token"] == 0 and not plain.drafting(0)


def test_a_run_that_dropped_the_draft_model_counts_as_unpaid():
    history = RunHistory()
    for _ in range(UNPAID_RUNS):
        history.record({"speculative_iterations": 5, "fallback": None,
                        "draft_model_dropped": {"at_token": 3, "reason": "r"}}, advised=False, seeded=False)
    assert history.unpaid == UNPAID_RUNS and history.advice(seeded=False)
