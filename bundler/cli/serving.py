"""`bundle serve`: verify and load as `run` does, then an OpenAI-compatible API."""

from __future__ import annotations

__all__ = ["client_keys", "serve", "serve_limits", "setting"]

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import click

from bundler.cli.app import command, identity_options, main, password, trusted
from bundler.cli.options import expected_reference, max_body_option, memory_budget_option, prompt_cache_option
from bundler.store.layout import Store
from bundler.store.refs import parse_ref
from bundler.trust import keys
from core.errors import BundleError
from bundler.serve.request_guard import ServeLimits
from bundler.serve.settings import ServeSettings


def runtime_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """serve --runtime, --runtime-bin, --runtime-speculation, --runtime-probe-limit, --dry-run (bundler.serve.runtimes)."""
    f = click.option("--dry-run", is_flag=True, help="With --runtime: run every check, print the runtime's command line "
                     "(secrets masked) and what it runs as JSON, and exit 0 without starting it.")(f)
    f = setting("--runtime-speculation", ServeSettings, "runtime_speculation", type=click.Choice(["auto", "on", "off"]))(f)
    f = setting("--runtime-probe-limit", ServeSettings, "runtime_probe_limit_s", type=click.FloatRange(0.001, 3600))(f)
    f = click.option("--runtime-bin", help="With --runtime llama-server: its binary (also $BUNDLE_LLAMA_SERVER); with "
                     "--runtime vllm: the Python of vLLM's venv (also $BUNDLE_VLLM_PYTHON).")(f)
    return click.option("--runtime", default="builtin", show_default=True,
                        type=click.Choice(["builtin", "llama-cpp-python", "llama-server", "vllm"]),
                        help="What decodes: our engines (builtin), or a third-party runtime started behind the same "
                             "front door, after the same checks, under the bundle's signed settings (docs/serving.md).")(f)


def setting(decl: str, owner: type, name: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An option whose default and help are the settings field's (bundler.serve.settings): each written once."""
    spec = {f.name: f for f in dataclasses.fields(owner)}[name]
    return click.option(decl, default=spec.default, show_default=True, help=spec.metadata["help"], **kwargs)


def serve_limits(host: str, allowed_hosts: tuple[str, ...], max_body: int, header_timeout: float, max_connections: int | None) -> ServeLimits:
    """The request guard's bounds from serve's options; --max-connections above the file limit's room is refused."""
    from bundler.serve.request_guard import connection_room

    limits = ServeLimits(host=host, allowed_hosts=allowed_hosts, max_body=max_body, header_timeout_s=header_timeout)
    if max_connections is not None:
        if max_connections > connection_room():
            raise BundleError("usage", f"--max-connections {max_connections} is above what the file limit leaves room for "
                                       f"({connection_room()}); raise `ulimit -n` or ask for fewer")
        limits.max_connections = max_connections
    return limits


def client_keys(api_key_file: str | None, metrics_key_file: str | None) -> tuple[str | None, str | None]:
    """The API key and the separate metrics key, each read bounded from its file; the same key twice is refused."""
    from bundler.serve.api_key import read_key_file

    api_key = read_key_file(api_key_file, "--api-key-file") if api_key_file else None
    metrics_key = read_key_file(metrics_key_file, "--metrics-key-file") if metrics_key_file else None
    if metrics_key is not None and metrics_key == api_key:
        raise BundleError("usage", "--metrics-key-file holds the API key: the metrics key must be a separate credential")
    return api_key, metrics_key


@main.command()
@click.argument("ref", required=False)
@click.option("--from-dir", type=click.Path(file_okay=False), help="Serve a directory `bundle fetch` filled (checked against its evidence first) instead of REF.")
@click.option("--evidence", envvar="BUNDLE_EVIDENCE", type=click.Path(file_okay=False), help="With --from-dir: the directory `fetch --evidence-only` filled, when DIR is a read-only image volume without its own .specbundle/ (also $BUNDLE_EVIDENCE).")
@click.option("--expect", envvar="BUNDLE_EXPECT", help="With --from-dir: the bundle the directory must hold, NAME:TAG, NAME@sha256:<hex>, sha256:<hex> or the STORAGE_URI (also $BUNDLE_EXPECT); its signed name, version or digest must agree.")
@setting("--host", ServeSettings, "host")
@setting("--port", ServeSettings, "port", type=click.IntRange(1, 65535))
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable); also $BUNDLE_TRUSTED_KEYS.")
@click.option("--api-key-file", type=click.Path(dir_okay=False), help="File holding the API key clients must send as `Authorization: Bearer <key>`.")
@click.option("--metrics-key-file", type=click.Path(dir_okay=False), help="File holding a separate key for /metrics scrapes: only a scrape with `Authorization: Bearer <metrics key>` gets the prompt cache's figures (which could tell one client whether another's prompt shared its start).")
@click.option("--open-probes", is_flag=True, help="GET /health, /livez and /metrics answer without the API key (Kubernetes probes and Prometheus scrapes send none; /metrics then leaves out the prompt cache's figures).")
@click.option("--served-model-name", envvar="BUNDLE_SERVED_MODEL_NAME", help="Another name the model answers to besides the bundle reference (KServe: the InferenceService's name; also $BUNDLE_SERVED_MODEL_NAME).")
@setting("--max-queue", ServeSettings, "max_queue", type=click.IntRange(1, 4096))
@setting("--time-limit", ServeSettings, "time_limit_s", type=click.FloatRange(0.1))
@click.option("--sequences", type=click.IntRange(1, 64), help="Requests decoded at once in one batch (llama.cpp, and torch models our compact forward runs; default: as many KV caches as fit, at most 8).")
@click.option("--no-draft", "speculate", flag_value=False, default=True, help="Decode with the target alone (where requests decode in a batch): a baseline for benchmarks.")
@click.option("--prompt-cache", callback=prompt_cache_option, help="Host memory for copies of finished requests' cache cells, which a request with the same start gets back (where requests decode in a batch): 2GiB, 0 for none (default: half the memory left, at most 8GiB).")
@click.option("--draft-tokens", type=click.IntRange(1, 64), help="Tokens drafted per step (default: the bundle's).")
@click.option("--device", help="cpu or cuda (default: cuda when available).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), help="Default: the bundle's; a bf16 bundle runs in float32 on a CPU whose bf16 products measure slower.")
@click.option("--memory-budget", callback=memory_budget_option, help="Memory the pair may use: 300MB, 2GiB or bytes (default: available memory).")
@click.option("--attest-key", type=click.Path(), help="Private key: sign run records of the served requests (see `bundle attestations`).")
@click.option("--attest-prompts", is_flag=True, help="With --attest-key: each request's token ids' sha256 and settings in the record, what `bundle replay` checks (never their text).")
@setting("--max-body", ServeLimits, "max_body", type=str, callback=max_body_option)
@click.option("--allowed-host", "allowed_hosts", multiple=True, help="Another Host name to answer for besides loopback and --host (repeatable; `*`: any, behind a proxy).")
@click.option("--max-connections", type=click.IntRange(1, 65536), help="Open connections at most (default: half the file limit, at most 1024).")
@click.option("--reproducible", is_flag=True, help="Greedy tokens that do not depend on what else shares a pass (batch-invariant forward; compact torch models only; docs/serving.md).")
@setting("--header-timeout", ServeLimits, "header_timeout_s", type=click.FloatRange(0.1, 3600))
@runtime_options
@identity_options
@command
def serve(store: Store, ref: str | None, from_dir: str | None, evidence: str | None, expect: str | None, host: str, port: int, key_paths: tuple[str, ...], ca_paths: tuple[str, ...], identities: tuple[str, ...], issuers: tuple[str, ...], api_key_file: str | None, metrics_key_file: str | None, max_queue: int,
          time_limit: float, attest_key: str | None, attest_prompts: bool, open_probes: bool, served_model_name: str | None, max_body: int, allowed_hosts: tuple[str, ...],
          max_connections: int | None, header_timeout: float, sequences: int | None, speculate: bool, prompt_cache: int | None, **options: Any) -> None:
    """Verify and load the bundle as `run` does, then serve it over an OpenAI-compatible HTTP API until SIGTERM."""
    from bundler.serve.server import serve_bundle
    from bundler.serve.settings import BatchSettings, LoadOptions
    from bundler.serve.sources import DirSource, StoreSource

    limits = serve_limits(host, allowed_hosts, max_body, header_timeout, max_connections)
    _check_sources(ref, from_dir, evidence, attest_key, attest_prompts)
    expected = expected_reference(from_dir, expect)
    api_key, metrics_key = client_keys(api_key_file, metrics_key_file)
    runtime, runtime_bin, dry_run = options.pop("runtime"), options.pop("runtime_bin"), options.pop("dry_run")
    guarded = {"runtime_speculation": options.pop("runtime_speculation"), "runtime_probe_limit_s": options.pop("runtime_probe_limit")}
    recorded = {"max_queue": max_queue, "time_limit_s": time_limit, "sequences": sequences, "speculate": speculate,
                "prompt_cache": prompt_cache, "runtime": runtime, "runtime_speculation": guarded["runtime_speculation"], **options}
    records = _records(store, attest_key, attest_prompts, recorded)
    ready = _announce(from_dir is not None and expected is None)
    try:
        source = DirSource(Path(from_dir), expected, store, Path(evidence) if evidence else None) if from_dir else StoreSource(store, parse_ref(ref))
        settings = ServeSettings(host=host, port=port, api_key=api_key, metrics_key=metrics_key, open_probes=open_probes, served_model_name=served_model_name,
                                 max_queue=max_queue, time_limit_s=time_limit, limits=limits, load=LoadOptions(**options), **guarded,
                                 batch=BatchSettings(sequences=sequences, speculate=speculate, prompt_cache=prompt_cache))
        if runtime != "builtin" or dry_run:
            return _serve_with_runtime(source, trusted(key_paths, ca_paths, identities, issuers), settings, runtime, runtime_bin, dry_run, records, ready)
        serve_bundle(source, trusted(key_paths, ca_paths, identities, issuers), settings, on_ready=ready, on_record=records.attach if records else None)
    finally:
        _close(records)


def _check_sources(ref: str | None, from_dir: str | None, evidence: str | None, attest_key: str | None, attest_prompts: bool) -> None:
    """The options that go together: one source, records of store bundles only, evidence with a directory."""
    if (ref is None) == (from_dir is None):
        raise BundleError("usage", "give either REF or --from-dir DIR")
    if from_dir and attest_key:
        raise BundleError("usage", "--attest-key needs a bundle in the store (REF), not --from-dir")
    if attest_prompts and not attest_key:
        raise BundleError("usage", "--attest-prompts needs --attest-key KEY")
    if evidence and not from_dir:
        raise BundleError("usage", "--evidence goes with --from-dir")


def _records(store: Store, attest_key: str | None, attest_prompts: bool, recorded: dict[str, Any]) -> Any:
    """Run records of what is served (--attest-key): one per busy hour and one at shutdown (ServeRecords)."""
    if not attest_key:
        return None
    from bundler.trust.runrecord import ServeRecords

    return ServeRecords(store, keys.load_private_key(Path(attest_key), password()), recorded, attest_prompts=attest_prompts)


def _close(records: Any) -> None:
    written = records.close() if records else None
    if written:
        click.echo(f"run record {written.record} signed by {written.key_id[:16]}…", err=True)


def _announce(unpinned: bool) -> Callable[[dict[str, Any]], None]:
    """What serve says once it serves: the bundle and where; a warning for a directory served without --expect."""

    def ready(info: dict[str, Any]) -> None:
        click.echo(f"serving {info['ref']} ({info['digest']}, {info['engine']}, {info['dtype']}) on {info['url']}", err=True)
        if unpinned:  # once serving: a refusal stays the one line CONTRACT.md promises
            click.echo("warning: --from-dir without --expect (or $BUNDLE_EXPECT) serves any bundle the trusted keys signed, "
                       "under its signed name: pin the reference or digest", err=True)

    return ready


def _serve_with_runtime(source: Any, trusted_keys: Any, settings: ServeSettings, runtime: str, runtime_bin: str | None, dry_run: bool,
                        records: Any, ready: Callable[[dict[str, Any]], None]) -> None:
    """serve --runtime NAME (bundler.serve.runtimes): the same checks, then a third-party runtime behind our front door;
    with --dry-run, the checks and the translation printed as JSON, nothing started."""
    import json

    from bundler.serve.app import SERVE_MAX_NEW_TOKENS, SERVE_PROMPT_TOKENS
    from bundler.serve.runtimes.flags import RuntimeOptions
    from bundler.serve.runtimes.server import dry_run as checked_launch, runtime_entry, serve_runtime

    if runtime == "builtin":
        raise BundleError("usage", "--dry-run shows a third-party runtime's command line: give --runtime")
    load, batch = settings.load, settings.batch
    opts = RuntimeOptions(name=runtime, binary=runtime_bin, speculate=batch.speculate, draft_tokens=load.draft_tokens, dtype=load.dtype,
                          sequences=batch.sequences or 1, context=SERVE_PROMPT_TOKENS + SERVE_MAX_NEW_TOKENS)
    if dry_run:
        click.echo(json.dumps(checked_launch(source, trusted_keys, settings, opts), indent=2))
        return

    def record(prepared: Any, launch: Any) -> Any:
        entry = runtime_entry(prepared, launch)
        pair = SimpleNamespace(fingerprint=prepared.fingerprint, device="cpu", dtype=prepared.dtype, runtime=entry,
                               engine="llama.cpp" if runtime == "llama-cpp-python" else runtime)
        return records.attach(prepared.report, pair), entry

    def started(info: dict[str, Any]) -> None:
        ready({**info, "engine": f"{runtime} pid {info['pid']}, {info['speculation']['method']}"})

    serve_runtime(source, trusted_keys, settings, opts, on_ready=started, on_record=record if records else None)
