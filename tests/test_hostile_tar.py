"""Hostile bundles, the tar archives: layers holding path traversal, links, devices or duplicate entries, signed by
the trusted key or not: refused as unsafe-archive before any file is written, and `bundle sign` will not sign them."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from attacker import file_entry, special_entry
from conftest import tree_digest
from hostile_store import _draft_with, Attack, INTEGRITY, REF, attack, base  # noqa: F401  (fixtures)


def _hostile_entries(tmp: Path) -> dict[str, list[tuple[tarfile.TarInfo, bytes | None]]]:
    pax = file_entry("draft/ok.txt", b"pwned")
    pax[0].pax_headers = {"path": "draft/../../../pwned"}
    return {
        "path-traversal": [file_entry("draft/../../../pwned", b"pwned")],
        "absolute-path": [file_entry(str(tmp / "pwned"), b"pwned")],
        "symlink": [special_entry("draft/escape", tarfile.SYMTYPE, str(tmp / "victim"))],
        "symlink-then-write-through": [
            special_entry("draft/sub", tarfile.SYMTYPE, str(tmp)),
            file_entry("draft/sub/pwned", b"pwned"),
        ],
        "hardlink": [special_entry("draft/hard", tarfile.LNKTYPE, str(tmp / "victim"))],
        "char-device": [special_entry("draft/null", tarfile.CHRTYPE, devmajor=1, devminor=3)],
        "block-device": [special_entry("draft/disk", tarfile.BLKTYPE, devmajor=8, devminor=0)],
        "fifo": [special_entry("draft/pipe", tarfile.FIFOTYPE)],
        "duplicate-entry": [file_entry("draft/model.safetensors", b"a second copy that would win on extraction")],
        "pax-path-traversal": [pax],
        "outside-its-layer": [file_entry("target/model.safetensors", b"overrides the target's weights")],
        "below-a-file": [file_entry("draft/config.json/x", b"pwned")],
    }


HOSTILE = list(_hostile_entries(Path("/x")))


def _plant(attack: Attack, case: str) -> None:
    (attack.tmp / "victim").write_bytes(b"victim")
    attack.edit.rewrite(REF, layers={"draft": _draft_with(attack, *_hostile_entries(attack.tmp)[case])})


def _assert_no_escape(attack: Attack) -> None:
    assert (attack.tmp / "victim").read_bytes() == b"victim"
    assert not (attack.tmp / "pwned").exists() and not (attack.tmp / "out" / "pwned").exists()


@pytest.mark.parametrize("case", HOSTILE)
def test_malicious_archive_signed_by_the_trusted_key_is_unsafe(attack: Attack, case: str) -> None:
    _plant(attack, case)
    attack.edit.drop_signatures()
    attack.edit.sign_with_key(REF, attack.base.key)
    attack.refused("unsafe-archive", INTEGRITY, unpack=True)
    _assert_no_escape(attack)


@pytest.mark.parametrize("case", ["path-traversal", "symlink", "hardlink", "char-device", "duplicate-entry"])
def test_malicious_archive_unsigned_is_unsafe_even_with_allow_unsigned(attack: Attack, case: str) -> None:
    _plant(attack, case)
    attack.edit.drop_signatures()
    attack.refused("unsafe-archive", INTEGRITY, "--allow-unsigned", unpack=True)
    _assert_no_escape(attack)


def test_bundle_sign_refuses_a_malicious_archive(attack: Attack) -> None:
    _plant(attack, "symlink")
    attack.edit.drop_signatures()
    before = tree_digest(attack.store)
    result = attack.bundle("sign", REF, "--key", str(attack.base.key))
    assert result.code == INTEGRITY and len(result.err.strip().splitlines()) == 1, result.err
    assert result.err.startswith("error: [unsafe-archive] ")
    assert tree_digest(attack.store) == before and attack.edit.signatures() == []
