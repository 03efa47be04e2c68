"""`bundle serve`'s probes, metrics and names as a platform reads them, on real server processes: /health 503 from
the moment the port opens until the pair is loaded, /livez failing when the decoding worker stops moving while work
waits, the OpenAI routes under KServe's /openai/v1 and the model under a served name, /metrics behind the API key
(the prompt cache's figures always), `promtool check metrics` on a live scrape, and the batch sized under the
memory cgroup's limit (a cgroup hierarchy of the test's own, read through SPECBUNDLE_CGROUP_ROOT)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import run_bundle
from tests.test_serve import REF, Server, _free_port, _pack

API_KEY = "probe-key"
METRICS_KEY = "probe-metrics-key"  # the separate credential the prompt cache's figures need
SERVED_NAME = "my-isvc"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, keypair) -> Path:
    """A GGUF pair (llama.cpp: it decodes in a batch and has a prompt cache)."""
    from tests.test_gguf_bench import gguf_context

    base = tmp_path_factory.mktemp("serve-probes")
    run_bundle("pack", str(gguf_context(base / "ctx")), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return base / "store"


@pytest.fixture(scope="module")
def kserve(store: Path, keypair, tmp_path_factory: pytest.TempPathFactory):
    """As deploy/kserve runs it: an API key, open probes, the InferenceService's name."""
    key = tmp_path_factory.mktemp("key") / "key"
    key.write_text(API_KEY)
    metrics_key = key.with_name("metrics.key")
    metrics_key.write_text(METRICS_KEY)
    srv = Server(store, keypair[1], "--api-key-file", str(key), "--open-probes", "--served-model-name", SERVED_NAME,
                 "--metrics-key-file", str(metrics_key), api_key=API_KEY)
    yield srv
    srv.stop()


def test_health_answers_503_from_the_moment_the_port_opens_until_the_pair_is_loaded(store: Path, keypair) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("BUNDLE_TRUSTED_KEYS", "BUNDLE_HOME")}
    proc = subprocess.Popen([sys.executable, "-m", "bundler", "serve", REF, "--key", str(keypair[1]), "--store", str(store),
                             "--port", str(port)], stderr=subprocess.PIPE, text=True, env={**env, "PYTHONWARNINGS": "ignore"})
    answers: list[tuple[int, dict]] = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None and not (answers and answers[-1][0] == 200):
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                answers.append((r.status_code, r.json()))
                loading = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
                if r.status_code == 503:
                    assert loading.status_code in (503, 200)
            except httpx.TransportError:  # the port is not open yet
                pass
            time.sleep(0.02)
    finally:
        proc.terminate()
        assert proc.wait(60) == 0, proc.stderr.read()
    codes = [code for code, _ in answers]
    assert codes[-1] == 200 and 503 in codes and codes == sorted(codes, reverse=True)  # 503s, then 200s only
    first = answers[0][1]
    assert first["status"] == "loading" and first["reason"] and first["bundle"] == {"ref": REF, "digest": None}
    assert answers[-1][1]["bundle"]["digest"].startswith("sha256:")


def test_a_refusal_while_loading_stops_the_open_port_and_exits_with_its_code(store: Path, other_keypair) -> None:
    result = run_bundle("serve", REF, "--key", str(other_keypair[1]), "--store", str(store), "--port", str(_free_port()))
    assert result.code == 3 and result.err.strip().splitlines()[-1].startswith("error: [untrusted-signer]")
    assert "Traceback" not in result.err


def test_livez_is_200_while_the_worker_moves_and_needs_no_key_with_open_probes(kserve: Server) -> None:
    kserve.client().completions.create(model=REF, prompt="hello", max_tokens=4, temperature=0)
    r = httpx.get(kserve.url + "/livez")
    assert r.status_code == 200 and r.json()["status"] == "alive"


def test_a_worker_that_stops_moving_while_work_waits_fails_liveness(store: Path, keypair) -> None:
    """The decoding thread never started (as wedged as it gets): liveness holds while nothing waits, and
    fails once a queued request has waited longer than the time limit without the worker moving."""
    from bundler.serve.jobs import Job
    from bundler.serve.lifecycle import Ready, Serving
    from bundler.serve.metrics import Metrics
    from bundler.serve.settings import LoadOptions, ServeSettings
    from bundler.serve.sources import StoreSource
    from bundler.serve.worker import Requests, SerialWorker
    from bundler.store.layout import Store
    from bundler.store.refs import parse_ref
    from bundler.trust.keys import key_id, load_public_key

    key = load_public_key(keypair[1])
    serving = Serving(ServeSettings(time_limit_s=0.2), REF)
    with StoreSource(Store(store), parse_ref(REF)).load({key_id(key): key}, (64, 16), LoadOptions()) as loaded:
        info = Ready.describe(loaded)
        metrics = Metrics(info)
        requests = Requests(loaded.pair, metrics, max_queue=4)
        serving.ready = Ready(loaded, requests, SerialWorker(requests), metrics, info)
        time.sleep(0.3)
        assert serving.liveness()[0] == 200  # idle for longer than the limit, but nothing waits
        loop = asyncio.new_event_loop()
        try:
            requests.submit(Job([1, 2, 3], 4, 0.0, 1.0, None, [], loop, asyncio.Queue(), 60.0))
            assert serving.liveness()[0] == 200  # the worker moved a moment ago (the limit has not passed)
            requests.progress.at -= 1.0  # a second without a step, a token or a request taken
            status, body = serving.liveness()
            assert status == 503 and body["status"] == "stalled" and "limit 0.2 s" in body["reason"]
        finally:
            loop.close()


def test_the_openai_routes_answer_under_kserves_prefix_and_the_served_name(kserve: Server) -> None:
    for prefix in ("/v1", "/openai/v1"):
        models = httpx.get(kserve.url + prefix + "/models", headers=kserve.auth()).json()["data"]
        assert [m["id"] for m in models] == [REF, SERVED_NAME]
        assert httpx.get(f"{kserve.url}{prefix}/models/{SERVED_NAME}", headers=kserve.auth()).status_code == 200
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "temperature": 0}
    plain = httpx.post(kserve.url + "/v1/chat/completions", json={**body, "model": REF}, headers=kserve.auth(), timeout=120).json()
    named = httpx.post(kserve.url + "/openai/v1/chat/completions", json={**body, "model": SERVED_NAME}, headers=kserve.auth(),
                       timeout=120).json()
    assert (plain["model"], named["model"]) == (REF, SERVED_NAME)
    assert named["choices"][0]["message"] == plain["choices"][0]["message"]
    completion = httpx.post(kserve.url + "/openai/v1/completions", json={"model": SERVED_NAME, "prompt": "hello", "max_tokens": 3},
                            headers=kserve.auth(), timeout=120)
    assert completion.status_code == 200 and completion.json()["model"] == SERVED_NAME


def _names(text: str) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_leave_out_the_prompt_cache_figures_unless_the_scrape_carries_the_metrics_key(kserve: Server) -> None:
    """A cached-token counter tells its reader whether another client's prompt began as theirs, and every client
    holds the API key: an open scrape (--open-probes) and one with the API key get every other figure, a scrape
    with the separate metrics key (--metrics-key-file) gets these too."""
    kserve.client().completions.create(model=REF, prompt="a shared start", max_tokens=2, temperature=0)
    opened = httpx.get(kserve.url + "/metrics")
    keyed = httpx.get(kserve.url + "/metrics", headers=kserve.auth())
    metrics = httpx.get(kserve.url + "/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"})
    assert opened.status_code == keyed.status_code == metrics.status_code == 200
    private = {"specbundle_cached_prompt_tokens_total", "specbundle_prompt_cache_bytes"}
    assert not private & _names(opened.text) and not private & _names(keyed.text) and private <= _names(metrics.text)
    assert "specbundle_requests_total" in _names(opened.text)


def test_the_metrics_key_opens_metrics_only(kserve: Server) -> None:
    """The metrics credential is Prometheus', not a client's: it answers nothing else."""
    bearer = {"Authorization": f"Bearer {METRICS_KEY}"}
    completion = httpx.post(kserve.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}, headers=bearer, timeout=60)
    assert completion.status_code == 401 and httpx.get(kserve.url + "/status.json", headers=bearer).status_code == 401


def test_metrics_need_the_api_key_without_open_probes(store: Path, keypair, tmp_path: Path) -> None:
    (tmp_path / "key").write_text(API_KEY)
    srv = Server(store, keypair[1], "--api-key-file", str(tmp_path / "key"), api_key=API_KEY)
    try:
        assert httpx.get(srv.url + "/metrics").status_code == 401
        assert httpx.get(srv.url + "/health").status_code == 401 and httpx.get(srv.url + "/livez").status_code == 401
        assert httpx.get(srv.url + "/metrics", headers=srv.auth()).status_code == 200
    finally:
        assert srv.stop() == 0


def test_the_dtype_label_names_the_gguf_file_type(kserve: Server) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(kserve.url + "/metrics").text
    info = [s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == "specbundle_bundle_info"]
    assert len(info) == 1 and info[0]["engine"] == "llama.cpp" and not info[0]["dtype"].isdigit()
    assert info[0]["dtype"] in ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "BF16")


def test_the_status_page_shows_the_threads_the_engines_use(kserve: Server) -> None:
    live = httpx.get(kserve.url + "/status.json", headers=kserve.auth()).json()["live"]
    assert isinstance(live["threads"], int) and live["threads"] >= 1


def test_promtool_finds_the_live_metrics_clean(kserve: Server) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    kserve.client().completions.create(model=REF, prompt="hello", max_tokens=4, temperature=0)
    text = httpx.get(kserve.url + "/metrics", headers=kserve.auth()).text
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and not checked.stdout.strip() and not checked.stderr.strip(), checked.stdout + checked.stderr


def _cgroup_root(base: Path, limit: str, usage: int) -> Path:
    """A cgroup v2 hierarchy of the test's own at this process's cgroup path (its children inherit it)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    unified = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    if unified is None:
        pytest.skip("no cgroup v2 line in /proc/self/cgroup")
    here = base.joinpath(*unified.strip("/").split("/")) if unified.strip("/") else base
    here.mkdir(parents=True, exist_ok=True)
    (here / "memory.max").write_text(limit)
    (here / "memory.current").write_text(str(usage))
    return base


@pytest.mark.parametrize("limit, expected", [("max", "roomy"), (str(64 << 20), "tight")])
def test_the_batch_and_the_prompt_cache_are_sized_under_the_memory_cgroups_limit(store: Path, keypair, tmp_path: Path,
                                                                                  monkeypatch, limit: str, expected: str) -> None:
    """A limit that leaves almost no room beside what is loaded: one sequence and no prompt cache, whatever the
    node's MemAvailable says; no limit: the default batch (8 sequences for the tiny pair) and a prompt cache."""
    usage = (64 << 20) - 4096
    monkeypatch.setenv("SPECBUNDLE_CGROUP_ROOT", str(_cgroup_root(tmp_path / "cgroup", limit, usage)))
    srv = Server(store, keypair[1])
    try:
        live = httpx.get(srv.url + "/status.json").json()["live"]
    finally:
        assert srv.stop() == 0
    if expected == "tight":
        assert (live["sequences"], live["prompt_cache_limit_bytes"]) == (1, 0)
    else:
        assert live["sequences"] == 8 and live["prompt_cache_limit_bytes"] > 0
