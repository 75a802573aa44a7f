"""The record of each rule's last scan (``slawatch.scan``): when, how long, how many
alerts, and the error if it failed. ``slawatch status`` and ``/v1/rules`` read it.

Writing it must never stop a scan: a failure to record is logged at DEBUG and
forgotten, and a scan that failed because the database is unreachable is not
recorded at all (the write would only wait for a connection once more).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

from slawatch.clock import Clock
from slawatch.db import Database, DatabaseUnavailable
from slawatch.engine.claim import DrainResult
from slawatch.engine.queries import queries
from slawatch.errors import SlawatchError

log = logging.getLogger(__name__)


def recorded(
    db: Database, rule: str, clock: Clock, drain: Callable[[str], DrainResult]
) -> DrainResult:
    """``drain(rule)``, with its time, alerts and outcome written to ``slawatch.scan``.

    Raises what ``drain`` raised, after recording it.
    """
    at, started = clock.now(), time.monotonic()
    try:
        result = drain(rule)
    except DatabaseUnavailable:
        raise  # recording would only wait for a connection once more
    except SlawatchError as exc:
        _write(db, rule, at, started, 0, str(exc))
        raise
    except Exception as exc:
        _write(db, rule, at, started, 0, f"unexpected {type(exc).__name__}: {exc}")
        raise
    _write(db, rule, at, started, result.claimed, None)
    return result


def _write(
    db: Database, rule: str, at: datetime, started: float, claimed: int, error: str | None
) -> None:
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
