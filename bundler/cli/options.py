"""Option values checked as click parses them (devices, sizes), and the prompt a command reads."""

from __future__ import annotations

__all__ = ["device_option", "expected_reference", "max_body_option", "memory_budget_option", "prompt_cache_option", "size_option"]

import re
from typing import Any

import click

from core.errors import BundleError


_DEVICE = re.compile(r"^(cpu|cuda(:[0-9]+)?|mps)$")


def device_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not _DEVICE.match(value):
        raise click.BadParameter(f"{value!r} is not a device: use cpu, cuda or cuda:N")
    return value


def size_option(value: str, option: str) -> int:
    """An option's size in bytes (bundler.format.sizes), its error as click's, without the option's name twice."""
    from bundler.format.sizes import parse_size

    try:
        return parse_size(value, option)
    except BundleError as err:
        raise click.BadParameter(err.message.removeprefix(f"{option} ")) from None


def memory_budget_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    return None if value is None else size_option(value, "--memory-budget")


def prompt_cache_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None or value.strip() == "0":  # 0: no prompt cache (parse_size takes 1 byte at least)
        return None if value is None else 0
    return size_option(value, "--prompt-cache")


def max_body_option(ctx: click.Context, param: click.Parameter, value: str | int) -> int:
    size = value if isinstance(value, int) else size_option(value, "--max-body")  # an int: the default, in bytes
    if size < 1:
        raise click.BadParameter("must be at least 1 byte")
    return size


def expected_reference(from_dir: str | None, expect: str | None) -> Any:
    """serve's --expect (else $BUNDLE_EXPECT), parsed (bundler.verbs.fromdir.Expected); None when neither is set.
    One parser for every reference: a tag beside a digest is checked too (bundler.verbs.fromdir.parse_expected)."""
    from bundler.verbs.fromdir import expected_from

    if not from_dir:
        source = click.get_current_context().get_parameter_source("expect")
        if expect is not None and source == click.core.ParameterSource.COMMANDLINE:
            raise BundleError("usage", "--expect goes with --from-dir (REF already names the bundle)")
        return None  # $BUNDLE_EXPECT set for a --from-dir pod, here serving from the store
    return expected_from(expect)
