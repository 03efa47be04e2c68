"""runner.decoding.run_history: after UNPAID_RUNS runs in a row whose draft did not pay, a bundle's runs on this machine
decode plainly from the first token (the draft never runs), every EXPLORE_EVERY-th run speculates as usual, twice as
rarely after each exploring run that did not pay (up to every EXPLORE_MAX-th);
seeded sampling is never advised; the counts live in the store's private state, keyed by bundle and machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundler.trust.keys import key_id, load_public_key
from bundler.store.refs import parse_ref
from bundler.verbs.run import HISTORY_STATE, run_bundle
from bundler.store.layout import PRIVATE, Store
from conftest import run_bundle as run_cli
from runner.decoding.run_history import EXPLORE_EVERY, EXPLORE_MAX, UNPAID_RUNS, RunHistory, machine_key
from runner.decoding.speculative import generate_plain, generate_speculative
from tests.tinymodels import make_pair, tiny_llama

REF = "tiny-spec:1.0.0"
FELL_BACK = {"speculative_iterations": 2, "fallback": {"at_token": 3, "reason": "r", "retries": 0, "resumed": 0}}
PAID = {"speculative_iterations": 20, "fallback": None}


def test_runs_start_plain_after_the_unpaid_runs_and_explore_ever_more_rarely_while_the_draft_does_not_pay() -> None:
    history, advised = RunHistory(), []
    for _ in range(3 * EXPLORE_MAX + 8):
        advice = history.advice(seeded=False)
        advised.append(advice is not None)
        history.record(FELL_BACK, advised=advice is not None, seeded=False)
    assert advised[:UNPAID_RUNS] == [False] * UNPAID_RUNS
    # the 8th run explores, then the 16th, 32nd, 64th (the interval doubles), then every 64th
    assert [i + 1 for i, a in enumerate(advised) if not a] == [1, 2, 3, EXPLORE_EVERY, 16, 32, EXPLORE_MAX, 128, 192]
    assert history.runs == 3 * EXPLORE_MAX + 8 and history.unpaid == UNPAID_RUNS + 6


def test_an_exploring_run_that_pays_ends_the_advice_and_the_next_decision_starts_from_every_eighth() -> None:
    history = RunHistory(runs=63, unpaid=UNPAID_RUNS + 3)
    assert history.explore_every() == EXPLORE_MAX and history.advice(seeded=False) is None  # the 64th run explores
    history.record(PAID, advised=False, seeded=False)
    assert history.unpaid == 0 and history.explore_every() == EXPLORE_EVERY


def test_a_run_that_paid_or_resumed_ends_the_advice_and_short_runs_say_nothing() -> None:
    history = RunHistory(runs=5, unpaid=4)
    history.record({"speculative_iterations": 0, "fallback": None}, advised=False, seeded=False)  # too short to tell
    assert history.unpaid == 4 and history.advice(seeded=False)
    resumed = {"speculative_iterations": 9, "fallback": {**FELL_BACK["fallback"], "resumed": 1}}
    history.record(resumed, advised=False, seeded=False)
    assert history.unpaid == 0 and history.advice(seeded=False) is None
    history = RunHistory(runs=5, unpaid=4)
    history.record(PAID, advised=False, seeded=False)
    assert history.unpaid == 0


def test_seeded_sampling_is_neither_advised_nor_recorded() -> None:
    history = RunHistory(runs=4, unpaid=9)
    assert history.advice(seeded=True) is None
    history.record(FELL_BACK, advised=False, seeded=True)
    assert history.counts() == {"runs": 4, "unpaid": 9}


@pytest.mark.parametrize("stored", [None, "x", {"runs": -1, "unpaid": 2}, {"runs": 3, "unpaid": True}, {"runs": 3}])
def test_counts_that_are_not_counts_start_afresh(stored) -> None:
    assert RunHistory.from_counts(stored).counts() == {"runs": 0, "unpaid": 0}


class _Counting:
    """An engine that counts its forward passes."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def forward(self, ids, last_only):
        self.calls += 1
        return self.engine.forward(ids, last_only)


def test_start_plain_never_runs_the_draft_and_gives_the_targets_tokens() -> None:
    from runner.engines import as_engine

    target = tiny_llama(320, seed=1, hidden=64, layers=2, init_std=0.1)
    draft = _Counting(as_engine(tiny_llama(320, seed=2, hidden=16, layers=1, heads=2, kv_heads=1, init_std=0.1)))
    prompt = [5, 17, 40, 9]
    run = generate_speculative(target, draft, prompt, 40, draft_tokens=4, start_plain="remembered")
    assert draft.calls == 0 and run.stats.drafted == 0
    assert run.tokens == generate_plain(target, prompt, 40).tokens
    assert run.stats.fallback == {"at_token": 0, "reason": "remembered", "retries": 0, "resumed": 0}
    without_guard = generate_speculative(target, draft, prompt, 40, draft_tokens=4, start_plain="remembered", guard=False)
    assert draft.calls > 0 and without_guard.stats.fallback is None


@pytest.fixture(scope="module")
def useless(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> Path:
    """A signed pair whose draft never pays, whatever the clock says: the draft is the target with its output
    head rolled by one row, so its greedy token is never the target's (acceptance 0, and it costs a target)."""
    import torch
    from transformers import LlamaForCausalLM

    base = tmp_path_factory.mktemp("history")
    # the draft model alone proposes (prompt lookup, which accepts where the text repeats, is another method)
    paths = make_pair(base / "ctx", speculative={"draft_tokens": 4, "min_size_ratio": 1.0, "methods": ["draft"]})
    tied = LlamaForCausalLM.from_pretrained(paths["target"])
    tied.config.tie_word_embeddings = False  # both untied, so that they are the same size
    for role, shift in (("target", 0), ("draft", 1)):
        model = LlamaForCausalLM(tied.config).eval()
        model.load_state_dict(tied.state_dict(), strict=False)
        model.lm_head.weight.data = torch.roll(tied.get_input_embeddings().weight.data, shift, dims=0).clone()
        for path in paths[role].iterdir():
            path.unlink()
        model.save_pretrained(paths[role], safe_serialization=True)
    run_cli("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return base / "store"


def test_bundle_runs_remember_in_the_store_that_the_draft_did_not_pay(useless: Path, keypair) -> None:
    store, key = Store(useless), load_public_key(keypair[1])
    trusted = {key_id(key): key}
    reports = [run_bundle(store, parse_ref(REF), trusted, "hello there", max_new_tokens=64) for _ in range(UNPAID_RUNS + 1)]
    for report in reports[:UNPAID_RUNS]:
        assert report["stats"]["drafted"] > 0 and report["stats"]["accepted"] == 0
        assert report["stats"]["fallback"]["at_token"] > 0 and report["stats"]["fallback"]["resumed"] == 0
    last = reports[-1]["stats"]
    assert last["drafted"] == 0 and last["fallback"]["at_token"] == 0
    assert f"did not pay in the last {UNPAID_RUNS} runs" in last["fallback"]["reason"]
    assert reports[-1]["tokens"] == reports[0]["tokens"]  # greedy: the same output either way
    state = json.loads((useless / PRIVATE / f"{HISTORY_STATE}.json").read_text())
    assert state == {machine_key(reports[0]["bundle"]["digest"]): {"runs": UNPAID_RUNS + 1, "unpaid": UNPAID_RUNS}}


def test_damaged_history_state_is_ignored_and_rewritten(useless: Path, keypair, tmp_path: Path) -> None:
    from conftest import copy_store

    store_dir = copy_store(useless, tmp_path)
    (store_dir / PRIVATE / f"{HISTORY_STATE}.json").write_text("{not json")
    key = load_public_key(keypair[1])
    report = run_bundle(Store(store_dir), parse_ref(REF), {key_id(key): key}, "hello", max_new_tokens=8)
    assert report["ok"]
    assert json.loads((store_dir / PRIVATE / f"{HISTORY_STATE}.json").read_text())
