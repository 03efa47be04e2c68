"""The release memory: which manifest digest each signed `name version` has, and the highest version seen.

Verify records what it accepted (`.specbundle/versions.json`) and refuses a lower version or a replaced
release; pack and sign refuse to make a release the store already knows with other content; pull merges
what verifying the pulled bundle recorded into the store's memory.
"""

from __future__ import annotations

__all__ = [
    "ROLLBACK_STATE", "check_new_release", "memory", "merge", "remember", "signed_releases", "version_key",
]

from typing import Any

from bundler.trust import signature
from core.errors import BundleError
from bundler.store.referrers import signature_artifacts
from bundler.store.layout import Store

ROLLBACK_STATE = "versions"


def version_key(version: str) -> tuple:
    """SemVer 2.0 precedence as a sort key: build metadata ignored, a pre-release before its release,
    pre-release identifiers compared one by one, numeric ones numerically and below alphanumeric ones,
    a shorter list of equal identifiers first (1.0.0-rc.9 < 1.0.0-rc.10 < 1.0.0)."""
    core, _, pre = version.split("+", 1)[0].partition("-")
    nums = tuple(_number(x) if _is_number(x) else (0, "") for x in core.split("."))
    nums = (nums + ((0, ""),) * 3)[:3] if len(nums) <= 3 else nums
    if not pre:
        return (nums, (1,))
    ids = tuple((0, _number(x), "") if _is_number(x) else (1, (0, ""), x) for x in pre.split("."))
    return (nums, (0, ids))


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _number(digits: str) -> tuple[int, str]:
    """A decimal number as a sort key without int(): numeric order for any length (Python refuses int() of
    more than 4,300 digits, and a Kitfile's version may be that long)."""
    digits = digits.lstrip("0")
    return (len(digits), digits)


def memory(state: dict[str, Any], name: str) -> dict[str, Any]:
    """This name's rollback memory: one entry per bundle name, whichever trusted key signed.

    Earlier stores kept one entry per name and signer (`name|key id`): those are folded in, so a key
    rotation cannot bring back a release older than one already seen under the other key.
    """
    seen: dict[str, Any] = {"highest": None, "digests": {}}
    for key, entry in state.items():
        if key != name and key.split("|", 1)[0] != name:
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("digests", {}), dict) or not isinstance(entry.get("highest"), (str, type(None))):
            raise BundleError("integrity", f"the store's rollback memory for {name!r} is damaged; remove .specbundle/{ROLLBACK_STATE}.json in the store to reset it (this forgets the versions seen)")
        for version, digest in entry.get("digests", {}).items():
            seen["digests"].setdefault(version, digest)
        highest = entry.get("highest")
        if highest and (not seen["highest"] or version_key(highest) > version_key(seen["highest"])):
            seen["highest"] = highest
    return seen


def remember(store: Store, name: str, version: str, digest: str) -> None:
    """Record that `name version` is `digest`, raising the highest version seen when it is higher (verify does
    this for what it accepted; one entry per name, whichever key signed)."""
    with store.lock():
        state = store.state(ROLLBACK_STATE)
        seen = memory(state, name)
        seen["digests"][version] = digest
        if not seen["highest"] or version_key(version) > version_key(seen["highest"]):
            seen["highest"] = version
        state = {k: v for k, v in state.items() if k.split("|", 1)[0] != name}
        state[name] = seen
        store.write_state(ROLLBACK_STATE, state)


def signed_releases(store: Store, name: str, version: str) -> set[str]:
    """The manifest digests this store knows as release `name version`, signed: the signatures it holds
    (their predicate's name, version and manifest digest, over that very subject) and the digests verify
    remembers for its rollback check (.specbundle/versions.json).

    Signatures are read, not verified: the store keeps only those it made or pull verified, and this only
    decides what pack and sign refuse to make, never what is trusted.
    """
    found: set[str] = set()
    for _, subject, data in signature_artifacts(store):
        claims = signature.read_unverified(data)
        fields = claims.bundle if claims is not None else {}
        if (fields.get("name"), fields.get("version"), fields.get("manifest_digest")) == (name, version, subject):
            found.add(subject)
    remembered = memory(store.state(ROLLBACK_STATE), name)["digests"].get(version)
    if isinstance(remembered, str):
        found.add(remembered)
    return found


def check_new_release(store: Store, name: str, version: str, digest: str) -> None:
    """Refuse to make `name version` with content `digest` when the store has that release signed with other
    content: verify would refuse one of the two as a replaced release (`rollback`). The same content passes."""
    other = sorted(signed_releases(store, name, version) - {digest})
    if other:
        raise BundleError("rollback", f"{name} {version} is already signed in this store with other content "
                          f"({other[0][:19]}…): raise package.version in the Kitfile for a new release")


def merge(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Rollback memory after a pull: what the store knew, plus what verifying the pulled bundle recorded."""
    out = dict(mine)
    for key, seen in theirs.items():
        old = out.get(key)
        if not isinstance(old, dict) or not isinstance(seen, dict):  # a damaged entry: what verify recorded wins
            out[key] = seen
            continue
        highest = max((v for v in (old.get("highest"), seen.get("highest")) if v and isinstance(v, str)), key=version_key, default=None)
        digests = [d if isinstance(d, dict) else {} for d in (seen.get("digests"), old.get("digests"))]
        out[key] = {"highest": highest, "digests": {**digests[0], **digests[1]}}
    return out
