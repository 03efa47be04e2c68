"""Bad Kitfiles are refused at pack with a clear one-line error and its code, and the store is unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_bundle, tree_digest

def _kitfile(tree: Path) -> str:
    return (tree / "Kitfile").read_text()


def _pack(tree: Path, store: Path) -> tuple:
    before = tree_digest(store)
    result = run_bundle("pack", str(tree), "-t", "tiny:1", "--store", str(store))
    return result, before == tree_digest(store)


@pytest.mark.parametrize(
    "change, code, exit_code",
    [
        pytest.param(lambda k: k + "surprise: 1\n", "invalid-kitfile", 6, id="unknown-top-level-key"),
        pytest.param(lambda k: k.replace("framework: transformers", "framework: transformers\n  colour: red"), "invalid-kitfile", 6, id="unknown-model-key"),
        pytest.param(lambda k: k.replace("path: target/", "path: /etc/"), "invalid-kitfile", 6, id="absolute-path"),
        pytest.param(lambda k: k.replace("path: target/", "path: ../target/"), "invalid-kitfile", 6, id="escaping-path"),
        pytest.param(lambda k: k.replace("path: target/", "path: target/sub/../../../x"), "invalid-kitfile", 6, id="escaping-path-inside"),
        pytest.param(lambda k: k.replace("path: draft/", "path: target/"), "invalid-kitfile", 6, id="duplicate-path"),
        pytest.param(lambda k: k.replace("- {name: draft, path: draft/, type: draft}\n", ""), "invalid-kitfile", 6, id="missing-draft"),
        pytest.param(lambda k: k.replace("type: tokenizer", "type: vocab"), "invalid-kitfile", 6, id="missing-tokenizer"),
        pytest.param(lambda k: k.replace("  path: target/\n", ""), "invalid-kitfile", 6, id="missing-target"),
        pytest.param(lambda k: k.replace("path: draft/", "path: nowhere/"), "invalid-kitfile", 6, id="path-does-not-exist"),
        pytest.param(lambda k: k.replace("path: README.md", "path: https://example.com/README.md"), "invalid-kitfile", 6, id="remote-path"),
        pytest.param(lambda k: k.replace("version: 1.0.0,", "version: one,"), "invalid-kitfile", 6, id="bad-version"),
        pytest.param(lambda k: k.replace("draft_tokens: 4", "draft_tokens: lots"), "invalid-kitfile", 6, id="bad-parameter-type"),
        pytest.param(lambda k: k.replace("draft_tokens: 4", "draft_tokens: 4, methods: [medusa]"), "invalid-kitfile", 6, id="unknown-method"),
        pytest.param(lambda k: k.replace("draft_tokens: 4", "draft_tokens: 4, methods: []"), "invalid-kitfile", 6, id="no-methods"),
        pytest.param(lambda k: k.replace("draft_tokens: 4", "draft_tokens: 4, methods: [ngram, ngram]"), "invalid-kitfile", 6, id="repeated-method"),
        pytest.param(lambda k: k.replace("draft_tokens: 4", "draft_tokens: 4, ngram: {min_n: 4, max_n: 2}"), "invalid-kitfile", 6, id="ngram-min-above-max"),
        pytest.param(lambda k: k.replace("draft_tokens: 4", "draft_tokens: 4, ngram: {min_n: 0}"), "invalid-kitfile", 6, id="ngram-zero"),
        pytest.param(lambda k: k.replace("draft_tokens: 4", "draft_tokens: 4, ngram: {draft_tokens: 65}"), "invalid-kitfile", 6, id="ngram-k-too-large"),
        pytest.param(lambda k: k.replace("draft_tokens: 4", "draft_tokens: 4, ngram: {window: 3}"), "invalid-kitfile", 6, id="ngram-unknown-key"),
        pytest.param(lambda k: k.replace("- {name: draft, path: draft/, type: draft}\n", "").replace("draft_tokens: 4", "methods: [ngram, draft]"),
                     "invalid-kitfile", 6, id="draft-method-without-draft"),
        pytest.param(lambda k: "model: [unclosed\n", "invalid-kitfile", 6, id="not-yaml"),
        pytest.param(lambda k: "- just\n- a list\n", "invalid-kitfile", 6, id="not-a-mapping"),
        pytest.param(
            lambda k: 'a: &a ["x","x","x","x","x","x","x","x","x"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n' + k,
            "invalid-kitfile", 6, id="yaml-bomb",
        ),
    ],
)
def test_bad_kitfile_is_refused_and_store_unchanged(tree: Path, store_dir: Path, change, code: str, exit_code: int) -> None:
    (tree / "Kitfile").write_text(change(_kitfile(tree)))
    result, unchanged = _pack(tree, store_dir)
    assert result.code == exit_code, result.err
    assert result.err.strip().startswith(f"error: [{code}] "), result.err
    assert len(result.err.strip().splitlines()) == 1
    assert unchanged


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.pth", "w.pkl", "last.ckpt"])
def test_pickle_weights_in_a_model_role_are_refused(tree: Path, store_dir: Path, name: str) -> None:
    (tree / "draft" / name).write_bytes(b"\x80\x04pickle")
    result, unchanged = _pack(tree, store_dir)
    assert result.code == 4
    assert result.err.startswith("error: [pickle-weights] ")
    assert name in result.err
    assert unchanged


def test_symlink_in_the_tree_is_refused(tree: Path, store_dir: Path) -> None:
    (tree / "target" / "link.json").symlink_to("/etc/passwd")
    result, unchanged = _pack(tree, store_dir)
    assert result.code == 6, result.err
    assert result.err.startswith("error: [invalid-bundle] ")
    assert unchanged


def test_missing_context_is_a_usage_error(tmp_path: Path, store_dir: Path) -> None:
    result = run_bundle("pack", str(tmp_path / "nope"), "-t", "x:1", "--store", str(store_dir))
    assert result.code == 2
    assert result.err.startswith("error: [missing-input] ")


def test_bad_reference_is_a_usage_error(tree: Path, store_dir: Path) -> None:
    result = run_bundle("pack", str(tree), "-t", "Not A Ref", "--store", str(store_dir))
    assert result.code == 2
    assert result.err.startswith("error: [usage] ")
