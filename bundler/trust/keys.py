"""Signing keys: ECDSA P-256 key pairs on disk, their ids, and the set of keys a user trusts.

A key id is the hex sha256 of the public key's SubjectPublicKeyInfo PEM, which is what the OpenSSF
model-signing library writes as `verificationMaterial.publicKey.hint`, so ids agree across both tools.
"""

from __future__ import annotations

__all__ = [
    "PASSWORD_ENV", "PrivateKey", "PublicKey", "TRUSTED_KEYS_ENV", "generate_keypair", "key_id",
    "load_private_key", "load_public_key", "trusted_keys",
]

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bundler.format import boundedjson
from bundler.format.atomicfile import write_atomically
from core.errors import BundleError

PRIVATE_KEY_NAME = "bundle.key"
PUBLIC_KEY_NAME = "bundle.pub"
TRUSTED_KEYS_ENV = "BUNDLE_TRUSTED_KEYS"
PASSWORD_ENV = "BUNDLE_KEY_PASSWORD"

PublicKey = ec.EllipticCurvePublicKey
PrivateKey = ec.EllipticCurvePrivateKey


def generate_keypair(out_dir: Path, password: bytes | None = None) -> tuple[Path, Path]:
    """Write out_dir/bundle.key (PKCS#8 PEM, P-256, mode 0600) and out_dir/bundle.pub (SPKI PEM).

    The private key is encrypted when `password` is non-empty. Neither file is ever overwritten: an
    existing key gives BundleError("usage"). Each file appears whole or not at all.
    Returns (private key path, public key path).
    """
    out_dir = Path(out_dir)
    key_path, pub_path = out_dir / PRIVATE_KEY_NAME, out_dir / PUBLIC_KEY_NAME
    for path in (key_path, pub_path):
        if path.exists() or path.is_symlink():
            raise BundleError("usage", f"{path} already exists; refusing to overwrite a key (choose another -o DIR)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BundleError("usage", f"cannot create key directory {out_dir}: {err.strerror or err}") from err

    private_key = ec.generate_private_key(ec.SECP256R1())
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    )
    private_pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    _write_new_file(key_path, private_pem, 0o600)
    try:
        _write_new_file(pub_path, public_key_pem(private_key.public_key()), 0o644)
    except BundleError:
        # A public key that appeared meanwhile is someone else's: do not leave an unmatched private key.
        key_path.unlink(missing_ok=True)
        raise
    return key_path, pub_path


def _write_new_file(path: Path, data: bytes, mode: int) -> None:
    """Create `path` holding `data` with `mode`, atomically, failing if it exists: readers never see a
    half-written key, and an existing key is never replaced."""
    try:
        write_atomically(path, data, mode, replace=False)
    except FileExistsError as err:
        raise BundleError("usage", f"{path} already exists; refusing to overwrite a key") from err
    except OSError as err:
        raise BundleError("usage", f"cannot write {path}: {err.strerror or err}") from err


def public_key_pem(public_key: PublicKey) -> bytes:
    """The SubjectPublicKeyInfo PEM bytes of a public key (what key ids are computed over)."""
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id(key: PublicKey | PrivateKey) -> str:
    """Hex sha256 of the public key PEM: model-signing's `publicKey.hint` for the same key."""
    public_key = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    return hashlib.sha256(public_key_pem(public_key)).hexdigest()


MAX_KEY_FILE = 64 << 10  # a PEM key is a few hundred bytes


def _read_key_file(path: Path, what: str) -> bytes:
    """A key file's bytes: a regular file, bounded (a FIFO would hang, /dev/zero would never end)."""
    if not os.path.lexists(path):
        raise BundleError("missing-input", f"{what} {path} does not exist")
    return boundedjson.read_regular(path, MAX_KEY_FILE, what, "key-error")


def _require_p256(key: PublicKey | PrivateKey | object, path: Path, what: str) -> None:
    if not isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)):
        raise BundleError("key-error", f"{what} {path} is not an ECDSA key (bundle keys are ECDSA P-256)")
    if not isinstance(key.curve, ec.SECP256R1):
        raise BundleError("key-error", f"{what} {path} uses curve {key.curve.name}, not P-256 (secp256r1)")


def load_private_key(path: Path, password: bytes | None = None) -> PrivateKey:
    """Load a PEM private key, decrypting with `password`; it must be ECDSA P-256.

    Errors: missing-input when the file does not exist; key-error when it cannot be read, is not a
    PEM key, needs a password that was not given, the password is wrong, or the key is not P-256.
    """
    data = _read_key_file(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password or None)
    except TypeError as err:
        # cryptography says TypeError both for "encrypted, no password" and "not encrypted, password given".
        if password:
            raise BundleError("key-error", f"private key {path} is not encrypted; unset BUNDLE_KEY_PASSWORD") from err
        raise BundleError("key-error", f"private key {path} is encrypted; set BUNDLE_KEY_PASSWORD") from err
    except ValueError as err:
        if password and b"ENCRYPTED" in data:
            raise BundleError("key-error", f"wrong password for private key {path} (BUNDLE_KEY_PASSWORD)") from err
        if b"PUBLIC KEY" in data:
            raise BundleError("key-error", f"{path} is a public key: signing needs the private key (the bundle.key `bundle keygen` wrote beside it)") from err
        raise BundleError("key-error", f"{path} is not a PEM private key (expected a file like the bundle.key `bundle keygen` writes)") from err
    except Exception as err:  # cryptography raises UnsupportedAlgorithm and others for odd key types
        raise BundleError("key-error", f"cannot load private key {path}: {err}") from err
    _require_p256(key, path, "private key")
    return key  # type: ignore[return-value]


def load_public_key(path: Path) -> PublicKey:
    """Load a PEM public key (SubjectPublicKeyInfo); it must be ECDSA P-256.

    Errors: missing-input when the file does not exist; key-error otherwise.
    """
    data = _read_key_file(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except Exception as err:  # ValueError for bad PEM, UnsupportedAlgorithm for odd key types
        if b"PRIVATE KEY" in data:
            raise BundleError("key-error", f"{path} is a private key: --key takes the public key here (the bundle.pub beside it); never hand out the private key") from err
        raise BundleError("key-error", f"{path} is not a PEM public key (expected a file like the bundle.pub `bundle keygen` writes)") from err
    _require_p256(key, path, "public key")
    return key  # type: ignore[return-value]


def trusted_keys(key_paths: Sequence[Path], env_dir: str | os.PathLike[str] | None = None) -> dict[str, PublicKey]:
    """The keys a verification trusts, by key id: each of `key_paths` plus every *.pub in `env_dir`.

    `env_dir` None means the directory named by $BUNDLE_TRUSTED_KEYS, read now (unset or empty: none).
    A key that cannot be loaded is an error rather than skipped, so a typo never silently narrows trust.
    """
    keys: dict[str, PublicKey] = {}
    for path in key_paths:
        key = load_public_key(Path(path))
        keys[key_id(key)] = key
    if env_dir is None:
        env_dir = os.environ.get(TRUSTED_KEYS_ENV) or None
    if env_dir is not None:
        directory = Path(env_dir)
        if not directory.is_dir():
            raise BundleError("key-error", f"{TRUSTED_KEYS_ENV}={directory} is not a directory")
        for path in sorted(directory.glob("*.pub")):
            key = load_public_key(path)
            keys[key_id(key)] = key
    return keys
