"""llama.cpp's own tools (llama-server, llama-bench, llama-quantize, llama-cli), built once from the llama.cpp
source that the installed llama-cpp-python vendors, with the engine's flags, and cached outside the repository
in ~/.cache/specbundle/llama-server/build-<version>/bin; and the llama-server command lines of its speculative
modes, so the serving benchmarks start the same peers.

    python benchmarks/llamacpp_tools.py build [--targets llama-server,llama-bench,llama-quantize,llama-cli]
    python benchmarks/llamacpp_tools.py where         # prints the bin folder (exit 3 when not built)
"""

from __future__ import annotations

import argparse
import fcntl
import os
import subprocess
import sys
import tarfile
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specbundle" / "llama-server"
# llama-cpp-python builds its library with GGML_NATIVE on (the engine's flags); the tools the same way,
# statically linked so a binary does not depend on the build tree.
CMAKE_FLAGS = ["-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DCMAKE_BUILD_TYPE=Release"]
TOOLS = ("llama-server", "llama-bench", "llama-quantize", "llama-cli")
# The version pyproject.toml pins; used when llama_cpp is not importable (a build before the venv is ready).
PINNED_VERSION = "0.3.36"
# llama-server's speculative modes (`--spec-type`) the peers use, and the flag that sets each one's most tokens
# drafted a step (the n-gram modes draft an m-gram of `size-m` tokens; draft-simple needs a draft model).
SPEC_TYPES = {"ngram-simple": "--spec-ngram-simple-size-m", "ngram-map-k": "--spec-ngram-map-k-size-m",
              "draft-simple": "--spec-draft-n-max"}


def engine_version() -> str:
    """The installed llama-cpp-python's version, or the pinned one when it is not installed yet."""
    try:
        import llama_cpp
    except ImportError:
        return PINNED_VERSION
    return llama_cpp.__version__


def bin_dir(version: str | None = None) -> Path:
    """The folder the tools of this version are (or will be) built into."""
    return CACHE / f"build-{version or engine_version()}" / "bin"


def tool(name: str, build: bool = False) -> Path:
    """The cached binary `name` (one of TOOLS); built (with all TOOLS) when asked, else SystemExit if absent."""
    binary = bin_dir() / name
    if binary.exists():
        return binary
    if not build:
        raise SystemExit(f"no {name} in {binary.parent}: run `python benchmarks/llamacpp_tools.py build` "
                         "(15-40 minutes on 2 cores)")
    build_tools(TOOLS)
    return binary


def llama_source(version: str) -> Path:
    """The llama-cpp-python sdist of `version`, fetched with pip and unpacked in the cache; its root folder."""
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(CACHE),
                        f"llama-cpp-python=={version}"], check=True)
    source = CACHE / f"llama_cpp_python-{version}"
    if not source.exists():
        with tarfile.open(sdist) as tar:
            tar.extractall(CACHE, filter="data")
    return source


def build_tools(targets: tuple[str, ...] = TOOLS, version: str | None = None) -> Path:
    """Configure and build `targets` from the vendored llama.cpp (niced, all cores); returns the bin folder."""
    version = version or engine_version()
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second benchmark asking meanwhile waits, then finds the tools built
        source = llama_source(version)
        build_dir = bin_dir(version).parent
        subprocess.run(["cmake", "-S", str(source / "vendor" / "llama.cpp"), "-B", str(build_dir), *CMAKE_FLAGS], check=True)
        subprocess.run(["nice", "cmake", "--build", str(build_dir), "--target", *targets, "-j", str(os.cpu_count() or 1)],
                       check=True)
    return bin_dir(version)


def convert_script(version: str | None = None) -> tuple[Path, Path]:
    """The vendored convert_hf_to_gguf.py and the gguf-py folder to put on PYTHONPATH beside it."""
    root = llama_source(version or engine_version()) / "vendor" / "llama.cpp"
    return root / "convert_hf_to_gguf.py", root / "gguf-py"


def server_argv(binary: Path, target: Path, port: int, threads: int, slots: int = 1, ctx_seq: int = 4096,
                spec_type: str | None = None, draft: Path | None = None, draft_max: int | None = None) -> list[str]:
    """llama-server on `target` with the threads and batch sizes of runner.engines.llamacpp (slots: `-np`;
    ctx_seq: the context of a slot); `spec_type` (a key of SPEC_TYPES, None for plain) adds llama-server's own
    speculation, `draft-simple` with the `draft` model; draft_max: the most tokens drafted a step (None:
    llama.cpp's default, 3 for draft-simple, 48 for the n-gram modes)."""
    argv = [str(binary), "-m", str(target), "--port", str(port), "--host", "127.0.0.1", "-t", str(threads),
            "-tb", str(threads), "-np", str(slots), "-c", str(ctx_seq * slots), "-b", "512", "-ub", "512",
            "--no-webui", "--log-disable"]
    from runner.engines.cpu import repack_weights

    if not repack_weights():  # the same set-up as our engine (runner.engines.cpu): repacking for AMX crashes llama.cpp
        argv.append("--no-repack")
    if spec_type is None:
        return argv
    if spec_type not in SPEC_TYPES:
        raise ValueError(f"unknown spec type {spec_type!r}: one of {', '.join(SPEC_TYPES)}")
    argv += ["--spec-type", spec_type]
    if draft_max is not None:
        argv += [SPEC_TYPES[spec_type], str(draft_max)]
    if spec_type == "draft-simple":
        if draft is None:
            raise ValueError("draft-simple needs a draft model")
        argv += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads)]
    return argv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("build", "where"))
    parser.add_argument("--targets", default=",".join(TOOLS), help="comma-separated cmake targets")
    args = parser.parse_args()
    if args.action == "where":
        print(bin_dir())
        return 0 if bin_dir().is_dir() else 3
    print(build_tools(tuple(t for t in args.targets.split(",") if t)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
