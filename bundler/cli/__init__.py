"""The `bundle` command line: parse, call one library function, print its value. The only place that exits.

`app` holds the group and what every command shares; each other module holds the commands of one purpose;
`render` turns their reports into text."""

from __future__ import annotations

__all__ = ["main"]

from bundler.cli import authoring, checking, decoding, serving, storage, transfer  # noqa: F401  each registers its commands
from bundler.cli.app import main
