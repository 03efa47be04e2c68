"""The import rules of the house, read from the source with ast (nothing of the project is imported):
no cycles among the project's modules, nothing in runner/ imports bundler/, and no `from X import _private`
across modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "bundler", "runner", "schemas")


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


MODULES = {module_name(p): p for pkg in PACKAGES if (ROOT / pkg).is_dir() for p in (ROOT / pkg).rglob("*.py")}


def imports(module: str) -> tuple[set[str], list[str]]:
    """The project modules `module` imports (anywhere in it), and the private names it imports from others."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    deps: set[str] = set()
    private: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            private += [f"{module} <- {base}.{alias.name}" for alias in node.names
                        if alias.name.startswith("_") and not alias.name.startswith("__") and base in MODULES]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != module:
                deps.add(target)
    return deps, private


GRAPH = {m: imports(m)[0] for m in MODULES}


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(GRAPH):
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(GRAPH[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    assert cycles() == []


def test_runner_never_imports_bundler() -> None:
    assert sorted(m for m, deps in GRAPH.items() if m.startswith("runner")
                  and any(d.startswith("bundler") for d in deps)) == []


def test_no_private_name_is_imported_across_modules() -> None:
    assert [p for m in MODULES for p in imports(m)[1]] == []


def test_the_rules_see_the_project() -> None:
    """The rules above are only as good as the graph: it must hold the project's modules and edges."""
    assert "bundler.cli" in GRAPH and "runner.decoding.speculative" in GRAPH
    assert "bundler.trust.verify" in GRAPH["bundler.cli"] or any(d.startswith("bundler") for d in GRAPH["bundler.cli"])
