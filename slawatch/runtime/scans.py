"""The record of each rule's last scan (``slawatch.scan``): when, how long, how many
alerts, and the error if it failed. ``slawatch status`` and ``/v1/rules`` read it.

Writing it must never stop a scan: a failure to record is logged at DEBUG and
forgotten, and a scan that failed because the database is unreachable is not
recorded at all (the write would only wait for a connection once more).

``slawatch run`` keeps what it last wrote per rule (:class:`ScanRecords`) and writes
a scan only when its outcome differs (alerts claimed, error) or the rule's record is
:data:`REFRESH` old: an idle rule scanned every second costs a write a minute, not
one a second. So "last scan" of a rule whose scans find nothing may be up to a
minute old; a scan that claimed, or failed, or recovered, is there at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from slawatch.clock import Clock
from slawatch.db import Database, DatabaseUnavailable
from slawatch.engine.claim import DrainResult
from slawatch.engine.generation import refusal
from slawatch.engine.queries import queries
from slawatch.errors import SlawatchError

log = logging.getLogger(__name__)

# Seconds after which a scan whose outcome did not change is written all the same.
REFRESH = 60.0


@dataclass(frozen=True)
class _Written:
    claimed: int
    error: str | None
    at: float  # time.monotonic() of the write


class ScanRecords:
    """What this process last wrote to ``slawatch.scan``, per rule: a scan that ends
    like the last one written, less than ``refresh`` seconds ago, is not written."""

    def __init__(self, refresh: float = REFRESH) -> None:
        self.refresh = refresh
        self._last: dict[str, _Written] = {}  # one scan per rule at a time: no lock

    def wanted(self, rule: str, claimed: int, error: str | None) -> bool:
        last = self._last.get(rule)
        return (
            last is None
            or (last.claimed, last.error) != (claimed, error)
            or time.monotonic() - last.at >= self.refresh
        )

    def written(self, rule: str, claimed: int, error: str | None) -> None:
        self._last[rule] = _Written(claimed, error, time.monotonic())


def recorded(
    db: Database,
    rule: str,
    clock: Clock,
    drain: Callable[[str], DrainResult],
    records: ScanRecords | None = None,
) -> DrainResult:
    """``drain(rule)``, with its time, alerts and outcome written to ``slawatch.scan``
    (with ``records``, only when it differs from the last one written, or that is old).

    Raises what ``drain`` raised, after recording it.
    """
    at, started = clock.now(), time.monotonic()
    try:
        result = drain(rule)
    except DatabaseUnavailable:
        raise  # recording would only wait for a connection once more
    except SlawatchError as exc:
        # Another definition of the rule is recorded: the instances running it scan it.
        if refusal(exc) is None:
            _write(db, rule, at, started, 0, str(exc), records)
        raise
    except Exception as exc:
        _write(db, rule, at, started, 0, f"unexpected {type(exc).__name__}: {exc}", records)
        raise
    _write(db, rule, at, started, result.claimed, None, records)
    return result


def _write(
    db: Database,
    rule: str,
    at: datetime,
    started: float,
    claimed: int,
    error: str | None,
    records: ScanRecords | None,
) -> None:
    if records is not None and not records.wanted(rule, claimed, error):
        return
    params = {
        "rule": rule,
        "at": at,
        "duration_ms": round((time.monotonic() - started) * 1000),
        "claimed": claimed,
        "error": error,
    }
    statement = queries()["record_scan"]
    try:
        db.run(f"recording the scan of rule {rule}", lambda c: c.execute(statement, params))
    except SlawatchError as exc:
        log.debug("rule %s: the scan was not recorded: %s", rule, exc)
        return
    if records is not None:
        records.written(rule, claimed, error)
