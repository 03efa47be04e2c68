"""Functions and modules a reader can hold in mind: none in core/, bundler/ or runner/ runs past MAX_LINES
lines, no module past MAX_MODULE_LINES, read from the source (nothing of the project is imported)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "bundler", "runner")
MAX_LINES = 60  # signature, docstring and body, from `def` to the last line (issue 48: was 80)
MAX_MODULE_LINES = 400  # a module past this does more than one job: cut it by purpose (docs/contributing.md)


def long_functions() -> list[str]:
    """`path:line name (n lines)` of every function or method longer than MAX_LINES."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                    lines = node.end_lineno - start + 1
                    if lines > MAX_LINES:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def long_modules(root: Path = ROOT) -> list[str]:
    """`path (n lines)` of every module of the packages under `root` longer than MAX_MODULE_LINES, counted as
    `wc -l` counts them."""
    return [f"{path.relative_to(root)} ({lines} lines)" for pkg in PACKAGES if (root / pkg).is_dir()
            for path in sorted((root / pkg).rglob("*.py"))
            if (lines := path.read_bytes().count(b"\n")) > MAX_MODULE_LINES]


def test_no_function_is_longer_than_a_reader_can_hold() -> None:
    assert long_functions() == []


def test_no_module_is_longer_than_a_reader_can_hold() -> None:
    assert long_modules() == []


def test_a_module_one_line_too_long_is_named(tmp_path: Path) -> None:
    """The rule bites: a module of MAX_MODULE_LINES lines passes, one more line is reported with its count."""
    (tmp_path / "runner").mkdir()
    (tmp_path / "runner" / "fits.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "runner" / "grown.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_modules(tmp_path) == [f"runner/grown.py ({MAX_MODULE_LINES + 1} lines)"]
