"""Run records: `bundle run --attest` leaves one signed record about the bundle that ran, and
`bundle attestations` verifies each record, reporting a changed, moved or untrusted one with its reason."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
import requests

from bundler.trust import dsse, runrecord
from bundler.trust.keys import key_id, load_private_key, load_public_key
from bundler.format.manifest import Descriptor
from bundler.format.mediatypes import OCI_MANIFEST, RUN_RECORD
from bundler.store.modelkit import load_modelkit
from bundler.store.refs import parse_ref
from bundler.store.layout import Store
from conftest import assert_matches_schema, copy_store, run_bundle
from registry_server import registry  # noqa: F401  (fixture)
from tests.tinymodels import make_pair

REF = "tiny-spec:1.0.0"
OTHER = "tiny-spec:2.0.0"
PROMPT = "the secret prompt about zebras"


@pytest.fixture(scope="module")
def attested(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path], other_keypair: tuple[Path, Path]) -> dict:
    """A signed tiny pair run once with --attest (the record signed by other_keypair), plus a second bundle."""
    base = tmp_path_factory.mktemp("attest")
    make_pair(base / "ctx")
    store = base / "store"
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(store), check=True)
    kitfile = (base / "ctx" / "Kitfile").read_text().replace("version: 1.0.0", "version: 2.0.0")
    assert "version: 2.0.0" in kitfile
    (base / "ctx" / "Kitfile").write_text(kitfile)
    run_bundle("pack", str(base / "ctx"), "-t", OTHER, "--key", str(keypair[0]), "--store", str(store), check=True)
    ran = run_bundle("run", REF, "--prompt", PROMPT, "--max-new-tokens", "10", "--key", str(keypair[1]),
                     "--attest", str(other_keypair[0]), "--store", str(store), "--json", check=True)
    return {"store": store, "run": json.loads(ran.out), "ctx": base / "ctx"}


def _trusted(*pubs: Path) -> dict:
    return {key_id(k): k for k in (load_public_key(p) for p in pubs)}


def _records(store: Path) -> list[Descriptor]:
    return Store(store).untagged(RUN_RECORD)


def _envelope(store: Path, record: Descriptor) -> tuple[dict, Descriptor]:
    s = Store(store)
    _, manifest = s.read_json_blob(record)
    layer = manifest["layers"][0]
    data, envelope = s.read_json_blob(layer)
    return envelope, Descriptor(layer["mediaType"], layer["digest"], layer["size"])


def _statement(store: Path) -> dict:
    envelope, _ = _envelope(store, _records(store)[0])
    return json.loads(base64.b64decode(envelope["payload"]))


def _check(store: Path, ref: str, trusted: dict) -> list[runrecord.RecordCheck]:
    return runrecord.attestations(Store(store), parse_ref(ref), trusted)[1]


def test_run_with_attest_leaves_one_record_about_the_bundle_with_the_runs_totals(attested: dict) -> None:
    out, store = attested["run"], attested["store"]
    records = _records(store)
    assert len(records) == 1
    assert out["attestation"]["digest"] == records[0].digest
    _, manifest = Store(store).read_json_blob(records[0])
    assert manifest["artifactType"] == "application/vnd.in-toto+json"
    assert manifest["subject"]["digest"] == out["bundle"]["digest"]
    statement = _statement(store)
    assert statement["subject"][0]["digest"]["sha256"] == out["bundle"]["digest"].split(":", 1)[1]
    assert statement["predicateType"] == "https://specbundle.dev/run/v1"
    stats, totals = out["stats"], statement["predicate"]["totals"]
    assert totals == {"requests": 1, "tokens": stats["new_tokens"], "drafted": stats["drafted"], "accepted": stats["accepted"],
                      "acceptance_rate": stats["acceptance_rate"], "fallbacks": 1 if stats["fallback"] else 0}
    predicate = statement["predicate"]
    assert predicate["verification"]["signer"]["key_id"] == out["bundle"]["signer"]
    assert predicate["tokenizer"]["fingerprint"] == out["tokenizer"]["fingerprint"]
    assert (predicate["device"], predicate["dtype"], predicate["engine"]) == (out["device"], out["dtype"], out.get("engine", "torch"))


def test_the_record_matches_its_json_schema(attested: dict) -> None:
    assert_matches_schema(_statement(attested["store"]), "run-record")


def test_the_record_holds_no_prompt_or_output_text(attested: dict) -> None:
    envelope, _ = _envelope(attested["store"], _records(attested["store"])[0])
    payload = base64.b64decode(envelope["payload"]).decode()
    assert "zebras" not in payload and attested["run"]["text"] not in payload.replace("\\", "")
    assert "prompts" not in json.loads(payload)["predicate"]


def test_attest_prompts_records_only_their_sha256(attested: dict, tmp_path: Path, keypair, other_keypair) -> None:
    store = copy_store(attested["store"], tmp_path)
    ran = run_bundle("run", REF, "--prompt", PROMPT, "--max-new-tokens", "4", "--key", str(keypair[1]), "--attest", str(other_keypair[0]),
                     "--attest-prompts", "--store", str(store), "--json", check=True)
    out = json.loads(ran.out)
    found = [c for c in _check(store, REF, _trusted(other_keypair[1])) if c.digest == out["attestation"]["digest"]]
    assert len(found) == 1 and found[0].verified
    prompts = found[0].statement["predicate"]["prompts"]
    assert prompts == [{"prompt_sha256": hashlib.sha256(PROMPT.encode()).hexdigest(), "output_sha256": hashlib.sha256(out["text"].encode()).hexdigest()}]
    assert "zebras" not in json.dumps(found[0].statement)


def test_a_record_by_a_trusted_key_verifies(attested: dict, other_keypair) -> None:
    (check,) = _check(attested["store"], REF, _trusted(other_keypair[1]))
    assert check.verified and check.error is None
    assert check.signer == key_id(load_public_key(other_keypair[1]))


def test_a_record_by_an_untrusted_key_is_invalid(attested: dict, keypair, other_keypair) -> None:
    (check,) = _check(attested["store"], REF, _trusted(keypair[1]))
    assert not check.verified and check.error.code == "untrusted-signer"
    assert check.signer is None and check.claimed_signer == key_id(load_public_key(other_keypair[1]))


def test_a_flipped_byte_in_the_stored_record_is_invalid(attested: dict, tmp_path: Path, other_keypair) -> None:
    store = copy_store(attested["store"], tmp_path)
    _, layer = _envelope(store, _records(store)[0])
    blob = Store(store).blob_path(layer.digest)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    (check,) = _check(store, REF, _trusted(other_keypair[1]))
    assert not check.verified and check.error.code == "digest-mismatch"
    assert "record envelope is damaged" in check.error.message


def _restore(store: Path, envelope: dict, subject_ref: str) -> None:
    """Store `envelope` again as a well-formed record artifact whose subject is `subject_ref`'s manifest."""
    s = Store(store)
    desc = s.resolve(parse_ref(subject_ref))
    runrecord.store_record(s, Descriptor(OCI_MANIFEST, desc.digest, desc.size), dsse.canonical_json(envelope))


def test_a_changed_byte_in_the_signed_statement_is_invalid(attested: dict, tmp_path: Path, other_keypair) -> None:
    store = copy_store(attested["store"], tmp_path)
    envelope, _ = _envelope(store, _records(store)[0])
    payload = base64.b64decode(envelope["payload"])
    tokens = json.loads(payload)["predicate"]["totals"]["tokens"]
    changed = payload.replace(b'"tokens":%d' % tokens, b'"tokens":%d' % (tokens + 1000))
    assert changed != payload
    for r in _records(store):  # only the rewritten record remains
        Store(store).remove_manifest(r.digest)
    _restore(store, {**envelope, "payload": base64.b64encode(changed).decode()}, REF)
    (check,) = _check(store, REF, _trusted(other_keypair[1]))
    assert not check.verified and check.error.code == "signature-invalid"
    assert "does not verify" in check.error.message


def test_a_record_moved_onto_another_bundle_is_invalid(attested: dict, tmp_path: Path, other_keypair) -> None:
    store = copy_store(attested["store"], tmp_path)
    envelope, _ = _envelope(store, _records(store)[0])
    _restore(store, envelope, OTHER)
    (check,) = _check(store, OTHER, _trusted(other_keypair[1]))
    assert not check.verified and check.error.code == "signature-mismatch"
    assert "another bundle" in check.error.message
    assert check.signer == key_id(load_public_key(other_keypair[1]))  # the signature itself is good
    (original,) = _check(store, REF, _trusted(other_keypair[1]))
    assert original.verified  # the same envelope on its own bundle still verifies


def test_attestations_cli_lists_and_exits_3_when_a_record_is_invalid(attested: dict, keypair, other_keypair) -> None:
    good = run_bundle("attestations", REF, "--key", str(other_keypair[1]), "--store", str(attested["store"]), "--json")
    assert good.code == 0, good.err
    (row,) = json.loads(good.out)
    assert row["verified"] is True and row["signer"] == {"key_id": key_id(load_public_key(other_keypair[1]))}
    assert row["statement"]["predicate"]["totals"]["tokens"] == attested["run"]["stats"]["new_tokens"]
    bad = run_bundle("attestations", REF, "--key", str(keypair[1]), "--store", str(attested["store"]))
    assert bad.code == 3
    assert "FAIL" in bad.out and "untrusted-signer" in bad.out
    assert bad.err.startswith("error: [untrusted-signer] 1 of 1 run record(s) did not verify")


def test_attest_prompts_without_attest_is_a_usage_error(attested: dict, keypair) -> None:
    result = run_bundle("run", REF, "--prompt", "x", "--key", str(keypair[1]), "--attest-prompts", "--store", str(attested["store"]))
    assert result.code == 2 and result.err.startswith("error: [usage]")


def test_a_recorder_counts_every_request_of_a_window_and_starts_a_new_one(attested: dict, tmp_path: Path, other_keypair) -> None:
    """serve's use: many requests, a record per window (hourly and at shutdown), an empty hourly window skipped."""
    store = copy_store(attested["store"], tmp_path)
    statement = _statement(store)["predicate"]
    s = Store(store)
    mk = load_modelkit(s, parse_ref(REF))
    ctx = runrecord.Context("serve", REF, mk.digest, mk.kitfile.name, mk.kitfile.version, statement["verification"]["signer"]["key_id"],
                            ("manifest", "signature"), statement["tokenizer"]["fingerprint"], mk.kitfile.parameters, {}, "torch", "cpu", "float32")
    recorder = runrecord.Recorder(s, ctx, load_private_key(other_keypair[0]))
    recorder.add({"new_tokens": 5, "drafted": 8, "accepted": 4, "fallback": None})
    recorder.add({"new_tokens": 7, "drafted": 2, "accepted": 2, "fallback": {"at_token": 3, "reason": "slow"}})
    first = recorder.flush(if_empty=False)
    assert recorder.flush(if_empty=False) is None
    second = recorder.flush()
    assert first.statement["predicate"]["totals"] == {"requests": 2, "tokens": 12, "drafted": 10, "accepted": 6, "acceptance_rate": 0.6, "fallbacks": 1}
    assert second.statement["predicate"]["totals"]["requests"] == 0
    assert second.statement["predicate"]["started"] == first.statement["predicate"]["finished"]
    checks = {c.digest: c for c in _check(store, REF, _trusted(other_keypair[1]))}
    assert checks[first.record].verified and checks[second.record].verified


def _record_without_a_model(store: Path, ref: str, signer_key: Path, started_offset_s: int = 0) -> runrecord.Written:
    """A record written by the library (as serve writes one) for a bundle with no runnable model: fast transport tests."""
    import datetime as dt

    s = Store(store)
    mk = load_modelkit(s, parse_ref(ref))
    ctx = runrecord.Context("run", ref, mk.digest, mk.kitfile.name, mk.kitfile.version, "ab" * 32, ("manifest", "signature"),
                            "sha256:" + "cd" * 32, mk.kitfile.parameters, {"max_new_tokens": 4}, "torch", "cpu", "float32")
    started = dt.datetime(2026, 12, 1, 9, 0, started_offset_s, tzinfo=dt.timezone.utc)
    recorder = runrecord.Recorder(s, ctx, load_private_key(signer_key), started=started)
    recorder.add({"new_tokens": 4, "drafted": 6, "accepted": 3, "fallback": None})
    return recorder.flush(started + dt.timedelta(seconds=2))


def test_records_travel_through_push_and_pull_and_verify_on_the_other_side(registry, tree: Path, tmp_path: Path, keypair, other_keypair) -> None:
    (tmp_path / "no-docker").mkdir()
    env = {"DOCKER_CONFIG": str(tmp_path / "no-docker"), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""}
    ref = f"{registry.host}/attested/tiny-spec:v1"  # repository = the signed name (the reference check)
    src, dst = tmp_path / "src", tmp_path / "dst"
    digest = run_bundle("pack", str(tree), "-t", ref, "--key", str(keypair[0]), "--store", str(src), check=True).out.split()[-1]
    written = [_record_without_a_model(src, ref, other_keypair[0], i) for i in range(2)]
    pushed = run_bundle("push", ref, "--plain-http", "--store", str(src), env=env, check=True)
    assert "2 run record(s)" in pushed.out
    # docker-registry 2.8 has no referrers API: signature and records share the fallback index.
    index = requests.get(f"http://{registry.host}/v2/attested/tiny-spec/manifests/sha256-{digest[7:]}",
                         headers={"Accept": "application/vnd.oci.image.index.v1+json"}).json()
    # two signatures (model-signing and cosign-style), the SBOM and provenance attestations `pack --key` writes
    # (the same artifactType, as cosign 3 writes them), and the two records
    assert sorted(m["artifactType"] for m in index["manifests"]) == ["application/vnd.dev.sigstore.bundle.v0.3+json"] * 4 + ["application/vnd.in-toto+json"] * 2
    pulled = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(dst), env=env, check=True)
    assert pulled.out.strip().splitlines()[-1] == digest
    listed = run_bundle("attestations", ref, "--key", str(other_keypair[1]), "--store", str(dst), "--json", check=True)
    rows = json.loads(listed.out)
    assert sorted(r["digest"] for r in rows) == sorted(w.record for w in written)
    assert all(r["verified"] and r["statement"]["subject"][0]["digest"]["sha256"] == digest[7:] for r in rows)
    assert [r["statement"]["predicate"]["started"] for r in rows] == sorted(r["statement"]["predicate"]["started"] for r in rows)


def test_serve_records_write_a_record_per_busy_interval_and_one_at_shutdown(tree: Path, tmp_path: Path, keypair, other_keypair) -> None:
    """serve's use (ServeRecords, serve_bundle's on_record): a timer writes a record for each interval with
    requests (an idle one writes none), and close() writes the last window at shutdown."""
    import time
    from types import SimpleNamespace

    from bundler.trust.verify import verify_bundle

    store = tmp_path / "store"
    run_bundle("pack", str(tree), "-t", REF, "--key", str(keypair[0]), "--store", str(store), check=True)
    report = verify_bundle(Store(store), parse_ref(REF), _trusted(keypair[1]))
    assert report.ok
    loaded = SimpleNamespace(fingerprint="sha256:" + "cd" * 32, device="cpu", dtype="float32", engine="torch")  # what serve's pair says of itself
    records = runrecord.ServeRecords(Store(store), load_private_key(other_keypair[0]), {"max_queue": 4}, interval_s=0.5)
    on_request = records.attach(report, loaded)
    on_request({"new_tokens": 3, "drafted": 4, "accepted": 2, "fallback": None}, [1, 2], "text")
    on_request({"new_tokens": 5, "drafted": 4, "accepted": 4, "fallback": None}, [3], "more")
    deadline = time.monotonic() + 10
    while not records.recorder.written and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.2)  # two more intervals pass with no request: nothing written for them
    assert len(records.recorder.written) == 1
    on_request({"new_tokens": 1, "drafted": 0, "accepted": 0, "fallback": {"at_token": 0, "reason": "x"}})
    last = records.close()
    hourly, at_shutdown = records.recorder.written
    assert last is at_shutdown and records.errors == []
    assert hourly.statement["predicate"]["totals"] == {"requests": 2, "tokens": 8, "drafted": 8, "accepted": 6, "acceptance_rate": 0.75, "fallbacks": 0}
    assert at_shutdown.statement["predicate"]["totals"]["requests"] == 1 and at_shutdown.statement["predicate"]["totals"]["fallbacks"] == 1
    assert at_shutdown.statement["predicate"]["kind"] == "serve" and "text" not in json.dumps(at_shutdown.statement["predicate"]["totals"])
    checks = _check(store, REF, _trusted(other_keypair[1]))
    assert [c.digest for c in checks] == [hourly.record, at_shutdown.record] and all(c.verified for c in checks)


def test_rm_keeps_records_until_gc_removes_them_with_their_bundle(tree: Path, tmp_path: Path, keypair, other_keypair) -> None:
    store = tmp_path / "store"
    run_bundle("pack", str(tree), "-t", REF, "--key", str(keypair[0]), "--store", str(store), check=True)
    written = _record_without_a_model(store, REF, other_keypair[0])
    _, manifest = Store(store).read_json_blob(_records(store)[0])
    record_blobs = [written.record, manifest["layers"][0]["digest"]]
    run_bundle("gc", "--store", str(store), check=True)  # the bundle is tagged: its record stays
    assert [r.digest for r in _records(store)] == [written.record]
    run_bundle("rm", REF, "--store", str(store), check=True)
    assert [r.digest for r in _records(store)] == [written.record]  # rm removes the tag only
    assert all(Store(store).has_blob(d) for d in record_blobs)
    run_bundle("gc", "--store", str(store), check=True)
    assert _records(store) == []
    assert not any(Store(store).has_blob(d) for d in record_blobs)
