"""--reproducible's forward (runner.models.invariant): a token's logits are the same bits whatever else is in its
pass, its slot in the batch, and how its sequence was cut into passes (prompt cache, verify passes)."""

from __future__ import annotations

import random

import torch

from runner.models import compact_llama as cl


def _model(dtype: torch.dtype, invariant: bool) -> cl.CompactLlama:
    torch.manual_seed(0)
    cfg = cl.compact_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 320, "tie_word_embeddings": True})
    weights = {k: (torch.randn(s) * 0.05 + (1 if len(s) == 1 else 0)).to(dtype) for k, s in cl._expected_shapes(cfg).items()}
    model = cl.CompactLlama(cl.weights_from_state_dict(cfg, weights))
    return model.batch_invariant() if invariant else model


def _alone_and_batched(model: cl.CompactLlama, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's logits stepped alone one token at a time, and the same sequence in passes of random
    lengths among other sequences' rows, at a random id, in a random row order."""
    rng = random.Random(seed)
    tokens = [rng.randrange(320) for _ in range(300)]
    with torch.inference_mode():
        cache = model.new_cache()
        alone = torch.cat([model(torch.tensor([t]), cache=cache).logits[0].float() for t in tokens])
        batch, me = model.new_batched_cache(4, 2048), rng.randrange(4)
        others = {s: [rng.randrange(320) for _ in range(400)] for s in range(4) if s != me}
        held, got, pos = dict.fromkeys(others, 0), [], 0
        while pos < len(tokens):
            rows, n = [], rng.choice([1, 2, 5, 13, 40])
            for s in rng.sample(range(4), 4):
                if s == me:
                    rows.append((s, pos, tokens[pos : pos + n]))
                elif rng.random() < 0.7:
                    k = rng.choice([1, 3, 20])
                    rows.append((s, held[s], others[s][held[s] : held[s] + k]))
                    held[s] += k
            first = sum(len(r[2]) for r in rows[: [r[0] for r in rows].index(me)])
            got.append(model.forward_rows(batch, rows, list(range(first, first + len(tokens[pos : pos + n])))))
            pos += n
    return alone, torch.cat(got)


def test_a_tokens_bf16_logits_are_the_same_bits_alone_and_in_any_batch_with_reproducible() -> None:
    model = _model(torch.bfloat16, invariant=True)
    for seed in range(3):
        alone, batched = _alone_and_batched(model, seed)
        assert torch.equal(alone, batched)


def test_the_default_forward_is_not_batch_invariant_which_is_why_the_mode_exists() -> None:
    model = _model(torch.bfloat16, invariant=False)
    assert any(not torch.equal(*_alone_and_batched(model, seed)) for seed in range(3))
