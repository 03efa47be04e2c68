"""README.md's "A walk through", run as written: every line of its ```sh blocks, in bash, in order.

A tiny random pair stands in for the downloads, under the directory names the walk-through uses; `bundle`
is the project's own (on PATH from the venv), the store is a temp BUNDLE_HOME, and the registry a real
local one (Debian's docker-registry). The only change to a line: `127.0.0.1:5000` becomes that
registry's address. Every line must exit 0 and print what it promises; a new line in the README without
an expectation here fails the test, so the two cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from registry_server import Registry, registry  # noqa: F401  (fixture)
from tinymodels import make_pair

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "## A walk through"
README_REGISTRY = "127.0.0.1:5000"
DIGEST = r"sha256:[0-9a-f]{64}"


def walkthrough_lines(readme: Path = README) -> list[str]:
    """The command lines of the walk-through section's ```sh blocks, as written."""
    text = readme.read_text(encoding="utf-8")
    start = text.index(SECTION + "\n")
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end != -1 else len(text)]
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        lines += [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return lines


def _lay_out_downloads(cwd: Path) -> None:
    """What the walk-through starts from: the target as downloaded (weights, config, tokenizer) under
    models/SmolLM2-135M-Instruct, and the draft in demo/draft (config, weights, draft vocabulary)."""
    pair = make_pair(cwd / ".made")
    target, draft = cwd / "models" / "SmolLM2-135M-Instruct", cwd / "demo" / "draft"
    target.parent.mkdir(parents=True)
    draft.parent.mkdir(parents=True)
    shutil.move(pair["target"], target)
    shutil.move(pair["draft"], draft)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(pair["tokenizer"] / name, target / name)
    vocab = json.loads((draft / "config.json").read_text())["vocab_size"]
    (draft / "draft_vocab.json").write_text(json.dumps({"ids": list(range(vocab))}))
    shutil.rmtree(cwd / ".made")


def _expect(line: str, out: str, err: str, cwd: Path, seen: dict[str, str]) -> None:
    """What each command of the walk-through promises, by its verb."""
    verb = re.search(r"\bbundle (\w+)", line).group(1)  # type: ignore[union-attr]
    last = out.strip().splitlines()[-1] if out.strip() else ""
    if verb == "init":
        assert "wrote ctx/Kitfile: smollm2-spec 1.0.0" in out
        assert "checked: tokenizer " in out
        assert "next: bundle pack ctx -t smollm2-spec:1.0.0 --key keys/bundle.key" in out
        assert "draft_vocab" in (cwd / "ctx" / "Kitfile").read_text()  # the demo draft carries one
    elif verb == "keygen":
        assert "key id:" in out
        assert (cwd / "keys" / "bundle.key").stat().st_mode & 0o777 == 0o600
    elif verb == "pack":
        assert re.fullmatch(DIGEST, last) and "signed by" in out
        seen["digest"] = last
    elif verb == "verify":
        assert f"verified smollm2-spec:1.0.0 {seen['digest']} signed by" in out
    elif verb == "inspect":
        assert "verified: yes" in out and "tokenizer: " in out
    elif verb == "run":
        assert re.search(r"\d+ tokens in [\d.]+ s: [\d.]+ tokens/s", err), err
    elif verb == "list":
        assert re.search(rf"^smollm2-spec:1\.0\.0\s+{seen['digest'][:19]}\s+smollm2-spec\s+1\.0\.0", out, flags=re.M), out
    elif verb == "tag":
        assert f"-> {seen['digest']}" in out
    elif verb == "push":
        assert out.startswith("pushed ") and "2 signature(s)" in out and last == seen["digest"]  # model-signing and cosign-style (docs/cosign.md)
    elif verb == "pull":
        assert "verified, signed by" in out and last == seen["digest"]
        assert (cwd / "store2" / "index.json").is_file()
    elif verb == "rm":
        for ref in re.findall(r"smollm2-spec:\S+", line):
            assert f"removed {ref}" in out
    elif verb == "gc":
        freed = re.search(r"freed ([\d,]+) bytes", out)
        assert freed and int(freed.group(1).replace(",", "")) > 0, out
    else:
        pytest.fail(f"the walk-through line {line!r} has no expectation in this test: add one")


def test_walkthrough_lines_are_found() -> None:
    lines = walkthrough_lines()
    assert lines[0].startswith("bundle init ") and any(line.startswith("bundle gc") for line in lines)


def test_the_readme_walkthrough_runs_as_written(registry: Registry, tmp_path: Path) -> None:  # noqa: F811
    cwd = tmp_path / "work"
    cwd.mkdir()
    _lay_out_downloads(cwd)
    (tmp_path / "docker").mkdir()
    venv_bin = Path(sys.executable).parent  # the venv's python: its bin/ holds `bundle`
    assert (venv_bin / "bundle").is_file(), "bundle is not installed in the venv (make install)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUNDLE_")}
    env.update(PATH=f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}", BUNDLE_HOME=str(tmp_path / "store"),
               DOCKER_CONFIG=str(tmp_path / "docker"), PYTHONWARNINGS="ignore", HOME=str(tmp_path))
    seen: dict[str, str] = {}
    for line in walkthrough_lines():
        command = line.replace(README_REGISTRY, registry.host)
        proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{line}\nexit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
        try:
            _expect(line, proc.stdout, proc.stderr, cwd, seen)
        except AssertionError as exc:
            raise AssertionError(f"{line}\nstdout: {proc.stdout}\nstderr: {proc.stderr}") from exc
