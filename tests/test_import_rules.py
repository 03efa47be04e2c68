"""The import rules of the house, read from the source with ast (nothing of the project is imported):
no cycles among the project's modules, nothing in runner/ imports bundler/, core/ imports neither, each package
imports only down its floors, no `from X import _private` across modules, and each module of core/, bundler/
and runner/ names its public face in __all__."""

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


def test_core_imports_nothing_of_the_project() -> None:
    """core/ is what both packages stand on: it may import itself, nothing else of the project."""
    assert sorted(f"{m} -> {d}" for m, deps in GRAPH.items() if m.split(".")[0] == "core"
                  for d in deps if d.split(".")[0] != "core") == []


# Each package's floors, lowest first: a module may import its own floor and those below, never one above.
# A package's top-level modules sit on the floor named after them (runner.pair and runner.gguf_run beside
# runner.run); the package's __init__ holds no code of a floor and imports nothing of the project.
FLOORS = {
    "bundler": ("format", "store", "trust", "registry", "verbs", "serve", "cli"),
    "runner": ("engines", "checks", "models", "decoding", "run", "bench"),
}
TOP_LEVEL_FLOOR = {"bundler.__main__": "cli", "runner.pair": "run", "runner.gguf_run": "run"}


def floor(module: str) -> str | None:
    """The floor `module` stands on within its package, "" for the package's __init__, None if it has none."""
    package, _, rest = module.partition(".")
    if not rest:
        return ""
    name = TOP_LEVEL_FLOOR.get(module, rest.partition(".")[0])
    return name if name in FLOORS[package] else None


def arrows_up(graph: dict[str, set[str]], package: str) -> list[str]:
    """Every import in `package` from a lower floor to a higher one (or out of its __init__), named."""
    order = {name: i for i, name in enumerate(FLOORS[package])}
    found = []
    for module in sorted(m for m in graph if m.split(".")[0] == package):
        for dep in sorted(d for d in graph[module] if d.split(".")[0] == package):
            here, there = floor(module), floor(dep)
            if here is None or there is None or there == "":
                continue  # no floor: test_every_module_has_a_floor names it; the __init__ is below every floor
            if here == "" or order[there] > order[here]:
                found.append(f"{module} ({here or '__init__'}) -> {dep} ({there}): up the floors {' < '.join(FLOORS[package])}")
    return found


def test_every_module_has_a_floor() -> None:
    assert sorted(m for m in GRAPH if m.split(".")[0] in FLOORS and floor(m) is None) == []


def test_bundler_imports_only_down_its_floors() -> None:
    assert arrows_up(GRAPH, "bundler") == []


def test_runner_imports_only_down_its_floors() -> None:
    assert arrows_up(GRAPH, "runner") == []


def test_an_import_up_a_floor_is_named() -> None:
    """The floor rule bites: an arrow up is reported with both ends; down, sideways and to __init__ are not."""
    graph = {"bundler.format.layerread": {"bundler.store.layout", "bundler.format.tarread", "bundler"},
             "bundler.verbs.run": {"bundler.trust.verify"}, "bundler.cli": {"bundler.verbs.run"},
             "runner.engines.llamacpp": {"runner.checks.cpus"}, "runner.run": {"runner.pair", "runner.decoding.stats"}}
    assert arrows_up(graph, "bundler") == [
        "bundler.format.layerread (format) -> bundler.store.layout (store): up the floors "
        "format < store < trust < registry < verbs < serve < cli"]
    assert [a.partition(":")[0] for a in arrows_up(graph, "runner")] == [
        "runner.engines.llamacpp (engines) -> runner.checks.cpus (checks)"]


def test_the_rules_see_the_project() -> None:
    """The rules above are only as good as the graph: it must hold the project's modules and edges."""
    assert "bundler.cli" in GRAPH and "runner.decoding.speculative" in GRAPH
    assert "bundler.trust.verify" in GRAPH["bundler.cli"] or any(d.startswith("bundler") for d in GRAPH["bundler.cli"])


# The public face: each module of core/, bundler/ and runner/ names in __all__ what the rest of the project
# (tests, benchmarks and demo included) takes from it. Private names (tests may reach in) and names a module only
# imports (a test may patch `module.os`) are not part of it.
FACED = sorted(m for m, p in MODULES.items()
               if m.split(".")[0] in ("core", "bundler", "runner") and p.name not in ("__init__.py", "__main__.py"))


def top_level(module: str) -> tuple[set[str], set[str] | None]:
    """The names `module` defines at its top level, and its __all__ (None without one)."""
    defined: set[str] = set()
    declared = None
    for node in ast.parse(MODULES[module].read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        for sub in ast.walk(node) if isinstance(node, (ast.Assign, ast.AnnAssign, ast.If, ast.Try)) else ():
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                defined.add(sub.id)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            declared = set(ast.literal_eval(node.value))
    return defined, declared


def dotted(node: ast.expr) -> str | None:
    """`a.b.c` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def taken(path: Path) -> set[tuple[str, str]]:
    """(module, name) for each name this file takes from a module of the project: `from M import name`, or
    `m.name` where an import bound m to M (`import M as m`, `from P import m`, or `import M` and `M.name`)."""
    tree = ast.parse(path.read_text())
    out, bound = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                elif node.module in MODULES:
                    out.add((node.module, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in MODULES:
                    bound[alias.asname] = alias.name
                elif not alias.asname:
                    head = alias.name.partition(".")[0]
                    bound.setdefault(head, head)
    for node in ast.walk(tree):
        base = dotted(node.value) if isinstance(node, ast.Attribute) else None
        if base and base.partition(".")[0] in bound:
            head, dot, rest = base.partition(".")
            out.add((bound[head] + dot + rest, node.attr))
    return out


def test_every_module_of_core_bundler_and_runner_declares_its_public_face() -> None:
    assert [m for m in FACED if top_level(m)[1] is None] == []


def test_every_name_taken_from_core_bundler_or_runner_is_in_its_all() -> None:
    faces = {m: top_level(m) for m in FACED}
    users = [p for d in ("core", "bundler", "runner", "tests", "benchmarks", "demo") for p in (ROOT / d).rglob("*.py")]
    missing = sorted({f"{m}.{name}" for path in users for m, name in taken(path)
                      if m in faces and MODULES[m] != path and not name.startswith("_")
                      and name in faces[m][0] and name not in (faces[m][1] or set())})
    assert missing == []


def test_all_names_only_what_the_module_defines() -> None:
    assert sorted(f"{m}.{name}" for m in FACED for name in (top_level(m)[1] or set()) - top_level(m)[0]) == []
