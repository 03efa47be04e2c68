"""The project as a wheel installs and runs outside the checkout: every module of the installed package imports
and `bundle --help` answers. The wheel is built from pyproject.toml's package list, as `make image` builds the
image's, so a package that list forgets (core/ once was) fails here instead of crash-looping every pod.

The fresh venv holds only the wheel; the third-party dependencies come from the test venv's site-packages,
added as a plain path (a .pth line), so its editable install of this checkout is not on the path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".git", ".venv", "build", "dist", "demo", "tests", "benchmarks", "node_modules", "__pycache__"}
# Every module of the installed distribution (but __main__, which runs the CLI), imported by name; the path of each
# must be the fresh venv's.
IMPORT_ALL = """
import importlib, importlib.metadata as md, sys
dist = md.distribution("specbundle")
names = sorted({str(f)[:-3].replace("/", ".").removesuffix(".__init__") for f in dist.files
                if str(f).endswith(".py") and not str(f).startswith("..") and not str(f).endswith("__main__.py")})
outside = []
for name in names:
    module = importlib.import_module(name)
    if not module.__file__.startswith(sys.prefix):
        outside.append(name)
assert not outside, f"imported from outside the venv: {outside[:5]}"
print(f"imported {len(names)} modules")
"""


def _copy_sources(dest: Path) -> Path:
    """The checkout's files a wheel is built from (no venv, no tests, no build outputs, nothing hidden: .git, and
    a working tree's other venvs such as `make vllm`'s .venv-vllm, gigabytes a wheel never reads)."""
    shutil.copytree(ROOT, dest, ignore=lambda d, names: [n for n in names if n in SKIP or n.startswith(".") or n.endswith(".egg-info")])
    return dest


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def _in_venv(venv: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("installed")
    src = _copy_sources(tmp / "src")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                          "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    wheel = next((tmp / "dist").glob("specbundle-*.whl"))
    return _fresh_venv(tmp, wheel)


def test_every_module_of_the_installed_package_imports(installed: Path, tmp_path: Path) -> None:
    out = _in_venv(installed, str(installed / "bin" / "python"), "-c", IMPORT_ALL, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    count = re.search(r"^imported (\d+) modules$", out.stdout, re.M)
    assert count and int(count.group(1)) > 50, out.stdout[-2000:]  # core, bundler, runner, schemas: every module


def test_bundle_help_runs_from_the_installed_entry_point(installed: Path, tmp_path: Path) -> None:
    out = _in_venv(installed, str(installed / "bin" / "bundle"), "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Usage" in out.stdout and "serve" in out.stdout


def test_a_package_missing_from_the_install_fails_the_check(installed: Path, tmp_path: Path) -> None:
    """The class of bug this file is for: the install without core/ (as the image once was) is refused."""
    venv = tmp_path / "broken"
    shutil.copytree(installed, venv, symlinks=True)
    site = next(venv.glob("lib/python*/site-packages"))
    shutil.rmtree(site / "core")
    out = _in_venv(venv, str(venv / "bin" / "python"), "-c", IMPORT_ALL, cwd=tmp_path)
    assert out.returncode != 0 and "No module named 'core'" in out.stderr
