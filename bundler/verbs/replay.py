"""`bundle replay RECORD`: a signed run record decoded again, and whether the tokens are the ones it signed.

The record is found in the store by its digest (`bundle attestations REF` lists them) and verified as
`attestations` verifies it (intact, signed by a trusted key, about the bundle it names); the bundle is verified
and loaded as `run` does (bundler.verbs.run). The prompt given is tokenized as the record's request was (chat
template or not) and must have the sha256 one of its requests signed (bundler.trust.requestlog), else it is
refused before any weight loads. That request is decoded again with its settings (max tokens: as many as it
produced; temperature, top-p, seed; the draft length, dtype and forward the record names) and the output
ids' sha256 compared with the signed one.

A record made with `--reproducible` should replay to the same tokens whatever shared its passes; one made
without may part at a near-tie of bf16 rounding (docs/serving.md), and the report says so.
"""

from __future__ import annotations

__all__ = ["ReplayRequest", "reference_tokens", "replay_record", "verified_record"]

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from bundler.format.manifest import Descriptor
from bundler.format.mediatypes import RUN_RECORD
from bundler.store.layout import Store
from bundler.store.refs import Ref, parse_ref
from bundler.trust import runrecord
from bundler.trust.requestlog import ids_sha256
from bundler.verbs.run import runner_args, verified_view
from core.boundedread import NotReadable, read_bounded
from core.errors import BundleError

MAX_TOKENS_FILE = 16 << 20  # `--tokens FILE`: a `run --json` output or a list of ids
DEFAULT_MODE_NOTE = ("the record was made without --reproducible: a replay may part from it at a near-tie of bf16 "
                     "rounding without anything being wrong; only a --reproducible record replays to the same tokens for sure")


@dataclass(frozen=True)
class ReplayRequest:
    """What the user gives a replay: the prompt's text, the device, and optionally the recorded output ids."""

    prompt: str
    device: str | None = None
    tokens: Sequence[int] | None = None  # the recorded output (`run --json`'s "tokens"): locates a difference


def _record_descriptor(store: Store, digest: str) -> Descriptor:
    """The run record artifact whose manifest digest is `digest` (or begins so, at least 12 hex digits, once)."""
    if not digest.startswith("sha256:") or len(digest) < 19:
        raise BundleError("usage", f"RECORD is a run record's digest, sha256:<hex> (at least 12 hex digits), not {digest!r}")
    found = [d for d in store.untagged(RUN_RECORD) if d.digest.startswith(digest)]
    if len(found) != 1:
        why = "no run record" if not found else f"{len(found)} run records begin with"
        raise BundleError("not-found", f"{why} {digest} in the store {store.root} (`bundle attestations REF` lists a bundle's)")
    return found[0]


def _subject_of(store: Store, desc: Descriptor) -> str:
    _, manifest = store.read_json_blob(desc)
    subject = manifest.get("subject") if isinstance(manifest, dict) else None
    digest = subject.get("digest") if isinstance(subject, dict) else None
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        raise BundleError("invalid-bundle", f"run record {desc.digest}: its manifest names no bundle")
    return digest


def verified_record(store: Store, digest: str, trusted: Mapping[str, Any]) -> runrecord.RecordCheck:
    """The record, verified as `bundle attestations` verifies it; its first failure raised (exit 3 for a changed
    byte, a bad or untrusted signature, a record moved onto another bundle)."""
    desc = _record_descriptor(store, digest)
    check = runrecord.check_record(store, desc, _subject_of(store, desc), trusted)
    if not check.verified:
        assert check.error is not None
        raise BundleError(check.error.code, f"run record {desc.digest}: {check.error.message}")
    return check


def reference_tokens(path: str) -> list[int]:
    """`--tokens FILE`: a JSON list of ids, or an object with "tokens" (what `run --json` prints)."""
    try:
        value = json.loads(read_bounded(path, MAX_TOKENS_FILE))
    except NotReadable as why:
        raise BundleError("usage", f"cannot read --tokens {path}: it {why}") from None
    except (ValueError, RecursionError):
        raise BundleError("usage", f"--tokens {path} is not JSON") from None
    ids = value.get("tokens") if isinstance(value, dict) else value
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise BundleError("usage", f"--tokens {path}: expected a list of token ids, or an object with one under \"tokens\"")
    return ids


def _requests(predicate: Mapping[str, Any]) -> list[dict[str, Any]]:
    requests = predicate.get("requests")
    if not requests:
        raise BundleError("usage", "the record lists no request to replay: it was made without --attest-prompts "
                                   "(or before bundle replay), so it signs no token digests")
    return list(requests)


def _pick(predicate: Mapping[str, Any], ids_for: Any) -> tuple[int, dict[str, Any], list[int]]:
    """(index, entry, prompt ids) of the request whose signed prompt digest the given prompt has."""
    requests = _requests(predicate)
    ids = {chat: ids_for(chat) for chat in {bool(e["chat"]) for e in requests}}
    for index, item in enumerate(requests):
        if item["prompt"]["sha256"] == ids_sha256(ids[bool(item["chat"])]):
            return index, item, ids[bool(item["chat"])]
    more = f" (and {predicate['requests_omitted']} it counted without listing)" if predicate.get("requests_omitted") else ""
    raise BundleError("usage", f"the prompt given is not one the record signed: its token ids' sha256 matches none of the "
                               f"{len(requests)} request(s) the record lists{more}")


def _bundle_ref(predicate: Mapping[str, Any], digest: str) -> Ref:
    """The bundle the record names, pinned by the digest it signed."""
    named = parse_ref(str(predicate["bundle"]["ref"]))
    return Ref(named.registry, named.repository, None, digest)


def _first_difference(replayed: Sequence[int], recorded: Sequence[int] | None) -> int | None:
    if recorded is None or list(replayed) == list(recorded):
        return None
    return next((i for i, (a, b) in enumerate(zip(replayed, recorded)) if a != b), min(len(replayed), len(recorded)))


def replay_record(store: Store, digest: str, trusted: Mapping[str, Any], request: ReplayRequest) -> dict[str, Any]:
    """Verify the record and its bundle, decode the recorded request again, compare. Returns the report
    ({"match", "tokens", "first_difference", ...}); a mismatch is a report, not an error (the caller decides)."""
    from runner.pair import prompt_ids  # here, not above: torch is imported only when a bundle runs
    from runner.run import generate, load_pair

    check = verified_record(store, digest, trusted)
    predicate = check.statement["predicate"]  # type: ignore[index]
    mode, settings = predicate.get("mode", "default"), predicate.get("settings", {})
    _requests(predicate)  # nothing to replay against: refused before the bundle is verified
    chosen: dict[str, Any] = {}

    def context(tokenizer: Any) -> tuple[int, int]:  # before any weight loads: a wrong prompt is refused here
        chosen["index"], chosen["entry"], chosen["ids"] = _pick(predicate, lambda chat: prompt_ids(tokenizer, request.prompt, raw=not chat))
        if request.tokens is not None and ids_sha256(request.tokens) != chosen["entry"]["output"]["sha256"]:
            raise BundleError("usage", "the --tokens given are not the output the record signed (their sha256 differs)")
        return len(chosen["ids"]), max(chosen["entry"]["output"]["tokens"], 1)

    subject = "sha256:" + check.statement["subject"][0]["digest"]["sha256"]  # type: ignore[index]
    dtype = predicate["dtype"] if predicate.get("engine") == "torch" else None
    with verified_view(store, _bundle_ref(predicate, subject), trusted) as checkout:
        pair = load_pair(checkout.root, context=context, draft_tokens=settings.get("draft_tokens"), device=request.device, dtype=dtype,
                         reproducible=mode == "reproducible", **runner_args(checkout.report, checkout.weights))
        item = chosen["entry"]
        result = generate(pair, chosen["ids"], max_new_tokens=max(item["output"]["tokens"], 1), temperature=item["temperature"],
                          top_p=item["top_p"], seed=item["seed"])
    replayed = result["tokens"][: item["output"]["tokens"]]
    return _report(check, predicate, subject, chosen["index"], replayed, request, pair)


def _report(check: runrecord.RecordCheck, predicate: Mapping[str, Any], subject: str, index: int, replayed: list[int],
            request: ReplayRequest, pair: Any) -> dict[str, Any]:
    item = predicate["requests"][index]
    match = len(replayed) == item["output"]["tokens"] and ids_sha256(replayed) == item["output"]["sha256"]
    mode = predicate.get("mode", "default")
    notes = [] if mode == "reproducible" else [DEFAULT_MODE_NOTE]
    if item["temperature"] > 0:
        notes.append("a sampled request: its tokens repeat only where the same seed drives the same sampler")
    return {
        "ok": match, "match": match, "record": check.digest, "signer": {"key_id": check.signer},
        "kind": predicate["kind"], "mode": mode, "bundle": {"ref": predicate["bundle"]["ref"], "digest": subject},
        "request": index, "requests": len(predicate["requests"]),
        "tokens": len(replayed), "recorded_tokens": item["output"]["tokens"],
        "first_difference": None if match else _first_difference(replayed, request.tokens),
        "located": match or request.tokens is not None,  # a digest alone says whether, not where
        "settings": {k: item[k] for k in ("max_tokens", "temperature", "top_p", "seed", "chat")},
        "replayed_on": {"device": pair.device, "dtype": pair.dtype, "engine": pair.engine},
        "recorded_on": {"device": predicate.get("device"), "dtype": predicate.get("dtype"), "engine": predicate.get("engine")},
        "notes": notes,
    }
