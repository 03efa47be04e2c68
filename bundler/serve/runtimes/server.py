"""`bundle serve --runtime NAME`: the front door's port opens at once (/health answers 503 while the bundle is
checked and the runtime loads); a supervising thread verifies and checks the bundle (bundler.serve.runtimes.checked),
translates its signed settings (bundler.serve.runtimes.flags), and only then starts the runtime
(bundler.serve.runtimes.child) on a free loopback port and waits for it to answer (with the signed speculation or
plain, as the start-up guard decides: bundler.serve.runtimes.guard, which may start it twice or three times to
measure, /health still 503 meanwhile); from then on the front door
(bundler.serve.runtimes.proxy) passes requests to it. The runtime ending by itself fails /health at once and ends
`serve` a moment later with `runtime-failed`; SIGTERM drains the open requests, then stops the runtime."""

from __future__ import annotations

__all__ = ["HEALTH_GRACE_S", "dry_run", "runtime_entry", "serve_runtime"]

import contextlib
import dataclasses
import sys
import threading
import time
from typing import Any, Callable, Mapping, TextIO

from bundler.serve.metrics import dtype_name
from bundler.serve.runtimes.checked import Prepared, prepared
from bundler.serve.runtimes.child import Child, free_port
from bundler.serve.runtimes.flags import Launch, RuntimeOptions, translate
from bundler.serve.runtimes.guard import (Rate, Unmeasured, Verdict, VerdictCache, cache_key, decided, measured, probe, unmeasured,
                                          would_probe)
from bundler.serve.runtimes.proxy import Governed, build_proxy
from bundler.serve.server import DRAIN_LIMIT_S, server_class
from bundler.serve.settings import ServeSettings
from bundler.serve.sources import Source
from bundler.store.layout import Store

HEALTH_GRACE_S = 2.0  # /health fails this long before the port closes after the runtime died: probes see it first
START_TIMEOUT_S = 900.0  # vLLM's CPU engine compiles for minutes before it answers
JOIN_S = 30.0

OnReady = Callable[[dict[str, Any]], None]
# The run record's hook: given the checked bundle and the launch, returns the per-request hook (stats) and the
# runtime's entry of the record, which gets the runtime's counters when serving ends.
RecordHook = Callable[[Prepared, Launch], tuple[Callable[[dict[str, Any]], None], dict[str, Any]]]
Spawn = Callable[..., Child]


def _footprint(opts: RuntimeOptions, settings: ServeSettings) -> dict[str, Any]:
    return {"context": opts.context, "sequences": opts.sequences, "dtype": opts.dtype or "float32"}


def runtime_entry(p: Prepared, launch: Launch) -> dict[str, Any]:
    """What the run record says of the runtime: name, version, executable, argv and environment (secrets
    masked), the speculation it runs, what it left out, and the files it was pointed at with their digests."""
    return {**launch.shown(), "files": [{"path": path, "sha256": digest} for path, digest in sorted(p.files.items())]}


def _plain(p: Prepared, opts: RuntimeOptions) -> Launch:
    """The runtime's command line without speculation (the guard's other choice)."""
    return translate(p, dataclasses.replace(opts, speculate=False), free_port())


def _with_verdict(launch: Launch, verdict: Verdict) -> Launch:
    launch.guard = verdict.shown()
    if not verdict.speculates() and verdict.source != "no-draft":
        launch.notes = [f"guard: {verdict.reason}"]
    return launch


def _store(source: Source) -> Store | None:
    """Where measured verdicts are remembered: the store serve was given (with --from-dir too)."""
    store = getattr(source, "store", None)
    return store if isinstance(store, Store) else None


def dry_run(source: Source, trusted: Mapping[str, Any], settings: ServeSettings, opts: RuntimeOptions) -> dict[str, Any]:
    """Every check, then the translation, as `serve` would start the runtime (its speculation as the guard decides
    without a probe, else "would probe"); nothing is started."""
    with prepared(source, trusted, _footprint(opts, settings), settings.load.memory_budget) as p:
        launch = translate(p, opts, free_port())
        verdict = decided(settings.runtime_speculation, p, launch, _store(source)) or would_probe(settings.runtime_speculation)
        launch = _with_verdict(launch if verdict.speculates() else _plain(p, opts), verdict)
        return {"bundle": p.info, "checks": p.checks, "format": p.format, "memory": {k: p.memory.get(k) for k in ("total_bytes", "max_tokens")},
                **runtime_entry(p, launch)}


def _info(p: Prepared, opts: RuntimeOptions) -> dict[str, str]:
    return {"ref": p.info["ref"], "digest": p.info["digest"], "signer": str(p.info.get("signer") or ""),
            "tokenizer_fingerprint": p.fingerprint, "engine": opts.name, "dtype": dtype_name(p.dtype)}


class _Supervisor:
    """The thread that checks, starts, watches and stops the runtime (the child dies with this thread)."""

    def __init__(self, g: Governed, source: Source, trusted: Mapping[str, Any], opts: RuntimeOptions, spawn: Spawn, log: TextIO,
                 on_ready: Callable[[dict[str, Any]], None], on_record: RecordHook | None, on_end: Callable[[], None]) -> None:
        self.g, self.source, self.trusted, self.opts, self.spawn, self.log = g, source, trusted, opts, spawn, log
        self.on_ready, self.on_record, self.on_end = on_ready, on_record, on_end
        self.child: Child | None = None
        self.store = _store(source)
        self.record_entry: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self.run, name="specbundle-runtime", daemon=True)

    def run(self) -> None:
        g = self.g
        try:
            with prepared(self.source, self.trusted, _footprint(self.opts, g.settings), g.settings.load.memory_budget) as p:
                if g.stopping.is_set():
                    return
                try:
                    self._serve(p)
                finally:
                    if self.child is not None:
                        self.child.stop()  # before the verified directory is removed
        except BaseException as exc:  # noqa: BLE001 - raised again by the main thread (the CLI's exit code)
            if g.error is None:
                g.error = exc
            self.on_end()

    def _serve(self, p: Prepared) -> None:
        g, opts = self.g, dataclasses.replace(self.opts, upstream_key=self.g.upstream_key)
        launch = self._start_chosen(p, opts)
        if launch is None:
            return
        child = self.child
        assert child is not None
        upstream = f"http://127.0.0.1:{launch.port}"
        g.checks, g.min_acceptance = p.checks, float(p.params.get("min_acceptance") or 0.0)
        if self.on_record is not None and p.report is not None:
            g.on_request, self.record_entry = self.on_record(p, launch)
        info = _info(p, opts)
        g.become_ready(upstream, info, launch.shown(), launch.metrics_path)
        self.on_ready({**info, "runtime": opts.name, "pid": child.pid, "speculation": launch.plan})
        child.wait()
        if not g.stopping.is_set():
            error = child.died()
            g.dead = error.message  # /health and /livez fail from now
            g.error = error
            time.sleep(HEALTH_GRACE_S)
            self.on_end()

    def _start(self, p: Prepared, launch: Launch) -> bool:
        """The runtime started as launched (the one before it stopped first: one in memory at a time); True once it
        answers, False when serving stops first."""
        if self.child is not None:
            self.child.stop()
        self.child = child = self.spawn(self.opts.name, launch.argv, launch.env, p.root.parent / "work", self.log)
        child.start()
        self.g.pid = child.pid
        return child.wait_ready(f"http://127.0.0.1:{launch.port}{launch.ready_path}", START_TIMEOUT_S, self._auth(), self.g.stopping.is_set)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.g.upstream_key}"}

    def _chosen(self, launch: Launch, verdict: Verdict) -> Launch:
        """The launch that runs, with the guard's verdict in its translation and one line in the log."""
        with self.child.log_lock if self.child is not None else contextlib.nullcontext():
            self.log.write(verdict.line() + "\n")
            self.log.flush()
        return _with_verdict(launch, verdict)

    def _start_chosen(self, p: Prepared, opts: RuntimeOptions) -> Launch | None:
        """The runtime started with the signed speculation or plain, as the guard decides (bundler.serve.runtimes.guard):
        from the options, the signed settings or a remembered verdict, else measured now; None when serving stops."""
        signed = translate(p, opts, free_port())
        verdict = decided(self.g.settings.runtime_speculation, p, signed, self.store)
        if verdict is None:
            return self._measured(p, opts, signed)
        launch = signed if verdict.speculates() else _plain(p, opts)
        return self._chosen(launch, verdict) if self._start(p, launch) else None

    def _probe(self, p: Prepared, launch: Launch) -> Rate | str:
        """The running runtime's probe (bundler.serve.runtimes.guard.probe), or why it measured nothing."""
        try:
            return probe(f"http://127.0.0.1:{launch.port}", self._auth(), p.info["ref"], self.g.settings.runtime_probe_limit_s,
                         self.g.stopping.is_set)
        except Unmeasured as why:
            return str(why)

    def _measured(self, p: Prepared, opts: RuntimeOptions, signed: Launch) -> Launch | None:
        """The signed speculation probed, then plain decoding; the faster serves (started again where it ran first)
        and the verdict is remembered. A probe that decides nothing keeps the signed speculation."""
        g, mode = self.g, self.g.settings.runtime_speculation
        cache = VerdictCache(self.store, cache_key(p, signed))
        g.loading = f"the runtime {opts.name}'s speculation is measured against its plain decoding (--runtime-speculation auto)"
        if not self._start(p, signed):
            return None
        fast = self._probe(p, signed)
        if g.stopping.is_set():
            return None
        if isinstance(fast, str):
            return self._chosen(signed, unmeasured(mode, fast))
        plain = _plain(p, opts)
        if not self._start(p, plain):
            return None
        slow = self._probe(p, plain)
        if g.stopping.is_set():
            return None
        verdict = unmeasured(mode, f"the plain probe: {slow}", fast) if isinstance(slow, str) else measured(mode, fast, slow)
        cache.write(verdict)
        if not verdict.speculates():
            return self._chosen(plain, verdict)
        signed = translate(p, opts, free_port())
        return self._chosen(signed, verdict) if self._start(p, signed) else None


def serve_runtime(source: Source, trusted: Mapping[str, Any], settings: ServeSettings, opts: RuntimeOptions, *,
                  on_ready: OnReady | None = None, on_record: RecordHook | None = None, spawn: Spawn = Child,
                  log: TextIO | None = None) -> None:
    """Open the front door, then check the bundle and start the runtime behind it (a refusal or the runtime's
    death stops the server and is raised here as its BundleError); serve until SIGTERM/SIGINT, drain, stop the
    runtime. spawn: how the runtime's process is made (tests record it)."""
    import uvicorn

    from bundler.serve.request_guard import protocol_class

    g = Governed(settings, source.name(), opts.name, opts.sequences)
    # The front door keeps the runtime's priority. Its loop's thread at nice +10 (tried to let it relay in the
    # runtime's gaps) starved it under load: governed vLLM at 8 clients on 2 cores, a new request waited 2.4-3.9 s
    # to reach the front door's handler (docs/benchmarks.md, "The front door's priority, undone").
    # uvloop: the front door's CPU per relayed token is taken from a runtime bound to every core; on the EPYC (Zen 4,
    # 2 cores) the front door spent 409 us of CPU a streamed event on uvloop against 514 on asyncio's loop (16 turns
    # interleaved, llama-cpp-python runtime, /proc/PID/task/*/schedstat). uvicorn's "auto" is uvloop where installed,
    # asyncio's loop where it is not (Windows).
    config = uvicorn.Config(build_proxy(g), host=settings.host, port=settings.port, log_level="warning", access_log=False,
                            http=protocol_class(settings.limits), lifespan="off", loop="auto",
                            timeout_graceful_shutdown=int(min(settings.time_limit_s, DRAIN_LIMIT_S)))
    class Server(server_class()):
        async def shutdown(self, sockets: Any = None) -> None:
            await super().shutdown(sockets)
            if g.client is not None:  # the pool to the runtime, closed in the loop that made it
                await g.client.close()

    server = Server(config)
    url = f"http://{settings.host}:{settings.port}"

    def ready(info: dict[str, Any]) -> None:
        if on_ready:
            on_ready({**info, "url": url})

    def end() -> None:
        server.should_exit = True

    supervisor = _Supervisor(g, source, trusted, opts, spawn, log or sys.stderr, ready, on_record, end)
    supervisor.thread.start()
    try:
        server.run()
    finally:
        g.stopping.set()
        if supervisor.child is not None:
            supervisor.child.stop()
        supervisor.thread.join(JOIN_S)
        if supervisor.record_entry is not None and g.mirror is not None:
            supervisor.record_entry["counters"] = g.mirror.as_mapping(g.mirror.totals())
    if g.error is not None:
        raise g.error
