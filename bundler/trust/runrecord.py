"""Run records: a signed statement, written after a run, of which bundle ran, how it was checked and how it did.

A record is an in-toto Statement v1 (predicateType https://specbundle.dev/run/v1, subject = the bundle's
manifest digest) in a bare DSSE envelope signed with an ECDSA P-256 key (bundler.trust.dsse, the code bundle
signatures use too). In the store it is an OCI artifact like a signature: an untagged manifest with
artifactType application/vnd.in-toto+json, `subject` = the bundle manifest, one layer holding the envelope.

It proves what this process loaded and measured, signed by whoever holds the key; it does not prove that
the host was honest (a host that holds the key can sign anything).

Prompt and output text are never recorded; with `attest_prompts` only their sha256, and each request's token ids'
sha256 with its decoding settings (bundler.trust.requestlog), which `bundle replay` decodes again and compares.
"""

from __future__ import annotations

__all__ = [
    "Context", "PREDICATE_ANNOTATION", "PREDICATE_TYPE", "RecordCheck", "Recorder", "ServeRecords", "Written",
    "Totals", "attestations", "build_statement", "check_record", "now", "sign_statement", "store_record",
]

import contextlib
import datetime as dt
import hashlib
import json
import platform
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Mapping

from bundler.format import boundedjson

from bundler.trust import dsse, keys, requestlog
from core.errors import BundleError
from bundler.format.manifest import Descriptor, parse_descriptor
from bundler.format.mediatypes import DSSE_ENVELOPE, OCI_MANIFEST, RUN_RECORD
from bundler.format.schemacheck import schema_problem
from bundler.store.layout import Store
from bundler.store.referrers import find_records, stage_artifact

PREDICATE_TYPE = "https://specbundle.dev/run/v1"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"
SCHEMA_NAME = "run-record.schema.json"  # in the `schemas` package


# ---------------------------------------------------------------- what a record says


def format_time(moment: dt.datetime) -> str:
    """RFC 3339 UTC with milliseconds: a short `bundle run` starts and ends within one second."""
    if moment.tzinfo is None:
        raise ValueError("timestamp must be timezone-aware")
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def runtime_versions(engine: str) -> dict[str, str]:
    """Versions of what ran: specbundle, Python, and the engine's libraries (the loaded module's own version
    where it is imported, else the installed distribution's)."""
    from bundler import __version__

    out = {"specbundle": __version__, "python": platform.python_version()}
    names = {"torch": ("torch", "transformers"), "llama.cpp": ("llama_cpp",)}.get(engine, ())
    for name in names:
        version = getattr(sys.modules.get(name), "__version__", None)
        if version is None:
            try:
                version = metadata.version({"llama_cpp": "llama-cpp-python"}.get(name, name))
            except metadata.PackageNotFoundError:
                continue
        out[name] = str(version)
    return out


@dataclass
class Totals:
    """Counts over the requests a record covers; acceptance rate = accepted / drafted, as `run --json` has it."""

    requests: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    fallbacks: int = 0

    def add(self, stats: Mapping[str, Any]) -> None:
        """Count one request from its `stats` (the `run --json` stats object)."""
        self.requests += 1
        self.tokens += int(stats["new_tokens"])
        self.drafted += int(stats["drafted"])
        self.accepted += int(stats["accepted"])
        self.fallbacks += 1 if stats.get("fallback") else 0

    def as_dict(self) -> dict[str, Any]:
        rate = self.accepted / self.drafted if self.drafted else None
        return {"requests": self.requests, "tokens": self.tokens, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": rate, "fallbacks": self.fallbacks}


@dataclass(frozen=True)
class Context:
    """What stays the same for every record one process writes: the bundle as verified and the runtime."""

    kind: str  # "run" or "serve"
    ref: str
    digest: str  # the bundle's manifest digest
    name: str
    version: str
    signer: str  # key id of the trusted key whose bundle signature verified
    checks: tuple[str, ...]  # names of the verify checks that passed
    tokenizer_fingerprint: str
    parameters: Mapping[str, Any]  # the Kitfile's model.parameters
    settings: Mapping[str, Any]  # what the command line set on top of them
    engine: str
    device: str
    dtype: str
    runtime: Mapping[str, Any] | None = None  # serve --runtime: the third-party runtime (bundler.serve.runtimes.server)

    @classmethod
    def from_report(cls, kind: str, report: Any, loaded: Mapping[str, Any], settings: Mapping[str, Any]) -> Context:
        """From a passing VerifyReport and the runner's answer (`tokenizer`, `device`, `dtype`, `engine`)."""
        mk = report.modelkit
        if mk is None or not report.signer or report.error is not None:
            raise BundleError("internal", "a run record needs a bundle that verified with a trusted signature")
        return cls(
            kind=kind, ref=report.ref, digest=mk.digest, name=mk.kitfile.name, version=mk.kitfile.version,
            signer=report.signer, checks=tuple(c.name for c in report.checks if c.ok),
            tokenizer_fingerprint=str(loaded["tokenizer"]["fingerprint"]), parameters=mk.kitfile.parameters,
            settings={k: v for k, v in settings.items() if v is not None},
            engine=str(loaded.get("engine") or "torch"), device=str(loaded["device"]), dtype=str(loaded["dtype"]),
            runtime=loaded.get("runtime"),
        )


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def build_statement(ctx: Context, totals: Totals, started: dt.datetime, finished: dt.datetime,
                    prompts: list[dict[str, str]] | None = None, requests: requestlog.RequestLog | None = None) -> dict[str, Any]:
    """The in-toto Statement a record signs; checked against schemas/run-record.schema.json."""
    predicate: dict[str, Any] = {
        "kind": ctx.kind,
        "mode": requestlog.mode_of(ctx.settings),
        "bundle": {"ref": ctx.ref, "digest": ctx.digest, "name": ctx.name, "version": ctx.version},
        "verification": {"signer": {"key_id": ctx.signer}, "checks": list(ctx.checks)},
        "tokenizer": {"fingerprint": ctx.tokenizer_fingerprint},
        "parameters": dict(ctx.parameters),
        "settings": dict(ctx.settings),
        "engine": ctx.engine,
        "device": ctx.device,
        "dtype": ctx.dtype,
        "versions": runtime_versions(ctx.engine),
        "started": format_time(started),
        "finished": format_time(finished),
        "totals": totals.as_dict(),
    }
    if prompts is not None:
        predicate["prompts"] = list(prompts)
    if requests is not None:
        predicate.update(requests.predicate())
    if ctx.runtime is not None:
        predicate["runtime"] = json.loads(json.dumps(ctx.runtime))  # as it is when the record is written
    statement = dsse.statement(ctx.ref, ctx.digest.split(":", 1)[1], PREDICATE_TYPE, predicate)
    problem = schema_problem(SCHEMA_NAME, statement)
    if problem:
        raise BundleError("internal", f"run record does not match {SCHEMA_NAME}: {problem}")
    return statement


# ---------------------------------------------------------------- the store


@dataclass(frozen=True)
class Written:
    record: str  # the record artifact's manifest digest
    subject: str  # the bundle's manifest digest
    key_id: str
    statement: dict[str, Any]


def sign_statement(statement: Mapping[str, Any], private_key: keys.PrivateKey) -> bytes:
    """The DSSE envelope (canonical JSON bytes) over the statement; keyid names the signing key."""
    envelope = dsse.sign_envelope(dsse.canonical_json(statement), private_key, keyid=keys.key_id(private_key))
    return dsse.canonical_json(envelope)


def store_record(store: Store, subject: Descriptor, envelope: bytes, predicate_type: str = PREDICATE_TYPE) -> Descriptor:
    """Add a signed envelope to the store as an untagged artifact whose subject is the bundle manifest."""
    with store.transaction() as staging:
        desc = stage_artifact(staging, RUN_RECORD, DSSE_ENVELOPE, envelope, subject, {PREDICATE_ANNOTATION: predicate_type})
        staging.commit()
        store.add_untagged(desc, RUN_RECORD)
    return desc


def write_record(store: Store, ctx: Context, totals: Totals, started: dt.datetime, finished: dt.datetime,
                 private_key: keys.PrivateKey, prompts: list[dict[str, str]] | None = None,
                 requests: requestlog.RequestLog | None = None) -> Written:
    """Build, sign and store one record over `totals` between `started` and `finished`."""
    statement = build_statement(ctx, totals, started, finished, prompts, requests)
    envelope = sign_statement(statement, private_key)
    desc = store_record(store, _subject_descriptor(store, ctx.digest), envelope)
    return Written(desc.digest, ctx.digest, keys.key_id(private_key), statement)


def _subject_descriptor(store: Store, digest: str) -> Descriptor:
    path = store.blob_path(digest)
    if not path.is_file():
        raise BundleError("not-found", f"bundle manifest {digest} is not in the store {store.root}")
    return Descriptor(OCI_MANIFEST, digest, path.stat().st_size)


class Recorder:
    """Counts requests as they finish and writes a record per window (serve: hourly and at shutdown; run: once).

    Thread-safe: serve's request handlers call `add` while a timer calls `flush`.
    """

    def __init__(self, store: Store, ctx: Context, private_key: keys.PrivateKey, attest_prompts: bool = False,
                 started: dt.datetime | None = None, log_requests: bool | None = None) -> None:
        self.store, self.ctx, self.private_key, self.attest_prompts = store, ctx, private_key, attest_prompts
        self.log_requests = attest_prompts if log_requests is None else log_requests  # token digests (requestlog)
        self._lock = threading.Lock()
        self._started = started or now()
        self._totals = Totals()
        self._prompts: list[dict[str, str]] = []
        self._requests = requestlog.RequestLog()
        self.written: list[Written] = []

    def add(self, stats: Mapping[str, Any], prompt: str | None = None, output: str | None = None,
            request: Mapping[str, Any] | None = None) -> None:
        """Count one finished request; with attest_prompts, keep the sha256 of its prompt and output; with
        log_requests, its `request` entry (requestlog.entry: token ids' sha256 and decoding settings)."""
        with self._lock:
            self._totals.add(stats)
            if self.attest_prompts:
                self._prompts.append({"prompt_sha256": text_sha256(prompt or ""), "output_sha256": text_sha256(output or "")})
            if self.log_requests and request is not None:
                self._requests.add(request)

    def flush(self, finished: dt.datetime | None = None, if_empty: bool = True) -> Written | None:
        """Sign and store a record over the window since the last flush, then start a new window.

        With if_empty False, a window with no requests writes nothing (serve's hourly records)."""
        with self._lock:
            if not if_empty and self._totals.requests == 0:
                return None
            end = finished or now()
            written = write_record(self.store, self.ctx, self._totals, self._started, end, self.private_key,
                                   self._prompts if self.attest_prompts else None, self._requests if self.log_requests else None)
            self._started, self._totals, self._prompts, self._requests = end, Totals(), [], requestlog.RequestLog()
            self.written.append(written)
            return written


class ServeRecords:
    """Run records for `bundle serve --attest-key`: one per hour with requests in it, and one at shutdown.

    Use: `records = ServeRecords(store, key, settings)`; pass `records.attach` as serve_bundle's `on_record`
    (called once with the verify report and the loaded pair, it returns the per-request hook and starts the
    hourly timer); call `records.close()` when serving has ended, which writes the last record.
    """

    def __init__(self, store: Store, private_key: keys.PrivateKey, settings: Mapping[str, Any] | None = None,
                 interval_s: float = 3600.0, attest_prompts: bool = False) -> None:
        self.store, self.private_key, self.settings, self.interval_s = store, private_key, dict(settings or {}), interval_s
        self.attest_prompts = attest_prompts  # each request's token ids' sha256 and settings (requestlog), never text
        self.recorder: Recorder | None = None
        self.errors: list[BaseException] = []  # failures of the hourly writer: the server keeps serving
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    def attach(self, report: Any, pair: Any) -> Any:
        """serve_bundle's `on_record`: the hook it calls after each request, `(stats, prompt_ids, text, request)`
        (request: its output ids and settings, bundler.serve.worker)."""
        loaded = {"tokenizer": {"fingerprint": pair.fingerprint}, "device": pair.device, "dtype": pair.dtype,
                  "engine": getattr(pair, "engine", "torch"), "runtime": getattr(pair, "runtime", None)}
        self.recorder = Recorder(self.store, Context.from_report("serve", report, loaded, self.settings), self.private_key,
                                 log_requests=self.attest_prompts)
        self._timer = threading.Thread(target=self._hourly, name="specbundle-run-records", daemon=True)
        self._timer.start()
        recorder = self.recorder

        def on_request(stats: Mapping[str, Any], prompt_ids: Any = None, _text: str | None = None,
                       request: Mapping[str, Any] | None = None) -> None:
            logged = None  # serve records no prompt or output text; with attest_prompts, token ids' sha256
            if recorder.log_requests and prompt_ids is not None and request is not None:
                logged = requestlog.entry(prompt_ids, request["tokens"], **{k: v for k, v in request.items() if k != "tokens"})
            recorder.add(stats, request=logged)

        return on_request

    def _hourly(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                assert self.recorder is not None
                self.recorder.flush(if_empty=False)
            except Exception as exc:  # noqa: BLE001 - a failed hourly record must not stop the server; close() tries again
                self.errors.append(exc)

    def close(self) -> Written | None:
        """Stop the timer and write the record of the last window (also when it holds no request)."""
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
        return self.recorder.flush() if self.recorder is not None else None


# ---------------------------------------------------------------- finding and verifying


@dataclass
class RecordCheck:
    """One record found for a bundle, and whether it verified; `statement` is shown even when it did not."""

    digest: str  # the record artifact's manifest digest
    verified: bool = False
    signer: str | None = None  # key id of the trusted key that signed it (only when the signature verified)
    claimed_signer: str | None = None  # the envelope's keyid: unchecked
    statement: dict[str, Any] | None = None
    error: BundleError | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "signer": {"key_id": self.signer} if self.signer else None,
            "verified": self.verified,
            "claimed_signer": {"key_id": self.claimed_signer} if self.claimed_signer else None,
            "reason": {"code": self.error.code, "message": self.error.message} if self.error else None,
            "statement": self.statement,
        }


def check_record(store: Store, desc: Descriptor, subject_digest: str, trusted: Mapping[str, keys.PublicKey]) -> RecordCheck:
    """Verify one record: readable and intact, signed by a trusted key, a run/v1 statement matching the schema,
    about this bundle. The first failure is the reason; never raises for a bad record."""
    result = RecordCheck(desc.digest)
    try:
        envelope_bytes = _read_envelope(store, desc)
        try:
            envelope_json = json.loads(envelope_bytes)
        except (UnicodeDecodeError, ValueError, RecursionError) as err:
            raise dsse.invalid(f"record envelope is not JSON: {err}") from None
        envelope = dsse.parse_envelope(envelope_json, "envelope")
        result.claimed_signer = envelope.keyid or None
        with contextlib.suppress(BundleError):  # not JSON, or nested too deep to show
            result.statement = boundedjson.loads(envelope.payload, "record statement")  # for display, verified or not
        result.signer = dsse.verify_signer(envelope, trusted, envelope.keyid or None)
        statement = dsse.parse_statement(envelope.payload_type, envelope.payload, PREDICATE_TYPE)
        problem = schema_problem(SCHEMA_NAME, statement)
        if problem:
            raise BundleError("invalid-bundle", f"record does not match {SCHEMA_NAME}: {problem}")
        signed = "sha256:" + statement["subject"][0]["digest"]["sha256"]
        claimed = statement["predicate"]["bundle"]["digest"]
        if signed != subject_digest or claimed != subject_digest:
            other = signed if signed != subject_digest else claimed
            raise BundleError("signature-mismatch", f"record is about another bundle: it signs {other}, this bundle is {subject_digest}")
        result.verified = True
    except BundleError as err:
        result.error = err
    return result


def attestations(store: Store, ref: Any, trusted: Mapping[str, keys.PublicKey]) -> tuple[str, list[RecordCheck]]:
    """(the bundle's manifest digest, every record attached to it, each verified), oldest first."""
    digest = store.resolve(ref).digest
    checks = [check_record(store, desc, digest, trusted) for desc in find_records(store, digest)]
    return digest, sorted(checks, key=_started_key)


def _started_key(check: RecordCheck) -> tuple[str, str]:
    predicate = (check.statement or {}).get("predicate") if isinstance(check.statement, dict) else None
    started = predicate.get("started") if isinstance(predicate, dict) else None
    return (started if isinstance(started, str) else "", check.digest)


def _read_envelope(store: Store, desc: Descriptor) -> bytes:
    """The record's one layer, digest-checked (a changed byte anywhere in the store fails here)."""
    try:
        _, manifest = store.read_json_blob(desc)
    except BundleError as err:
        raise BundleError(err.code, f"record manifest is damaged: {err.message}") from None
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list) or len(layers) != 1:
        raise BundleError("invalid-bundle", "record manifest must have exactly one layer")
    layer = parse_descriptor(layers[0], f"record {desc.digest} layer")
    if layer.media_type != DSSE_ENVELOPE:
        raise BundleError("invalid-bundle", f"record layer is {layer.media_type!r}, expected {DSSE_ENVELOPE}")
    try:
        data, _ = store.read_json_blob(layer)
    except BundleError as err:
        raise BundleError(err.code, f"record envelope is damaged: {err.message}") from None
    return data
