"""The architectures people bundle, each as a tiny random pair built here: packed, signed, verified, gated and
run by `bundle run`; its greedy output (fp32) is transformers' own `generate` on the same target, token for
token; `run --json` says which forward ran (runner.models.compact_llama where it computes exactly, else transformers)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bundler.trust.keys import key_id, load_public_key
from bundler.store.refs import parse_ref
from bundler.verbs.run import run_bundle as run_in_process
from bundler.store.layout import Store
from conftest import run_bundle
from tests.tinymodels import make_pair

REF = "tiny-spec:1.0.0"  # the name the Kitfile signs (make_pair)
PROMPT = "the quick brown fox speculative decoding drafts tokens"  # longer than gemma2's 16-token window here
COMPACT = {"llama", "qwen2", "mistral"}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma2", "phi3"])
def test_greedy_bundle_run_is_transformers_generate(tmp_path: Path, keypair: tuple[Path, Path], arch: str) -> None:
    paths = make_pair(tmp_path / "ctx", arch=arch, max_shard_size="60KB" if arch == "llama" else None)
    store = tmp_path / "store"
    run_bundle("pack", str(paths["root"]), "-t", REF, "--key", str(keypair[0]), "--store", str(store), check=True)
    key = load_public_key(keypair[1])
    out = run_in_process(Store(store), parse_ref(REF), {key_id(key): key}, PROMPT, max_new_tokens=24, raw=True,
                         dtype="float32", device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(paths["tokenizer"])
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    target = AutoModelForCausalLM.from_pretrained(paths["target"], dtype=torch.float32).eval()
    expected = target.generate(torch.tensor([prompt_ids]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                               pad_token_id=0)[0, len(prompt_ids):].tolist()
    # run stops at an end-of-sequence token, generate (told no eos) goes on: compare what run produced
    assert out["tokens"] == expected[: len(out["tokens"])] and len(out["tokens"]) > 0
    path = "compact" if arch in COMPACT else "transformers"
    assert out["forward"] == {"target": path, "draft": path}
