"""The acceptance rule of speculative decoding, written once: how tokens come from logits (`Sampler`), and how a
verify pass's logits accept or reject proposed tokens, greedy or sampled.

A proposal is either a draft model's (each token drawn from the draft's distribution q) or deterministic (an
n-gram's: q is one-hot on its token, `one_hot`). Sampled, token x is accepted with min(1, p(x)/q(x)) and on
the first rejection the next token is drawn from max(p - q, 0) normalised: for a one-hot q that is "accept
with p(x), else draw from p with x removed". Either way the output follows the target's distribution exactly.
"""

from __future__ import annotations

__all__ = ["Sampler", "greedy_choices", "one_hot", "verify_greedy", "verify_sampled"]

import numpy as np
import torch


class Sampler:
    """Turns logits into tokens: argmax at temperature 0, else seeded sampling with temperature and top-p.

    Logits are cut to the first `vocab_size` ids, so models whose embeddings are padded past the
    tokenizer's vocabulary are compared on the ids the tokenizer can produce.
    """

    def __init__(self, temperature: float, top_p: float, seed: int | None, device: torch.device, vocab_size: int):
        # A temperature below float32's smallest normal number divides the float32 logits by (nearly) 0: take its
        # limit, argmax, rather than NaNs.
        self.greedy = temperature < torch.finfo(torch.float32).tiny
        self.temperature, self.top_p, self.vocab_size = temperature, top_p, vocab_size
        self.generator = torch.Generator(device=device)
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(n, V) logits -> (n, vocab_size) float32 probabilities after temperature and top-p."""
        logits = logits[..., : self.vocab_size].float()
        # Shifted by the row's max before dividing (softmax is the same): a tiny temperature such as 1e-300 then
        # gives -inf for every other token, a one-hot row, where logits / t would be inf - inf = NaN.
        probs = torch.softmax((logits - logits.amax(-1, keepdim=True)) / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            keep = (sorted_p.cumsum(-1) - sorted_p) < self.top_p
            keep[..., 0] = True  # the top token always (a top_p of 5e-324 is 0 in float32)
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=self.generator).view(-1)

    def pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One token per row, and the distribution it was drawn from (None when greedy)."""
        if self.greedy:  # argmax over float32 is exact and ~4x faster than over bfloat16 on a CPU
            return logits[..., : self.vocab_size].float().argmax(-1), None
        probs = self.probs(logits)
        return self.sample(probs), probs


def one_hot(tokens: list[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """The distributions of a deterministic proposal (an n-gram's): (len(tokens), vocab_size), 1 at each token."""
    q = torch.zeros(len(tokens), vocab_size, device=device)
    q[torch.arange(len(tokens), device=device), torch.tensor(tokens, dtype=torch.long, device=device)] = 1.0
    return q


def greedy_choices(logits, vocab_size: int) -> list[int]:
    """Each row's argmax over the first vocab_size ids: numpy's for a batch context's float32 logits (no torch
    thread pool beside llama.cpp's threads), torch's for an engine's (argmax over float32 is exact and faster
    than over bfloat16 on a CPU)."""
    if isinstance(logits, np.ndarray):
        return logits[:, :vocab_size].argmax(-1).tolist()
    return logits[:, :vocab_size].float().argmax(-1).tolist()


def verify_greedy(logits, drafted: list[int], vocab_size: int) -> tuple[int, int, list[int]]:
    """Accepts drafts while they equal the target's argmax; the next token is the target's argmax after them.

    Returns n accepted, the next token and the new tokens: n drafts and the next one."""
    k = len(drafted)
    choice = greedy_choices(logits, vocab_size)  # the target's greedy choice at each of the k + 1 positions
    n = 0
    while n < k and drafted[n] == choice[n]:
        n += 1
    return n, choice[n], drafted[:n] + [choice[n]]


def verify_sampled(
    logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None, sampler: Sampler
) -> tuple[int, torch.Tensor, list[int]]:
    """Rejection sampling: accept draft i with min(1, p_i/q_i); at the first rejection resample from
    max(p - q, 0) normalised; after k acceptances take a bonus token from p_{k+1}. Lossless."""
    k = len(drafts)
    p = sampler.probs(logits)  # (k + 1, V)
    rows = p
    accept = drafts.new_empty(0)
    if k:
        position = torch.arange(k, device=drafts.device)
        p_draft, q_draft = p[position, drafts], q[position, drafts]
        uniform = torch.rand(k, generator=sampler.generator, device=p.device)
        accept = (uniform * q_draft < p_draft).long()  # u < p/q without dividing by q
        residual = (p[:k] - q).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p[:k])  # p == q: nothing to correct
        rows = torch.cat([residual, p[k:]])
    # Row i is where the next token comes from when exactly i drafts were accepted; draw all, keep one.
    candidates = sampler.sample(rows)
    flat = torch.cat([accept, candidates, drafts]).tolist()  # the one device sync of the iteration
    accepted, drafted = flat[:k], flat[2 * k + 1 :]
    n = 0
    while n < k and accepted[n]:
        n += 1
    return n, candidates[n : n + 1], drafted[:n] + [flat[k + n]]
