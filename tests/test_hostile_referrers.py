"""Hostile referrers: signature artifacts anyone who can push to a repository can attach to a bundle.

Every value read from a referrer, an annotation or a signature is type-checked before use: a malformed or
unsigned candidate is skipped (or refused as `signature-invalid` when it is the only one), never decides and
never ends `verify`, `pull` or `fetch` in an internal error. Expiry takes RFC 3339 UTC with `Z` only.
Each test runs the `bundle` command as a process, on a real store and, for pull and fetch, a real registry
(behind a relaying attacker where the registry itself would refuse the attacker's index).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import requests

from conftest import run_bundle
from hostile_registry import Reply, Seen, hostile
from registry_server import Registry, registry  # noqa: F401  (fixture)

from bundler.store.layout import Store
from bundler.store.modelkit import file_hashes, load_modelkit
from bundler.store.referrers import find_signatures
from bundler.store.refs import parse_ref
from bundler.trust import cosign, keys, signature
from bundler.trust.sign import attach_signature, signed_fields

REF = "tiny-spec:1.0.0"
INDEX = "application/vnd.oci.image.index.v1+json"
SIG_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"


def _pack(tree: Path, store: Path, key: Path | None, ref: str = REF) -> str:
    args = ["pack", str(tree), "-t", ref, "--store", str(store)] + (["--key", str(key)] if key else [])
    return run_bundle(*args, check=True).out.strip().splitlines()[-1]


def _drop(store: Path, digest: str, kind: str) -> None:
    """Take this kind of signature off the bundle (as `cosign sign` alone, or model_signing alone, would leave it)."""
    s = Store(store)
    for desc, payload in find_signatures(s, digest):
        if cosign.kind_of(payload) == kind:
            with s.lock():
                s.remove_manifest(desc.digest)


def _attach(store: Path, payload: bytes, ref: str = REF) -> None:
    s = Store(store)
    attach_signature(s, load_modelkit(s, parse_ref(ref)), payload, {})


def _cosign(digest: str, key: Path, annotations: dict[str, Any] | None = None, hint: Any = "keep") -> bytes:
    """A cosign-style signature of `digest` by `key`, its unsigned hint replaced unless "keep"."""
    bundle = json.loads(cosign.sign_digest(digest, keys.load_private_key(key), annotations))
    if hint != "keep":
        bundle["verificationMaterial"]["publicKey"]["hint"] = hint
    return json.dumps(bundle).encode()


def _verify(store: Path, pub: Path, ref: str = REF) -> tuple[Any, dict[str, Any]]:
    result = run_bundle("verify", ref, "--key", str(pub), "--json", "--store", str(store))
    assert "Traceback" not in result.err and "[internal]" not in result.err, result.err
    return result, json.loads(result.out)


def _refused(result: Any, report: dict[str, Any], code: str) -> None:
    assert result.code == 3, result.err
    assert result.err.startswith(f"error: [{code}] ") and len(result.err.strip().splitlines()) == 1, result.err
    assert report["error"]["code"] == code


# ---------------------------------------------------------------- the hint: outside the signed bytes


@pytest.mark.parametrize("hint", [[], {}, 5, True, ["a"]], ids=["list", "object", "number", "bool", "list-of-str"])
def test_a_cosign_referrer_whose_hint_is_not_a_string_is_skipped(tree: Path, store_dir: Path, keypair, hint: Any) -> None:
    digest = _pack(tree, store_dir, keypair[0])
    _attach(store_dir, _cosign(digest, keypair[0], hint=hint))
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 0, result.err
    bad = [s for s in report["signatures"] if s["kind"] == "cosign" and not s["verified"]]
    assert len(bad) == 1 and bad[0]["error"]["code"] == "signature-invalid" and "hint" in bad[0]["error"]["message"]


def test_a_cosign_only_bundle_whose_hint_is_not_a_string_is_refused_as_invalid(tree: Path, store_dir: Path, keypair) -> None:
    digest = _pack(tree, store_dir, None)
    _attach(store_dir, _cosign(digest, keypair[0], hint=[]))
    result, report = _verify(store_dir, keypair[1])
    _refused(result, report, "signature-invalid")


# ---------------------------------------------------------------- expiry: RFC 3339 UTC with Z, nothing else


BAD_EXPIRIES = ["2099-01-01T00:00:00", "2099-01-01T00:00:00+00:00", "2099-01-01 00:00:00Z", "2099-13-01T00:00:00Z",
                "2099-02-30T00:00:00Z", "20990101T000000Z", 4102444800, ["2099-01-01T00:00:00Z"], ""]


@pytest.mark.parametrize("expires", BAD_EXPIRIES, ids=lambda v: repr(v)[:24])
def test_a_cosign_expiry_in_another_form_is_refused_not_a_crash(tree: Path, store_dir: Path, keypair, expires: Any) -> None:
    digest = _pack(tree, store_dir, None)
    _attach(store_dir, _cosign(digest, keypair[0], {cosign.EXPIRES_ANNOTATION: expires}))
    result, report = _verify(store_dir, keypair[1])
    _refused(result, report, "signature-invalid")
    assert cosign.EXPIRES_ANNOTATION in report["error"]["message"]


def test_a_cosign_expiry_without_a_zone_beside_a_good_signature_is_skipped(tree: Path, store_dir: Path, keypair) -> None:
    digest = _pack(tree, store_dir, keypair[0])
    _attach(store_dir, _cosign(digest, keypair[0], {cosign.EXPIRES_ANNOTATION: "2099-01-01T00:00:00"}))
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 0, result.err
    assert sorted(s["verified"] for s in report["signatures"]) == [False, True, True]


def test_a_cosign_expiry_with_a_fraction_and_z_is_read(tree: Path, store_dir: Path, keypair) -> None:
    digest = _pack(tree, store_dir, None)
    _attach(store_dir, _cosign(digest, keypair[0], {cosign.EXPIRES_ANNOTATION: "2020-01-01T00:00:00.5Z"}))
    result, report = _verify(store_dir, keypair[1])
    _refused(result, report, "expired")


@pytest.mark.parametrize("expires", ["2099-13-01T00:00:00Z", "2099-02-30T23:00:00Z", "2099-01-01T24:00:00Z"])
def test_a_model_signing_expiry_that_names_no_moment_is_refused_not_a_crash(tree: Path, store_dir: Path, keypair, expires: str) -> None:
    """The predicate schema's pattern lets these through; the date itself does not exist."""
    _pack(tree, store_dir, None)
    s = Store(store_dir)
    mk = load_modelkit(s, parse_ref(REF))
    files, roles = file_hashes(s, mk)
    fields = signed_fields(mk, roles, 30) | {"expires": expires}
    _attach(store_dir, signature.sign(files, fields, keys.load_private_key(keypair[0]), mk.kitfile.name))
    result, report = _verify(store_dir, keypair[1])
    _refused(result, report, "signature-invalid")
    # signing again replaces what it can read as its own, and skips what it cannot: no crash either
    signed = run_bundle("sign", REF, "--key", str(keypair[0]), "--store", str(store_dir))
    assert signed.code == 0, signed.err
    assert _verify(store_dir, keypair[1])[0].code == 0


# ---------------------------------------------------------------- an unsigned artifact naming the trusted key


def _unsigned_model_signing(tree_store: Path, trusted_key: Path, forger_key: Path, how: str) -> bytes:
    """A model-signing artifact whose hint names the trusted key but whose signature the trusted key never made."""
    s = Store(tree_store)
    mk = load_modelkit(s, parse_ref(REF))
    files, roles = file_hashes(s, mk)
    bundle = json.loads(signature.sign(files, signed_fields(mk, roles, 30), keys.load_private_key(forger_key), mk.kitfile.name))
    bundle["verificationMaterial"]["publicKey"]["hint"] = keys.key_id(keys.load_public_key(trusted_key))
    if how == "garbage":
        bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(b"\x30\x06\x02\x01\x01\x02\x01\x01").decode()
    return json.dumps(bundle).encode()


@pytest.mark.parametrize("how", ["another-key", "garbage"])
def test_an_unsigned_model_signing_artifact_naming_the_trusted_key_does_not_block_a_cosign_signature(
        tree: Path, store_dir: Path, keypair, other_keypair, how: str) -> None:
    digest = _pack(tree, store_dir, keypair[0])
    _drop(store_dir, digest, cosign.MODEL_SIGNING_KIND)
    _attach(store_dir, _unsigned_model_signing(store_dir, keypair[1], other_keypair[0], how))
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 0, result.err
    assert report["signature_kinds"] == ["cosign"]
    assert [(s["kind"], s["verified"]) for s in report["signatures"]] == [("cosign", True), ("model-signing", False)]


def test_a_validly_signed_model_signing_signature_that_fails_later_still_decides(tree: Path, store_dir: Path, keypair) -> None:
    """The key's full statement, signed by it, over another version: the cosign-style one beside it does not rescue it."""
    digest = _pack(tree, store_dir, keypair[0])
    _drop(store_dir, digest, cosign.MODEL_SIGNING_KIND)
    s = Store(store_dir)
    mk = load_modelkit(s, parse_ref(REF))
    files, roles = file_hashes(s, mk)
    fields = signed_fields(mk, roles, 30) | {"version": "9.9.9"}
    _attach(store_dir, signature.sign(files, fields, keys.load_private_key(keypair[0]), mk.kitfile.name))
    result, report = _verify(store_dir, keypair[1])
    _refused(result, report, "signature-mismatch")


# ---------------------------------------------------------------- pull and fetch, from a registry


def _hostile_referrers(store: Path, digest: str, keypair, other_keypair) -> None:
    """Every hostile candidate of this file attached beside the bundle's good signatures."""
    _attach(store, _cosign(digest, keypair[0], hint=[]), ref=_ref_of(store))
    _attach(store, _cosign(digest, keypair[0], {cosign.EXPIRES_ANNOTATION: "2099-01-01T00:00:00"}), ref=_ref_of(store))
    _attach(store, _cosign(digest, keypair[0], {cosign.EXPIRES_ANNOTATION: ["x"]}), ref=_ref_of(store))


def _ref_of(store: Path) -> str:
    return next(m["annotations"]["org.opencontainers.image.ref.name"] for m in Store(store).index()["manifests"]
                if "annotations" in m and "org.opencontainers.image.ref.name" in m["annotations"])


def _pushed_with_hostile_referrers(registry: Registry, tmp_path: Path, keypair, other_keypair, cosign_only: bool) -> tuple[str, str]:
    from tests.tinymodels import make_pair

    make_pair(tmp_path / "ctx")
    ref = f"{registry.host}/hostile-{'cosign' if cosign_only else 'both'}/tiny-spec:1.0.0"
    digest = _pack(tmp_path / "ctx", tmp_path / "src", keypair[0], ref)
    if cosign_only:
        _drop(tmp_path / "src", digest, cosign.MODEL_SIGNING_KIND)
        s = Store(tmp_path / "src")
        mk = load_modelkit(s, parse_ref(ref))
        files, roles = file_hashes(s, mk)
        bundle = json.loads(signature.sign(files, signed_fields(mk, roles, 30), keys.load_private_key(other_keypair[0]), mk.kitfile.name))
        bundle["verificationMaterial"]["publicKey"]["hint"] = keys.key_id(keys.load_public_key(keypair[1]))
        attach_signature(s, mk, json.dumps(bundle).encode(), {})
    _hostile_referrers(tmp_path / "src", digest, keypair, other_keypair)
    (tmp_path / "no-docker").mkdir(exist_ok=True)
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "src"), env={"DOCKER_CONFIG": str(tmp_path / "no-docker")}, check=True)
    return ref, digest


@pytest.mark.parametrize("cosign_only", [False, True], ids=["both-kinds", "cosign-only"])
def test_pull_and_fetch_skip_hostile_referrers(registry: Registry, tmp_path: Path, keypair, other_keypair, cosign_only: bool) -> None:  # noqa: F811
    ref, digest = _pushed_with_hostile_referrers(registry, tmp_path, keypair, other_keypair, cosign_only)
    env = {"DOCKER_CONFIG": str(tmp_path / "no-docker")}
    pulled = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "pulled"), env=env)
    assert pulled.code == 0, pulled.err
    assert pulled.out.strip().splitlines()[-1] == digest
    # only what verified is kept
    kept = [cosign.kind_of(p) for _, p in find_signatures(Store(tmp_path / "pulled"), digest)]
    assert sorted(kept) == (["cosign"] if cosign_only else ["cosign", "model-signing"])
    dest = tmp_path / "models"
    fetched = run_bundle("fetch", f"bundle://{ref}", str(dest), "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "fetch-store"), env=env)
    assert fetched.code == 0, fetched.err
    assert (dest / "target" / "config.json").is_file()


def _relay(upstream: str, edit_index: Any) -> Any:
    """A relaying attacker in front of a real registry: every request passed on, the referrers index rewritten."""

    def route(req: Seen, body: bytes) -> Reply:
        headers = {k: v for k, v in req.headers.items() if k in ("accept", "content-type", "range", "authorization")}
        resp = requests.request(req.method, f"http://{upstream}{req.path}", headers=headers, data=body, timeout=30, allow_redirects=False)
        data = resp.content
        if "/manifests/sha256-" in req.path and resp.status_code == 200:
            data = json.dumps(edit_index(json.loads(data))).encode()
        out = {k: v for k, v in resp.headers.items() if k.lower() in ("content-type", "location", "www-authenticate")}
        return Reply(resp.status_code, out, data)

    return route


JUNK_ENTRIES = [
    {"artifactType": SIG_TYPE, "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:zz", "size": 10},
    {"artifactType": SIG_TYPE, "digest": "sha256:" + "0" * 64, "size": -1},
    {"artifactType": SIG_TYPE, "digest": "sha256:" + "0" * 64, "size": True},
    {"artifactType": SIG_TYPE, "digest": "sha256:" + "0" * 64, "size": 1 << 40},
    {"artifactType": SIG_TYPE, "digest": "sha256:" + "0" * 64, "size": 300, "mediaType": []},
    {"artifactType": SIG_TYPE, "digest": "sha256:" + "1" * 64, "size": 300},  # listed, but not on the registry
    {"artifactType": SIG_TYPE, "digest": ["sha256:" + "2" * 64], "size": 300},
    {"artifactType": "application/vnd.in-toto+json", "digest": "sha256:" + "3" * 64, "size": 300},  # a record nobody stored
    {"artifactType": "application/vnd.in-toto+json", "digest": 7, "size": 300},
    "not-an-object",
    None,
]


def test_pull_and_fetch_skip_malformed_and_missing_entries_of_the_referrers_index(registry: Registry, tmp_path: Path, keypair) -> None:  # noqa: F811
    from tests.tinymodels import make_pair

    make_pair(tmp_path / "ctx")
    upstream_ref = f"{registry.host}/junk/tiny-spec:1.0.0"
    digest = _pack(tmp_path / "ctx", tmp_path / "src", keypair[0], upstream_ref)
    (tmp_path / "no-docker").mkdir()
    env = {"DOCKER_CONFIG": str(tmp_path / "no-docker")}
    run_bundle("push", upstream_ref, "--plain-http", "--store", str(tmp_path / "src"), env=env, check=True)

    def edit(index: dict[str, Any]) -> dict[str, Any]:
        return {**index, "manifests": JUNK_ENTRIES + index["manifests"]}

    with hostile(_relay(registry.host, edit)) as relay:
        ref = f"{relay.host}/junk/tiny-spec:1.0.0"
        pulled = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "pulled"), env=env)
        fetched = run_bundle("fetch", f"bundle://{ref}", str(tmp_path / "models"), "--plain-http", "--key", str(keypair[1]),
                             "--store", str(tmp_path / "fetch-store"), env=env)
    assert pulled.code == 0, pulled.err
    assert pulled.out.strip().splitlines()[-1] == digest
    assert fetched.code == 0, fetched.err
    assert (tmp_path / "models" / ".specbundle" / "signature.json").is_file()


def test_a_referrers_index_that_is_not_an_index_is_a_coded_error(registry: Registry, tmp_path: Path, keypair) -> None:  # noqa: F811
    from tests.tinymodels import make_pair

    make_pair(tmp_path / "ctx")
    upstream_ref = f"{registry.host}/notindex/tiny-spec:1.0.0"
    _pack(tmp_path / "ctx", tmp_path / "src", keypair[0], upstream_ref)
    (tmp_path / "no-docker").mkdir()
    env = {"DOCKER_CONFIG": str(tmp_path / "no-docker")}
    run_bundle("push", upstream_ref, "--plain-http", "--store", str(tmp_path / "src"), env=env, check=True)
    for shape in ([], {"manifests": {"a": 1}}, {"manifests": "x"}, 5):
        with hostile(_relay(registry.host, lambda index, shape=shape: shape)) as relay:
            pulled = run_bundle("pull", f"{relay.host}/notindex/tiny-spec:1.0.0", "--plain-http", "--key", str(keypair[1]),
                                "--store", str(tmp_path / "pulled"), env=env)
        assert pulled.code == 5 and pulled.err.startswith("error: [registry] "), (shape, pulled.err)


# ---------------------------------------------------------------- the release memory


def test_a_signed_version_too_long_for_int_is_remembered_not_a_crash(tmp_path: Path, keypair) -> None:
    """The Kitfile schema bounds a version's digits by nothing; Python's int() refuses over 4,300 of them."""
    from bundletree import make_tree

    store = tmp_path / "store"
    huge = "1" * 5000 + ".0.0"
    _pack(make_tree(tmp_path / "old"), store, keypair[0], "tiny-spec:old")
    result, report = _verify(store, keypair[1], "tiny-spec:old")
    assert result.code == 0, result.err
    _pack(make_tree(tmp_path / "new", version=huge, seed=1), store, keypair[0], "tiny-spec:huge")
    result, report = _verify(store, keypair[1], "tiny-spec:huge")
    assert result.code == 0, result.err
    result, report = _verify(store, keypair[1], "tiny-spec:old")  # now older than what the store has seen
    _refused(result, report, "rollback")


# ---------------------------------------------------------------- artifacts not shaped like a signature


@pytest.mark.parametrize("payload", [b"not json at all", b"[" * 5000, b'{"mediaType": 5}', b"\xff\xfe"], ids=["text", "nesting-bomb", "wrong-type", "not-utf8"])
def test_an_intact_referrer_that_is_no_sigstore_bundle_is_no_signature_not_damage(tree: Path, store_dir: Path, keypair, payload: bytes) -> None:
    """Its blobs match their digests: the store is not damaged, the artifact is just no signature."""
    _pack(tree, store_dir, keypair[0])
    _attach(store_dir, payload)
    result, report = _verify(store_dir, keypair[1])
    assert result.code == 0, result.err
    assert sorted(s["kind"] for s in report["signatures"] if s["verified"]) == ["cosign", "model-signing"]


def test_an_only_referrer_that_is_no_sigstore_bundle_is_refused_as_invalid(tree: Path, store_dir: Path, keypair) -> None:
    _pack(tree, store_dir, None)
    _attach(store_dir, b"not json at all")
    result, report = _verify(store_dir, keypair[1])
    _refused(result, report, "signature-invalid")


def test_a_really_damaged_signature_blob_still_refuses_the_bundle(tree: Path, store_dir: Path, keypair) -> None:
    import os

    digest = _pack(tree, store_dir, keypair[0])
    s = Store(store_dir)
    desc, payload = find_signatures(s, digest)[0]
    _, manifest = s.read_json_blob(desc)
    path = s.blob_path(manifest["layers"][0]["digest"])
    os.chmod(path, 0o644)
    path.write_bytes(payload[:-1] + b" ")
    result, report = _verify(store_dir, keypair[1])
    _refused(result, report, "digest-mismatch")


def test_pull_and_fetch_skip_a_referrer_that_is_no_sigstore_bundle(registry: Registry, tmp_path: Path, keypair) -> None:  # noqa: F811
    from tests.tinymodels import make_pair

    make_pair(tmp_path / "ctx")
    ref = f"{registry.host}/notsig/tiny-spec:1.0.0"
    _pack(tmp_path / "ctx", tmp_path / "src", keypair[0], ref)
    _attach(tmp_path / "src", b"not json at all", ref=ref)
    (tmp_path / "no-docker").mkdir()
    env = {"DOCKER_CONFIG": str(tmp_path / "no-docker")}
    run_bundle("push", ref, "--plain-http", "--store", str(tmp_path / "src"), env=env, check=True)
    pulled = run_bundle("pull", ref, "--plain-http", "--key", str(keypair[1]), "--store", str(tmp_path / "pulled"), env=env)
    assert pulled.code == 0, pulled.err
    fetched = run_bundle("fetch", f"bundle://{ref}", str(tmp_path / "models"), "--plain-http", "--key", str(keypair[1]),
                         "--store", str(tmp_path / "fetch-store"), env=env)
    assert fetched.code == 0, fetched.err


def test_inspect_list_sign_and_gc_survive_every_hostile_referrer(tree: Path, store_dir: Path, keypair) -> None:
    digest = _pack(tree, store_dir, keypair[0])
    for payload in (_cosign(digest, keypair[0], hint=[]), _cosign(digest, keypair[0], {cosign.EXPIRES_ANNOTATION: "2099-01-01T00:00:00"}),
                    _cosign(digest, keypair[0], {cosign.EXPIRES_ANNOTATION: {"a": 1}}), b"not json at all", b"[" * 5000):
        _attach(store_dir, payload)
    for args in (["inspect", REF, "--key", str(keypair[1])], ["inspect", REF, "--json"], ["list"], ["list", "--json"],
                 ["sign", REF, "--key", str(keypair[0])], ["gc", "--dry-run"]):
        result = run_bundle(*args, "--store", str(store_dir))
        assert result.code == 0 and "Traceback" not in result.err, (args, result.err)
    assert _verify(store_dir, keypair[1])[0].code == 0
