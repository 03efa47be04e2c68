"""`--reproducible` through the command line (issue 50): five prompts sent twice to one server, and to a second
fresh server, at 1 and 4 clients, with the draft on and off, get identical texts: the batch-invariant forward
(runner.models.invariant) makes a greedy answer independent of what else shares its pass. `run --reproducible`
says in `run --json` which mode ran; a GGUF pair refuses the mode (it is the compact torch forward's)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import run_bundle
from tests.test_serve import REF, Server, _pack
from tests.test_serve_batch import _complete

PROMPTS = ["hello there", "what is a draft?", "one two three", "the quick fox", "lossless decoding"]


def _answers(srv: Server, clients: int) -> list[str]:
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(lambda p: _complete(srv, p, 16), PROMPTS))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, keypair) -> Path:
    return _pack(tmp_path_factory.mktemp("reproducible"), keypair, speculative={"draft_tokens": 3})


@pytest.mark.parametrize("draft", [[], ["--no-draft"]], ids=["draft-on", "draft-off"])
def test_the_same_request_gets_the_same_tokens_whatever_shares_the_batch(store: Path, keypair, draft: list[str]) -> None:
    texts = []
    for _ in range(2):  # two fresh servers
        srv = Server(store, keypair[1], "--reproducible", "--sequences", "4", "--dtype", "bfloat16", *draft)
        try:
            texts += [_answers(srv, 1), _answers(srv, 4), _answers(srv, 1), _answers(srv, 4)]
        finally:
            assert srv.stop() == 0
    assert all(t == texts[0] for t in texts), texts
    assert len(set(texts[0])) > 1  # the prompts get different answers: the test would see a difference


def test_run_reproducible_says_which_mode_ran(store: Path, keypair) -> None:
    result = run_bundle("run", REF, "--prompt", "hello there", "--max-new-tokens", "8", "--reproducible", "--json",
                        "--key", str(keypair[1]), "--store", str(store), check=True)
    report = json.loads(result.out)
    assert report["ok"] and report["reproducible"] is True


def test_a_gguf_pair_refuses_reproducible(tmp_path: Path, keypair) -> None:
    from tests.test_gguf_bench import gguf_context

    run_bundle("pack", str(gguf_context(tmp_path / "ctx")), "-t", REF, "--key", str(keypair[0]), "--store", str(tmp_path / "s"), check=True)
    result = run_bundle("run", REF, "--prompt", "hi", "--reproducible", "--key", str(keypair[1]), "--store", str(tmp_path / "s"))
    assert result.code == 2 and "--reproducible" in result.err
