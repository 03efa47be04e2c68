"""Functions a reader can hold in mind: none in core/, bundler/ or runner/ runs past MAX_LINES lines, read
from the source with ast (nothing of the project is imported)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "bundler", "runner")
MAX_LINES = 80  # signature, docstring and body, from `def` to the last line


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


def test_no_function_is_longer_than_a_reader_can_hold() -> None:
    assert long_functions() == []
