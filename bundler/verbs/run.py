"""`bundle run`, `serve` and `bench`: verify (never skipped), extract the small files into a private read-only
directory, then hand over to the runner, which reads each weight file straight from its verified layer blob."""

from __future__ import annotations

__all__ = [
    "HISTORY_MAX_BYTES", "HISTORY_STATE", "bench_bundle", "loaded_bundle", "run_bundle", "run_history",
    "runner_args", "verified_view",
]

import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from bundler.format.kitfile import runner_params
from bundler.trust import requestlog, runrecord
from core.errors import BundleError
from bundler.store.refs import Ref
from bundler.store.layout import Store
from bundler.trust.extract import extract_leaving_in_blobs, make_writable
from bundler.trust.verify import verify_bundle
from bundler.trust.verify_report import VerifyReport

WEIGHT_SUFFIX = ".safetensors"  # left in the blobs; GGUF files are extracted (llama.cpp opens a path)
HISTORY_STATE = "run-history"  # the store's private state: runner.decoding.run_history's counts per bundle and machine
HISTORY_KEPT = 64  # keys kept, the newest
HISTORY_MAX_BYTES = 64 << 10  # HISTORY_KEPT keys of ~200 bytes fit many times over; a larger file is ignored


@dataclass(frozen=True)
class Checkout:
    """A verified bundle ready for the runner: the small files extracted below `root` (read-only), the
    safetensors files as byte ranges of their layer blobs (`weights`: bundle path -> runner FileRange)."""

    root: Path
    report: VerifyReport
    weights: dict[str, Any]
    timings: dict[str, float]  # verify_s, extract_s


@contextlib.contextmanager
def _private_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="specbundle-run-") as tmp:
        root = Path(tmp) / "bundle"
        try:
            yield root
        finally:
            if root.exists():
                make_writable(root)  # so the temp dir can be removed


@contextlib.contextmanager
def verified_view(store: Store, ref: Ref, trusted: Mapping[str, Any]) -> Iterator[Checkout]:
    """Verify the bundle (a trusted signature required), then extract all but its *.safetensors files into a
    private read-only temp directory (each file hashed while written); the weight files stay in their
    blobs, and the runner hashes each one from the buffer it loads it into. Removed afterwards."""
    from runner.checks.modelinfo import FileRange  # torch-free

    start = time.perf_counter()
    report = verify_bundle(store, ref, trusted)
    report.raise_for_error()
    verified = time.perf_counter()
    with _private_dir() as root:
        spans = extract_leaving_in_blobs(store, report, root, lambda path: path.endswith(WEIGHT_SUFFIX), read_only=True)
        weights = {path: FileRange(span.blob, span.offset, span.size) for path, span in spans.items()}
        timings = {"verify_s": verified - start, "extract_s": time.perf_counter() - verified}
        yield Checkout(root, report, weights, timings)


def run_history(store: Store, digest: str) -> Any:
    """runner.decoding.run_history.RunHistory of this bundle on this machine, saved to the store's private state after
    each run. Only an economy: damaged or unwritable state is ignored (nothing is refused for it)."""
    from runner.decoding.run_history import RunHistory, machine_key

    key = machine_key(digest)

    def read() -> dict[str, Any]:
        try:
            return store.state(HISTORY_STATE, max_bytes=HISTORY_MAX_BYTES)
        except BundleError:  # damaged, oversized or not a file: ignored, and replaced by the next save
            return {}

    def save(counts: dict[str, int]) -> None:
        with contextlib.suppress(OSError, BundleError), store.lock():
            state = read()
            state.pop(key, None)
            state[key] = counts  # the newest last
            for old in list(state)[: max(0, len(state) - HISTORY_KEPT)]:
                del state[old]
            store.write_state(HISTORY_STATE, state)

    return RunHistory.from_counts(read().get(key), save)


def runner_args(report: VerifyReport, weights: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the runner takes from a verified bundle: {"roles": role -> directory, "params": runner_params,
    "verified_files": the signed file list}, and "weight_ranges" when `weights` (a checkout's) are given."""
    mk = report.modelkit
    assert mk is not None and report.claims is not None
    # The runner hashes each file from the very buffer it loads it from, against the signed list
    # (runner.models.loading): nothing can be swapped between verification and loading.
    args = {"roles": mk.kitfile.role_paths(), "params": runner_params(mk.kitfile.parameters), "verified_files": report.claims.files}
    if weights:
        args["weight_ranges"] = dict(weights)
    return args


def _bundle_info(ref: Ref, report: VerifyReport) -> dict[str, Any]:
    return {"ref": str(ref), "digest": report.digest, "signer": report.signer}


def run_bundle(
    store: Store, ref: Ref, trusted: Mapping[str, Any], prompt: str, on_text: Callable[[str], None] | None = None,
    attest: Any = None, attest_prompts: bool = False, **options: Any
) -> dict[str, Any]:
    """Verify the bundle, then decode; raises the first BundleError (before any weights are loaded).

    With `attest` (a private key), a signed run record is added to the store once the run has finished
    (bundler.trust.runrecord); `attest_prompts` puts the sha256 of the prompt and output in it, and of their token
    ids with the decoding settings (bundler.trust.requestlog: what `bundle replay` needs)."""
    from runner.run import run_unpacked  # torch is imported only when a bundle runs

    started = runrecord.now()
    with verified_view(store, ref, trusted) as checkout:
        report, checkout_timings = checkout.report, checkout.timings
        result = run_unpacked(checkout.root, prompt=prompt, on_text=on_text, history=run_history(store, report.digest),
                              **runner_args(report, checkout.weights), **options)
    prompt_ids = result.pop("prompt_ids", [])
    before = checkout_timings["verify_s"] + checkout_timings["extract_s"]
    timings = {**checkout_timings, **result.get("timings", {})}
    timings["first_token_s"] = timings.get("first_token_s", 0.0) + before  # from the start of verification
    out = {"ok": True, "bundle": _bundle_info(ref, report), **result, "timings": timings, "error": None}
    if attest is not None:
        recorder = runrecord.Recorder(store, runrecord.Context.from_report("run", report, result, options), attest, attest_prompts, started)
        request = requestlog.entry(prompt_ids, result["tokens"], max_tokens=options.get("max_new_tokens", 128),
                                   temperature=options.get("temperature") or 0.0, top_p=options.get("top_p") or 1.0,
                                   seed=options.get("seed"), chat=not options.get("raw"))
        recorder.add(result["stats"], prompt, result.get("text", ""), request)
        written = recorder.flush()
        out["attestation"] = {"digest": written.record, "key_id": written.key_id} if written else None
    return out


@contextlib.contextmanager
def loaded_bundle(
    store: Store, ref: Ref, trusted: Mapping[str, Any], context: tuple[int, int], **options: Any
) -> Iterator[tuple[Any, dict[str, Any], VerifyReport]]:
    """Verify, extract the small files and load the pair once (runner.run.load_pair: the same checks and
    refusals as run), keeping the verified checkout alive until the block ends (a server's lifetime).

    context: (prompt tokens, new tokens) the memory preflight sizes the caches for. Yields (pair, bundle
    info {"ref", "digest", "signer"}, report); raises the first BundleError before any weights are loaded."""
    from runner.run import load_pair  # torch is imported only when a bundle runs

    with verified_view(store, ref, trusted) as checkout:
        # The pair gets no run history (runner.decoding.run_history): a server's requests differ more than one user's
        # runs and write nothing to it; serve reads its counts to start from (bundler.serve.batch_worker).
        pair = load_pair(checkout.root, context=context, **runner_args(checkout.report, checkout.weights), **options)
        yield pair, _bundle_info(ref, checkout.report), checkout.report


def bench_bundle(store: Store, ref: Ref, trusted: Mapping[str, Any], prompts: list[str], **options: Any) -> dict[str, Any]:
    """Verify, extract the small files, then benchmark the pair (runner.bench.torch_bench) on `prompts`, the weights read
    from their verified blobs as `bundle run` reads them."""
    from runner.bench.torch_bench import bench_unpacked

    with verified_view(store, ref, trusted) as checkout:
        result = bench_unpacked(checkout.root, prompts=prompts, history=run_history(store, checkout.report.digest),
                                **runner_args(checkout.report, checkout.weights), **options)
    return {"bundle": _bundle_info(ref, checkout.report), **result}
