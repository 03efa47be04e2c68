"""What a benchmark ran on: the CPU (runner.engines.cpu) and the engine versions; every bench result says which."""

from __future__ import annotations

__all__ = ["cpu_info", "machine_info"]

from runner.engines import cpu

cpu_info = cpu.cpu_info  # benchmarks take it from here, beside machine_info


def engine_versions() -> dict:
    """torch, transformers and llama-cpp-python versions (None when not installed)."""
    versions = {}
    for name, module in (("torch", "torch"), ("transformers", "transformers"), ("llama-cpp-python", "llama_cpp")):
        try:
            versions[name] = __import__(module).__version__
        except ImportError:
            versions[name] = None
    return versions


def machine_info(threads: int) -> dict:
    """The "machine" block of bench --json."""
    return {"cpu": cpu_info(), "threads": threads, "engines": engine_versions()}
