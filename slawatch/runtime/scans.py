"""The record of each rule's last scan (``slawatch.scan``): when, how long, how many
alerts, and the error if it failed. ``slawatch status`` and ``/v1/rules`` read it.

Writing it must never stop a scan: a failure to record is logged at DEBUG and
forgotten, and a scan that failed because the database is unreachable is not
recorded at all (the write would only wait for a connection once more).

``slawatch run`` keeps what it last wrote per rule (:class:`ScanRecords`) and writes
a scan only when its outcome differs (alerts claimed, error) or the rule's record is
:data:`REFRESH` old: an idle rule scanned every second costs a write a minute, not
one a second, and the idle rules of a step (runtime/scheduler.py) are written in one
statement (:func:`recorded_idle`). A scan that claimed, or failed, or recovered, is
there at once. When
each rule was last scanned, idle or not, is one row per process
(``slawatch.scanner``), written every :data:`BEAT` seconds while scans run
(:meth:`ScanRecords.beat`): "last scan" (the later of the two) is the last scan run,
at most a few seconds behind, for one write per process, not one per rule.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from psycopg.types.json import Jsonb

from slawatch.clock import Clock
from slawatch.db import Database, DatabaseUnavailable
from slawatch.engine.claim import DrainResult
from slawatch.engine.generation import refusal
from slawatch.engine.queries import queries
from slawatch.errors import SlawatchError

log = logging.getLogger(__name__)

# Seconds after which a scan whose outcome did not change is written all the same.
REFRESH = 60.0
# Seconds between writes of when this process last scanned each rule (slawatch.scanner).
BEAT = 5.0


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
        # This process's row of slawatch.scanner: when each rule was last scanned.
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._ran: dict[str, datetime] = {}
        self._beaten: dict[str, datetime] = {}

    def ran(self, rule: str, at: datetime) -> None:
        """A scan of ``rule`` that began at ``at`` ran (idle or not, failed or not)."""
        self._ran[rule] = at

    def beat(self, db: Database, now: datetime) -> None:
        """Write when each rule was last scanned, if any scanned since the last write
        (one row of slawatch.scanner); a failure is logged at DEBUG, the next beat
        tries again."""
        ran = dict(self._ran)
        if ran == self._beaten:
            return
        params = {
            "instance": self.instance,
            "at": now,
            "scans": Jsonb({rule: at.isoformat() for rule, at in ran.items()}),
        }
        statement = queries()["record_scanner"]
        try:
            db.run("recording when the rules were scanned", lambda c: c.execute(statement, params))
        except SlawatchError as exc:
            log.debug("the scans' times were not recorded: %s", exc)
            return
        self._beaten = ran

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


def recorded_idle(
    db: Database, scans: list[tuple[str, datetime, float]], records: ScanRecords
) -> None:
    """Scans of nothing, each (rule, when it began, seconds), recorded as
    :func:`recorded` records one (``records`` told each ran; a row written where the
    last one is old), the rows in one statement: a step's idle rules
    (runtime/scheduler.py). A failure is logged at DEBUG: the next scans write again."""
    wanted = []
    for rule, at, seconds in scans:
        records.ran(rule, at)
        if records.wanted(rule, 0, None):
            wanted.append((rule, at, round(seconds * 1000)))
    if not wanted:
        return
    params = {
        "rules": [w[0] for w in wanted],
        "at": [w[1] for w in wanted],
        "duration_ms": [w[2] for w in wanted],
    }
    statement = queries()["record_scans"]
    try:
        db.run("recording the scans of a step", lambda c: c.execute(statement, params))
    except SlawatchError as exc:
        log.debug("the scans of rules %s were not recorded: %s", params["rules"], exc)
        return
    for rule, _, _ in wanted:
        records.written(rule, 0, None)


def _write(
    db: Database,
    rule: str,
    at: datetime,
    started: float,
    claimed: int,
    error: str | None,
    records: ScanRecords | None,
) -> None:
    if records is not None:
        records.ran(rule, at)
        if not records.wanted(rule, claimed, error):
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
