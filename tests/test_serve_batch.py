"""`bundle serve` with continuous batching, as a real server process on 127.0.0.1: concurrent requests decode
together and each answer is what it would be alone; requests join and leave mid-batch; a client that goes
away frees its sequence; the queue bound and 429 hold; SIGTERM lets the open requests finish. A GGUF bundle
(llama.cpp) throughout; a safetensors bundle (torch, our compact forward) batches as well (the last test)."""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from conftest import run_bundle
from tests.test_serve import REF, Server, _free_port, _pack

PROMPTS = ["hello there", "what is a draft?", "one two three", "the quick fox", "lossless decoding", "a b c d", "tokens", "why"]
TIE = 1e-3  # as in tests/test_batching.py: a difference where the single computation's top two logits are this close


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, keypair) -> Path:
    from tests.test_gguf_bench import gguf_context

    base = tmp_path_factory.mktemp("serve-batch")
    run_bundle("pack", str(gguf_context(base / "ctx")), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return base


METRICS_KEY = "batch-metrics-key"  # the prompt cache's figures go only to this credential (bundler.serve.api_key)


def _metrics_key_file(store: Path) -> str:
    path = store / "metrics.key"
    path.write_text(METRICS_KEY)
    return str(path)


@pytest.fixture(scope="module")
def server(store: Path, keypair):
    srv = Server(store / "store", keypair[1], "--sequences", "8", "--metrics-key-file", _metrics_key_file(store), metrics_key=METRICS_KEY)
    yield srv
    srv.stop()


def _complete(srv: Server, prompt: str, max_tokens: int) -> str:
    body = {"model": REF, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def _stream(srv: Server, prompt: str, max_tokens: int, pieces: list[float] | None = None) -> dict:
    body = {"model": REF, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    text, usage, done, finish = "", None, False, None
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                if chunk["choices"]:
                    text += chunk["choices"][0]["text"]
                    finish = chunk["choices"][0]["finish_reason"] or finish
                    if pieces is not None:
                        pieces.append(time.monotonic())
    return {"text": text, "usage": usage, "done": done, "finish_reason": finish}


def _live(srv: Server) -> dict:
    return httpx.get(srv.url + "/status.json", timeout=10).json()["live"]


def _wait(condition, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _same_up_to_ties(store: Path, prompt: str, alone: str, batched: str, max_tokens: int) -> bool:
    """Equal, or the texts part at a token where the single computation's top two logits tie (TIE)."""
    if alone == batched:
        return True
    from runner.engines.llamacpp import load
    from runner.checks.gguf_header import read_header
    from runner.gguf_run import GGUFTokenizer

    path = store / "ctx" / "target" / "model.gguf"
    tokenizer, engine = GGUFTokenizer(path, read_header(path)["metadata"]), load(path, n_ctx=512, threads=1)
    ids = tokenizer.prompt_ids(prompt, raw=True)
    engine.reset(len(ids) + max_tokens)
    logits = engine.forward(torch.tensor(ids), last_only=True)[0]
    tokens: list[int] = []
    for _ in range(max_tokens):
        token = int(logits.argmax())
        if not batched.startswith(tokenizer.decode(tokens + [token])):  # the first token the texts part at
            top = torch.topk(logits, 2).values
            return float(top[0] - top[1]) <= TIE * float(logits.abs().max())
        tokens.append(token)
        logits = engine.forward(torch.tensor([token]), last_only=True)[0]
    return False


def test_eight_concurrent_requests_decode_in_one_batch_and_each_answers_as_alone(server: Server, store: Path) -> None:
    alone = [_complete(server, p, 24) for p in PROMPTS]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: _complete(server, p, 24), PROMPTS))
    for prompt, a, b in zip(PROMPTS, alone, together):
        assert _same_up_to_ties(store, prompt, a, b, 24), (prompt, a, b)
    metrics = server.metrics()
    sizes = {labels: v for (name, labels), v in metrics.items() if name == "specbundle_batch_size_bucket"}
    assert sizes[(("le", "1.0"),)] < metrics[("specbundle_batch_size_count", ())]  # some steps held several requests
    assert metrics[("specbundle_sequences", ())] == 8
    assert metrics[("specbundle_queue_wait_seconds_count", ())] >= 16


def test_a_request_joins_and_leaves_while_a_long_one_decodes(server: Server, store: Path) -> None:
    long_alone = _complete(server, PROMPTS[0], 400)
    short_alone = [_complete(server, p, 8) for p in PROMPTS[1:4]]
    long_pieces: list[float] = []
    with ThreadPoolExecutor(4) as pool:
        long = pool.submit(_stream, server, PROMPTS[0], 400, long_pieces)
        _wait(lambda: len(long_pieces) >= 3, "the long request's first pieces")
        shorts = [pool.submit(_stream, server, p, 8) for p in PROMPTS[1:4]]
        short_results = [s.result() for s in shorts]
        short_done = time.monotonic()
        long_result = long.result()
    assert long_pieces[-1] > short_done  # the long request was still decoding when the short ones had left
    assert _same_up_to_ties(store, PROMPTS[0], long_alone, long_result["text"], 400)
    for prompt, alone, got in zip(PROMPTS[1:4], short_alone, short_results):
        assert got["done"] and _same_up_to_ties(store, prompt, alone, got["text"], 8)
    _wait(lambda: _live(server)["active_sequences"] == 0, "the batch to empty", 10)


def test_a_request_sharing_an_earlier_ones_prompt_prefix_reuses_its_cells_and_answers_as_bundle_run(server: Server, store: Path,
                                                                                                    keypair) -> None:
    from runner.checks.gguf_header import read_header
    from runner.gguf_run import GGUFTokenizer

    first, second = "the quick brown fox jumps over", "the quick brown fox sleeps in"
    path = store / "ctx" / "target" / "model.gguf"
    tokenizer = GGUFTokenizer(path, read_header(path)["metadata"])
    a, b = (tokenizer.prompt_ids(p, raw=True) for p in (first, second))
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    _complete(server, first, 12)
    before = server.metrics()[("specbundle_cached_prompt_tokens_total", ())]
    served = _complete(server, second, 12)
    assert server.metrics()[("specbundle_cached_prompt_tokens_total", ())] - before >= common > 0
    ran = run_bundle("run", REF, "--prompt", second, "--raw", "--max-new-tokens", "12", "--key", str(keypair[1]),
                     "--store", str(store / "store"), "--json", check=True)
    assert _same_up_to_ties(store, second, json.loads(ran.out)["text"], served, 12)


def test_a_prompt_asked_again_after_its_sequence_served_another_comes_back_from_the_prompt_cache(store: Path, keypair) -> None:
    """One sequence: A, then B (another start), then A again: with the prompt cache (on by default) A's cells
    come back from host memory and only its last token is prefilled; with --prompt-cache 0 they are gone. The
    answers are the same either way."""
    from runner.checks.gguf_header import read_header
    from runner.gguf_run import GGUFTokenizer

    a, b = "the quick brown fox jumps over the lazy dog", "lossless decoding of tokens"
    path = store / "ctx" / "target" / "model.gguf"
    a_ids = GGUFTokenizer(path, read_header(path)["metadata"]).prompt_ids(a, raw=True)
    answers = {}
    for option in ([], ["--prompt-cache", "0"]):
        srv = Server(store / "store", keypair[1], "--sequences", "1", "--metrics-key-file", _metrics_key_file(store), *option,
                     metrics_key=METRICS_KEY)
        try:
            first = _complete(srv, a, 8)
            _complete(srv, b, 8)
            before = srv.metrics()[("specbundle_cached_prompt_tokens_total", ())]
            answers[bool(option)] = (first, _complete(srv, a, 8))
            cached = srv.metrics()[("specbundle_cached_prompt_tokens_total", ())] - before
            size = srv.metrics()[("specbundle_prompt_cache_bytes", ())]
            assert (cached, size > 0) == ((0, False) if option else (len(a_ids) - 1, True))
            assert "prompt_cache_bytes" not in _live(srv)  # the status page (the API key's) shows no cache fill
        finally:
            srv.stop()
    assert answers[False] == answers[True] and answers[False][0] == answers[False][1]


def test_the_outbox_holds_a_steps_events_until_send_and_delivers_them_in_order() -> None:
    import asyncio

    from bundler.serve.jobs import Job, Outbox

    loop = asyncio.new_event_loop()
    try:
        outbox = Outbox()
        jobs = [Job([1], 4, 0.0, 1.0, None, [], loop, asyncio.Queue(), 10.0, outbox=outbox) for _ in range(2)]
        jobs[0].emit("text", "a")
        jobs[1].emit("text", "x")
        jobs[0].emit("done", {"n": 1})
        loop.run_until_complete(asyncio.sleep(0.01))
        assert all(job.events.empty() for job in jobs)  # held until the worker's next pass
        outbox.send()
        loop.run_until_complete(asyncio.sleep(0.01))
        got = [[job.events.get_nowait() for _ in range(job.events.qsize())] for job in jobs]
        assert got == [[("text", "a"), ("done", {"n": 1})], [("text", "x")]] and not outbox.pending
    finally:
        loop.close()


def test_a_prompt_cache_size_that_is_not_a_size_is_a_usage_error(store: Path, keypair) -> None:
    result = run_bundle("serve", REF, "--key", str(keypair[1]), "--store", str(store / "store"), "--prompt-cache", "lots")
    assert result.code == 2 and "--prompt-cache" in result.err and "Traceback" not in result.err


def test_a_client_that_goes_away_frees_its_sequence_at_the_next_step(server: Server) -> None:
    before = server.metrics()[("specbundle_requests_total", (("status", "cancelled"),))]
    body = {"model": REF, "prompt": PROMPTS[2], "max_tokens": 1024, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
        assert _live(server)["active_sequences"] == 1
    # the connection is closed: the request is cancelled and its sequence leaves
    _wait(lambda: _live(server)["active_sequences"] == 0, "the cancelled request's sequence to leave", 10)
    assert server.metrics()[("specbundle_requests_total", (("status", "cancelled"),))] == before + 1
    assert _complete(server, PROMPTS[3], 4)  # and the server goes on


def test_a_full_queue_answers_429_while_every_sequence_is_busy(store: Path, keypair) -> None:
    """One sequence, a queue of one: while a request decodes, of four more sent at once one waits and the others
    are refused with 429 (at least two of them even if the first ends meanwhile: the tiny model decodes its 1024
    tokens fast, and one waiting request then follows it, so the test does not rely on the first lasting), and
    every request not refused is answered."""
    srv = Server(store / "store", keypair[1], "--sequences", "1", "--max-queue", "1")
    try:
        first_pieces: list[float] = []
        with ThreadPoolExecutor(5) as pool:
            first = pool.submit(_stream, srv, PROMPTS[0], 1024, first_pieces)
            _wait(lambda: bool(first_pieces), "the first request to decode")
            body = {"model": REF, "prompt": PROMPTS[1], "max_tokens": 4, "temperature": 0}
            more = list(pool.map(lambda _: httpx.post(srv.url + "/v1/completions", json=body, timeout=60), range(4)))
            assert first.result()["done"]
        refused = [r for r in more if r.status_code == 429]
        assert len(refused) >= 2 and all(r.status_code == 200 for r in more if r not in refused)
        assert all(r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full" for r in refused)
        assert srv.metrics()[("specbundle_requests_total", (("status", "rejected"),))] == len(refused)
    finally:
        assert srv.stop() == 0


def test_sigterm_lets_the_open_requests_of_the_batch_finish(store: Path, keypair) -> None:
    srv = Server(store / "store", keypair[1], "--sequences", "4")
    alone = [_stream(srv, p, 300) for p in PROMPTS[:3]]
    pieces: list[float] = []
    with ThreadPoolExecutor(3) as pool:
        streams = [pool.submit(_stream, srv, p, 300, pieces) for p in PROMPTS[:3]]
        _wait(lambda: _live(srv)["active_sequences"] == 3, "three requests in the batch")
        srv.proc.send_signal(signal.SIGTERM)
        results = [s.result() for s in streams]
    assert srv.proc.wait(60) == 0
    for r, a in zip(results, alone):  # each answer whole: as long as alone, ended by its length or its eos
        assert r["done"] and r["finish_reason"] == a["finish_reason"]
        assert r["usage"]["completion_tokens"] == a["usage"]["completion_tokens"]


def test_status_page_figures_name_the_batch(server: Server) -> None:
    live = _live(server)
    assert live["sequences"] == 8 and live["active_sequences"] == 0
    threading.Thread(target=_complete, args=(server, PROMPTS[0], 8)).start()
    _wait(lambda: _live(server)["batch_size"] is not None, "a batch size")


def test_more_sequences_than_the_memory_budget_holds_are_refused_while_loading_and_the_server_exits_4(store: Path, keypair) -> None:
    # The port opens first (/health answers 503 while loading); the refusal stops it and is the exit code.
    result = run_bundle("serve", REF, "--key", str(keypair[1]), "--store", str(store / "store"), "--port", str(_free_port()),
                        "--sequences", "64", "--memory-budget", "80MB")
    # (llama.cpp's own warnings about the tiny files' training context may come first, from loading the pair)
    last = result.err.strip().splitlines()[-1]
    assert result.code == 4 and last.startswith("error: [memory-budget]") and "64 x" in last
    assert "Traceback" not in result.err


def _stranger_store(base: Path, keypair) -> Path:
    """A store holding a GGUF pair whose draft rarely agrees (another random model), with the guard on."""
    from tests.tinygguf import write_gguf
    from tests.tinymodels import train_tokenizer, write_kitfile, write_tokenizer

    ctx = base / "ctx"
    (ctx / "target").mkdir(parents=True)
    (ctx / "draft").mkdir()
    write_gguf(ctx / "target" / "model.gguf", seed=0, hidden=128, layers=2, logit_scale=3)
    write_gguf(ctx / "draft" / "model.gguf", seed=7, hidden=32, layers=1, heads=2, kv_heads=1, logit_scale=3)
    write_tokenizer(ctx / "tokenizer", train_tokenizer())
    write_kitfile(ctx, speculative={"draft_tokens": 3, "min_acceptance": 0.5})
    run_bundle("pack", str(ctx), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return base / "store"


def test_after_three_requests_whose_draft_did_not_pay_requests_leave_the_draft_model_out_from_the_first_token(
        tmp_path: Path, keypair) -> None:
    """The server's memory of its guards (as `bundle run`'s run history): a draft that rarely agrees (another
    random model) is dropped in each request; from the fourth request on, the draft model does not run at all
    (prompt lookup, which the bundle allows, may still propose)."""
    srv = Server(_stranger_store(tmp_path, keypair), keypair[1], "--sequences", "2")
    try:
        stats = []
        for prompt in PROMPTS[:4]:
            body = {"model": REF, "prompt": prompt, "max_tokens": 48, "temperature": 0}
            stats.append(httpx.post(srv.url + "/v1/completions", json=body, timeout=120).json()["specbundle"]["stats"])
    finally:
        assert srv.stop() == 0
    for s in stats[:3]:  # the draft model dropped (prompt lookup went on), or all speculation fell back for good
        assert s["speculative_iterations"] and (s["draft_model_dropped"] or s["fallback"] and not s["fallback"]["resumed"])
    assert stats[3]["draft_passes"] == 0 and "draft" not in stats[3]["methods"]
    assert stats[3]["draft_model_dropped"]["at_token"] == 0 and "did not pay" in stats[3]["draft_model_dropped"]["reason"]


def test_a_server_starts_from_what_bundle_run_found_on_this_machine_and_writes_nothing(tmp_path: Path, keypair) -> None:
    """The store's run history says the draft did not pay in the last runs here: the first request already
    leaves the draft model out from its first token (it never runs), and the store's counts stay as they were."""
    from bundler.store.layout import Store
    from bundler.store.modelkit import load_modelkit
    from bundler.store.refs import parse_ref
    from bundler.verbs.run import run_history
    from runner.decoding.run_history import UNPAID_RUNS

    copied = _stranger_store(tmp_path, keypair)
    digest = load_modelkit(Store(copied), parse_ref(REF)).digest
    history = run_history(Store(copied), digest)
    fell_back = {"speculative_iterations": 2, "fallback": {"at_token": 3, "reason": "r", "retries": 0, "resumed": 0}}
    for _ in range(UNPAID_RUNS):
        history.record(fell_back, advised=False, seeded=False)
    counts = history.counts()
    srv = Server(copied, keypair[1], "--sequences", "1")
    try:
        body = {"model": REF, "prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0}
        stats = httpx.post(srv.url + "/v1/completions", json=body, timeout=120).json()["specbundle"]["stats"]
    finally:
        assert srv.stop() == 0
    assert stats["draft_passes"] == 0 and "draft" not in stats["methods"]
    assert stats["draft_model_dropped"]["at_token"] == 0 and "did not pay" in stats["draft_model_dropped"]["reason"]
    assert run_history(Store(copied), digest).counts() == counts


def test_a_safetensors_bundle_decodes_concurrent_requests_in_one_batch_on_torch_each_as_alone(tmp_path: Path, keypair) -> None:
    """The torch engine batches too (runner.models.compact_llama's batched forward): four concurrent requests of
    the tiny safetensors pair share steps, and each greedy answer is the one the server gives it alone (which is
    `bundle run`'s: tests/test_serve.py), or parts from it only where the single computation's top two logits tie."""
    from transformers import AutoModelForCausalLM
    from tokenizers import Tokenizer

    store = _pack(tmp_path, keypair, speculative={"draft_tokens": 3})
    srv = Server(store, keypair[1], "--sequences", "4")
    try:
        alone = [_complete(srv, p, 16) for p in PROMPTS[:4]]
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda p: _complete(srv, p, 16), PROMPTS[:4]))
        metrics = srv.metrics()
    finally:
        assert srv.stop() == 0
    sizes = {labels: v for (name, labels), v in metrics.items() if name == "specbundle_batch_size_bucket"}
    assert sizes[(("le", "1.0"),)] < metrics[("specbundle_batch_size_count", ())]  # some steps held several requests
    assert metrics[("specbundle_sequences", ())] == 4
    if alone == together:
        return
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ctx" / "target").eval()
    tokenizer = Tokenizer.from_file(str(tmp_path / "ctx" / "tokenizer" / "tokenizer.json"))
    for prompt, one, got in zip(PROMPTS[:4], alone, together):
        if one == got:
            continue
        ids, new = tokenizer.encode(prompt).ids, []  # replayed alone: where do the texts part, and is it a tie?
        with torch.no_grad():
            for _ in range(16):
                logits = model(torch.tensor([ids + new])).logits[0, -1]
                token = int(logits.argmax())
                if not got.startswith(tokenizer.decode(new + [token])):
                    top = torch.topk(logits, 2).values
                    assert float(top[0] - top[1]) <= TIE * float(logits.abs().max()), (prompt, one, got)
                    break
                new.append(token)
            else:
                raise AssertionError((prompt, one, got))
