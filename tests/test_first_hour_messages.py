"""Mistakes a new user makes in the first hour get a one-line error that says what to do, and change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_bundle, tree_digest


@pytest.mark.parametrize("days", ["0", "-1"])
def test_valid_days_must_be_positive_for_pack_and_sign(tree: Path, store_dir: Path, keypair, days: str) -> None:
    r = run_bundle("pack", str(tree), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--valid-days", days, "--store", str(store_dir))
    assert r.code == 2 and r.err.startswith("error: [usage]") and "--valid-days" in r.err
    assert tree_digest(store_dir) == "absent"
    run_bundle("pack", str(tree), "-t", "tiny-spec:1.0.0", "--store", str(store_dir), check=True)
    before = tree_digest(store_dir)
    s = run_bundle("sign", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--valid-days", days, "--store", str(store_dir))
    assert s.code == 2 and s.err.startswith("error: [usage]") and "--valid-days" in s.err
    assert tree_digest(store_dir) == before


@pytest.fixture
def signed_store(tree: Path, store_dir: Path, keypair) -> Path:
    run_bundle("pack", str(tree), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--store", str(store_dir), check=True)
    return store_dir


def test_no_trusted_key_and_the_wrong_key_get_different_hints(signed_store: Path, keypair, other_keypair) -> None:
    from bundler.trust.keys import key_id, load_public_key

    signer = key_id(load_public_key(keypair[1]))[:12]
    other = key_id(load_public_key(other_keypair[1]))[:12]
    none = run_bundle("verify", "tiny-spec:1.0.0", "--store", str(signed_store))
    assert none.code == 3 and none.err.startswith("error: [untrusted-signer]")
    assert signer in none.err and "no key is trusted" in none.err and "--key" in none.err
    wrong = run_bundle("verify", "tiny-spec:1.0.0", "--key", str(other_keypair[1]), "--store", str(signed_store))
    assert wrong.code == 3 and wrong.err.startswith("error: [untrusted-signer]")
    assert signer in wrong.err and other in wrong.err and "none of the trusted keys" in wrong.err


def test_a_private_key_or_a_readme_as_key_says_what_was_expected(signed_store: Path, keypair, tree: Path) -> None:
    priv = run_bundle("verify", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--store", str(signed_store))
    assert priv.code == 3 and priv.err.startswith("error: [key-error]") and "is a private key" in priv.err and "bundle.pub" in priv.err
    readme = run_bundle("verify", "tiny-spec:1.0.0", "--key", str(tree / "README.md"), "--store", str(signed_store))
    assert readme.code == 3 and "is not a PEM public key (expected a file like the bundle.pub" in readme.err
    assert "cryptography.io" not in readme.err
    sign = run_bundle("sign", "tiny-spec:1.0.0", "--key", str(keypair[1]), "--store", str(signed_store))
    assert sign.code == 3 and "is a public key: signing needs the private key" in sign.err


def test_a_bad_version_says_what_a_version_looks_like(tree: Path, store_dir: Path) -> None:
    kitfile = tree / "Kitfile"
    kitfile.write_text(kitfile.read_text().replace("version: 1.0.0", "version: one"))
    r = run_bundle("pack", str(tree), "-t", "tiny-spec:1.0.0", "--store", str(store_dir))
    assert r.code == 6 and r.err.startswith("error: [invalid-kitfile]")
    assert "'one' must be a version like 1.0.0" in r.err and "[0-9]" not in r.err
    assert tree_digest(store_dir) == "absent"


def test_a_missing_part_is_named_not_a_schema_message(tree: Path, store_dir: Path) -> None:
    kitfile = tree / "Kitfile"
    kitfile.write_text("\n".join(line for line in kitfile.read_text().splitlines() if "type: draft" not in line) + "\n")
    r = run_bundle("pack", str(tree), "-t", "tiny-spec:1.0.0", "--store", str(store_dir))
    assert r.code == 6 and r.err.startswith("error: [invalid-kitfile]")
    assert "no draft part" in r.err and "too short" not in r.err


def test_inspect_piped_prints_whole_digests_and_a_clean_unverified_line(signed_store: Path, keypair) -> None:
    from bundler.trust.keys import key_id, load_public_key

    r = run_bundle("inspect", "tiny-spec:1.0.0", "--store", str(signed_store))
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    manifest = (signed_store / "index.json").read_text()
    assert lines[0].startswith("tiny-spec:1.0.0  sha256:") and lines[0].split()[1][7:] in manifest
    assert all("\x1b[" not in line for line in lines)  # no colour codes
    assert any(line.startswith("target ") and len(line.split()[-1]) == 71 for line in lines)  # a whole digest
    verified = next(line for line in lines if line.startswith("verified:"))
    assert verified.startswith("verified: no ([untrusted-signer]") and "error:" not in verified
    assert not any(line == "tokenizer: None" for line in lines)
    ok = run_bundle("inspect", "tiny-spec:1.0.0", "--key", str(keypair[1]), "--store", str(signed_store)).out
    assert f"verified: yes, signed by {key_id(load_public_key(keypair[1]))}" in ok


def test_kitfile_example_does_not_collide_with_the_demo_bundle() -> None:
    import yaml

    from bundler.format.kitfile import kitfile_from_data

    root = Path(__file__).parent.parent
    example = kitfile_from_data(yaml.safe_load((root / "Kitfile.example").read_text()), "Kitfile.example")
    demo = kitfile_from_data(yaml.safe_load((root / "demo" / "Kitfile").read_text()), "demo/Kitfile")
    assert example.name != demo.name
