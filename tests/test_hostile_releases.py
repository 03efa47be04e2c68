"""Hostile bundles, the release memory and the reference: an older signed release served again (rollback), the same
version with other content, a tag repointed or renamed, versions by semver precedence, and a damaged or oversized
memory file: refused with a line that says how to proceed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bundletree import make_tree
from conftest import run_bundle, tree_digest
from hostile_store import _context, Attack, INTEGRITY, NEWER, REF, attack, base  # noqa: F401  (fixtures)
from tests.unchecked_pack import pack_unchecked


def test_rollback_to_an_older_version_is_refused(attack: Attack) -> None:
    assert attack.verify(ref=NEWER).code == 0
    attack.refused("rollback", INTEGRITY, unpack=True)


def test_same_version_with_other_content_is_a_rollback(attack: Attack, tmp_path: Path) -> None:
    assert attack.verify().code == 0
    rebuilt = _context(tmp_path / "ctx-rebuilt", "tiny-spec", "1.0.0", 7)
    # `bundle pack` refuses this itself (tests/test_pack_checks.py): the replaced release is made with the library
    pack_unchecked(rebuilt, REF, attack.store, attack.base.key)
    attack.refused("rollback", INTEGRITY)


def _both_keys(attack: Attack) -> list[str]:
    return ["--key", str(attack.base.pub), "--key", str(attack.base.other_pub)]


def test_rollback_memory_holds_across_a_key_rotation(attack: Attack) -> None:
    attack.edit.drop_signatures(attack.edit.manifest_digest(NEWER))
    attack.edit.sign_with_key(NEWER, attack.base.other_key)  # the new key signs 1.1.0; the old key signed 1.0.0
    assert attack.bundle("verify", NEWER, *_both_keys(attack)).code == 0
    before = tree_digest(attack.store)
    result = attack.bundle("verify", REF, *_both_keys(attack))
    assert result.code == INTEGRITY and result.err.startswith("error: [rollback] "), result.err
    assert tree_digest(attack.store) == before


def test_allow_rollback_accepts_an_older_release_for_that_command_only(attack: Attack) -> None:
    assert attack.verify(ref=NEWER).code == 0
    refused = attack.verify()
    assert refused.code == INTEGRITY and "--allow-rollback" in refused.err
    assert attack.verify("--allow-rollback").code == 0
    assert attack.verify().code == INTEGRITY, "the newest version seen is still 1.1.0"


@pytest.mark.parametrize(
    "older, newer",
    [("1.0.0-rc.9", "1.0.0-rc.10"), ("1.0.0-alpha", "1.0.0-alpha.1"), ("1.0.0-alpha.1", "1.0.0-alpha.beta"), ("1.0.0-alpha.beta", "1.0.0-beta"),
     ("1.0.0-beta.2", "1.0.0-beta.11"), ("1.0.0-rc.1", "1.0.0"), ("1.9.0", "1.10.0"), ("1.0.0", "2.0.0+build.1")],
)
def test_versions_follow_semver_precedence(older: str, newer: str) -> None:
    from bundler.trust.releases import version_key

    assert version_key(older) < version_key(newer)


def test_prerelease_rc10_after_rc9_is_an_upgrade_and_back_is_a_rollback(attack: Attack, tmp_path: Path) -> None:
    for version in ("1.0.0-rc.9", "1.0.0-rc.10"):
        ctx = _context(tmp_path / version, "tiny-spec", version, 3)
        run_bundle("pack", str(ctx), "-t", f"tiny-spec:{version}", "--key", str(attack.base.key), "--store", str(attack.store), check=True)
    assert attack.verify(ref="tiny-spec:1.0.0-rc.9").code == 0
    assert attack.verify(ref="tiny-spec:1.0.0-rc.10").code == 0
    attack.refused("rollback", INTEGRITY, ref="tiny-spec:1.0.0-rc.9")


@pytest.mark.parametrize("damage", ["garbage", "not-an-object", "directory", "fifo"])
def test_damaged_rollback_memory_is_a_clear_error_saying_how_to_reset(attack: Attack, damage: str) -> None:
    import os

    assert attack.verify().code == 0
    path = attack.store / ".specbundle" / "versions.json"
    path.unlink()
    if damage == "garbage":
        path.write_bytes(b"{\x00not json")
    elif damage == "not-an-object":
        path.write_text("[1, 2]")
    elif damage == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    result = attack.verify()
    assert result.code == INTEGRITY and result.err.startswith("error: [integrity] ") and "remove" in result.err and "versions.json" in result.err, result.err
    if damage != "directory":
        path.unlink()
    else:
        path.rmdir()
    assert attack.verify().code == 0, "removing the file resets the memory"


def test_version_tag_repointed_at_an_older_signed_release_is_refused(attack: Attack) -> None:
    attack.edit.retag(REF, "tiny-spec:1.1.0")  # the tag says 1.1.0, the signed content is 1.0.0
    attack.refused("signature-mismatch", INTEGRITY, ref="tiny-spec:1.1.0", unpack=True)
    result = attack.verify(ref="tiny-spec:1.1.0")
    assert "--allow-ref-mismatch" in result.err


def test_tag_of_another_name_on_a_signed_bundle_is_refused(attack: Attack) -> None:
    attack.edit.retag(REF, "prod-model:9.9.9")
    attack.refused("signature-mismatch", INTEGRITY, ref="prod-model:9.9.9")


def test_ref_mismatch_is_accepted_with_the_explicit_flag(attack: Attack) -> None:
    attack.edit.retag(REF, "prod-model:9.9.9")
    assert attack.verify("--allow-ref-mismatch", ref="prod-model:9.9.9").code == 0


def test_digest_reference_and_non_version_tag_are_fine(attack: Attack) -> None:
    attack.edit.retag(REF, "tiny-spec:latest")
    assert attack.verify(ref="tiny-spec:latest").code == 0
    assert attack.verify(ref=f"tiny-spec@{attack.edit.manifest_digest(REF)}").code == 0


def test_oversized_rollback_memory_is_refused_before_parsing(tmp_path: Path, keypair) -> None:
    from bundler.store.layout import MAX_STATE

    store = tmp_path / "store"
    run_bundle("pack", str(make_tree(tmp_path / "ctx")), "-t", "tiny-spec:1.0.0", "--key", str(keypair[0]), "--store", str(store), check=True)
    path = store / ".specbundle" / "versions.json"
    path.write_bytes(b"{\"x\": [" + b"[]," * (MAX_STATE // 3) + b"[]]}")
    result = run_bundle("verify", "tiny-spec:1.0.0", "--key", str(keypair[1]), "--store", str(store))
    assert result.code == 3 and result.err.startswith("error: [integrity] ") and "versions.json" in result.err, result.err
