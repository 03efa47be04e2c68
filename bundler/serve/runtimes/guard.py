"""The guard of a third-party runtime, decided at start-up: whether the runtime's own speculation pays on this
machine, measured, never guessed.

Our guard switches speculation off per step (runner.decoding.guard); vLLM, llama-server and llama-cpp-python's
server run one proposer for the whole process and cannot be told per request. So `serve --runtime R` with the
bundle's guard on (the default) and `--runtime-speculation auto` measures, once: the runtime started with the
signed speculation answers a short fixed probe (PROBE_PROMPTS, greedy, PROBE_TOKENS each, one at a time, after
one untimed warm-up request), then the same runtime started plain answers the same probe, and the faster of the
two serves (bundler.serve.runtimes.server starts them). A probe that fails or outlives its limit decides nothing:
the signed speculation serves, and the verdict says why.

A measured verdict is remembered in the store's private state (`.specbundle/runtime-speculation.json`, as the
run history is: bundler.verbs.run), keyed by everything that could change it: the runtime, its version and its
executable's sha256, its command line (the private directory and port left out), the speculation it runs, the
bundle's digest, the CPU model and its core count. A later start with the same key reads it and starts the runtime
once. Only an economy: damaged or unwritable state is ignored.
"""

from __future__ import annotations

__all__ = ["PROBE_TOKENS", "STATE", "Rate", "Unmeasured", "Verdict", "VerdictCache", "cache_key", "decided", "measured",
           "probe", "probe_prompts", "unmeasured", "would_probe"]

import contextlib
import hashlib
import importlib.resources
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

import httpx

from bundler.serve.runtimes.checked import Prepared
from bundler.serve.runtimes.flags import Launch, mask
from bundler.store.layout import Store
from core.errors import BundleError
from runner.decoding.run_history import machine_key

PROBE_FILE = "probe.jsonl"  # beside this module: an open question, a rewrite of a given text, code
PROBE_TOKENS = 48  # per prompt: enough steps for a draft's rate to show, few enough that start-up stays short
WARM_UP_TOKENS = 8  # a fresh runtime's first request pays one-time costs (buffers, graphs): untimed
STATE = "runtime-speculation"
STATE_KEPT = 64  # keys kept, the newest
STATE_MAX_BYTES = 64 << 10
MODES = ("auto", "on", "off")


class Unmeasured(Exception):
    """A probe that measured nothing: why (its limit passed, the runtime refused or went away)."""


@dataclass(frozen=True)
class Rate:
    """A probe's result: the tokens the runtime generated and the seconds its timed requests took."""

    tokens: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Verdict:
    """Whether the runtime speculates, and why. choice: speculative | plain (None: to be measured, a dry run);
    source: measured | cached | unmeasured | option | signed | no-draft | would probe."""

    mode: str
    choice: str | None
    source: str
    reason: str
    speculative: float | None = None  # tokens/s of the probe with the signed speculation
    plain: float | None = None  # tokens/s of the probe decoding plainly
    measured_at: str | None = None

    def speculates(self) -> bool:
        return self.choice != "plain"

    def shown(self) -> dict[str, Any]:
        """The `guard` block of the translation (`--dry-run`, /status.json, the run record)."""
        return {"mode": self.mode, "choice": self.choice, "source": self.source, "reason": self.reason,
                "speculative_tokens_per_second": _rounded(self.speculative), "plain_tokens_per_second": _rounded(self.plain),
                "measured_at": self.measured_at}

    def line(self) -> str:
        """The one line `serve` logs."""
        return f"runtime speculation: {self.choice or 'to be measured'} ({self.source}: {self.reason})"


def _rounded(rate: float | None) -> float | None:
    return round(rate, 2) if rate is not None else None


def probe_prompts() -> list[str]:
    """The probe's prompts, shipped with the package."""
    text = (importlib.resources.files("bundler.serve.runtimes") / PROBE_FILE).read_text(encoding="utf-8")
    return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]


def decided(mode: str, p: Prepared, signed: Launch, store: Store | None) -> Verdict | None:
    """The verdict that needs no probe: the options', the signed settings', or the one remembered for this key;
    None: measure."""
    if mode not in MODES:
        raise BundleError("usage", f"--runtime-speculation {mode!r}: one of {', '.join(MODES)}")
    if signed.plan["method"] == "plain":
        return Verdict(mode, "plain", "no-draft", "--no-draft: the target alone")
    if mode == "off":
        return Verdict(mode, "plain", "option", "--runtime-speculation off: the target alone")
    if mode == "on":
        return Verdict(mode, "speculative", "option", "--runtime-speculation on: the signed speculation throughout")
    if not p.params.get("guard", True):
        return Verdict(mode, "speculative", "signed", "the bundle's signed settings turn the guard off: the signed speculation throughout")
    return VerdictCache(store, cache_key(p, signed)).read(mode)


def would_probe(mode: str) -> Verdict:
    """A dry run's verdict where serving would measure."""
    return Verdict(mode, None, "would probe", f"serve starts the runtime with the signed speculation, then plain, times "
                                              f"{len(probe_prompts())} greedy requests of {PROBE_TOKENS} tokens on each, and keeps the faster")


def measured(mode: str, speculative: Rate, plain: Rate) -> Verdict:
    """The faster of the two probes (the signed speculation on a tie)."""
    fast, slow = speculative.per_second, plain.per_second
    choice = "plain" if slow > fast else "speculative"
    reason = (f"speculative {fast:.1f} tokens/s, plain {slow:.1f} tokens/s on this machine "
              f"({fast / slow if slow else 0.0:.2f}x): {'the target alone' if choice == 'plain' else 'the signed speculation'}")
    return Verdict(mode, choice, "measured", reason, fast, slow, datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))


def unmeasured(mode: str, why: str, speculative: Rate | None = None) -> Verdict:
    """The signed speculation, kept because the probe decided nothing."""
    return Verdict(mode, "speculative", "unmeasured", f"{why}: the signed speculation kept",
                   speculative.per_second if speculative else None)


def cache_key(p: Prepared, launch: Launch) -> str:
    """sha256 of what could change the verdict: the runtime, its version and executable, its command line and
    environment as started (secrets masked, the private directory and the port left out), the speculation, the
    bundle's digest and the machine (runner.decoding.run_history.machine_key: the CPU model and its cores)."""
    here, port = str(p.root.parent), str(launch.port)
    argv = [a.replace(here, "<bundle>") for a in mask(launch.argv)]
    argv = ["<port>" if i and argv[i - 1] == "--port" else a for i, a in enumerate(argv)]
    env = {k: "<port>" if v == port else v.replace(here, "<bundle>") for k, v in launch.shown()["env"].items()}
    material = {"runtime": launch.runtime, "version": launch.version, "executable": launch.executable, "argv": argv,
                "env": env, "speculation": launch.plan, "machine": machine_key(p.info["digest"])}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


class VerdictCache:
    """Measured verdicts in the store's private state, one per key (no store: nothing remembered)."""

    def __init__(self, store: Store | None, key: str) -> None:
        self.store, self.key = store, key

    def _state(self) -> dict[str, Any]:
        if self.store is None:
            return {}
        try:
            return self.store.state(STATE, max_bytes=STATE_MAX_BYTES)
        except BundleError:  # damaged, oversized or not a file: ignored, and replaced by the next write
            return {}

    def read(self, mode: str) -> Verdict | None:
        entry = self._state().get(self.key)
        if not isinstance(entry, Mapping) or entry.get("choice") not in ("speculative", "plain"):
            return None
        rates = [entry.get("speculative"), entry.get("plain")]
        if not all(isinstance(r, (int, float)) and not isinstance(r, bool) and r >= 0 for r in rates):
            return None
        when = str(entry.get("measured_at") or "")[:40]
        return Verdict(mode, entry["choice"], "cached", f"speculative {rates[0]:.1f} tokens/s, plain {rates[1]:.1f} tokens/s on this "
                                                        f"machine, measured {when} (remove the store's .specbundle/{STATE}.json "
                                                        "to measure again)", float(rates[0]), float(rates[1]), when or None)

    def write(self, verdict: Verdict) -> None:
        if self.store is None or verdict.source != "measured":
            return
        entry = {"choice": verdict.choice, "speculative": verdict.speculative, "plain": verdict.plain, "measured_at": verdict.measured_at}
        with contextlib.suppress(OSError, BundleError), self.store.lock():
            state = self._state()
            state.pop(self.key, None)
            state[self.key] = entry  # the newest last
            for old in list(state)[: max(0, len(state) - STATE_KEPT)]:
                del state[old]
            self.store.write_state(STATE, state)


def _body(path: str, model: str, prompt: str, tokens: int) -> dict[str, Any]:
    if path.endswith("/chat/completions"):
        return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0}
    return {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0}


def _ask(client: httpx.Client, url: str, body: dict[str, Any], deadline: float, limit_s: float) -> httpx.Response:
    left = deadline - time.monotonic()
    if left <= 0:
        raise Unmeasured(f"the probe took longer than {limit_s:g} s (--runtime-probe-limit)")
    try:
        return client.post(url, json=body, timeout=left)
    except httpx.TimeoutException:
        raise Unmeasured(f"the probe took longer than {limit_s:g} s (--runtime-probe-limit)") from None
    except httpx.HTTPError as err:
        raise Unmeasured(f"the runtime did not answer the probe ({type(err).__name__})") from None


def _tokens(answer: httpx.Response) -> int:
    if answer.status_code != 200:
        raise Unmeasured(f"the runtime answered the probe with HTTP {answer.status_code}")
    try:
        return int(answer.json()["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        raise Unmeasured("the runtime's answer to the probe carried no usage") from None


def probe(upstream: str, headers: Mapping[str, str], model: str, limit_s: float, stopping: Callable[[], bool]) -> Rate:
    """The runtime's greedy tokens/s on the probe prompts, one request at a time, after an untimed warm-up (chat
    completions; plain completions where the runtime refuses chat, e.g. a model without a chat template). Raises
    Unmeasured: the limit passed (limit_s for all of it), the runtime refused or went away, serving stopped."""
    deadline = time.monotonic() + limit_s
    prompts = probe_prompts()
    with httpx.Client(headers=dict(headers)) as client:
        path = "/v1/chat/completions"
        warm = _ask(client, upstream + path, _body(path, model, prompts[0], WARM_UP_TOKENS), deadline, limit_s)
        if warm.status_code != 200 and warm.status_code not in (401, 403):
            path = "/v1/completions"
            warm = _ask(client, upstream + path, _body(path, model, prompts[0], WARM_UP_TOKENS), deadline, limit_s)
        _tokens(warm)
        tokens, seconds = 0, 0.0
        for prompt in prompts:
            if stopping():
                raise Unmeasured("serving stopped")
            start = time.perf_counter()
            answer = _ask(client, upstream + path, _body(path, model, prompt, PROBE_TOKENS), deadline, limit_s)
            seconds += time.perf_counter() - start
            tokens += _tokens(answer)
    if tokens == 0:
        raise Unmeasured("the runtime generated no token in the probe")
    return Rate(tokens, seconds)
