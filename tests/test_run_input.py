"""`bundle run` input a new user gives it: the prompt from a file or stdin, devices, memory budgets with units,
and an answer that ends before anything is drafted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bundler.format.sizes import parse_size
from conftest import run_bundle
from tests.tinymodels import make_pair

REF = "tiny-spec:1.0.0"


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("run-input")
    make_pair(base / "ctx")
    store = base / "store"
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(store), check=True)
    return {"base": base, "store": store}


def _run(signed: dict[str, Path], keypair, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("BUNDLE_TRUSTED_KEYS", "BUNDLE_HOME")}
    env["PYTHONWARNINGS"] = "ignore"
    cmd = [sys.executable, "-m", "bundler", "run", REF, "--key", str(keypair[1]), "--store", str(signed["store"]), "--raw", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, stdin=None if stdin is not None else subprocess.DEVNULL)


def _tokens(proc: subprocess.CompletedProcess) -> list[int]:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["tokens"]


def test_piped_stdin_without_prompt_is_the_prompt(signed, keypair) -> None:
    from bundler.trust.keys import key_id, load_public_key
    from bundler.store.refs import parse_ref
    from bundler.verbs.run import run_bundle as run_in_process
    from bundler.store.layout import Store

    piped = _tokens(_run(signed, keypair, "--max-new-tokens", "6", "--json", stdin="hello world\n"))
    key = load_public_key(keypair[1])
    direct = run_in_process(Store(signed["store"]), parse_ref(REF), {key_id(key): key}, "hello world", max_new_tokens=6, raw=True)
    assert piped == direct["tokens"]


def test_prompt_dash_and_prompt_file_read_the_prompt(monkeypatch, tmp_path: Path) -> None:
    import io

    from bundler.verbs.prompts import read_prompt

    assert read_prompt("-", None, stdin=io.BytesIO(b"from stdin\n")) == "from stdin"
    (tmp_path / "p.txt").write_text("from a file\n")
    assert read_prompt(None, str(tmp_path / "p.txt")) == "from a file"
    assert read_prompt("@literal", None) == "@literal"


def test_no_prompt_at_all_is_a_usage_error(signed, keypair) -> None:
    proc = _run(signed, keypair, "--prompt", "-", stdin="")
    assert proc.returncode == 2 and proc.stderr.startswith("error: [usage]") and "empty" in proc.stderr


def test_a_missing_prompt_file_is_missing_input_exit_2(signed, keypair, tmp_path: Path) -> None:
    proc = _run(signed, keypair, "--prompt-file", str(tmp_path / "nope.txt"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: [missing-input]")


def test_an_unknown_device_is_a_usage_error_exit_2(signed, keypair) -> None:
    proc = _run(signed, keypair, "--prompt", "hi", "--device", "tpu")
    assert proc.returncode == 2 and proc.stderr.startswith("error: [usage]") and "cpu, cuda or cuda:N" in proc.stderr


def test_memory_budget_takes_units_and_a_too_small_one_is_refused_exit_4(signed, keypair) -> None:
    assert parse_size("300MB") == 300_000_000 and parse_size("2GiB") == 2 << 30 and parse_size("1048576") == 1 << 20
    too_small = _run(signed, keypair, "--prompt", "hi", "--memory-budget", "1KB")
    assert too_small.returncode == 4 and too_small.stderr.startswith("error: [memory-budget]")
    bad = _run(signed, keypair, "--prompt", "hi", "--memory-budget", "lots")
    assert bad.returncode == 2 and bad.stderr.startswith("error: [usage]") and "300MB or 2GiB" in bad.stderr


def test_one_new_token_nothing_drafted_prints_stats_without_crashing(signed, keypair) -> None:
    proc = _run(signed, keypair, "--prompt", "hello", "--max-new-tokens", "1", "--memory-budget", "4GiB")
    assert proc.returncode == 0, proc.stderr
    assert "acceptance n/a (0/0 drafted)" in proc.stderr
    assert "timings: verify" in proc.stderr
