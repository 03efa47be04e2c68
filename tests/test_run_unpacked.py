"""run_unpacked end to end on a tiny pair: the contract's fields, the target's own output, verified loading."""

from __future__ import annotations

import hashlib

import pytest
import torch
from transformers import AutoTokenizer

from core.errors import BundleError
from runner.models.loading import load_model
from runner.run import generate, run_unpacked
from runner.decoding.speculative import generate_plain
from runner.checks.tokenizer_gate import fingerprint
from tests.tinymodels import make_pair

torch.set_num_threads(1)
ROLES = {"target": "target/", "draft": "draft/", "tokenizer": "tokenizer/"}
CONTRACT_STATS = {
    "new_tokens", "drafted", "accepted", "acceptance_rate", "mean_accepted_length", "target_passes",
    "tokens_per_second", "fallback",
}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return make_pair(tmp_path_factory.mktemp("bundle"), vocab_size=320)


def test_run_returns_the_contract_fields(bundle):
    result = run_unpacked(bundle["root"], ROLES, {"draft_tokens": 4}, "hello there", max_new_tokens=12)
    assert result["tokenizer"] == {"fingerprint": fingerprint(bundle["tokenizer"])}
    assert isinstance(result["text"], str)
    assert all(isinstance(t, int) for t in result["tokens"]) and 0 < len(result["tokens"]) <= 12
    assert CONTRACT_STATS <= set(result["stats"])
    assert result["stats"]["new_tokens"] == len(result["tokens"])
    assert (result["device"], result["dtype"]) == ("cpu", "float32")


def test_run_output_is_the_target_alone_greedy_output_of_the_chat_prompt(bundle):
    result = run_unpacked(bundle["root"], ROLES, {}, "what is a draft?", max_new_tokens=16, draft_tokens=3)
    tokenizer = AutoTokenizer.from_pretrained(bundle["tokenizer"])
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "what is a draft?"}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    target = load_model(bundle["target"], "float32", "cpu")
    expected = generate_plain(target, prompt, 16, eos_ids=[tokenizer.eos_token_id], vocab_size=320).tokens
    assert result["tokens"] == expected
    assert result["prompt_tokens"] == len(prompt)
    assert result["text"] == tokenizer.decode(expected, skip_special_tokens=True)


def test_raw_prompt_skips_the_chat_template(bundle):
    templated = run_unpacked(bundle["root"], ROLES, {}, "hi", max_new_tokens=2)
    raw = run_unpacked(bundle["root"], ROLES, {}, "hi", max_new_tokens=2, raw=True)
    assert raw["prompt_tokens"] < templated["prompt_tokens"]


def test_streamed_text_adds_up_to_the_final_text(bundle):
    pieces: list[str] = []
    result = run_unpacked(bundle["root"], ROLES, {}, "stream this", max_new_tokens=10, on_text=pieces.append)
    assert "".join(pieces) == result["text"]


def test_sampling_with_a_seed_is_reproducible(bundle):
    run = lambda: run_unpacked(  # noqa: E731
        bundle["root"], ROLES, {}, "sample", max_new_tokens=10, temperature=1.0, top_p=0.9, seed=3
    )["tokens"]
    assert run() == run()


def verified_files(root) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*") if p.is_file()
    }


def test_loading_from_verified_digests_gives_the_same_output(bundle):
    plain = run_unpacked(bundle["root"], ROLES, {}, "check", max_new_tokens=6)
    hashed = run_unpacked(bundle["root"], ROLES, {}, "check", max_new_tokens=6, verified_files=verified_files(bundle["root"]))
    assert hashed["tokens"] == plain["tokens"]


def test_weights_swapped_after_verification_are_refused_while_loading(tmp_path):
    paths = make_pair(tmp_path)
    digests = verified_files(tmp_path)
    weights = paths["draft"] / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(BundleError) as caught:
        run_unpacked(tmp_path, ROLES, {}, "hello", max_new_tokens=4, verified_files=digests)
    assert caught.value.code == "digest-mismatch"
    assert "model.safetensors changed after verification" in caught.value.message


def test_a_pair_loaded_once_generates_what_run_unpacked_does_each_time(bundle):
    from runner.run import generate, load_pair

    pair = load_pair(bundle["root"], ROLES, {}, context=(64, 12))
    for prompt in ("hello there", "what is a draft?"):
        once = generate(pair, pair.prompt_ids(prompt), max_new_tokens=12)
        assert once["tokens"] == run_unpacked(bundle["root"], ROLES, {}, prompt, max_new_tokens=12)["tokens"]


def test_on_tokens_returning_true_stops_the_generation_after_that_batch(bundle):
    from runner.run import generate, load_pair

    pair = load_pair(bundle["root"], ROLES, {"guard": False}, context=(64, 16))
    batches = []
    result = generate(pair, pair.prompt_ids("stop early"), max_new_tokens=16, on_tokens=lambda new: batches.append(new) or True)
    assert len(batches) == 1 and result["tokens"] == batches[0]


@pytest.mark.parametrize("case, dtype, reproducible, probe, want", [
    ("no bf16 products here", None, False, True, "float32"),
    ("bf16 native here", None, False, False, "bfloat16"),
    ("--dtype bfloat16", "bfloat16", False, True, "bfloat16"),
    ("--reproducible", None, True, True, "bfloat16"),
])
def test_a_bf16_bundle_is_computed_in_float32_only_where_that_is_measured_faster_and_nobody_named_a_dtype(
        bundle, monkeypatch, case, dtype, reproducible, probe, want):
    """The bundle says bf16; where runner.models.packed's probe finds float32 products faster (a CPU without
    native bf16; forced here, the tiny pair let past the size floor) and the user named no --dtype, the pair
    runs in float32 and says so; --dtype and --reproducible keep the bundle's bf16."""
    from runner.models import packed
    from runner.run import load_pair

    monkeypatch.setattr(packed, "SMALL_BYTES", 0)
    monkeypatch.setattr(packed, "float32_pays", lambda threads: probe)
    pair = load_pair(bundle["root"], ROLES, {"dtype": "bfloat16"}, context=(64, 8), dtype=dtype, reproducible=reproducible)
    assert pair.dtype == pair.extra["engine_fields"]["dtype"] == want, case
    assert {p.dtype for p in pair.target.parameters()} == {getattr(torch, want)}
    assert generate(pair, pair.prompt_ids("hello"), max_new_tokens=4)["tokens"]


def test_a_tiny_bf16_pair_skips_the_probe_and_stays_bf16(bundle, monkeypatch):
    """Below the size floor no product is timed (the tests' pairs, a load that must stay quick)."""
    from runner.models import packed
    from runner.run import load_pair

    monkeypatch.setattr(packed, "float32_pays", lambda threads: pytest.fail("probed a tiny pair"))
    assert load_pair(bundle["root"], ROLES, {"dtype": "bfloat16"}, context=(64, 8)).dtype == "bfloat16"
