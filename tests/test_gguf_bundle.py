"""GGUF bundles: the tokenizer gate on GGUF metadata refuses each near-miss field by field before any
weights load, a GGUF pair runs on the llama.cpp engine, a GGUF/safetensors mix is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core.errors import BundleError
from runner.checks import gguf_header, gguf_tokenizer_gate
from runner.engines import llamacpp
from runner.run import run_unpacked
from tests.tinygguf import tokenizer_fields, write_gguf

ROLES = {"target": "target", "draft": "draft"}
SMALL = dict(hidden=32, layers=1, heads=2, kv_heads=1)


def gguf_pair(root: Path, draft_tokenizer: dict | None = None) -> Path:
    (root / "target").mkdir(parents=True)
    (root / "draft").mkdir()
    write_gguf(root / "target" / "model.gguf", seed=0, hidden=128, layers=2)
    write_gguf(root / "draft" / "model.gguf", seed=1, tokenizer=draft_tokenizer, **SMALL)
    return root


@pytest.fixture
def no_weights_load(monkeypatch):
    """Fails the test if a model's weights are loaded (llamacpp.load builds a full context)."""
    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the refusal")
    monkeypatch.setattr(llamacpp, "load", refuse)


FIELDS = tokenizer_fields()
TOKEN = FIELDS["tokens"].index("Ġthe") if "Ġthe" in FIELDS["tokens"] else 300
NEAR_MISSES = {
    "one token text": ({"tokens": FIELDS["tokens"][:TOKEN] + ["Ġtha"] + FIELDS["tokens"][TOKEN + 1 :]},
                       f"token {TOKEN} differs"),
    "a merge": ({"merges": FIELDS["merges"][:5] + ["x y"] + FIELDS["merges"][6:]}, "merge 5 differs"),
    "bos id": ({"bos_token_id": 0}, "bos_token_id differs: target 1 draft 0"),
    "eos id": ({"eos_token_id": 0}, "eos_token_id differs: target 2 draft 0"),
    "add_bos": ({"add_bos_token": True}, "add_bos_token differs: target False draft True"),
    "pre-tokenizer": ({"pre": "gpt-2"}, "pre differs: target 'smollm' draft 'gpt-2'"),
}


@pytest.mark.parametrize("case", list(NEAR_MISSES))
def test_gate_refuses_each_gguf_tokenizer_near_miss_field_by_field_before_weights_load(tmp_path, no_weights_load, case):
    change, message = NEAR_MISSES[case]
    root = gguf_pair(tmp_path, change)
    with pytest.raises(BundleError) as refused:
        run_unpacked(root, ROLES, {}, "hello", max_new_tokens=4, raw=True)
    assert refused.value.code == "tokenizer-mismatch"
    assert message in str(refused.value)


def test_gguf_pair_runs_on_the_llama_cpp_engine_with_the_target_greedy_output(tmp_path):
    root = gguf_pair(tmp_path)
    result = run_unpacked(root, ROLES, {"min_size_ratio": 1}, "the quick brown fox", max_new_tokens=12, raw=True)
    target = llamacpp.load(root / "target" / "model.gguf", n_ctx=64, threads=1)
    from runner.decoding.speculative import generate_plain

    prompt = target.llm.tokenize(b"the quick brown fox", add_bos=False)
    assert result["engine"] == "llama.cpp"
    assert result["tokens"] == generate_plain(target, prompt, 12, eos_ids={2}).tokens
    assert result["tokenizer"]["fingerprint"] == gguf_tokenizer_gate.fingerprint(
        gguf_tokenizer_gate.tokenizer_metadata(gguf_header.read_header(root / "target" / "model.gguf")))


def test_a_pair_mixing_gguf_and_safetensors_is_refused(tmp_path, no_weights_load):
    root = gguf_pair(tmp_path)
    shutil.rmtree(root / "draft")
    (root / "draft").mkdir()
    (root / "draft" / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(BundleError) as refused:
        run_unpacked(root, ROLES, {}, "hello", max_new_tokens=4, raw=True)
    assert refused.value.code == "invalid-bundle"
    assert "a bundle pairs two GGUF files or two safetensors models, not one of each" in str(refused.value)


def test_pairing_refuses_a_draft_too_close_in_size(tmp_path, no_weights_load):
    root = tmp_path
    (root / "target").mkdir()
    (root / "draft").mkdir()
    write_gguf(root / "target" / "model.gguf", seed=0, **SMALL)
    write_gguf(root / "draft" / "model.gguf", seed=1, **SMALL)
    with pytest.raises(BundleError) as refused:
        run_unpacked(root, ROLES, {}, "hello", max_new_tokens=4, raw=True)
    assert refused.value.code == "size-ratio"


def test_a_gguf_pair_loaded_once_generates_what_run_unpacked_does(tmp_path):
    from runner.run import generate, load_pair

    root = gguf_pair(tmp_path)
    pair = load_pair(root, ROLES, {"min_size_ratio": 1}, context=(32, 12))
    assert pair.engine == "llama.cpp" and pair.forward() == {"target": "llama.cpp", "draft": "llama.cpp"}
    once = generate(pair, pair.prompt_ids("the quick brown fox", raw=True), max_new_tokens=12)
    assert once["tokens"] == run_unpacked(root, ROLES, {"min_size_ratio": 1}, "the quick brown fox", max_new_tokens=12, raw=True)["tokens"]


def test_a_chat_template_cannot_reach_pythons_internals() -> None:
    """A GGUF file's chat template is rendered in jinja2's sandbox, like transformers' and llama-cpp-python's
    (runner.models.chat_template); a sandbox violation is a clean [invalid-bundle] refusal."""
    from runner.models.chat_template import TemplateRefused, render
    from runner.gguf_run import NO_BOS_EOS

    assert render("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}",
                  [{"role": "user", "content": "hi"}], variables=NO_BOS_EOS) == "[user] hi"
    with pytest.raises(TemplateRefused) as err:
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}", [], variables=NO_BOS_EOS)
    assert err.value.code == "invalid-bundle" and "sandbox" in err.value.message
