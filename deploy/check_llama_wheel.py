"""Refuse a llama-cpp-python wheel that cannot load a model: unpack the wheel, import llama_cpp from it (not from
the venv's own), load a tiny GGUF (tests/tinygguf.py) and decode a few tokens greedily. A build whose CPU backends
are not found fails here with llama.cpp's "no backends are loaded" instead of in a pod.

    python deploy/check_llama_wheel.py path/to/llama_cpp_python-*.whl
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import sys, llama_cpp
from pathlib import Path
from tests.tinygguf import write_gguf
assert llama_cpp.__file__.startswith(sys.argv[1]), llama_cpp.__file__
path = write_gguf(Path(sys.argv[1]) / "tiny.gguf")
llm = llama_cpp.Llama(str(path), n_ctx=64, n_threads=1, verbose=False)
tokens = []
for token in llm.generate([261, 223, 83, 87], temp=0.0, top_k=1):
    tokens.append(token)
    if len(tokens) == 4:
        break
print("system:", llama_cpp.llama_print_system_info().decode())
print("loaded and decoded", tokens)
"""


def check(wheel: Path) -> str:
    """The probe's output; raises CalledProcessError when the wheel cannot load and decode the tiny model."""
    with tempfile.TemporaryDirectory() as tmp:
        zipfile.ZipFile(wheel).extractall(tmp)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, str(ROOT)])}
        return subprocess.run([sys.executable, "-c", PROBE, tmp], env=env, check=True, capture_output=True, text=True,
                              timeout=300).stdout


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(check(Path(arg)), end="")
