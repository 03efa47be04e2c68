"""storage_reference: the one reading of a `bundle://` / `kit://` storage URI or a plain reference that fetch
and serve --from-dir's --expect share."""

from __future__ import annotations

import pytest

from bundler.store.refs import parse_storage_reference, storage_reference
from bundler.verbs.fetch import storage_ref
from bundler.verbs.fromdir import Expected, parse_expected
from core.errors import BundleError

DIGEST = "sha256:" + "0" * 64


@pytest.mark.parametrize("scheme", ["bundle://", "kit://"])
def test_a_storage_scheme_is_dropped(scheme: str) -> None:
    assert storage_reference(f"{scheme}registry.example:5000/team/model:1.0.0") == "registry.example:5000/team/model:1.0.0"


@pytest.mark.parametrize("text", ["kit://robot:pa55w0rd@registry.example/model:1.0.0", "robot:pa55w0rd@registry.example/model:1.0.0"])
def test_credentials_before_the_host_are_dropped_with_or_without_a_scheme(text: str) -> None:
    assert storage_reference(text) == "registry.example/model:1.0.0"


def test_the_at_of_a_digest_is_not_taken_for_credentials() -> None:
    assert storage_reference(f"kit://model@{DIGEST}") == f"model@{DIGEST}"
    assert storage_reference(f"registry.example/model@{DIGEST}") == f"registry.example/model@{DIGEST}"


def test_a_plain_reference_is_returned_as_written() -> None:
    assert storage_reference("model:latest") == "model:latest"


@pytest.mark.parametrize("text", ["oci://registry.example/model:1.0.0", "KIT://registry.example/model:1.0.0", "model/x://y"])
def test_another_scheme_is_none_for_the_caller_to_refuse(text: str) -> None:
    assert storage_reference(text) is None


# ---------------------------------------------------------------- fetch's STORAGE_URI and --expect read alike


def test_expect_reads_a_bare_name_at_a_digest_as_fetch_does() -> None:
    ref = storage_ref(f"kit://model@{DIGEST}")
    assert (ref.repository, ref.digest) == ("model", DIGEST)
    assert parse_expected(f"kit://model@{DIGEST}") == Expected(f"model@{DIGEST}", "model", None, DIGEST)


def test_expect_drops_the_credentials_of_a_plain_reference_as_fetch_does() -> None:
    text = "robot:pa55w0rd@registry.example/model:1.0.0"
    assert str(storage_ref(text)) == "registry.example/model:1.0.0"
    assert parse_expected(text) == Expected("registry.example/model:1.0.0", "model", "1.0.0", None)


@pytest.mark.parametrize("text", ["kit://robot:pa55w0rd@model", "bundle://robot:pa55w0rd@model", "robot:pa55w0rd@model",
                                  f"kit://robot:pa55w0rd@model@{DIGEST}"])
def test_a_refused_reference_is_quoted_with_its_credentials_masked_without_a_slash_too(text: str) -> None:
    with pytest.raises(BundleError) as refused:
        parse_storage_reference(text)
    assert refused.value.code == "usage" and "pa55w0rd" not in refused.value.message and "***@" in refused.value.message
