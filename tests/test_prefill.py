"""The one prefill (runner.decoding.prefill): what the caches keep of a prompt, the chunks the rest goes in, oldest
prompt first, and the first new token, which comes with the prompt's last chunk and is the target's own."""

from __future__ import annotations

import pytest
import torch

from runner.decoding.batching import BatchedGenerator
from runner.decoding.ngram import NgramProposer
from runner.decoding.policy import Unguarded
from runner.decoding.prefill import PromptState, chunks, prefilled, start
from runner.decoding.sampling import Sampler
from runner.decoding.stats import Stats
from runner.decoding.step import EngineRows, Step
from runner.engines import as_engine
from runner.models.compact_llama import CompactLlama
from tests.tinymodels import layer_skip_draft, tiny_llama

torch.set_num_threads(1)
V = 320
PROMPT = [5, 17, 33, 9, 40, 2]


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(V, seed=0, hidden=64, layers=2, init_std=0.3)
    return CompactLlama(target), CompactLlama(layer_skip_draft(target, 1))


def _state(seq: int, prompt: list[int], proposer: NgramProposer | None = None) -> PromptState:
    """A new greedy sequence that plans plain steps (no method)."""
    stats = Stats()
    return PromptState(seq=seq, prompt=list(prompt), sampler=Sampler(0.0, 1.0, None, torch.device("cpu"), V),
                       max_new_tokens=8, k=3, policy=Unguarded(stats, (), max_k=6), proposer=proposer, stats=stats)


def _targets_next(model, prompt: list[int]) -> int:
    """The target's greedy next token after the whole prompt, in one pass over it."""
    with torch.inference_mode():
        return int(model(torch.tensor([prompt])).logits[0, -1].argmax())


def test_in_a_batch_the_first_token_comes_with_the_prompts_pass_and_the_draft_catches_up_later(models) -> None:
    generator = BatchedGenerator(*models, sequences=2, n_ctx_seq=64, draft_tokens=3, guard=False)
    s = generator.add(PROMPT, 8)
    assert s.prefilling and s.cached == 0
    generator.step()
    assert s.stats.target_calls == [(0, len(PROMPT))] and s.stats.target_passes == 1 and s.stats.plain_steps == 0
    assert s.tokens == [_targets_next(models[0], PROMPT)] and s.last == s.tokens[0] and not s.prefilling
    assert s.behind == PROMPT + s.tokens and generator.draft.length(s.seq) == 0  # it runs them when it first drafts


def test_waiting_prompts_share_a_pass_oldest_first_and_the_last_one_taken_is_cut_to_the_room() -> None:
    a, b, c = _state(0, [1] * 5), _state(1, [2] * 4), _state(2, [3] * 3)
    a.prefilled = 2  # its first chunk went in at an earlier step
    assert [(s.seq, chunk) for s, chunk in chunks([a, b, c], 6)] == [(0, [1, 1, 1]), (1, [2, 2, 2])]
    assert chunks([a, b, c], 0) == []


def test_what_the_caches_hold_of_the_prompt_stays_up_to_all_but_its_last_token_on_one_engine_too(models) -> None:
    """A single sequence's engine as a context (EngineRows): the prefill keeps the target's cells of the prompt
    but its last token, which alone goes in, and gives the first token; the draft keeps all it holds."""
    target, draft = as_engine(models[0]), as_engine(models[1])
    for engine in (target, draft):
        engine.reset(64)
        engine.forward(torch.tensor(PROMPT + [7]), last_only=True)  # the prompt, and a token past it
    step = Step(EngineRows(target), EngineRows(draft), draft_confidence=0.0, eos=set())
    s = _state(0, PROMPT, NgramProposer(1, 3))
    start(step, s, held=len(PROMPT) + 1, draft_held=len(PROMPT))
    assert s.cached == s.prefilled == len(PROMPT) - 1 and target.length() == len(PROMPT) - 1
    assert s.draft_cached == len(PROMPT) and draft.length() == len(PROMPT) and list(s.proposer.tokens) == PROMPT
    [(_, chunk)] = chunks([s], step.target.max_tokens)
    assert chunk == PROMPT[-1:]
    result = step.run([], lambda room: [(s.seq, chunk, False)])
    first = prefilled(step, s, chunk, result.filled_logits[0])
    assert first.new == [_targets_next(models[0], PROMPT)] and first.outcome is None
    assert s.stats.target_calls == [(len(PROMPT) - 1, 1)] and s.behind == first.new and s.last == first.new[0]
