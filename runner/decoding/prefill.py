"""The one prefill: how a sequence's prompt reaches the caches, and where its first new token comes from.

Written once for both drivers (runner.decoding.batching for `bundle serve`'s batch; runner.decoding.speculative
for `bundle run`), so that what they decide about a prompt is decided here only:

- What the caches hold of the prompt already stays (`start`): in a batch, an earlier request's cells in the
  sequence id or a copy the prompt cache put back (runner.decoding.prompt_cache); a single sequence's engine,
  reset, holds nothing. The target keeps at most all but the prompt's last token, so that it runs at least that
  one, for the logits of the first new token; `cached` counts what it kept (serve's
  specbundle_cached_prompt_tokens_total). The draft model keeps whatever prefix it holds (`draft_cached`).
- The rest of the prompt goes through the target in chunks (`chunks`), oldest prompt first, as much per pass as
  the pass has room for beside the decoding sequences' rows (a batch context's max_tokens; a single sequence's
  engine takes the whole prompt in one row and cuts it itself). Each chunk is one target pass in the
  sequence's statistics (`target_calls` (cache length before, tokens in) and `target_passes`), never a step.
- The first new token comes with the prompt's last chunk (`prefilled`): picked from that pass's last logits by
  the sequence's sampler, as llama-server and transformers' generate do, so it costs no pass of its own. The
  sequence then steps (runner.decoding.step) with `last` = that token.
- The draft model catches up with its first drafting step: `behind` = the prompt past what its cache holds, and
  the first token (nothing without a draft model).
- The n-gram index (prompt lookup) starts with the whole prompt.
"""

from __future__ import annotations

__all__ = ["PromptState", "chunks", "prefilled", "start"]

from dataclasses import dataclass

from runner.decoding.step import SequenceState, Step, Verdict


@dataclass(kw_only=True)
class PromptState(SequenceState):
    """A sequence with its prompt, and the prompt's progress through the prefill."""

    prompt: list[int]
    prefilled: int = 0  # prompt tokens in the target's cache
    cached: int = 0  # of them, those the target's cache held already (an earlier request's cells)
    draft_cached: int = 0  # prompt tokens the draft model's cache held already

    @property
    def prefilling(self) -> bool:
        """Whether the prompt is still going in (no new token yet)."""
        return self.last is None


def start(step: Step, s: PromptState, held: int = 0, draft_held: int = 0) -> None:
    """A sequence's prefill begins: of the prompt, the target's cache keeps the `held` first tokens (all but the
    last at most), the draft model's its `draft_held` first ones; the rest of their cells in the id go. The
    n-gram index takes the prompt."""
    if not s.prompt:
        raise ValueError("the prompt has no tokens")
    s.prefilled = s.cached = min(held, len(s.prompt) - 1)
    step.target.keep(s.seq, s.cached)
    s.draft_cached = draft_held if step.draft is not None else 0
    if step.draft is not None:
        step.draft.keep(s.seq, s.draft_cached)
    if s.proposer is not None:
        s.proposer.extend(s.prompt)


def chunks(waiting: list[PromptState], room: int) -> list[tuple[PromptState, list[int]]]:
    """The next chunk of each waiting prompt, in order, within `room` tokens of one target pass."""
    out = []
    for s in waiting:
        if room <= 0:
            break
        chunk = s.prompt[s.prefilled : s.prefilled + room]
        out.append((s, chunk))
        room -= len(chunk)
    return out


def prefilled(step: Step, s: PromptState, chunk: list[int], logits) -> Verdict | None:
    """After a target pass ran `chunk` of the prompt (its logits: the row's last): the pass counted; with the
    prompt's last chunk, the first new token, as the sequence's first Verdict (no proposal: outcome None)."""
    s.prefilled += len(chunk)
    s.stats.target_passes += 1
    s.stats.target_calls.append((s.prefilled - len(chunk), len(chunk)))
    if s.prefilled < len(s.prompt):
        return None
    token, _ = step.pick(s, logits)
    s.last = token
    s.behind = [*s.prompt[s.draft_cached :], token] if step.draft is not None else []
    return Verdict([token], None)
