"""`bundle serve --runtime llama-cpp-python`: a third-party runtime (llama-cpp-python's own OpenAI server, a real
process) governed by specbundle, on a tiny signed GGUF pair. The runtime starts only after every check serve runs
(a tampered, unsigned or mismatched bundle never spawns it); the bundle's signed settings become its flags (shown by
--dry-run, refused where it cannot honour them); clients reach it only through our front door (API key, Host,
body bound, X-Bundle-Digest, probes, metrics); its death fails /health, then ends serve with exit 7; SIGTERM stops
it; the run record names it. The same for llama-server and vLLM: tests/test_serve_runtime_slow.py (-m slow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from bundler.serve.request_guard import ServeLimits
from bundler.serve.runtimes.child import Child
from bundler.serve.runtimes.flags import RuntimeOptions
from bundler.serve.runtimes.server import serve_runtime
from bundler.serve.settings import ServeSettings
from bundler.serve.sources import StoreSource
from bundler.store.layout import Store
from bundler.store.refs import parse_ref
from bundler.trust import keys
from conftest import copy_store, run_bundle
from registry_server import registry  # noqa: F401  (a fixture)
from tests.test_gguf_bench import gguf_context
from tests.test_serve import REF, Server, _free_port
from tests.tinymodels import write_kitfile
from tests.unchecked_pack import pack_unchecked

RUNTIME = ("--runtime", "llama-cpp-python")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, keypair) -> Path:
    base = tmp_path_factory.mktemp("serve-runtime")
    run_bundle("pack", str(gguf_context(base / "ctx")), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return base / "store"


@pytest.fixture(scope="module")
def api_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("key") / "api-key"
    path.write_text("front-door-key\n")
    return path, "front-door-key"


@pytest.fixture(scope="module")
def server(store: Path, keypair, api_key):
    srv = Server(store, keypair[1], *RUNTIME, "--api-key-file", str(api_key[0]), api_key=api_key[1])
    yield srv
    srv.stop()


class Spawns:
    """A spawn function that records each runtime it is asked to start (and starts it, as Child does)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, name: str, argv: list[str], *args, **kwargs) -> Child:
        self.calls.append(argv)
        return Child(name, argv, *args, **kwargs)


def _serve_in_process(store: Path, pub: Path) -> tuple[Exception | None, Spawns]:
    """serve_runtime on REF in this process with a recording spawn; what it raised."""
    spawns = Spawns()
    settings = ServeSettings(port=_free_port(), limits=ServeLimits())
    trusted = {keys.key_id(keys.load_public_key(pub)): keys.load_public_key(pub)}
    try:
        serve_runtime(StoreSource(Store(store), parse_ref(REF)), trusted, settings, RuntimeOptions("llama-cpp-python"), spawn=spawns)
    except Exception as exc:  # noqa: BLE001 - the refusal is the result
        return exc, spawns
    return None, spawns


def _runtime_port(srv: Server) -> int:
    argv = httpx.get(srv.url + "/status.json", headers=srv.auth()).json()["runtime"]["argv"]
    return int(argv[argv.index("--port") + 1])


def test_dry_run_prints_the_runtimes_command_line_from_the_signed_settings_and_starts_nothing(store: Path, keypair) -> None:
    result = run_bundle("serve", REF, *RUNTIME, "--dry-run", "--key", str(keypair[1]), "--store", str(store), check=True)
    shown = json.loads(result.out)
    argv = shown["argv"]
    assert argv[1:3] == ["-m", "llama_cpp.server"] and argv[argv.index("--model_alias") + 1] == REF
    # the bundle allows prompt lookup (no `methods`: all of them); this runtime takes no draft model
    assert shown["speculation"]["method"] == "ngram"
    # its signed settings turn the guard off: the signed speculation, no probe at start-up (bundler.serve.runtimes.guard)
    assert shown["guard"]["source"] == "signed" and shown["guard"]["choice"] == "speculative"
    assert argv[argv.index("--draft_model") + 1] == "prompt-lookup-decoding"
    assert argv[argv.index("--draft_model_num_pred_tokens") + 1] == str(shown["speculation"]["draft_tokens"])
    assert shown["env"]["API_KEY"] == "***" and "***" not in argv
    assert {f["path"] for f in shown["files"]} >= {"target/model.gguf", "draft/model.gguf"}
    assert "signature" in shown["checks"]
    assert not Path(argv[argv.index("--model") + 1]).exists()  # the checked copy is gone: nothing was left to start


def test_no_draft_runs_the_target_alone(store: Path, keypair) -> None:
    result = run_bundle("serve", REF, *RUNTIME, "--no-draft", "--dry-run", "--key", str(keypair[1]), "--store", str(store), check=True)
    shown = json.loads(result.out)
    assert shown["speculation"] == {"method": "plain"} and "--draft_model" not in shown["argv"]


def test_a_setting_the_runtime_cannot_honour_is_refused_before_it_starts(tmp_path: Path, keypair) -> None:
    ctx = gguf_context(tmp_path / "ctx")
    write_kitfile(ctx, speculative={"draft_tokens": 3, "methods": ["draft"], "min_size_ratio": 1})
    run_bundle("pack", str(ctx), "-t", REF, "--key", str(keypair[0]), "--store", str(tmp_path / "store"), check=True)
    refused = run_bundle("serve", REF, *RUNTIME, "--dry-run", "--key", str(keypair[1]), "--store", str(tmp_path / "store"))
    assert refused.code == 2
    assert refused.err.startswith("error: [runtime-unsupported] --runtime llama-cpp-python cannot honour the bundle's methods ['draft']")


def test_a_tampered_bundle_never_starts_the_runtime(store: Path, keypair, tmp_path: Path) -> None:
    changed = copy_store(store, tmp_path)
    blob = max((changed / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)  # a weights layer
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    raised, spawns = _serve_in_process(changed, keypair[1])
    assert getattr(raised, "code", None) == "digest-mismatch" and spawns.calls == []


def test_an_unsigned_bundle_never_starts_the_runtime(tmp_path: Path, keypair) -> None:
    run_bundle("pack", str(gguf_context(tmp_path / "ctx")), "-t", REF, "--store", str(tmp_path / "store"), check=True)
    raised, spawns = _serve_in_process(tmp_path / "store", keypair[1])
    assert getattr(raised, "code", None) == "signature-missing" and spawns.calls == []


def test_a_tokenizer_mismatch_never_starts_the_runtime(tmp_path: Path, keypair) -> None:
    from tests.tinygguf import write_gguf

    ctx = gguf_context(tmp_path / "ctx")
    write_gguf(ctx / "draft" / "model.gguf", seed=0, hidden=128, layers=1, tokenizer={"eos_token_id": 0})
    pack_unchecked(ctx, REF, tmp_path / "store", keypair[0])
    raised, spawns = _serve_in_process(tmp_path / "store", keypair[1])
    assert getattr(raised, "code", None) == "tokenizer-mismatch" and spawns.calls == []
    cli = run_bundle("serve", REF, *RUNTIME, "--key", str(keypair[1]), "--store", str(tmp_path / "store"), "--port", str(_free_port()))
    assert cli.code == 4 and cli.err.startswith("error: [tokenizer-mismatch]")


def test_greedy_answers_through_the_front_door_are_the_runtimes_own(server: Server, store: Path) -> None:
    from llama_cpp import Llama

    body = {"model": REF, "prompt": "the quick brown fox", "max_tokens": 12, "temperature": 0}
    answer = httpx.post(server.url + "/v1/completions", json=body, headers=server.auth(), timeout=60)
    assert answer.status_code == 200 and answer.headers["x-bundle-digest"].startswith("sha256:")
    ctx = store.parent / "ctx" / "target" / "model.gguf"  # the file the bundle was packed from
    alone = Llama(str(ctx), n_ctx=256, n_threads=1, verbose=False).create_completion(body["prompt"], max_tokens=12, temperature=0)
    assert answer.json()["choices"][0]["text"] == alone["choices"][0]["text"]
    assert answer.json()["model"] == REF


def test_a_stream_passes_through_event_by_event_with_the_digest(server: Server) -> None:
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/openai/v1/chat/completions", json=body, headers=server.auth(), timeout=60) as answer:
        assert answer.status_code == 200 and answer.headers["x-bundle-digest"].startswith("sha256:")
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3


def test_the_front_door_guards_the_runtime(server: Server) -> None:
    body = {"prompt": "hi", "max_tokens": 2}
    assert httpx.post(server.url + "/v1/completions", json=body).status_code == 401
    assert httpx.post(server.url + "/v1/completions", json=body, headers={**server.auth(), "Host": "evil.example"}).status_code == 400
    big = {"prompt": "x" * (2 << 20), "max_tokens": 2}
    assert httpx.post(server.url + "/v1/completions", json=big, headers=server.auth()).status_code == 413
    # the runtime's own port asks for a key only the front door holds
    direct = httpx.post(f"http://127.0.0.1:{_runtime_port(server)}/v1/completions", json=body, timeout=30)
    assert direct.status_code == 401


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(sys.platform != "linux", reason="a priority per thread is Linux's")
def test_the_front_door_and_the_runtime_keep_the_callers_priority(server: Server) -> None:
    # A front door niced below its runtime was starved under load (docs/benchmarks.md, "The front door's priority, undone")
    runtime = httpx.get(server.url + "/status.json", headers=server.auth()).json()["runtime"]["pid"]
    ours = _nice(os.getpid())
    assert _nice(server.proc.pid) == ours  # the event loop's thread: the process's main thread
    assert _nice(runtime) == ours


def test_probes_models_and_metrics_speak_as_bundle_serve(server: Server) -> None:
    health = httpx.get(server.url + "/health", headers=server.auth())
    assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["bundle"]["ref"] == REF
    assert httpx.get(server.url + "/livez", headers=server.auth()).json()["status"] == "alive"
    card = httpx.get(server.url + "/v1/models", headers=server.auth()).json()["data"][0]
    assert card["id"] == REF and card["specbundle"]["engine"] == "llama-cpp-python"
    httpx.post(server.url + "/v1/completions", json={"prompt": "a b", "max_tokens": 3, "temperature": 0}, headers=server.auth(), timeout=60)
    metrics = server.metrics()
    assert metrics[("specbundle_requests_total", (("status", "ok"),))] >= 1
    assert metrics[("specbundle_generated_tokens_total", ())] >= 3
    assert ("specbundle_draft_tokens_total", ()) in metrics and ("specbundle_spec_decode_num_accepted_tokens_total", ()) in metrics
    assert any(name == "specbundle_runtime_info" and dict(labels)["runtime"] == "llama-cpp-python" for name, labels in metrics)


def _wait(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_the_runtimes_death_fails_health_then_ends_serve_with_exit_7(store: Path, keypair) -> None:
    srv = Server(store, keypair[1], *RUNTIME)
    try:
        pid = httpx.get(srv.url + "/status.json").json()["runtime"]["pid"]
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: httpx.get(srv.url + "/health").status_code == 503, 5)
        assert httpx.get(srv.url + "/health").json()["status"] == "failed"
        code = srv.proc.wait(15)
    finally:
        srv.stop()
    assert code == 7
    err = srv.proc.stderr.read()
    assert "error: [runtime-failed] the runtime llama-cpp-python" in err and "killed by signal 9" in err
    assert "[llama-cpp-python] " in err  # its own output, prefixed, in our log


def test_sigterm_stops_the_runtime_and_exits_0(store: Path, keypair) -> None:
    srv = Server(store, keypair[1], *RUNTIME)
    pid = httpx.get(srv.url + "/status.json").json()["runtime"]["pid"]
    assert srv.stop() == 0
    _wait(lambda: not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(), 10)


def test_the_run_record_names_the_runtime_its_argv_and_files(store: Path, keypair, tmp_path: Path) -> None:
    changed = copy_store(store, tmp_path)
    srv = Server(changed, keypair[1], *RUNTIME, "--attest-key", str(keypair[0]))
    httpx.post(srv.url + "/v1/completions", json={"prompt": "a", "max_tokens": 4, "temperature": 0}, timeout=60)
    assert srv.stop() == 0
    records = json.loads(run_bundle("attestations", REF, "--key", str(keypair[1]), "--store", str(changed), "--json", check=True).out)
    predicate = records[-1]["statement"]["predicate"]
    runtime = predicate["runtime"]
    assert records[-1]["verified"] and predicate["engine"] == "llama.cpp"
    assert runtime["runtime"] == "llama-cpp-python" and runtime["version"] and runtime["executable"]["sha256"]
    assert "llama_cpp.server" in runtime["argv"] and runtime["env"]["API_KEY"] == "***"
    assert runtime["guard"]["source"] == "signed"  # the bundle's guard is off: its speculation as signed, no probe
    assert {f["path"] for f in runtime["files"]} >= {"target/model.gguf", "draft/model.gguf"}
    assert predicate["totals"]["requests"] == 1 and predicate["totals"]["tokens"] == 4


@pytest.fixture(scope="module")
def fetched(registry, store: Path, tmp_path_factory: pytest.TempPathFactory, keypair) -> dict:  # noqa: F811 - registry: a fixture
    """The bundle pushed to a real local registry and fetched (`bundle fetch`) into a directory, as KServe leaves it."""
    base = tmp_path_factory.mktemp("runtime-from-dir")
    (base / "no-docker").mkdir()
    (base / "keys").mkdir()
    (base / "keys" / "bundle.pub").write_bytes(keypair[1].read_bytes())
    env = {"DOCKER_CONFIG": str(base / "no-docker"), "BUNDLE_PLAIN_HTTP": "1", "BUNDLE_TRUSTED_KEYS": str(base / "keys")}
    ref = f"{registry.host}/models/{REF}"
    run_bundle("push", REF, ref, "--plain-http", "--store", str(store), env=env, check=True)
    run_bundle("fetch", f"bundle://{ref}", str(base / "dir"), env={**env, "BUNDLE_HOME": str(base / "fetch-home")}, check=True)
    return {"dir": base / "dir", "ref": ref, "env": env, "base": base}


def test_from_dir_runs_the_same_checks_and_shows_the_same_translation(fetched: dict, keypair) -> None:
    shown = json.loads(run_bundle("serve", "--from-dir", str(fetched["dir"]), "--expect", fetched["ref"], *RUNTIME, "--dry-run",
                                  "--key", str(keypair[1]), "--store", str(fetched["base"] / "home"), check=True).out)
    assert shown["bundle"]["ref"] == fetched["ref"] and "expected" in shown["checks"]
    assert shown["speculation"]["method"] == "ngram"


def test_from_dir_a_file_changed_after_fetch_never_starts_the_runtime(fetched: dict, keypair, tmp_path: Path) -> None:
    import shutil

    from bundler.serve.sources import DirSource

    volume = tmp_path / "volume"
    shutil.copytree(fetched["dir"], volume)
    weights = volume / "draft" / "model.gguf"
    weights.chmod(0o644)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    spawns = Spawns()
    pub = keys.load_public_key(keypair[1])
    settings = ServeSettings(port=_free_port(), limits=ServeLimits())
    with pytest.raises(Exception) as refused:
        serve_runtime(DirSource(volume), {keys.key_id(pub): pub}, settings, RuntimeOptions("llama-cpp-python"), spawn=spawns)
    assert getattr(refused.value, "code", None) == "digest-mismatch" and spawns.calls == []


# The shape of llama-server's /metrics, as tools/server/server-task.cpp of the llama.cpp that llama-cpp-python 0.3.36
# vendors writes it (HELP, TYPE counter, the sample), and of vLLM's (prometheus_client, one series per model name).
LLAMA_SERVER_METRICS = """# HELP llamacpp:spec_decode_num_draft_tokens_total Draft tokens.
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total {drafted}
# HELP llamacpp:spec_decode_num_accepted_tokens_total Accepted tokens.
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total {accepted}
# HELP llamacpp:tokens_predicted_total Tokens.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {tokens}
"""


def test_a_runtimes_counters_grow_ours_by_what_they_grew_and_a_restart_counts_afresh() -> None:
    from prometheus_client import generate_latest

    from bundler.serve.metrics import Metrics
    from bundler.serve.runtimes.counters import Mirror

    metrics = Metrics({"ref": REF})
    mirror = Mirror("llama-server", metrics)
    for drafted, accepted, tokens in ((30, 12, 40), (60, 30, 70), (9, 3, 10)):  # the third: the runtime started again
        mirror.update(LLAMA_SERVER_METRICS.format(drafted=drafted, accepted=accepted, tokens=tokens))
    text = generate_latest(metrics.registry).decode()
    assert "specbundle_spec_decode_num_draft_tokens_total 69.0" in text and "specbundle_draft_tokens_total 69.0" in text
    assert "specbundle_accepted_tokens_total 33.0" in text and "specbundle_generated_tokens_total 80.0" in text
    assert mirror.acceptance() == 3 / 9 and mirror.counts_tokens
