"""`bundle tune`: measure every speculation setting of a pair on the user's prompts (runner.bench.tune), choose
the fastest, check the choice on prompts it was not chosen on, and (a context only) write it into the Kitfile
so that `pack` signs what was tuned."""

from __future__ import annotations

__all__ = ["TuneOptions", "split_held_out", "tune_bundle", "tune_context", "tune_target"]

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundler.format.atomicfile import write_atomically
from bundler.format.kitfile import KITFILE_NAMES, load_kitfile, runner_params, with_speculative
from bundler.store.layout import Store
from bundler.store.refs import Ref, parse_ref
from bundler.verbs.run import runner_args, verified_view
from core.errors import BundleError

BUNDLE_DRAFT = "bundle"  # the name of the bundle's own draft among the candidates
HELD_OUT_EVERY = 3  # a user's file: every third prompt is held out for the check


@dataclass(frozen=True)
class TuneOptions:
    """What tune measures: the tuning prompts and the held-out ones (texts), candidate drafts, the k range."""

    prompts: Sequence[str]
    held_out: Sequence[str] = ()
    drafts: Sequence[Path] = ()
    ks: Sequence[int] = tuple(range(1, 9))
    max_new_tokens: int = 64
    repeat: int = 1  # rounds over the prompts, pooled
    device: str | None = None
    progress: Callable[[str], None] | None = None


def split_held_out(prompts: Sequence[str]) -> tuple[list[str], list[str]]:
    """A user's prompts as (tuning, held out): every third held out, none when there are fewer than three."""
    if len(prompts) < HELD_OUT_EVERY:
        return list(prompts), []
    held = [p for i, p in enumerate(prompts) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    return [p for i, p in enumerate(prompts) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1], held


def tune_target(store: Store, target: str) -> Path | Ref:
    """TARGET as `tune` takes it: a context directory (a Path) or a stored bundle (a Ref). A name that is both a
    directory here and a reference the store holds is refused as ambiguous (a usage error): tuning the
    unverified directory where the signed bundle was meant, or the other way round, is never guessed."""
    directory = Path(target)
    try:
        ref: Ref | None = parse_ref(target)
    except BundleError:
        ref = None
    if not directory.is_dir():
        if ref is None:
            raise BundleError("usage", f"{target!r} is neither a context directory nor a reference (NAME[:TAG] or NAME@sha256:<hex>)")
        return ref
    if ref is not None:
        try:
            store.resolve(ref)
        except BundleError as err:
            if err.code != "not-found":
                raise
            return directory  # not in the store (or no store yet): the directory
        raise BundleError("usage", f"{target!r} is both a directory here and a bundle in the store {store.root}: "
                                   f"give the directory as ./{target} or the bundle by digest (NAME@sha256:<hex>)")
    return directory


def _kitfile_path(context: Path, kitfile: Path | None) -> Path:
    return kitfile if kitfile is not None else next((context / n for n in KITFILE_NAMES if (context / n).is_file()), context / "Kitfile")


def tune_context(context: Path, options: TuneOptions, *, write: bool = False, kitfile: Path | None = None) -> dict[str, Any]:
    """Tune the pair of a context directory (checked as `pack` checks it); `write` puts the chosen settings
    into its Kitfile, the rest of the file as it was."""
    parsed = load_kitfile(context, kitfile)
    result = _tune(context, parsed.role_paths(), runner_params(parsed.parameters), options)
    result["written"] = None
    if write:
        path = _kitfile_path(context, kitfile)
        edited = with_speculative(path.read_text(encoding="utf-8"), result["settings"], str(path))
        write_atomically(path, edited.encode(), path.stat().st_mode & 0o777)
        result["written"] = str(path)
    return result


def tune_bundle(store: Store, ref: Ref, trusted: Mapping[str, Any], options: TuneOptions) -> dict[str, Any]:
    """Tune a stored bundle, verified as `bundle run` verifies it (a trusted signature required)."""
    with verified_view(store, ref, trusted) as checkout:
        result = _tune(checkout.root, **runner_args(checkout.report, checkout.weights), options=options)
    return {"bundle": {"ref": str(ref), "digest": checkout.report.digest}, **result, "written": None}


def _candidates(root: Path, roles: Mapping[str, str], params: Mapping[str, Any], pair: Any, options: TuneOptions,
                weight_ranges: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The drafts to try: the bundle's own (where it has one) and each --draft directory, each checked
    against the target and tokenizer as a bundle's draft is (tokenizer gate, pairing) before it loads.
    weight_ranges: a stored bundle's weights, left in their blobs (the checkout holds none of them)."""
    drafts = {BUNDLE_DRAFT: pair.draft} if pair.draft is not None else {}
    for directory in options.drafts:
        directory = Path(directory)
        if not directory.is_dir():
            raise BundleError("missing-input", f"--draft {directory} is not a directory")
        drafts[str(directory)] = _load_candidate(root, roles, params, pair, directory, weight_ranges)
    return drafts


def _load_candidate(root: Path, roles: Mapping[str, str], params: Mapping[str, Any], pair: Any, directory: Path,
                    weight_ranges: Mapping[str, Any] | None = None) -> Any:
    from runner.pair import gguf_dirs
    from runner.run import weight_ranges_at

    candidate_roles = {**roles, "draft": os.path.relpath(directory.resolve(), Path(root).resolve())}
    ggufs = gguf_dirs(root, candidate_roles)
    if pair.engine == "llama.cpp" or ggufs:
        if not ggufs:
            raise BundleError("invalid-bundle", f"--draft {directory} holds no GGUF file; the bundle's target is one")
        return _gguf_draft(ggufs, params, pair)
    from runner.models.loading import load_model
    from runner.run import preflight, runtime_draft

    # The target's weights of a stored bundle are blob ranges, not files below root: the pairing reads them there.
    checked = preflight(root, candidate_roles, params, weight_ranges_at(root, weight_ranges))
    return runtime_draft(load_model(directory, pair.dtype, pair.device, role="draft"), checked)


def _gguf_draft(ggufs: Mapping[str, Path], params: Mapping[str, Any], pair: Any) -> Any:
    from runner.gguf_run import load_gguf_pair

    context = pair.context_tokens
    return load_gguf_pair(ggufs, params, context=(context, 0), draft_tokens=1).draft


def _tune(root: Path, roles: Mapping[str, str], params: Mapping[str, Any], options: TuneOptions,
          verified_files: Mapping[str, str] | None = None, weight_ranges: Mapping[str, Any] | None = None) -> dict[str, Any]:
    from runner.bench.machine import machine_info
    from runner.bench.tune import held_out_check, measure_settings, settings_grid
    from runner.decoding.settings import DecodingSettings
    from runner.checks.context_window import PromptContext
    from runner.run import load_pair

    texts = [*options.prompts, *options.held_out]  # each refused before loading where it does not fit the window
    pair = load_pair(root, roles, params, context=PromptContext(texts, options.max_new_tokens),
                     draft_tokens=max(options.ks), device=options.device, verified_files=verified_files, weight_ranges=weight_ranges)
    drafts = _candidates(root, roles, params, pair, options, weight_ranges)
    base = DecodingSettings.from_params(params, has_draft=pair.draft is not None)
    grid = settings_grid(base.methods, options.ks, list(drafts))
    measure = lambda prompts: measure_settings(  # noqa: E731
        pair.target, drafts, base, grid, [pair.prompt_ids(p) for p in prompts], eos=pair.eos_ids, vocab=pair.vocab_size,
        max_new_tokens=options.max_new_tokens, repeat=options.repeat, progress=options.progress)
    tuned = measure(options.prompts)
    choice = tuned.best(speculative_only=True)
    held = measure(options.held_out) if options.held_out else None
    plain_tps = tuned.plain.tokens_per_second
    return {
        "engine": pair.engine, "dtype": pair.dtype, "device": pair.device, "prompts": len(options.prompts),
        "held_out_prompts": len(options.held_out), "max_new_tokens": options.max_new_tokens, "repeat": options.repeat,
        "ks": list(options.ks),
        "drafts": list(drafts),
        "rows": [{"setting": r.setting.label(), **r.as_dict(plain_tps)} for r in tuned.rows],
        "choice": {"setting": choice.setting.label(), **choice.as_dict(plain_tps)},
        "plain_fastest": tuned.best().setting.method == "plain",
        "settings": _kitfile_settings(tuned, choice, base),
        "held_out": held_out_check(held, choice.setting) if held else None,
        "held_out_rows": [{"setting": r.setting.label(), **r.as_dict(held.plain.tokens_per_second)} for r in held.rows] if held else None,
        "machine": machine_info(getattr(pair.target, "threads", None) or os.cpu_count() or 1),
    }


def _kitfile_settings(tuned: Any, choice: Any, base: Any) -> dict[str, Any]:
    """The Kitfile's speculative parameters for the choice: its method first, then every other method whose
    best setting beat plain decoding, fastest first; each method's k from its best setting (the choice's
    wins where two share a k). A candidate draft's k is written, but the draft itself stays the bundle's."""
    plain = tuned.plain.tokens_per_second
    best: dict[str, Any] = {}
    for row in sorted((r for r in tuned.rows if r.setting.method != "plain"), key=lambda r: -r.tokens_per_second):
        best.setdefault(row.setting.method, row)
    methods = [choice.setting.method] + [m for m, r in best.items() if m != choice.setting.method and r.tokens_per_second > plain]
    out: dict[str, Any] = {"methods": methods}
    ngram = {"min_n": base.ngram_min, "max_n": base.ngram_max, "draft_tokens": base.ngram_tokens}
    for method in reversed(methods):  # the choice last: its k wins
        row = choice if method == choice.setting.method else best[method]
        if "draft" in method:
            out["draft_tokens"] = row.setting.k
        if "ngram" in method:
            ngram["draft_tokens"] = row.setting.k
    if any("ngram" in m for m in methods):
        out["ngram"] = ngram
    return out
