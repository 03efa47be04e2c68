"""The publisher's signature through the command line (issue 46, item 3): a target and a draft that arrive
signed with model_signing 1.1.1 (`model.sig` beside the weights) are packed with their signatures, which
`verify --upstream-key ROLE=KEY` checks under the publisher's own key; one changed byte in an upstream-signed
file is refused at pack (exit 3) and nothing is stored; another publisher key is refused at verify (exit 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from conftest import run_bundle
from tests.tinymodels import make_pair

REF = "tiny-spec:1.0.0"


def _publisher(base: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = base / f"{name}.key", base / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _sign_model(directory: Path, private: Path) -> None:
    ms = pytest.importorskip("model_signing")
    ms.signing.Config().use_elliptic_key_signer(private_key=private).sign(directory, directory / "model.sig")


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> dict:
    base = tmp_path_factory.mktemp("upstream")
    make_pair(base / "ctx")
    target_pub, draft_pub = _publisher(base, "target-publisher"), _publisher(base, "draft-publisher")
    _sign_model(base / "ctx" / "target", target_pub[0])
    _sign_model(base / "ctx" / "draft", draft_pub[0])
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return {"base": base, "store": str(base / "store"), "target": str(target_pub[1]), "draft": str(draft_pub[1])}


def test_the_publishers_signatures_verify_under_their_own_keys(packed: dict, keypair) -> None:
    result = run_bundle("verify", REF, "--key", str(keypair[1]), "--upstream-key", f"target={packed['target']}",
                        "--upstream-key", f"draft={packed['draft']}", "--store", packed["store"])
    assert result.code == 0, result.err
    line = next(x for x in result.out.splitlines() if " upstream " in x)
    assert line.startswith("ok") and "target: its publisher's signature" in line and "draft: its publisher's signature" in line


def test_another_publisher_key_is_refused_with_exit_3(packed: dict, keypair) -> None:
    result = run_bundle("verify", REF, "--key", str(keypair[1]), "--upstream-key", f"target={packed['draft']}", "--store", packed["store"])
    assert result.code == 3 and len(result.err.strip().splitlines()) == 1, result.err


def test_a_role_without_a_publisher_signature_is_refused(tmp_path: Path, keypair) -> None:
    make_pair(tmp_path / "ctx")
    run_bundle("pack", str(tmp_path / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(tmp_path / "s"), check=True)
    pub = _publisher(tmp_path, "p")[1]
    result = run_bundle("verify", REF, "--key", str(keypair[1]), "--upstream-key", f"target={pub}", "--store", str(tmp_path / "s"))
    assert result.code == 3 and "[signature-missing]" in result.err


def test_one_changed_byte_in_an_upstream_signed_file_is_refused_at_pack(tmp_path: Path, keypair) -> None:
    make_pair(tmp_path / "ctx")
    _sign_model(tmp_path / "ctx" / "target", _publisher(tmp_path, "p")[0])
    config = tmp_path / "ctx" / "target" / "config.json"
    config.write_text(config.read_text().replace("{", "{ ", 1))
    result = run_bundle("pack", str(tmp_path / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(tmp_path / "s"))
    assert result.code == 3 and "[tampered]" in result.err and "publisher" in result.err
    listed = run_bundle("list", "--store", str(tmp_path / "s"))
    assert REF.split(":")[0] not in listed.out


def test_a_malformed_role_option_is_a_usage_error(packed: dict, keypair) -> None:
    result = run_bundle("verify", REF, "--key", str(keypair[1]), "--upstream-key", f"tokenizer={packed['target']}", "--store", packed["store"])
    assert result.code == 2 and "ROLE" in result.err
