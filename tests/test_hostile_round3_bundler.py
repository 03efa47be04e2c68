"""Hostile inputs, round three (issue #24), the bundler's surfaces: model directories given to `init` and
`pack`, run records from registries, metadata shown on a terminal, private state files, every blob under a
verified manifest, and bundle metadata parsed before trust.

Each test runs the `bundle` command as a user would, on real directories, a real store and (for records) a
real registry on 127.0.0.1; an attack is refused with its one-line `error: [code]` and exit code, and nothing
is written that should not be.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from attacker import StoreEditor
from bundletree import make_tree
from conftest import run_bundle, tree_digest
from registry_server import registry  # noqa: F401  (fixture)

SECRET = "registry-password-0123456789"


# ---------------------------------------------------------------- 1. init and pack read only what is inside


def _models(root: Path) -> dict[str, Path]:
    """Two model directories as downloaded (config.json, model.safetensors), and a tokenizer directory."""
    tree = make_tree(root / "made")
    return {"target": tree / "target", "draft": tree / "draft", "tokenizer": tree / "tokenizer", "root": root}


def _init(models: dict[str, Path], out: Path, target: Path | None = None, tokenizer: Path | None = None):
    return run_bundle("init", "--target", str(target or models["target"]), "--draft", str(models["draft"]),
                      "--tokenizer", str(tokenizer or models["tokenizer"]), "-o", str(out), "--name", "tiny",
                      env={"BUNDLE_HOME": str(models["root"] / "store")})


def _refused_link(result, out: Path, link: Path) -> None:
    """Exit 6, one line naming the link, nothing left at CONTEXT nor beside it, the secret nowhere."""
    assert result.code == 6, result.err
    assert result.err.startswith("error: [invalid-bundle] ") and len(result.err.strip().splitlines()) == 1, result.err
    assert str(link) in result.err and "outside" in result.err, result.err
    assert SECRET not in result.err + result.out
    assert not out.exists()
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.init-")]


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    return _models(tmp_path)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """A file outside every model directory, like ~/.docker/config.json."""
    path = tmp_path / "home" / ".docker" / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"auths": {"registry.example": {"auth": SECRET}}}))
    return path


@pytest.mark.parametrize("where", ["/proc/self/environ", "/etc/passwd", "/dev/zero", "/sys/kernel/mm/transparent_hugepage/enabled"])
def test_init_refuses_a_link_to_a_system_file(models: dict[str, Path], tmp_path: Path, where: str) -> None:
    link = models["target"] / "generation_config.json"
    link.symlink_to(where)
    out = tmp_path / "ctx"
    result = run_bundle("init", "--target", str(models["target"]), "--draft", str(models["draft"]),
                        "--tokenizer", str(models["tokenizer"]), "-o", str(out), "--name", "tiny",
                        env={"BUNDLE_HOME": str(tmp_path / "store"), "REGISTRY_PASSWORD": SECRET})
    _refused_link(result, out, link)
    assert where in result.err  # where the link leads, as written


def test_init_refuses_an_absolute_link_to_a_private_file(models: dict[str, Path], secret_file: Path, tmp_path: Path) -> None:
    link = models["target"] / "special_tokens_map.json"
    link.symlink_to(secret_file)
    _refused_link(_init(models, tmp_path / "ctx"), tmp_path / "ctx", link)


def test_init_refuses_a_link_upwards(models: dict[str, Path], secret_file: Path, tmp_path: Path) -> None:
    link = models["draft"] / "notes.json"
    link.symlink_to(os.path.relpath(secret_file, models["draft"]))
    _refused_link(_init(models, tmp_path / "ctx"), tmp_path / "ctx", link)


def test_init_refuses_a_link_in_the_tokenizer_directory(models: dict[str, Path], secret_file: Path, tmp_path: Path) -> None:
    link = models["tokenizer"] / "special_tokens_map.json"
    link.symlink_to(secret_file)
    _refused_link(_init(models, tmp_path / "ctx"), tmp_path / "ctx", link)


def test_init_never_walks_a_directory_link_leaving_the_tree(models: dict[str, Path], secret_file: Path, tmp_path: Path) -> None:
    link = models["target"] / "extra"
    link.symlink_to(secret_file.parent)  # a directory: its files would otherwise become target/extra/*
    _refused_link(_init(models, tmp_path / "ctx"), tmp_path / "ctx", link)


def test_init_follows_links_that_stay_inside(models: dict[str, Path], tmp_path: Path) -> None:
    (models["target"] / "weights").mkdir()
    os.rename(models["target"] / "model.safetensors", models["target"] / "weights" / "model.safetensors")
    (models["target"] / "model.safetensors").symlink_to(Path("weights", "model.safetensors"))
    (models["target"] / "same").symlink_to("weights")  # a directory link inside the tree
    out = tmp_path / "ctx"
    result = _init(models, out)
    assert result.code == 0, result.err
    assert (out / "target" / "model.safetensors").is_file() and not (out / "target" / "model.safetensors").is_symlink()
    assert (out / "target" / "same" / "model.safetensors").is_file()


def _cache_repo(hub: Path, name: str, source: Path) -> Path:
    """A Hugging Face hub cache repository as the hub writes it: blobs/<hash> and snapshots/<rev>/<file> links
    (relative, `../../blobs/<hash>`, one more `..` per subdirectory). Returns the snapshot directory."""
    repo = hub / f"models--org--{name}"
    snapshot = repo / "snapshots" / ("a1" * 20)
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a1" * 20)
    for i, src in enumerate(sorted(p for p in source.rglob("*") if p.is_file())):
        rel = src.relative_to(source)
        blob = repo / "blobs" / f"{i:064x}"
        shutil.copyfile(src, blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(*[".."] * (len(rel.parts) + 1), "blobs", blob.name))
    return snapshot


def test_init_reads_real_hugging_face_cache_snapshots(models: dict[str, Path], tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    (models["target"] / "sub").mkdir()
    (models["target"] / "sub" / "extra.json").write_text("{}")  # a file one directory down: ../../../blobs/
    target = _cache_repo(hub, "tiny-target", models["target"])
    tokenizer = _cache_repo(hub, "tiny-tokenizer", models["tokenizer"])
    out = tmp_path / "ctx"
    result = _init(models, out, target=target, tokenizer=tokenizer)
    assert result.code == 0, result.err
    assert (out / "target" / "sub" / "extra.json").read_text() == "{}"
    assert (out / "target" / "model.safetensors").read_bytes() == (models["target"] / "model.safetensors").read_bytes()
    assert not any(p.is_symlink() for p in out.rglob("*"))


def test_init_names_a_cache_snapshot_after_its_repository(models: dict[str, Path], tmp_path: Path) -> None:
    import yaml

    target = _cache_repo(tmp_path / "hub", "Tiny-Target", models["target"])
    out = tmp_path / "ctx"
    result = run_bundle("init", "--target", str(target), "--draft", str(models["draft"]), "--tokenizer", str(models["tokenizer"]),
                        "-o", str(out), env={"BUNDLE_HOME": str(tmp_path / "store")})
    assert result.code == 0, result.err
    kitfile = yaml.safe_load((out / "Kitfile").read_text())
    assert kitfile["package"]["name"] == "tiny-target" and kitfile["model"]["name"] == "tiny-target"  # not the revision hash


def test_init_refuses_a_cache_link_into_another_cached_repository(models: dict[str, Path], tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    target = _cache_repo(hub, "tiny-target", models["target"])
    other = _cache_repo(hub, "someone-else", models["draft"])
    stolen = next((other.parent.parent / "blobs").iterdir())
    link = target / "stolen.json"
    link.symlink_to(Path("..", "..", "..", other.parent.parent.name, "blobs", stolen.name))
    _refused_link(_init(models, tmp_path / "ctx", target=target), tmp_path / "ctx", link)


def test_init_refuses_a_cache_snapshot_link_to_a_system_file(models: dict[str, Path], tmp_path: Path) -> None:
    target = _cache_repo(tmp_path / "hub", "tiny-target", models["target"])
    link = target / "config.json"
    link.unlink()
    link.symlink_to("/proc/self/environ")
    _refused_link(_init(models, tmp_path / "ctx", target=target), tmp_path / "ctx", link)


def test_pack_refuses_a_kitfile_linked_from_outside_the_context(tmp_path: Path, secret_file: Path) -> None:
    tree = make_tree(tmp_path / "ctx")
    outside = tmp_path / "elsewhere" / "Kitfile"
    outside.parent.mkdir()
    os.rename(tree / "Kitfile", outside)
    (tree / "Kitfile").symlink_to(outside)
    store = tmp_path / "store"
    result = run_bundle("pack", str(tree), "-t", "tiny:1", "--store", str(store))
    assert result.code == 6, result.err
    assert result.err.startswith("error: [invalid-kitfile] ") and str(tree / "Kitfile") in result.err, result.err
    assert tree_digest(store / "blobs") == "absent"


def test_pack_refuses_a_linked_file_in_a_layer(tmp_path: Path, secret_file: Path) -> None:
    tree = make_tree(tmp_path / "ctx")
    (tree / "draft" / "generation_config.json").symlink_to(secret_file)
    store = tmp_path / "store"
    result = run_bundle("pack", str(tree), "-t", "tiny:1", "--store", str(store))
    assert result.code == 6, result.err
    assert "symlink" in result.err and SECRET not in result.err
    assert tree_digest(store / "blobs") == "absent"


# ---------------------------------------------------------------- 5. run records from registries are bounded


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


def _no_creds(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "no-docker").mkdir(exist_ok=True)
    return {"DOCKER_CONFIG": str(tmp_path / "no-docker"), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""}


def _attach_all(store: Path, ref: str, host: str) -> None:
    """An attacker with push rights attaches every record of `store` to the bundle in the registry, past push's limits."""
    from bundler.registry import pull as pulling, push as pushing
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
        blobs = [pulling._descriptor(x, "record") for x in [manifest["config"], *manifest["layers"]]]
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


# ---------------------------------------------------------------- 6. what is shown is what was verified

HOSTILE_TEXT = "x\n\rok   sha256:0000  signer abcdef \x1b[2J\x1b]0;title\x07\u202egnp.exe\u2028"
RAW_CONTROLS = ("\x1b", "\r", "\x07", "\u202e", "\u2028")


def _clean_screen(text: str) -> None:
    """No control or format character a terminal would act on (newlines only between lines we print)."""
    assert not any(c in text for c in RAW_CONTROLS), repr(text)


def test_attestations_show_an_unverified_record_escaped_and_not_as_a_verified_row(tmp_path: Path, keypair, other_keypair) -> None:
    from bundler.trust import runrecord
    from bundler.trust.keys import load_private_key
    from bundler.store.modelkit import load_modelkit
    from bundler.store.refs import parse_ref
    from bundler.store.layout import Store

    store = tmp_path / "store"
    digest = run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]),
                        "--store", str(store), check=True).out.split()[-1]
    s = Store(store)
    mk = load_modelkit(s, parse_ref("tiny-spec:1.0.0"))
    statement = {"_type": "https://in-toto.io/Statement/v1", "subject": [{"name": "tiny-spec", "digest": {"sha256": digest[7:]}}],
                 "predicateType": runrecord.PREDICATE_TYPE,
                 "predicate": {"kind": HOSTILE_TEXT, "started": HOSTILE_TEXT, "finished": HOSTILE_TEXT, "engine": HOSTILE_TEXT,
                               "totals": {"requests": HOSTILE_TEXT, "acceptance_rate": 10 ** 400}}}
    envelope = runrecord.sign_statement(statement, load_private_key(keypair[0]))  # a key not trusted for records
    runrecord.store_record(s, mk.manifest_desc, envelope)
    result = run_bundle("attestations", "tiny-spec:1.0.0", "--key", str(other_keypair[1]), "--store", str(store))
    assert result.code == 3 and len(result.err.strip().splitlines()) == 1, result.err
    _clean_screen(result.out + result.err)
    lines = result.out.splitlines()
    assert len(lines) == 3, lines  # the count, the FAIL row, its claims
    assert lines[1].startswith("FAIL ") and "NOT VERIFIED: error: [" in lines[1]
    assert lines[2].startswith("     claimed, not checked: ") and "\\x1b[2J" in lines[2] and "\\u202e" in lines[2]
    assert not any(line.startswith("ok") for line in lines)
    as_json = json.loads(run_bundle("attestations", "tiny-spec:1.0.0", "--key", str(other_keypair[1]), "--store", str(store), "--json").out)
    assert as_json[0]["verified"] is False and as_json[0]["statement"]["predicate"]["kind"] == HOSTILE_TEXT  # JSON keeps it whole


def test_list_inspect_and_errors_show_bundle_metadata_escaped(tmp_path: Path, keypair) -> None:
    from attacker import StoreEditor

    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", "tiny-spec:1.0.0", "--store", str(store), check=True)
    edit = StoreEditor(store)

    def hostile(cfg: dict) -> None:
        cfg["package"]["name"] = HOSTILE_TEXT
        cfg["package"]["version"] = HOSTILE_TEXT

    edit.rewrite("tiny-spec:1.0.0", config=hostile)
    listed = run_bundle("list", "--store", str(store))
    assert listed.code == 0, listed.err
    _clean_screen(listed.out)
    assert len(listed.out.splitlines()) == 2 and "\\x1b[2J" in listed.out
    inspected = run_bundle("inspect", "tiny-spec:1.0.0", "--store", str(store))
    _clean_screen(inspected.out + inspected.err)
    assert len(inspected.err.strip().splitlines()) <= 1 and "[internal]" not in inspected.err
    verified = run_bundle("verify", "tiny-spec:1.0.0", "--allow-unsigned", "--store", str(store))
    assert verified.code == 6 and verified.err.startswith("error: [invalid-kitfile] "), verified.err
    assert len(verified.err.strip().splitlines()) == 1
    _clean_screen(verified.out + verified.err)


def test_shown_escapes_controls_and_cuts_long_values() -> None:
    from core.display import MAX_SHOWN, shown

    assert shown("a\nb\x1b[31mc\u202ed\ud800") == "a\\nb\\x1b[31mc\\u202ed\\ud800"
    assert shown("plain text, tiny-spec 1.0.0") == "plain text, tiny-spec 1.0.0"
    assert len(shown("y" * 10_000)) == MAX_SHOWN


# ---------------------------------------------------------------- 8. state files are bounded


def test_oversized_run_history_is_ignored_and_replaced(tmp_path: Path) -> None:
    from bundler.verbs.run import HISTORY_MAX_BYTES, HISTORY_STATE, run_history
    from bundler.store.layout import PRIVATE, Store

    store = Store(tmp_path / "store")
    store.ensure()
    path = tmp_path / "store" / PRIVATE / f"{HISTORY_STATE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"[" + b"[]," * (HISTORY_MAX_BYTES // 3 + 10) + b"[]]")  # a valid JSON array, too large
    history = run_history(store, "sha256:" + "a" * 64)
    assert (history.runs, history.unpaid) == (0, 0)
    history.record({"speculative_iterations": 3, "fallback": None}, advised=False, seeded=False)
    replaced = json.loads(path.read_text())
    assert isinstance(replaced, dict) and len(replaced) == 1 and path.stat().st_size < 1024


@pytest.mark.parametrize("content", [b"[1, 2]", b'"text"', b"{\"k\": " * 5000, b"\xff\xfe"])
def test_malformed_run_history_is_ignored_and_replaced(tmp_path: Path, content: bytes) -> None:
    from bundler.verbs.run import HISTORY_STATE, run_history
    from bundler.store.layout import PRIVATE, Store

    store = Store(tmp_path / "store")
    store.ensure()
    path = tmp_path / "store" / PRIVATE / f"{HISTORY_STATE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    history = run_history(store, "sha256:" + "b" * 64)
    history.record({"speculative_iterations": 1, "fallback": None}, advised=False, seeded=False)
    assert list(json.loads(path.read_text()).values()) == [{"runs": 1, "unpaid": 0}]


def test_oversized_rollback_memory_is_refused_before_parsing(tmp_path: Path, keypair) -> None:
    from bundler.store.layout import MAX_STATE

    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--store", str(store), check=True)
    path = store / ".specbundle" / "versions.json"
    path.write_bytes(b"{\"x\": [" + b"[]," * (MAX_STATE // 3) + b"[]]}")
    result = run_bundle("verify", "tiny-spec:1.0.0", "--key", str(keypair[1]), "--store", str(store))
    assert result.code == 3 and result.err.startswith("error: [integrity] ") and "versions.json" in result.err, result.err


def test_a_damaged_upload_session_file_starts_the_upload_afresh(registry, tmp_path: Path, keypair) -> None:
    import hashlib

    env = _no_creds(tmp_path)
    ref = f"{registry.host}/sessions/tiny-spec:v1"
    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", ref, "--key", str(keypair[0]), "--store", str(store), check=True)
    sessions = store / ".specbundle" / "uploads"
    sessions.mkdir(parents=True, exist_ok=True)
    where = hashlib.sha256(f"{registry.host}/sessions/tiny-spec".encode()).hexdigest()[:16]
    for i, blob in enumerate(sorted((store / "blobs" / "sha256").iterdir())):
        content = [b"[1, 2]", b"x" * (1 << 20), b'{"location": 7}', b'{"location": ' * 3000][i % 4]
        (sessions / f"{where}-{blob.name}.json").write_bytes(content)
    pushed = run_bundle("push", ref, "--plain-http", "--store", str(store), env=env)
    assert pushed.code == 0, pushed.err


@pytest.mark.parametrize("content", [b"[1]", b'{"auths": [1]}', b'{"credHelpers": "x"}', b"[" * 100_000, b" " * (5 << 20)])
def test_a_hostile_docker_config_is_a_registry_auth_error(tmp_path: Path, content: bytes) -> None:
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / "config.json").write_bytes(content)
    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", "127.0.0.1:9/x/tiny-spec:1.0.0", "--store", str(store), check=True)
    result = run_bundle("push", "127.0.0.1:9/x/tiny-spec:1.0.0", "--plain-http", "--store", str(store),
                        env={"DOCKER_CONFIG": str(docker), "BUNDLE_REGISTRY_USER": "", "BUNDLE_REGISTRY_PASSWORD": ""})
    assert result.code == 5 and result.err.startswith("error: [registry-auth] "), result.err
    assert len(result.err.strip().splitlines()) == 1


# ---------------------------------------------------------------- 9. every blob verify walks is checked


def test_a_damaged_signature_config_blob_fails_verify_and_is_never_pushed(registry, tmp_path: Path, keypair) -> None:
    from attacker import StoreEditor

    env = _no_creds(tmp_path)
    ref = f"{registry.host}/damaged/tiny-spec:v1"
    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", ref, "--key", str(keypair[0]), "--store", str(store), check=True)
    edit = StoreEditor(store)
    (sig,) = edit.signatures(edit.manifest_digest(ref), kind="model-signing")  # its config blob, the empty JSON object, is the cosign one's too
    config = json.loads(edit.read(sig["digest"]))["config"]
    assert config["size"] == 2  # the empty JSON object
    edit.overwrite(config["digest"], b"[]")  # same size, other bytes
    result = run_bundle("verify", ref, "--key", str(keypair[1]), "--store", str(store))
    assert result.code == 3 and result.err.startswith("error: [signature-missing] "), result.err
    assert f"signature artifact {sig['digest'][:19]}… is damaged" in result.err
    pushed = run_bundle("push", ref, "--plain-http", "--store", str(store), env=env)
    assert pushed.code == 3 and pushed.err.startswith("error: [digest-mismatch] ") and "nothing pushed" in pushed.err, pushed.err
    pulled = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "other"), env=env)
    assert pulled.code == 5 and "[registry-not-found]" in pulled.err, pulled.err  # not even the bundle reached the registry


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


# ---------------------------------------------------------------- 10. metadata parsed within bounds before trust


def _hostile_context(root: Path, role: str, name: str, content: bytes) -> Path:
    tree = make_tree(root)
    (tree / role / name).write_bytes(content)
    return tree


def _tokenizer_with(change) -> bytes:
    from bundletree import tokenizer_json

    data = json.loads(tokenizer_json())
    change(data)
    return json.dumps(data).encode()


def _safetensors(header: bytes) -> bytes:
    import struct

    return struct.pack("<Q", len(header)) + header


HOSTILE_METADATA = {
    "huge-token-id": ("tokenizer", "tokenizer.json", _tokenizer_with(lambda d: d["model"]["vocab"].update(big=2 ** 40))),
    "negative-token-id": ("tokenizer", "tokenizer.json", _tokenizer_with(lambda d: d["model"]["vocab"].update(neg=-5))),
    "string-token-id": ("tokenizer", "tokenizer.json", _tokenizer_with(lambda d: d["model"]["vocab"].update(s="7"))),
    "added-token-huge-id": ("tokenizer", "tokenizer.json", _tokenizer_with(lambda d: d.update(added_tokens=[{"id": 2 ** 62, "content": "x"}]))),
    "tokenizer-nesting-bomb": ("tokenizer", "tokenizer.json", b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "tokenizer-deep-nesting": ("tokenizer", "tokenizer.json", b'{"normalizer": ' + b'{"a": ' * 200 + b"1" + b"}" * 200 + b"}"),
    "tokenizer-a-list": ("tokenizer", "tokenizer.json", b"[1, 2, 3]"),
    "model-a-string": ("tokenizer", "tokenizer.json", b'{"model": "BPE"}'),
    "merges-of-numbers": ("tokenizer", "tokenizer.json", _tokenizer_with(lambda d: d["model"].update(merges=[[1, 2]]))),
    "special-token-a-list": ("tokenizer", "tokenizer_config.json", b'{"bos_token": ["<s>"]}'),
    "tokenizer-config-a-list": ("tokenizer", "tokenizer_config.json", b"[]"),
    "config-a-list": ("target", "config.json", b"[]"),
    "config-hidden-size-a-string": ("draft", "config.json", json.dumps({"model_type": "llama", "hidden_size": "64", "vocab_size": 10,
                                                                         "num_hidden_layers": 1, "num_attention_heads": 2}).encode()),
    "config-text-config-a-list": ("target", "config.json", json.dumps({"model_type": "llama", "text_config": [1]}).encode()),
    "safetensors-header-a-list": ("target", "model.safetensors", _safetensors(b"[]")),
    "safetensors-shape-a-string": ("target", "model.safetensors", _safetensors(b'{"w": {"dtype": "F32", "shape": "64,64", "data_offsets": [0, 0]}}')),
    "safetensors-tensor-a-number": ("draft", "model.safetensors", _safetensors(b'{"w": 5}')),
    "safetensors-header-nesting-bomb": ("draft", "model.safetensors", _safetensors(b"{\"w\": " + b"[" * 50_000 + b"]" * 50_000 + b"}")),
    "safetensors-huge-header": ("target", "model.safetensors", (2 ** 40).to_bytes(8, "little") + b"{}"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_METADATA))
def test_inspect_of_an_unsigned_bundle_refuses_hostile_metadata_with_exit_6(tmp_path: Path, case: str) -> None:
    from unchecked_pack import pack_unchecked

    role, name, content = HOSTILE_METADATA[case]
    store = tmp_path / "store"
    pack_unchecked(_hostile_context(tmp_path / "ctx", role, name, content), "tiny-spec:1.0.0", store)
    result = run_bundle("inspect", "tiny-spec:1.0.0", "--store", str(store))
    assert result.code == 6, result.out + result.err
    assert result.err.startswith("error: [invalid-bundle] ") and len(result.err.strip().splitlines()) == 1, result.err
    assert name in result.err
    as_json = run_bundle("inspect", "tiny-spec:1.0.0", "--json", "--store", str(store))
    assert as_json.code == 6 and json.loads(as_json.out)["error"]["code"] == "invalid-bundle"


@pytest.mark.parametrize("case", ["huge-token-id", "tokenizer-nesting-bomb", "config-hidden-size-a-string", "safetensors-shape-a-string"])
def test_pack_refuses_hostile_metadata_in_a_model_directory(tmp_path: Path, case: str) -> None:
    role, name, content = HOSTILE_METADATA[case]
    store = tmp_path / "store"
    result = run_bundle("pack", str(_hostile_context(tmp_path / "ctx", role, name, content)), "-t", "tiny-spec:1.0.0", "--store", str(store))
    assert result.code == 6 and result.err.startswith("error: [invalid-bundle] "), result.err
    assert tree_digest(store / "blobs") == "absent"


def test_verify_bounds_a_hostile_tokenizer_copy_before_the_signature(tmp_path: Path) -> None:
    from unchecked_pack import pack_unchecked

    tree = make_tree(tmp_path / "ctx")
    (tree / "target" / "tokenizer.json").write_bytes(HOSTILE_METADATA["huge-token-id"][2])  # a copy that differs
    store = tmp_path / "store"
    pack_unchecked(tree, "tiny-spec:1.0.0", store)
    result = run_bundle("verify", "tiny-spec:1.0.0", "--allow-unsigned", "--store", str(store))
    assert result.code == 6 and "[invalid-bundle]" in result.err and "tokenizer.json" in result.err, result.err


# A value of another JSON type put anywhere in a real file: what metadatacheck lets through, the runner's
# readers must take without an exception other than BundleError.
REPLACEMENTS = ([], {}, "7", 2 ** 40, -1, None, True, 1.5, [[["x"]]], {"content": 3}, ["a", "b"], [0, 0])


def _mutate(value, rng, depth: int = 0):
    """`value` with one node, chosen at random along a random path, replaced by a value of another type."""
    import copy

    value = copy.deepcopy(value)
    if not isinstance(value, (dict, list)) or not value or rng.random() < 0.15 * depth:
        return rng.choice(REPLACEMENTS)
    keys = list(value) if isinstance(value, dict) else list(range(len(value)))
    key = rng.choice(keys[:50])
    value[key] = _mutate(value[key], rng, depth + 1)
    return value


def test_mutated_metadata_is_refused_or_read_cleanly(tmp_path: Path) -> None:
    import random
    import struct

    from core.errors import BundleError
    from bundler.format.metadatacheck import check_roles
    from runner.checks import modelinfo, tokenizer_gate

    tree = make_tree(tmp_path / "ctx")
    originals = {
        ("tokenizer", "tokenizer.json"): json.loads((tree / "tokenizer" / "tokenizer.json").read_text()),
        ("tokenizer", "tokenizer_config.json"): json.loads((tree / "tokenizer" / "tokenizer_config.json").read_text()),
        ("target", "config.json"): json.loads((tree / "target" / "config.json").read_text()),
    }
    weights = (tree / "draft" / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", weights[:8])
    header = json.loads(weights[8:8 + n])
    rng = random.Random(24)
    outcomes = {"refused": 0, "read": 0}
    for case in range(300):
        work = tmp_path / f"case{case}"
        shutil.copytree(tree, work)
        which = rng.randrange(len(originals) + 1)
        if which == len(originals):
            body = json.dumps(_mutate(header, rng)).encode()
            (work / "draft" / "model.safetensors").write_bytes(struct.pack("<Q", len(body)) + body + weights[8 + n:])
        else:
            (role, name), original = list(originals.items())[which]
            (work / role / name).write_text(json.dumps(_mutate(original, rng)))
        try:
            check_roles(work, {"target": "target", "draft": "draft", "tokenizer": "tokenizer"})
        except BundleError:
            outcomes["refused"] += 1
            shutil.rmtree(work)
            continue
        try:
            tokenizer_gate.fingerprint(work / "tokenizer")
            modelinfo.count_parameters(work / "draft")
            modelinfo.estimate_memory(work / "target", work / "draft", "float32", 64)
            outcomes["read"] += 1
        except BundleError:
            outcomes["read"] += 1  # a clean refusal of the runner's own
        shutil.rmtree(work)
    assert outcomes["refused"] > 50 and outcomes["read"] > 50, outcomes


def test_a_damaged_second_signature_fails_verify_although_the_other_holds(tmp_path: Path, keypair) -> None:
    """Item 9 with two signatures: the cosign-style one's Sigstore bundle damaged, the model-signing one intact.
    verify does not verify around the damage: the store is refused, naming the artifact."""
    from attacker import StoreEditor

    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--store", str(store), check=True)
    edit = StoreEditor(store)
    (sig,) = edit.signatures(edit.manifest_digest("tiny-spec:1.0.0"), kind="cosign")
    layer = json.loads(edit.read(sig["digest"]))["layers"][0]["digest"]
    data = edit.read(layer)
    edit.overwrite(layer, data[:-2] + b" }")  # same size, other bytes
    result = run_bundle("verify", "tiny-spec:1.0.0", "--key", str(keypair[1]), "--store", str(store))
    assert result.code == 3 and result.err.startswith("error: [digest-mismatch] "), result.err
    assert f"signature artifact {sig['digest'][:19]}… in the store is damaged" in result.err
