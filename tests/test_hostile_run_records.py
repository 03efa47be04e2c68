"""Hostile run records from registries and stores: more records than kept (trusted first), a record manifest that is a
nesting bomb, a damaged record blob: pull keeps a bounded set, push passes on only what pull would keep, gc drops
them with their bundle."""

from __future__ import annotations

import json
from pathlib import Path

from attacker import StoreEditor
from bundletree import make_tree
from conftest import run_bundle
from hostile_store import _no_creds
from registry_server import registry  # noqa: F401  (fixture)


def _write_record(store: Path, ref: str, signer_key: Path, n: int, extra: dict | None = None) -> str:
    """A run record written by the library (as serve writes one), its window starting n minutes after 09:00."""
    import datetime as dt

    from bundler.trust import runrecord
    from bundler.trust.keys import load_private_key
    from bundler.store.modelkit import load_modelkit
    from bundler.store.refs import parse_ref
    from bundler.store.layout import Store

    s = Store(store)
    mk = load_modelkit(s, parse_ref(ref))
    ctx = runrecord.Context("serve", ref, mk.digest, mk.kitfile.name, mk.kitfile.version, "ab" * 32, ("manifest", "signature"),
                            "sha256:" + "cd" * 32, {**mk.kitfile.parameters, **(extra or {})}, {}, "torch", "cpu", "float32")
    started = dt.datetime(2026, 12, 1, 9, 0, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=n)
    recorder = runrecord.Recorder(s, ctx, load_private_key(signer_key), started=started)
    recorder.add({"new_tokens": 4, "drafted": 6, "accepted": 3, "fallback": None})
    return recorder.flush(started + dt.timedelta(seconds=30)).record


def _record_digests(store: Path) -> set[str]:
    index = json.loads((store / "index.json").read_text())
    return {m["digest"] for m in index["manifests"] if m.get("artifactType") == "application/vnd.in-toto+json"}


def _attach_all(store: Path, ref: str, host: str) -> None:
    """An attacker with push rights attaches every record of `store` to the bundle in the registry, past push's limits."""
    from bundler.registry import push as pushing, remote
    from bundler.registry.client import client_for
    from bundler.store.modelkit import load_modelkit
    from bundler.store.refs import parse_ref
    from bundler.store.referrers import find_records
    from bundler.store.layout import Store

    s, parsed = Store(store), parse_ref(ref)
    digest = load_modelkit(s, parsed).digest
    client = client_for(parsed, plain_http=True)
    uploader = pushing._Uploader(client, s, None)
    records = []
    for desc in find_records(s, digest):
        _, manifest = s.read_json_blob(desc)
        blobs = [remote._descriptor(x, "record") for x in [manifest["config"], *manifest["layers"]]]
        for blob in blobs:
            uploader.upload(blob, "record blob")
        records.append((desc, s.read_json_blob(desc)[0], blobs))
    pushing.push_records(client, digest, records)


def test_pull_keeps_a_bounded_number_of_records_trusted_first(registry, tmp_path: Path, keypair, other_keypair) -> None:
    from bundler.trust.keys import generate_keypair
    from bundler.trust.recordlimits import MAX_RECORDS

    env = _no_creds(tmp_path)
    ref = f"{registry.host}/bounded/tiny-spec:v1"
    src, dst = tmp_path / "src", tmp_path / "dst"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", ref, "--key", str(keypair[0]), "--store", str(src), check=True)
    trusted = {_write_record(src, ref, other_keypair[0], n) for n in range(0, 2 * 12, 2)}  # 12, the oldest
    stranger = generate_keypair(tmp_path / "stranger")[0]
    untrusted = {_write_record(src, ref, stranger, n) for n in range(1, 2 * (MAX_RECORDS + 4), 2)}  # 36, newer
    run_bundle("push", ref, "--plain-http", "--store", str(src), env=env, check=True)
    _attach_all(src, ref, registry.host)  # all 48, past push's own limit
    pulled = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--key", str(other_keypair[1]),
                        "--store", str(dst), env=env)
    assert pulled.code == 0, pulled.err
    assert f"{MAX_RECORDS} run record(s)" in pulled.out and "16 more run record(s) not kept" in pulled.out
    kept = _record_digests(dst)
    assert len(kept) == MAX_RECORDS
    assert trusted <= kept  # every record signed by a trusted key, although the oldest
    assert len(kept & untrusted) == MAX_RECORDS - len(trusted)
    # Nothing of a dropped record is in the store.
    for digest in untrusted - kept:
        assert not (dst / "blobs" / "sha256" / digest[7:]).exists()


def test_push_passes_on_only_what_pull_would_keep(registry, tmp_path: Path, keypair, other_keypair) -> None:
    from bundler.trust.recordlimits import MAX_RECORDS

    env = _no_creds(tmp_path)
    ref = f"{registry.host}/pushed/tiny-spec:v1"
    src = tmp_path / "src"
    digest = run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", ref, "--key", str(keypair[0]), "--store", str(src), check=True).out.split()[-1]
    for n in range(MAX_RECORDS + 3):
        _write_record(src, ref, other_keypair[0], n)
    big = _write_record(src, ref, other_keypair[0], 99, extra={"padding": "x" * (80 << 10)})  # one record over 64 KiB
    pushed = run_bundle("push", ref, "--plain-http", "--store", str(src), env=env)
    assert pushed.code == 0, pushed.err
    assert f"{MAX_RECORDS} run record(s)" in pushed.out
    index = requests_index(registry.host, "pushed/tiny-spec", digest)
    records = [m["digest"] for m in index if m["artifactType"] == "application/vnd.in-toto+json"]
    assert len(records) == MAX_RECORDS and big not in records


def test_a_record_manifest_that_is_a_nesting_bomb_is_skipped_by_pull(tmp_path: Path, keypair) -> None:
    import hashlib

    from hostile_registry import Reply, hostile

    oci_manifest, oci_index = "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json"
    store = tmp_path / "store"
    digest = run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]),
                        "--store", str(store), check=True).out.split()[-1]
    index = json.loads((store / "index.json").read_text())
    [bundle] = [m for m in index["manifests"] if "annotations" in m]
    [sig] = StoreEditor(store).signatures(kind="model-signing")  # the registry serves this one signature
    bomb = b"[" * 30_000 + b"]" * 30_000  # under the size a record may have, far over any nesting
    bomb_digest = "sha256:" + hashlib.sha256(bomb).hexdigest()
    listing = json.dumps({"schemaVersion": 2, "mediaType": oci_index, "manifests": [
        sig, {"mediaType": oci_manifest, "digest": bomb_digest, "size": len(bomb), "artifactType": "application/vnd.in-toto+json"}]}).encode()

    def blob(d: str) -> bytes:
        return (store / "blobs" / "sha256" / d.split(":")[1]).read_bytes()

    def route(req, body: bytes) -> Reply:
        if req.path.endswith("/manifests/1.0.0"):
            return Reply(200, {"Content-Type": oci_manifest}, blob(bundle["digest"]))
        if req.path.endswith("/manifests/" + digest.replace(":", "-")):
            return Reply(200, {"Content-Type": oci_index}, listing)
        if req.path.endswith(f"/manifests/{sig['digest']}"):
            return Reply(200, {"Content-Type": oci_manifest}, blob(sig["digest"]))
        if req.path.endswith(f"/manifests/{bomb_digest}"):
            return Reply(200, {"Content-Type": oci_manifest}, bomb)
        if "/blobs/sha256:" in req.path:
            return Reply(200, {}, blob(req.path.rsplit("/", 1)[1]))
        return Reply(404)

    with hostile(route) as reg:
        result = run_bundle("pull", f"{reg.host}/org/tiny-spec:1.0.0", "--plain-http", "--key", str(keypair[1]),
                            "--store", str(tmp_path / "pulled"), env=_no_creds(tmp_path))
    assert result.code == 0, result.err
    assert _record_digests(tmp_path / "pulled") == set()


def requests_index(host: str, repository: str, digest: str) -> list[dict]:
    import requests

    resp = requests.get(f"http://{host}/v2/{repository}/manifests/sha256-{digest[7:]}",
                        headers={"Accept": "application/vnd.oci.image.index.v1+json"}, timeout=10)
    return resp.json()["manifests"]


def test_gc_drop_records_removes_every_run_record(tmp_path: Path, keypair, other_keypair) -> None:
    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--store", str(store), check=True)
    records = {_write_record(store, "tiny-spec:1.0.0", other_keypair[0], n) for n in range(3)}
    kept = run_bundle("gc", "--store", str(store), "--json", check=True)
    assert json.loads(kept.out)["removed_manifests"] == [] and _record_digests(store) == records
    dropped = run_bundle("gc", "--drop-records", "--store", str(store), "--json", check=True)
    assert sorted(json.loads(dropped.out)["removed_manifests"]) == sorted(records)
    assert _record_digests(store) == set()
    assert not any((store / "blobs" / "sha256" / d[7:]).exists() for d in records)
    assert run_bundle("verify", "tiny-spec:1.0.0", "--key", str(keypair[1]), "--store", str(store)).code == 0


def test_a_damaged_run_record_blob_is_not_pushed(registry, tmp_path: Path, keypair, other_keypair) -> None:
    from attacker import StoreEditor

    env = _no_creds(tmp_path)
    ref = f"{registry.host}/damaged-records/tiny-spec:v1"
    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", ref, "--key", str(keypair[0]), "--store", str(store), check=True)
    good, bad = (_write_record(store, ref, other_keypair[0], n) for n in range(2))
    edit = StoreEditor(store)
    layer = json.loads(edit.read(bad))["layers"][0]["digest"]
    data = bytearray(edit.read(layer))
    data[10] ^= 1
    edit.overwrite(layer, bytes(data))
    pushed = run_bundle("push", ref, "--plain-http", "--store", str(store), env=env)
    assert pushed.code == 0 and "1 run record(s)" in pushed.out, pushed.out + pushed.err
