"""Keys: `bundle keygen` files, loading with and without passwords, key ids, and the trusted key set."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import model_signing
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from core.errors import BundleError
from bundler.trust.keys import generate_keypair, key_id, load_private_key, load_public_key, trusted_keys


def _write_key(path: Path, key) -> Path:
    """Write any private key (or its public half when path ends in .pub) as PEM."""
    if path.suffix == ".pub":
        data = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    else:
        data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path.write_bytes(data)
    return path


def test_keygen_writes_a_p256_pkcs8_private_key_with_mode_0600_and_its_public_key(tmp_path: Path) -> None:
    key_path, pub_path = generate_keypair(tmp_path / "keys")

    assert (key_path, pub_path) == (tmp_path / "keys" / "bundle.key", tmp_path / "keys" / "bundle.pub")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert key_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert pub_path.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    private_key, public_key = load_private_key(key_path), load_public_key(pub_path)
    assert isinstance(private_key.curve, ec.SECP256R1)
    assert key_id(private_key) == key_id(public_key)


def test_keygen_key_mode_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        key_path, _ = generate_keypair(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600


def test_keygen_leaves_no_temporary_files(tmp_path: Path) -> None:
    generate_keypair(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle.key", "bundle.pub"]


def test_keygen_with_a_password_encrypts_the_private_key(tmp_path: Path) -> None:
    key_path, pub_path = generate_keypair(tmp_path, password=b"correct horse")

    assert key_path.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert key_id(load_private_key(key_path, b"correct horse")) == key_id(load_public_key(pub_path))


def test_loading_an_encrypted_key_with_the_wrong_password_is_a_key_error(tmp_path: Path) -> None:
    key_path, _ = generate_keypair(tmp_path, password=b"correct horse")
    with pytest.raises(BundleError) as caught:
        load_private_key(key_path, b"battery staple")
    assert caught.value.code == "key-error"
    assert "wrong password" in caught.value.message


def test_loading_an_encrypted_key_without_a_password_is_a_key_error_that_names_the_variable(tmp_path: Path) -> None:
    key_path, _ = generate_keypair(tmp_path, password=b"correct horse")
    with pytest.raises(BundleError) as caught:
        load_private_key(key_path)
    assert caught.value.code == "key-error"
    assert "BUNDLE_KEY_PASSWORD" in caught.value.message


def test_keygen_never_overwrites_an_existing_key(tmp_path: Path) -> None:
    key_path, pub_path = generate_keypair(tmp_path)
    before = key_path.read_bytes(), pub_path.read_bytes()

    with pytest.raises(BundleError) as caught:
        generate_keypair(tmp_path)

    assert caught.value.code == "usage"
    assert (key_path.read_bytes(), pub_path.read_bytes()) == before


def test_keygen_refuses_when_only_the_public_key_exists(tmp_path: Path) -> None:
    (tmp_path / "bundle.pub").write_text("someone else's key")
    with pytest.raises(BundleError) as caught:
        generate_keypair(tmp_path)
    assert caught.value.code == "usage"
    assert not (tmp_path / "bundle.key").exists()


def test_key_id_is_model_signings_public_key_hint(tmp_path: Path) -> None:
    key_path, pub_path = generate_keypair(tmp_path / "keys")
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights").write_bytes(b"w")
    signature_path = tmp_path / "model.sig"

    model_signing.signing.Config().use_elliptic_key_signer(private_key=key_path).sign(model, signature_path)

    hint = json.loads(signature_path.read_text())["verificationMaterial"]["publicKey"]["hint"]
    assert key_id(load_public_key(pub_path)) == hint


@pytest.mark.parametrize(
    "make_key",
    [lambda: ec.generate_private_key(ec.SECP384R1()), lambda: ed25519.Ed25519PrivateKey.generate()],
    ids=["P-384", "Ed25519"],
)
def test_a_key_that_is_not_p256_is_a_key_error(tmp_path: Path, make_key) -> None:
    key = make_key()
    for path, load in ((tmp_path / "other.key", load_private_key), (tmp_path / "other.pub", load_public_key)):
        _write_key(path, key)
        with pytest.raises(BundleError) as caught:
            load(path)
        assert caught.value.code == "key-error"


def test_a_file_that_is_not_a_pem_key_is_a_key_error(tmp_path: Path) -> None:
    path = tmp_path / "bundle.pub"
    path.write_text("not a key\n")
    for load in (load_public_key, load_private_key):
        with pytest.raises(BundleError) as caught:
            load(path)
        assert caught.value.code == "key-error"


def test_a_missing_key_file_is_missing_input(tmp_path: Path) -> None:
    with pytest.raises(BundleError) as caught:
        load_public_key(tmp_path / "nope.pub")
    assert caught.value.code == "missing-input"


def test_trusted_keys_are_each_key_flag_plus_every_pub_in_the_trusted_keys_directory(tmp_path: Path, monkeypatch) -> None:
    _, flag_pub = generate_keypair(tmp_path / "mine")
    trusted_dir = tmp_path / "trusted"
    trusted_dir.mkdir()
    keys_in_dir = [_write_key(trusted_dir / f"{n}.pub", ec.generate_private_key(ec.SECP256R1())) for n in ("a", "b")]
    (trusted_dir / "notes.txt").write_text("not a key, not read")
    monkeypatch.setenv("BUNDLE_TRUSTED_KEYS", str(trusted_dir))

    keys = trusted_keys([flag_pub])

    expected = {key_id(load_public_key(p)) for p in [flag_pub, *keys_in_dir]}
    assert set(keys) == expected
    assert all(key_id(key) == kid for kid, key in keys.items())


def test_trusted_keys_without_the_variable_are_only_the_key_flags(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("BUNDLE_TRUSTED_KEYS", raising=False)
    _, pub = generate_keypair(tmp_path)
    assert list(trusted_keys([pub])) == [key_id(load_public_key(pub))]
    assert trusted_keys([]) == {}


def test_trusted_keys_directory_that_does_not_exist_is_a_key_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BUNDLE_TRUSTED_KEYS", str(tmp_path / "missing"))
    with pytest.raises(BundleError) as caught:
        trusted_keys([])
    assert caught.value.code == "key-error"


def test_a_bad_key_in_the_trusted_directory_is_an_error_not_skipped(tmp_path: Path) -> None:
    (tmp_path / "broken.pub").write_text("garbage")
    with pytest.raises(BundleError) as caught:
        trusted_keys([], env_dir=tmp_path)
    assert caught.value.code == "key-error"
    assert "broken.pub" in caught.value.message
