"""The application clock: the only source of "now" for rule logic.

SQL never calls ``now()`` for a deadline; the claim receives this clock's time
as a parameter, so tests move it with freezegun and database clock skew cannot
move a deadline.
"""

from __future__ import annotations

from datetime import UTC, datetime


class Clock:
    """Wall-clock time in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)
