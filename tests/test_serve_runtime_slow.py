"""`bundle serve --runtime vllm | llama-server` on real runtimes (opt-in: `pytest -m slow`; each is skipped where its
runtime is not installed: vLLM in its own venv, `make vllm`, found at $BUNDLE_VLLM_PYTHON or .venv-vllm/bin/python;
llama-server built by `python benchmarks/llamacpp_tools.py build`, found at $BUNDLE_LLAMA_SERVER or in that cache).
vLLM's CPU engine takes minutes to start. The fast runtime's tests, in `make test`: tests/test_serve_runtime.py."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from conftest import run_bundle
from tests.test_gguf_bench import gguf_context
from tests.test_serve import REF, Server
from tests.tinymodels import make_pair

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _vllm_python() -> str:
    found = os.environ.get("BUNDLE_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(found).exists():
        pytest.skip("no vLLM venv: `make vllm`, or set $BUNDLE_VLLM_PYTHON")
    return found


def _llama_server() -> str:
    found = os.environ.get("BUNDLE_LLAMA_SERVER")
    if not found:
        import sys

        sys.path.insert(0, str(ROOT / "benchmarks"))
        from llamacpp_tools import bin_dir

        found = str(bin_dir() / "llama-server")
    if not Path(found).exists():
        pytest.skip("no llama-server: `python benchmarks/llamacpp_tools.py build`, or set $BUNDLE_LLAMA_SERVER")
    return found


def _torch_store(base: Path, keypair, draft_tokens: int) -> Path:
    """A tiny safetensors pair vLLM's CPU attention takes (head size 32)."""
    make_pair(base / "ctx", target_hidden=128, draft_hidden=64,
              speculative={"draft_tokens": draft_tokens, "min_acceptance": 0.0, "min_size_ratio": 1})
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return base / "store"


def _metric(srv: Server, name: str) -> float:
    return sum(v for (n, _labels), v in srv.metrics().items() if n == name)


def _ask(srv: Server, prompt: str, tokens: int = 24) -> httpx.Response:
    return httpx.post(srv.url + "/v1/completions", json={"prompt": prompt, "max_tokens": tokens, "temperature": 0}, timeout=600)


@pytest.mark.parametrize("draft_tokens", [2, 4])
def test_vllm_runs_the_bundles_draft_at_its_signed_length_and_its_counters_are_ours(tmp_path: Path, keypair, draft_tokens: int) -> None:
    python = _vllm_python()
    # on: the signed draft throughout (the start-up guard's probe is tests/test_serve_runtime_guard.py's)
    srv = Server(_torch_store(tmp_path, keypair, draft_tokens), keypair[1], "--runtime", "vllm", "--runtime-bin", python,
                 "--runtime-speculation", "on")
    try:
        answer = _ask(srv, "the quick brown fox")
        assert answer.status_code == 200 and answer.headers["x-bundle-digest"].startswith("sha256:")
        drafts, drafted = _metric(srv, "specbundle_spec_decode_num_drafts_total"), _metric(srv, "specbundle_draft_tokens_total")
        assert drafts > 0 and drafted == drafts * draft_tokens  # vLLM drafts the signed length at every step
        assert _metric(srv, "specbundle_generated_tokens_total") >= 1
        assert _metric(srv, "specbundle_spec_decode_num_draft_tokens_total") > 0  # llama-server's own counters, our names
    finally:
        assert srv.stop() == 0


def test_vllm_dying_ends_serve_with_exit_7(tmp_path: Path, keypair) -> None:
    python = _vllm_python()
    srv = Server(_torch_store(tmp_path, keypair, 3), keypair[1], "--runtime", "vllm", "--runtime-bin", python, "--no-draft")
    try:
        os.kill(httpx.get(srv.url + "/status.json").json()["runtime"]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while httpx.get(srv.url + "/health").status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert srv.proc.wait(30) == 7
    finally:
        srv.stop()


def test_llama_server_runs_the_bundles_draft_model_behind_the_front_door(tmp_path: Path, keypair) -> None:
    binary = _llama_server()
    run_bundle("pack", str(gguf_context(tmp_path / "ctx")), "-t", REF, "--key", str(keypair[0]), "--store", str(tmp_path / "store"), check=True)
    srv = Server(tmp_path / "store", keypair[1], "--runtime", "llama-server", "--runtime-bin", binary)
    try:
        status = httpx.get(srv.url + "/status.json").json()["runtime"]
        assert status["speculation"]["method"] == "draft" and "-md" in status["argv"]
        assert status["argv"][status["argv"].index("--spec-draft-n-max") + 1] == "3"
        answer = _ask(srv, "the quick brown fox")
        assert answer.status_code == 200 and answer.headers["x-bundle-digest"].startswith("sha256:")
        assert _metric(srv, "specbundle_generated_tokens_total") >= 1
        assert _metric(srv, "specbundle_spec_decode_num_draft_tokens_total") > 0  # llama-server's own counters, our names
    finally:
        assert srv.stop() == 0
