"""Interop with the OpenSSF `model_signing` library, both ways, over a real directory of files.

These pin down the rule the unpacked bundle must follow: model_signing hashes every regular file under
the directory (hidden ones and nested .git* files included), except the top-level .git, .github,
.gitattributes and .gitignore, and it fails on any file it finds that the signature does not list.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import model_signing
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from core.errors import BundleError
from bundler.trust.keys import generate_keypair, key_id, load_private_key, load_public_key
from bundler.trust.signature import sign, verify

FIELDS = {
    "name": "tiny-spec",
    "version": "1.0.0",
    "manifest_digest": "sha256:" + "ab" * 32,
    "created": "2026-11-30T12:00:00Z",
    "expires": "2027-11-30T12:00:00Z",
}


def _file_digests(root: Path) -> dict[str, str]:
    """Every regular file under root, by POSIX path relative to root, with its sha256."""
    digests = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory, name)
            digests[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A small unpacked bundle: nested directories, a hidden file, a nested .gitattributes, an empty file, odd names."""
    root = tmp_path / "tiny-spec"
    files = {
        "Kitfile": b"manifestVersion: 1.0.0\n",
        "README.md": b"",
        "target/config.json": b'{"model_type": "llama"}',
        "target/model.safetensors": bytes(range(256)) * 8,
        "target/.gitattributes": b"*.safetensors filter=lfs\n",
        "draft/model.safetensors": b"\x00\x01" * 300,
        "tokenizer/tokenizer.json": b'{"model": {}}',
        "tokenizer/sub/.hidden": b"hidden but hashed",
        "docs/na\u00efve notes.md": b"non-ASCII name with a space",
        "docs-extra/a": b"sorts differently by string and by path component",
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.fixture
def keypair(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keypair(tmp_path / "keys")


@pytest.fixture
def our_signature(tmp_path: Path, model_dir: Path, keypair) -> Path:
    """Our signature over model_dir, written outside it."""
    signature = tmp_path / "tiny-spec.sig"
    signature.write_bytes(sign(_file_digests(model_dir), FIELDS, load_private_key(keypair[0]), model_dir.name))
    return signature


def _model_signing_verify(model: Path, signature: Path, public_key: Path) -> None:
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public_key).verify(model, signature)


def test_model_signing_verifies_our_signature_with_our_public_key(model_dir, our_signature, keypair) -> None:
    _model_signing_verify(model_dir, our_signature, keypair[1])


def test_model_signing_cli_verifies_our_signature(model_dir, our_signature, keypair) -> None:
    cli = Path(sys.executable).parent / "model_signing"
    result = subprocess.run(
        [str(cli), "verify", "key", str(model_dir), "--signature", str(our_signature), "--public_key", str(keypair[1])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Verification succeeded" in result.stdout


def test_model_signing_refuses_our_signature_after_one_byte_of_a_file_changes(model_dir, our_signature, keypair) -> None:
    weights = model_dir / "draft" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0x01
    weights.write_bytes(bytes(data))

    with pytest.raises(ValueError, match="Hash mismatch for 'draft/model.safetensors'"):
        _model_signing_verify(model_dir, our_signature, keypair[1])


def test_model_signing_refuses_our_signature_over_a_directory_with_an_extra_file(model_dir, our_signature, keypair) -> None:
    (model_dir / "target" / "extra.txt").write_text("not signed")
    with pytest.raises(ValueError, match="Extra files"):
        _model_signing_verify(model_dir, our_signature, keypair[1])


def test_model_signing_refuses_our_signature_with_another_public_key(model_dir, our_signature, tmp_path) -> None:
    _, other_pub = generate_keypair(tmp_path / "other")
    with pytest.raises(ValueError, match="Key mismatch"):
        _model_signing_verify(model_dir, our_signature, other_pub)


def test_we_verify_model_signings_signature_over_the_directory(model_dir, keypair, tmp_path) -> None:
    signature = tmp_path / "by-model-signing.sig"
    model_signing.signing.Config().use_elliptic_key_signer(private_key=keypair[0]).sign(model_dir, signature)

    public_key = load_public_key(keypair[1])
    claims = verify(signature.read_bytes(), {key_id(public_key): public_key})

    assert claims.files == _file_digests(model_dir)
    assert claims.bundle == {}
    assert claims.key_id == key_id(public_key)
    assert claims.model_name == "tiny-spec"


def test_we_refuse_model_signings_signature_by_a_key_we_do_not_trust(model_dir, keypair, tmp_path) -> None:
    signature = tmp_path / "by-model-signing.sig"
    model_signing.signing.Config().use_elliptic_key_signer(private_key=keypair[0]).sign(model_dir, signature)
    other = load_public_key(generate_keypair(tmp_path / "other")[1])

    with pytest.raises(BundleError) as caught:
        verify(signature.read_bytes(), {key_id(other): other})
    assert caught.value.code == "untrusted-signer"


def test_we_refuse_model_signings_signature_by_a_p384_key(model_dir, keypair, tmp_path) -> None:
    p384 = tmp_path / "p384.key"
    p384.write_bytes(
        ec.generate_private_key(ec.SECP384R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    signature = tmp_path / "p384.sig"
    model_signing.signing.Config().use_elliptic_key_signer(private_key=p384).sign(model_dir, signature)
    ours = load_public_key(keypair[1])

    with pytest.raises(BundleError) as caught:
        verify(signature.read_bytes(), {key_id(ours): ours})
    assert caught.value.code == "untrusted-signer"


def test_model_signing_leaves_out_only_top_level_git_paths(model_dir, keypair, tmp_path) -> None:
    (model_dir / ".gitignore").write_text("*.tmp\n")
    (model_dir / ".git").mkdir()
    (model_dir / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    signature = tmp_path / "by-model-signing.sig"
    model_signing.signing.Config().use_elliptic_key_signer(private_key=keypair[0]).sign(model_dir, signature)
    public_key = load_public_key(keypair[1])

    signed = set(verify(signature.read_bytes(), {key_id(public_key): public_key}).files)

    on_disk = set(_file_digests(model_dir))
    assert on_disk - signed == {".gitignore", ".git/HEAD"}
    assert {"target/.gitattributes", "tokenizer/sub/.hidden"} <= signed


def test_model_signing_verifies_bundle_unpack_output_end_to_end(tmp_path: Path, keypair) -> None:
    """pack --key, unpack --signature, then the model_signing CLI verifies the unpacked tree; one byte changed, it refuses."""
    from bundletree import make_tree
    from conftest import run_bundle

    make_tree(tmp_path / "ctx")
    store = str(tmp_path / "store")
    run_bundle("pack", str(tmp_path / "ctx"), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--store", store, check=True)
    out, sig = tmp_path / "out", tmp_path / "bundle.sig"
    run_bundle("unpack", "tiny-spec:1.0.0", "-d", str(out), "--signature", str(sig), "--key", str(keypair[1]), "--store", store, check=True)
    cli = [str(Path(sys.executable).parent / "model_signing"), "verify", "key", str(out), "--signature", str(sig), "--public_key", str(keypair[1])]
    assert subprocess.run(cli, capture_output=True).returncode == 0
    weights = out / "draft" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert subprocess.run(cli, capture_output=True).returncode != 0
