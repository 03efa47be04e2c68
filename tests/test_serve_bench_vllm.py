"""benchmarks/serve_bench.py --mode load's vLLM peer (benchmarks/serving/vllm.py), checked without starting vLLM
(it takes minutes to start on 2 cores; the benchmark itself runs it): the servers and options the mode takes, the
command line and environment each set-up gets on a real tiny signed safetensors bundle (the one `bundle serve
--runtime vllm` gives vLLM, with the set-up's dtype, speculation and threads), the refusals made before any
server starts, and how the best vLLM set-up is picked and compared with `bundle serve` at a concurrency."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from conftest import run_bundle
from tests.tinymodels import make_pair

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # as benchmarks/serve_bench.py puts them

import serve_bench  # noqa: E402
from serving import load, vllm  # noqa: E402
from serving.common import checked_bundle  # noqa: E402

REF = "tiny-spec:1.0.0"
DRAFT_TOKENS = 3


def _args(*extra: str) -> argparse.Namespace:
    args, module = serve_bench.parse(["--mode", "load", *extra])
    assert module is load
    return args


@pytest.fixture(scope="module")
def torch_store(tmp_path_factory: pytest.TempPathFactory, keypair) -> Path:
    """A tiny signed safetensors pair, as vLLM's CPU attention takes it (head size 32)."""
    base = tmp_path_factory.mktemp("vllm-peer")
    make_pair(base / "ctx", target_hidden=128, draft_hidden=64,
              speculative={"draft_tokens": DRAFT_TOKENS, "min_acceptance": 0.0, "min_size_ratio": 1})
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return base / "store"


def test_load_takes_vllm_in_its_four_set_ups_and_with_the_draft() -> None:
    assert vllm.VLLM_SERVERS == {"vllm-fp32-bind": ("float32", True, False), "vllm-bf16-bind": ("bfloat16", True, False),
                                 "vllm-fp32": ("float32", False, False), "vllm-bf16": ("bfloat16", False, False),
                                 "vllm-draft-bind": ("float32", True, True)}
    assert set(vllm.VLLM_SERVERS) <= set(load.SERVERS)
    args = _args("--ref", REF, "--servers", "bundle,bundle-plain,vllm-fp32-bind,vllm-fp32", "--vllm-python", "/opt/v/bin/python")
    assert args.vllm_python == "/opt/v/bin/python" and args.servers.split(",")[2:] == ["vllm-fp32-bind", "vllm-fp32"]
    assert _args().vllm_python == str(ROOT / ".venv-vllm" / "bin" / "python")  # what `make vllm` makes


def test_a_missing_vllm_venv_or_an_unknown_server_is_refused_before_anything_starts(tmp_path: Path) -> None:
    args = _args("--servers", "bundle,vllm-bf16-bind", "--vllm-python", str(tmp_path / "none" / "python"))
    with pytest.raises(SystemExit, match="make vllm"):
        load.run(args)
    with pytest.raises(SystemExit, match="unknown server vllm-fp16"):
        load.run(_args("--servers", "bundle,vllm-fp16"))


def test_a_gguf_bundle_is_refused_for_the_vllm_servers() -> None:
    files = {"target": Path("target.gguf"), "draft": None}
    with pytest.raises(SystemExit, match="GGUF bundle: the vllm-\\* servers run a safetensors bundle"):
        load._check_files(_args("--ref", "x:1"), ["bundle", "vllm-fp32"], None, files)


def test_cpu_lists_are_written_as_vllms_bind_variable_takes_them() -> None:
    assert vllm.cpu_list([1, 0]) == "0-1" and vllm.cpu_list([0, 2, 3]) == "0,2,3" and vllm.cpu_list([5]) == "5"


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("name", sorted(vllm.VLLM_SERVERS))
def test_each_set_up_gets_serves_vllm_command_line_with_its_dtype_speculation_and_threads(torch_store: Path, keypair, name: str) -> None:
    args = _args("--ref", REF, "--store", str(torch_store), "--key", str(keypair[1]), "--vllm-python", sys.executable,
                 "--clients", "1,4,8")
    dtype, bind, draft = vllm.VLLM_SERVERS[name]
    with checked_bundle(REF, str(torch_store), str(keypair[1]), vllm.footprint(args, 8)) as checked:
        started, env = vllm.launch(checked, name, args, 8, 8123)
        argv = started.argv
        assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        model = Path(_value(argv, "--model"))
        assert {"config.json", "tokenizer.json", "model.safetensors"} <= {p.name for p in model.iterdir()}  # the tokenizer beside it
        assert _value(argv, "--dtype") == dtype and _value(argv, "--max-num-seqs") == "8"
        assert _value(argv, "--served-model-name") == REF and _value(argv, "--host") == "127.0.0.1" and _value(argv, "--port") == "8123"
    if draft:
        spec = json.loads(_value(argv, "--speculative-config"))
        assert spec["method"] == "draft_model" and spec["num_speculative_tokens"] == DRAFT_TOKENS
    else:
        assert "--speculative-config" not in argv
    cpus = sorted(os.sched_getaffinity(0))
    if bind:  # the engine on every CPU this process may use
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == vllm.cpu_list(cpus) and env["OMP_NUM_THREADS"] == str(len(cpus))
    else:  # vLLM's own defaults: neither set, not even inherited
        assert env["VLLM_CPU_OMP_THREADS_BIND"] is None and env["OMP_NUM_THREADS"] is None
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and "VLLM_API_KEY" not in env and env["PYTHONPATH"] is None


def _round(tokens_per_second: float, ttft_p99: float) -> dict:
    """One round of a server at one concurrency, as load.summarize makes it from its requests."""
    requests = [{"ttft_s": ttft_p99, "tokens": 100, "itl_s": [0.01]} for _ in range(4)]
    return load.summarize(requests, 400 / tokens_per_second)


def test_best_vllm_is_the_fastest_vllm_set_up_and_bundle_is_compared_with_it() -> None:
    servers = ["bundle", "bundle-plain", "vllm-fp32-bind", "vllm-bf16"]
    results = {"bundle": {"4": [_round(40, 0.5), _round(44, 0.7)]}, "bundle-plain": {"4": [_round(42, 0.4), _round(42, 0.4)]},
               "vllm-fp32-bind": {"4": [_round(60, 1.0), _round(70, 1.0)]}, "vllm-bf16": {"4": [_round(30, 0.2), _round(30, 0.2)]}}
    summary = load._summary(results, servers, 4)
    assert summary["best_vllm"] == "vllm-fp32-bind" and summary["best_llama"] is None
    over_run, rounds = summary["ratios_over_run"], summary["ratios_per_round"]
    fastest = 800 / (400 / 60 + 400 / 70)  # its tokens over its wall time in both rounds
    assert over_run["bundle_over_best_vllm_tps"] == pytest.approx(800 / (400 / 40 + 400 / 44) / fastest)
    assert over_run["bundle_plain_over_best_vllm_tps"] == pytest.approx(42 / fastest)
    assert rounds["bundle_over_best_vllm_tps"] == pytest.approx([40 / 60, 44 / 70])
    assert rounds["bundle_over_best_vllm_ttft_p99"] == pytest.approx([0.5, 0.7])
    assert rounds["bundle_plain_over_best_vllm_ttft_p99"] == pytest.approx([0.4, 0.4])
    assert over_run["bundle_over_best_vllm_ttft_p99_of_medians"] == pytest.approx(0.6)
    assert summary["medians"]["vllm-fp32-bind"]["ttft_p99_s"] == pytest.approx(1.0)


def test_pause_idle_is_an_option_of_load_and_off_by_default() -> None:
    """`--pause-idle`: every server but the one taking its turn stopped by Process.pause (an idle vLLM CPU engine
    keeps a core busy); off unless asked."""
    assert _args("--pause-idle").pause_idle and not _args().pause_idle


def test_a_paused_server_is_stopped_in_every_process_of_its_session_until_resumed() -> None:
    """Process.pause / resume (both benchmarks' --pause-idle): SIGSTOP and SIGCONT to the server's whole session,
    a real HTTP server on loopback here; stop() ends a paused one too (resumed first, then SIGTERM, by its pid)."""
    import sys
    import time

    from serving.common import Process, free_port, proc_stat

    port = free_port()
    server = Process([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], port, ready_path="/",
                     timeout_s=30, own_session=True)
    def settles(stopped: bool) -> bool:  # the state the signal leaves, read for at most 2 s
        for _ in range(200):
            if (proc_stat(f"/proc/{server.proc.pid}/stat")[1][0] == "T") == stopped:
                return True
            time.sleep(0.01)
        return False

    try:
        server.pause()
        assert settles(stopped=True)
        server.resume()
        assert settles(stopped=False)
        server.pause()
    finally:
        server.stop()
    assert server.proc.returncode is not None
