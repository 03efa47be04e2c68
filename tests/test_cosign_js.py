"""An independent check with Sigstore's own JavaScript libraries (tests/js): `@sigstore/verify` verifies our
cosign-style signature of the manifest digest with the public key, offline, and refuses it after a changed
byte or with another key; a Sigstore bundle made by `@sigstore/sign` with a key is accepted by `bundle verify`.

`make test` installs tests/js (npm ci); without it these tests install it themselves. They skip only when
node is not installed."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import run_bundle

from bundler.trust import cosign
from bundler.store.modelkit import load_modelkit
from bundler.store.refs import parse_ref
from bundler.store.referrers import find_signatures
from bundler.trust.sign import attach_signature
from bundler.store.layout import Store

JS = Path(__file__).parent / "js"
REF = "tiny-spec:1.0.0"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed: Sigstore's JavaScript verifier cannot run")


@pytest.fixture(scope="module")
def sigstore_js() -> Path:
    """tests/js with its node_modules (installed from package-lock.json when absent)."""
    if not (JS / "node_modules" / "@sigstore" / "verify").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JS, check=True, capture_output=True, timeout=300)
    return JS


def _node(script: str, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([NODE, str(JS / script), *map(str, args)], capture_output=True, text=True, timeout=60)


def _signed(tree: Path, store: Path, key: Path) -> tuple[str, bytes]:
    digest = run_bundle("pack", str(tree), "-t", REF, "--key", str(key), "--store", str(store), check=True).out.strip().splitlines()[-1]
    [payload] = [p for _, p in find_signatures(Store(store), digest) if cosign.kind_of(p) == cosign.KIND]
    return digest, payload


def test_sigstore_js_verifies_our_cosign_signature(sigstore_js: Path, tree: Path, store_dir: Path, keypair, tmp_path: Path) -> None:
    digest, payload = _signed(tree, store_dir, keypair[0])
    (tmp_path / "bundle.json").write_bytes(payload)
    result = _node("verify_bundle.mjs", tmp_path / "bundle.json", keypair[1], digest, cosign.PREDICATE_TYPE)
    assert result.returncode == 0 and result.stdout.strip() == "verified", result.stderr


def test_sigstore_js_refuses_a_flipped_payload_byte(sigstore_js: Path, tree: Path, store_dir: Path, keypair, tmp_path: Path) -> None:
    digest, payload = _signed(tree, store_dir, keypair[0])
    bundle = json.loads(payload)
    body = bytearray(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    body[body.index(b"sha256") + 12] ^= 0x01  # one character of the signed digest
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(bytes(body)).decode()
    (tmp_path / "bundle.json").write_text(json.dumps(bundle))
    result = _node("verify_bundle.mjs", tmp_path / "bundle.json", keypair[1], digest)
    assert result.returncode == 1 and "not verified" in result.stderr


def test_sigstore_js_refuses_another_key(sigstore_js: Path, tree: Path, store_dir: Path, keypair, other_keypair, tmp_path: Path) -> None:
    digest, payload = _signed(tree, store_dir, keypair[0])
    (tmp_path / "bundle.json").write_bytes(payload)
    result = _node("verify_bundle.mjs", tmp_path / "bundle.json", other_keypair[1], digest)
    assert result.returncode == 1 and "not verified" in result.stderr


def test_sigstore_js_refuses_our_signature_for_another_digest(sigstore_js: Path, tree: Path, store_dir: Path, keypair, tmp_path: Path) -> None:
    _, payload = _signed(tree, store_dir, keypair[0])
    (tmp_path / "bundle.json").write_bytes(payload)
    result = _node("verify_bundle.mjs", tmp_path / "bundle.json", keypair[1], "sha256:" + "0" * 64)
    assert result.returncode == 1 and "subject digest" in result.stderr


def test_bundle_verify_accepts_a_bundle_signed_by_sigstore_js(sigstore_js: Path, tree: Path, store_dir: Path, keypair, other_keypair) -> None:
    digest = run_bundle("pack", str(tree), "-t", REF, "--store", str(store_dir), check=True).out.strip().splitlines()[-1]
    made = _node("sign_bundle.mjs", keypair[0], digest)
    assert made.returncode == 0, made.stderr
    store = Store(store_dir)
    attach_signature(store, load_modelkit(store, parse_ref(REF)), made.stdout.encode(), {})

    trusted = run_bundle("verify", REF, "--key", str(keypair[1]), "--json", "--store", str(store_dir))
    report = json.loads(trusted.out)
    assert trusted.code == 0 and report["ok"] and report["signature_kinds"] == ["cosign"], trusted.err
    foreign = run_bundle("verify", REF, "--key", str(other_keypair[1]), "--store", str(store_dir))
    assert foreign.code == 3 and foreign.err.startswith("error: [untrusted-signer]")
