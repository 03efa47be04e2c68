"""What a bundle says, shown on a terminal: names, versions, statements and errors holding newlines, escapes or
bidirectional overrides are shown escaped (core.display), and an unverified record never reads as a verified row."""

from __future__ import annotations

import json
from pathlib import Path

from bundletree import make_tree
from conftest import run_bundle
from hostile_registry import hostile


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
