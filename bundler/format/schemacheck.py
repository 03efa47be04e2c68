"""The JSON Schemas of the `schemas` package (Kitfile, signature predicate, run record), each loaded and
checked once, and what a value breaks of one."""

from __future__ import annotations

__all__ = ["schema_problem", "validator"]

import functools
import json
from importlib import resources
from typing import Any

import jsonschema


@functools.cache
def validator(name: str) -> jsonschema.protocols.Validator:
    """A validator for schemas/<name> in the dialect its `$schema` names, the schema itself checked first."""
    schema = json.loads(resources.files("schemas").joinpath(name).read_text(encoding="utf-8"))
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def schema_problem(name: str, value: Any) -> str | None:
    """Why `value` does not match schemas/<name> (jsonschema's best match, with where it is), or None."""
    error = jsonschema.exceptions.best_match(validator(name).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path)
    return error.message + (f" (at {where})" if where else "")
