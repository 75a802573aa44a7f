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


class DeliveryError(SlawatchError):
    """A notifier could not deliver a batch.

    ``permanent``: retrying cannot help (a 4xx other than 408/429, a rejected
    recipient); the deliveries go dead at once. ``retry_after``: the receiver
    asked for this many seconds of quiet (HTTP Retry-After).
    """

    def __init__(
        self, message: str, *, permanent: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.retry_after = retry_after


class BadInput(ConfigError):
    """A command's or a request's input is malformed or out of bounds (exit 2; HTTP 400)."""


class NotFound(SlawatchError):
    """What a command or request names does not exist (exit 1; HTTP 404)."""

    exit_code = 1
