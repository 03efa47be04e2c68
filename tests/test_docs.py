"""The README and docs/ as a reader meets them: every relative link resolves, and the README's code map
names exactly the modules that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    """The link targets of a Markdown page that are paths in the repository (no URL, no pure anchor)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_every_relative_link_resolves() -> None:
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in PAGES for target in relative_links(page)
              if not (page.parent / target.split("#")[0]).exists()]
    assert broken == []


def code_map_paths(readme: str) -> set[str]:
    """The files the README's code map names: `folder/` lines open a folder, indented lines name its entries."""
    block = readme.split("## The code", 1)[1].split("```", 2)[1]
    paths, stack = set(), []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        stack = stack[:depth] + [name.rstrip("/")]
        if name.endswith(".py"):
            paths.add("/".join(stack))
    return paths


def test_readme_code_map_names_exactly_the_modules_that_exist() -> None:
    named = code_map_paths((ROOT / "README.md").read_text())
    modules = {str(p.relative_to(ROOT)) for pkg in ("core", "bundler", "runner") for p in (ROOT / pkg).rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py")}
    assert named == modules


def named_modules(page: str) -> set[str]:
    """The files and folders a page names in backticks (`runner/decoding/policy.py`, `pair.py`, `bundler/serve/`),
    outside code blocks, placeholders (`<new>.py`) and the "before:" lines that tell what the layout replaced."""
    text = re.sub(r"```.*?```", "", page, flags=re.S)
    lines, before = [], False
    for line in text.splitlines():  # a "- before" bullet runs on to the next bullet or blank line
        if not line.strip() or line.lstrip().startswith("- "):
            before = line.lstrip().startswith("- before")
        if not before:
            lines.append(line)
    tokens = re.findall(r"`([^`\s]+)`", "\n".join(lines))
    return {t for t in tokens if "<" not in t and re.fullmatch(r"[\w./-]+(\.py|/)", t)}


def test_contributing_names_only_modules_that_exist() -> None:
    searched = [p for top in ("core", "bundler", "runner", "tests") for p in (ROOT / top).rglob("*")]
    def exists(name: str) -> bool:  # a path from the root, or a bare file name found in the packages or tests
        return (ROOT / name).exists() or "/" not in name and any(p.name == name for p in searched)

    named = named_modules((ROOT / "docs" / "contributing.md").read_text())
    assert {"runner/decoding/policy.py", "runner/decoding/step.py"} <= named | {"runner/decoding/" + n for n in named}
    assert sorted(n for n in named if not exists(n)) == []
