"""The step (runner.decoding.step): mechanism only. Its sequence's policy plans; the step runs the passes, verifies
and hands back one typed Verdict per sequence (the new tokens and, for a proposal, its Outcome); both caches
keep the invariant (the target's holds every token but `last`, the draft model's every token but `behind`);
`finish` cuts at the limit and eos and lets the policy learn (the adaptive draft length)."""

from __future__ import annotations

import pytest
import torch

from runner.decoding.methods import DRAFT
from runner.decoding.policy import Outcome, Unguarded
from runner.decoding.sampling import Sampler
from runner.decoding.speculative import generate_plain
from runner.decoding.stats import Stats
from runner.decoding.step import EngineRows, SequenceState, Step, StepResult, Verdict, finish_tokens
from runner.engines import as_engine
from tests.tinymodels import layer_skip_draft, tiny_llama

torch.set_num_threads(1)
V = 320
PROMPT = [5, 17, 33, 9]


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(V, seed=0, hidden=64, layers=2, init_std=0.1)
    return target, layer_skip_draft(target, 1)


def _sequence(models, methods: tuple, k: int = 3) -> tuple[Step, SequenceState]:
    """One sequence after the prompt's prefill, as generate_speculative leaves it before its first step."""
    target, draft = (as_engine(m) for m in models)
    for engine in (target, draft):
        engine.reset(64)
    target.forward(torch.tensor(PROMPT[:-1]), last_only=True)
    stats = Stats()
    policy = Unguarded(stats, methods, max_k=2 * k)
    sampler = Sampler(0.0, 1.0, None, torch.device("cpu"), V)
    s = SequenceState(seq=0, sampler=sampler, max_new_tokens=20, k=k, policy=policy, stats=stats, last=PROMPT[-1],
                      behind=list(PROMPT))
    return Step(EngineRows(target), EngineRows(draft), draft_confidence=0.0, eos=set()), s


def test_a_proposing_step_gives_a_typed_verdict_and_keeps_both_caches_in_step(models):
    step, s = _sequence(models, (DRAFT,))
    result = step.run([s])
    assert isinstance(result, StepResult) and len(result.verdicts) == 1 and result.filled_logits == []
    verdict = result.verdicts[0]
    outcome = verdict.outcome
    assert isinstance(outcome, Outcome) and outcome.source is DRAFT and outcome.proposed == outcome.budget == 3
    assert 0 <= outcome.accepted <= 3 and len(verdict.new) == outcome.accepted + 1
    assert 0.0 < outcome.verify_seconds <= outcome.seconds
    assert verdict.new == generate_plain(models[0], torch.tensor(PROMPT), len(verdict.new)).tokens
    # the target's cache: the prompt and every new token but the last; the draft model's: all but `behind`
    assert step.target.length(0) == len(PROMPT) + len(verdict.new) - 1 and s.last == verdict.new[-1]
    assert step.draft.length(0) + len(s.behind) == len(PROMPT) + len(verdict.new)


def test_a_plain_step_has_no_outcome_and_the_draft_model_catches_up_later(models):
    step, s = _sequence(models, ())  # no method: the null policy plans a plain step
    verdict = step.run([s]).verdicts[0]
    assert verdict.outcome is None and len(verdict.new) == 1
    assert s.stats.plain_steps == 1 and s.stats.speculative_iterations == 0
    assert s.behind == PROMPT + verdict.new and step.draft.length(0) == 0  # never run: it catches up when it drafts


def test_finish_cuts_at_the_limit_and_after_eos_then_the_policy_adapts_the_draft_length(models):
    assert finish_tokens([1, 2], [3, 4, 5], max_new_tokens=4, eos=set()) == ([3, 4], True)
    assert finish_tokens([], [3, 9, 5], max_new_tokens=10, eos={9}) == ([3, 9], True)
    assert finish_tokens([], [3, 4], max_new_tokens=10, eos={9}) == ([3, 4], False)
    step, s = _sequence(models, (DRAFT,))
    verdict = step.run([s]).verdicts[0]
    all_accepted = Outcome(DRAFT, proposed=3, accepted=3, seconds=0.0, verify_seconds=0.0, budget=3)
    assert not step.finish(s, Verdict(verdict.new, all_accepted))
    assert s.tokens == verdict.new and s.k == 4  # a whole draft accepted: one longer
    early = Outcome(DRAFT, proposed=4, accepted=0, seconds=0.0, verify_seconds=0.0, budget=4)
    step.finish(s, Verdict([7], early))
    assert s.k == 3  # rejected early: one shorter
    cut = Outcome(DRAFT, proposed=2, accepted=2, seconds=0.0, verify_seconds=0.0, budget=2)
    step.finish(s, Verdict([8], cut))
    assert s.k == 3  # a length the caps or the end cut says nothing
