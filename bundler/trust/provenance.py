"""SLSA v1 provenance of a pack (https://slsa.dev/spec/v1.0/provenance): how the bundle was built, from what.

  buildDefinition.buildType             BUILD_TYPE: `bundle pack` of a context into a KitOps ModelKit
  buildDefinition.externalParameters    the Kitfile (as the config holds it) and the reference packed
  buildDefinition.internalParameters    which command wrote the statement (pack, or attest afterwards)
  buildDefinition.resolvedDependencies  every file packed: its path in the context and its sha256
  runDetails.builder                    BUILDER_ID, with specbundle's version
  runDetails.metadata                   started and finished (pack only: `attest` did not see the pack run)

The statement's subject (bundler.trust.attest) is the output: the bundle's manifest digest.
"""

from __future__ import annotations

__all__ = ["BUILDER_ID", "BUILD_TYPE", "PREDICATE_TYPE", "build_provenance"]

import datetime as dt
from collections.abc import Mapping
from typing import Any

from bundler.format.mediatypes import SLSA_PROVENANCE_V1

PREDICATE_TYPE = SLSA_PROVENANCE_V1
BUILD_TYPE = "https://specbundle.dev/pack/v1"
BUILDER_ID = "https://specbundle.dev/builder/bundle-pack/v1"


def _time(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_provenance(kitfile: Mapping[str, Any], reference: str, files: Mapping[str, str], written_by: str,
                     started: dt.datetime | None = None, finished: dt.datetime | None = None) -> dict[str, Any]:
    """The SLSA v1 provenance predicate of a pack: `kitfile` as JSON, `files` path -> sha256 of every input file."""
    from bundler import __version__

    predicate: dict[str, Any] = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"kitfile": dict(kitfile), "reference": reference},
            "internalParameters": {"writtenBy": written_by},
            "resolvedDependencies": [{"name": path, "digest": {"sha256": digest}} for path, digest in sorted(files.items())],
        },
        "runDetails": {"builder": {"id": BUILDER_ID, "version": {"specbundle": __version__}}},
    }
    metadata = {}
    if started is not None:
        metadata["startedOn"] = _time(started)
    if finished is not None:
        metadata["finishedOn"] = _time(finished)
    if metadata:
        predicate["runDetails"]["metadata"] = metadata
    return predicate
