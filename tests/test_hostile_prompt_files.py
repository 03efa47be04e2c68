"""Hostile prompt files and prompts (issue 45): any prompt file is a usage error (exit 2) or prompts, never exit 1,
a hang or a traceback; `run`, `tune` and `bench` refuse a prompt that with --max-new-tokens does not fit the
model's context window before any weights load, a huge one without tokenizing it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import run_bundle
from tests.hostile_files import assert_clean_refusal, bundle, deep_json, make_hostile
from tests.tinymodels import make_pair

REF = "tiny-spec:1.0.0"
WINDOW = 2048  # the tiny models' max_position_embeddings (tests/tinymodels.py)

HOSTILE = [
    ("fifo", ""), ("dev-zero", ""), ("directory", ""), ("huge", ""),
    ("nested", deep_json() + "\n"),
    ("nested-category", '{"prompt": "hi", "category": ' + "[" * 100_000 + "]" * 100_000 + "}\n"),
    ("prompt-a-number", '{"prompt": 5}\n'),
    ("category-an-object", '{"prompt": "hi", "category": {"a": 1}}\n'),
    ("not-an-object", '{"prompt": "hi"}\n[1, 2]\n'),
    ("lone-surrogate", '{"prompt": "\\ud800"}\n'),
    ("empty", ""), ("blank-prompt", '{"prompt": "   "}\n'),
]


def _file(tmp_path: Path, kind: str, text: str) -> Path:
    name = "prompts.jsonl" if text.startswith("{") else "prompts.txt"
    return make_hostile(tmp_path / name, kind if kind in ("fifo", "dev-zero", "directory", "huge") else "text", text)


@pytest.mark.parametrize("command", ["tune", "bench"])
@pytest.mark.parametrize("kind, text", HOSTILE, ids=[k for k, _ in HOSTILE])
def test_a_hostile_prompts_file_is_a_usage_error(command: str, kind: str, text: str, tmp_path: Path) -> None:
    path = _file(tmp_path, kind, text)
    result = bundle(command, REF, "--prompts", str(path), "--store", str(tmp_path / "store"), timeout=30)
    assert_clean_refusal(result)


def test_a_prompts_file_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_bytes(b"\xff\xfe not text\n")
    assert_clean_refusal(bundle("tune", REF, "--prompts", str(tmp_path / "p.txt"), "--store", str(tmp_path / "s"), timeout=30))


RUN_HOSTILE = [("fifo", ""), ("dev-zero", ""), ("huge", ""), ("empty", ""), ("directory", "")]


@pytest.mark.parametrize("kind, text", RUN_HOSTILE, ids=[k for k, _ in RUN_HOSTILE])
def test_a_hostile_prompt_file_for_run_is_a_usage_error(kind: str, text: str, tmp_path: Path) -> None:
    path = _file(tmp_path, kind, text)
    result = bundle("run", REF, "--prompt-file", str(path), "--store", str(tmp_path / "store"), timeout=30)
    assert_clean_refusal(result)


def test_dev_zero_on_stdin_is_a_usage_error(tmp_path: Path) -> None:
    """More than a prompt file may hold, piped: refused after reading only that much."""
    result = bundle("run", REF, "--store", str(tmp_path / "store"), stdin=b"\0" * ((16 << 20) + 2), timeout=60)
    assert_clean_refusal(result)
    assert "bytes" in result.err


# -- the model's context window ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("window")
    make_pair(base / "ctx")
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return {"ctx": base / "ctx", "store": base / "store", "pub": keypair[1]}


def _run(signed: dict[str, Path], *args: str, stdin: bytes | None = None) -> tuple[object, float]:
    start = time.monotonic()
    result = bundle("run", REF, "--key", str(signed["pub"]), "--store", str(signed["store"]), "--raw", *args, stdin=stdin, timeout=120)
    return result, time.monotonic() - start


def test_a_prompt_longer_than_the_window_is_refused_before_loading(signed: dict[str, Path]) -> None:
    """15,000 words on a 2048-position model: exit 2 naming the window, no prefill of it."""
    result, _ = _run(signed, "--prompt", "word " * 15_000, "--max-new-tokens", "4")
    assert_clean_refusal(result)
    assert "context window of 2048" in result.err


def test_a_5mb_line_is_refused_by_its_length_without_tokenizing(signed: dict[str, Path]) -> None:
    result, seconds = _run(signed, "--max-new-tokens", "4", stdin=b"x" * (5 << 20) + b"\n")
    assert_clean_refusal(result)
    assert "whatever it says" in result.err and "context window of 2048" in result.err
    assert seconds < 60


def test_max_new_tokens_beyond_the_window_is_refused(signed: dict[str, Path]) -> None:
    result, _ = _run(signed, "--prompt", "hello", "--max-new-tokens", str(WINDOW + 1))
    assert_clean_refusal(result)
    assert "context window of 2048" in result.err


def test_a_prompt_that_fits_still_runs(signed: dict[str, Path]) -> None:
    result, _ = _run(signed, "--prompt", "hello world", "--max-new-tokens", "3", "--json")
    assert result.code == 0, result.err


def test_tune_refuses_a_prompt_beyond_the_window_before_loading(signed: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "long.txt").write_text("short one\n" + "word " * 15_000 + "\n")
    result = bundle("tune", str(signed["ctx"]), "--prompts", str(tmp_path / "long.txt"), "--held-out", "none",
                    "--max-k", "1", "--max-new-tokens", "4", timeout=120)
    assert_clean_refusal(result)
    assert "context window of 2048" in result.err


def test_bench_refuses_a_prompt_beyond_the_window_before_loading(signed: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "long.txt").write_text("x" * (1 << 20) + "\n")
    result = bundle("bench", REF, "--prompts", str(tmp_path / "long.txt"), "--max-new-tokens", "4", "--key", str(signed["pub"]),
                    "--store", str(signed["store"]), timeout=120)
    assert_clean_refusal(result)
    assert "context window of 2048" in result.err


def test_serve_bounds_a_request_by_the_models_window(signed: dict[str, Path]) -> None:
    """A prompt the server's sizing (3072 tokens) would take but the model's 2048 positions cannot, and one whose
    max_tokens would run past the window: both 400 context_length_exceeded, before the queue."""
    from bundler.serve.api_error import ApiError
    from bundler.serve.app import SERVE_MAX_NEW_TOKENS, SERVE_PROMPT_TOKENS
    from bundler.serve.openai_requests import parse_request, prompt_ids, prompt_token_limit
    from runner.run import load_pair

    pair = load_pair(signed["ctx"], {"target": "target/", "draft": "draft/", "tokenizer": "tokenizer/"}, {}, context=(64, 8))
    limit = prompt_token_limit(pair, SERVE_PROMPT_TOKENS)
    assert pair.context_window == WINDOW and limit == WINDOW - 1
    per_unit = len(pair.prompt_ids("hello world " * 50, raw=True)) / 50
    too_long = "hello world " * int(2200 / per_unit)
    past_window = "hello world " * int(1500 / per_unit)
    assert len(pair.prompt_ids(too_long, raw=True)) > limit
    assert len(pair.prompt_ids(past_window, raw=True)) <= limit < len(pair.prompt_ids(past_window, raw=True)) + SERVE_MAX_NEW_TOKENS
    for prompt, max_tokens in ((too_long, 1), (past_window, SERVE_MAX_NEW_TOKENS)):
        req = parse_request({"prompt": prompt, "max_tokens": max_tokens}, chat=False, max_new_tokens=SERVE_MAX_NEW_TOKENS,
                            default_max_tokens=16)
        with pytest.raises(ApiError) as refused:
            prompt_ids(pair, req, limit)
        assert refused.value.status == 400 and refused.value.code == "context_length_exceeded"
    fits = parse_request({"prompt": "hello world", "max_tokens": 16}, chat=False, max_new_tokens=SERVE_MAX_NEW_TOKENS,
                         default_max_tokens=16)
    assert prompt_ids(pair, fits, limit)
