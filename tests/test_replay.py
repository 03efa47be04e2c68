"""`bundle replay RECORD` (issue 50): a run record made with `--attest-prompts` signs each request's token ids'
sha256 and its settings, and says which forward ran; replay verifies the record and its bundle, decodes the
request again and says whether the tokens are the ones signed. On the tiny bf16 pair, `--reproducible`."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest

from bundler.format.manifest import Descriptor
from bundler.format.mediatypes import OCI_MANIFEST
from bundler.store.layout import Store
from bundler.store.refs import parse_ref
from bundler.trust import dsse, runrecord
from bundler.trust.keys import load_private_key
from bundler.trust.requestlog import ids_sha256
from conftest import copy_store, run_bundle
from tests.test_serve import REF, Server, _pack

PROMPT = "what is a draft?"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, keypair) -> Path:
    return _pack(tmp_path_factory.mktemp("replay"), keypair, speculative={"draft_tokens": 3})


@pytest.fixture(scope="module")
def recorded(store: Path, keypair, other_keypair) -> dict:
    """`run --reproducible --attest --attest-prompts` once: its --json output (the record signed by other_keypair)."""
    ran = run_bundle("run", REF, "--prompt", PROMPT, "--max-new-tokens", "8", "--dtype", "bfloat16", "--reproducible",
                     "--attest", str(other_keypair[0]), "--attest-prompts", "--key", str(keypair[1]), "--store", str(store),
                     "--json", check=True)
    return json.loads(ran.out)


def _replay(store: Path, record: str, keypair, other_keypair, *extra: str):
    return run_bundle("replay", record, "--key", str(keypair[1]), "--key", str(other_keypair[1]), "--store", str(store), *extra)


def _envelope(store: Path, record: str) -> dict:
    s = Store(store)
    desc = next(d for d in s.untagged("application/vnd.in-toto+json") if d.digest == record)
    _, manifest = s.read_json_blob(desc)
    layer = manifest["layers"][0]
    return s.read_json_blob(Descriptor(layer["mediaType"], layer["digest"], layer["size"]))[1]


def _store_envelope(store: Path, envelope: dict) -> str:
    s = Store(store)
    bundle = s.resolve(parse_ref(REF))
    return runrecord.store_record(s, Descriptor(OCI_MANIFEST, bundle.digest, bundle.size), dsse.canonical_json(envelope)).digest


def test_a_record_made_by_run_reproducible_replays_to_the_same_tokens(store: Path, recorded: dict, keypair, other_keypair) -> None:
    result = _replay(store, recorded["attestation"]["digest"], keypair, other_keypair, "--prompt", PROMPT)
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["match"] is True and report["mode"] == "reproducible" and report["kind"] == "run"
    assert report["tokens"] == report["recorded_tokens"] == len(recorded["tokens"]) > 0
    assert report["first_difference"] is None and report["notes"] == []


def test_the_record_signs_token_digests_and_the_mode_never_the_text(store: Path, recorded: dict) -> None:
    statement = json.loads(base64.b64decode(_envelope(store, recorded["attestation"]["digest"])["payload"]))
    predicate = statement["predicate"]
    assert predicate["mode"] == "reproducible" and predicate["requests_omitted"] == 0
    (entry,) = predicate["requests"]
    assert entry["output"] == {"tokens": len(recorded["tokens"]), "sha256": ids_sha256(recorded["tokens"])}
    assert entry["chat"] is True and entry["temperature"] == 0.0 and entry["max_tokens"] == 8
    assert "draft?" not in json.dumps(statement)


def test_a_record_whose_output_digest_was_changed_fails_its_signature(store: Path, recorded: dict, keypair, other_keypair, tmp_path: Path) -> None:
    copy = copy_store(store, tmp_path)
    envelope = _envelope(copy, recorded["attestation"]["digest"])
    payload = base64.b64decode(envelope["payload"])
    signed = ids_sha256(recorded["tokens"]).encode()
    assert payload.count(signed) == 1
    envelope["payload"] = base64.b64encode(payload.replace(signed, ids_sha256(recorded["tokens"][:-1]).encode())).decode()
    result = _replay(copy, _store_envelope(copy, envelope), keypair, other_keypair, "--prompt", PROMPT)
    assert result.code == 3 and "[signature-invalid]" in result.err and result.out == ""


def test_a_prompt_other_than_the_recorded_one_is_refused(store: Path, recorded: dict, keypair, other_keypair) -> None:
    result = _replay(store, recorded["attestation"]["digest"], keypair, other_keypair, "--prompt", PROMPT + " ")
    assert result.code == 2 and "not one the record signed" in result.err and result.out == ""


def test_tokens_other_than_the_signed_ones_are_a_mismatch_located_by_the_recorded_output(store: Path, recorded: dict, keypair, other_keypair,
                                                                                         tmp_path: Path) -> None:
    """A record key's holder signs an output the bundle does not give: match false, exit 3; given that output
    (`--tokens`, checked against the signed digest), the report says where the replay parts from it."""
    copy = copy_store(store, tmp_path)
    statement = json.loads(base64.b64decode(_envelope(copy, recorded["attestation"]["digest"])["payload"]))
    claimed = list(recorded["tokens"])
    claimed[2] = claimed[2] + 1
    statement["predicate"]["requests"][0]["output"]["sha256"] = ids_sha256(claimed)
    envelope = json.loads(runrecord.sign_statement(statement, load_private_key(other_keypair[0])))
    (tmp_path / "claimed.json").write_text(json.dumps(claimed))
    result = _replay(copy, _store_envelope(copy, envelope), keypair, other_keypair, "--prompt", PROMPT, "--tokens", str(tmp_path / "claimed.json"))
    assert result.code == 3 and "[replay-mismatch]" in result.err
    report = json.loads(result.out)
    assert report["match"] is False and report["first_difference"] == 2 and report["located"] is True


def test_a_record_made_without_attest_prompts_says_it_has_nothing_to_replay(store: Path, keypair, other_keypair, tmp_path: Path) -> None:
    copy = copy_store(store, tmp_path)
    ran = run_bundle("run", REF, "--prompt", PROMPT, "--max-new-tokens", "2", "--attest", str(other_keypair[0]), "--key", str(keypair[1]),
                     "--store", str(copy), "--json", check=True)
    result = _replay(copy, json.loads(ran.out)["attestation"]["digest"], keypair, other_keypair, "--prompt", PROMPT)
    assert result.code == 2 and "--attest-prompts" in result.err


def test_a_record_made_without_reproducible_replays_and_says_its_tokens_may_part_at_a_near_tie(store: Path, keypair, other_keypair,
                                                                                               tmp_path: Path) -> None:
    copy = copy_store(store, tmp_path)
    ran = run_bundle("run", REF, "--prompt", PROMPT, "--max-new-tokens", "4", "--raw", "--dtype", "float32", "--attest", str(other_keypair[0]),
                     "--attest-prompts", "--key", str(keypair[1]), "--store", str(copy), "--json", check=True)
    result = _replay(copy, json.loads(ran.out)["attestation"]["digest"], keypair, other_keypair, "--prompt", PROMPT)
    assert result.code == 0, result.err  # float32: greedy tokens equal the target's alone (docs/running.md), mode or not
    report = json.loads(result.out)
    assert report["match"] and report["mode"] == "default" and report["replayed_on"]["dtype"] == "float32"
    assert report["settings"]["chat"] is False and "near-tie" in report["notes"][0]


def test_a_record_made_by_serve_reproducible_replays_to_the_same_tokens(store: Path, keypair, other_keypair, tmp_path: Path) -> None:
    copy = copy_store(store, tmp_path)
    srv = Server(copy, keypair[1], "--reproducible", "--dtype", "bfloat16", "--sequences", "2", "--attest-key", str(other_keypair[0]), "--attest-prompts")
    try:
        body = {"model": REF, "prompt": "the quick fox", "max_tokens": 6, "temperature": 0}
        answer = httpx.post(srv.url + "/v1/completions", json=body, timeout=120).json()
    finally:
        assert srv.stop() == 0
    listed = json.loads(run_bundle("attestations", REF, "--key", str(other_keypair[1]), "--store", str(copy), "--json", check=True).out)
    (record,) = [r for r in listed if r["statement"]["predicate"]["kind"] == "serve"]
    assert record["statement"]["predicate"]["requests"][0]["chat"] is False  # a completion: its prompt as it is
    result = _replay(copy, record["digest"], keypair, other_keypair, "--prompt", "the quick fox")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["match"] is True and report["kind"] == "serve" and report["mode"] == "reproducible"
    assert report["tokens"] == answer["usage"]["completion_tokens"]


def test_a_serve_window_lists_its_first_requests_and_counts_the_rest_within_the_schema() -> None:
    from datetime import datetime, timezone

    from bundler.trust.requestlog import MAX_LOGGED, RequestLog, entry
    from conftest import assert_matches_schema

    log = RequestLog()
    for n in range(MAX_LOGGED + 6):
        log.add(entry(list(range(n + 1)), [n], max_tokens=16, temperature=0.0, top_p=1.0, seed=None, chat=True))
    ctx = runrecord.Context(kind="serve", ref=REF, digest="sha256:" + "ab" * 32, name="tiny-spec", version="1.0.0", signer="cd" * 32,
                            checks=("signature",), tokenizer_fingerprint="sha256:" + "ef" * 32, parameters={},
                            settings={"reproducible": True}, engine="torch", device="cpu", dtype="bfloat16")
    when = datetime.now(timezone.utc)
    statement = runrecord.build_statement(ctx, runrecord.Totals(requests=MAX_LOGGED + 6), when, when, requests=log)
    assert_matches_schema(statement, "run-record")
    predicate = statement["predicate"]
    assert len(predicate["requests"]) == MAX_LOGGED and predicate["requests_omitted"] == 6 and predicate["mode"] == "reproducible"
    assert len(json.dumps(statement)) < 48 << 10  # within recordlimits.MAX_RECORD_BYTES (64 KiB) once base64'd in the envelope
