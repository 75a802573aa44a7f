"""The exceptions slawatch raises; the CLI maps each family to an exit code."""

from __future__ import annotations


class SlawatchError(Exception):
    """Root of every expected slawatch failure: printed as one line, no traceback."""

    exit_code = 1


class ConfigError(SlawatchError):
    """A rule, notifier, setting or command line is wrong (exit 2)."""

    exit_code = 2


class DatabaseError(SlawatchError):
    """The database could not be reached or refused an operation (exit 1)."""

    exit_code = 1
