"""Subcommand parsers of the ``irpe`` CLI, one module per area; each only parses and calls a library."""

from __future__ import annotations


class CLIError(Exception):
    """A user error: printed as one line naming the fix, exit code 2."""


# Errors the library raises for bad user input (their messages name the fix); anything else is a bug.
USER_ERRORS: tuple[type[BaseException], ...] = (CLIError, ValueError, FileNotFoundError, PermissionError)
