"""Maintenance: alert and delivery history older than the retention, removed in bounded batches.

The outbox (``slawatch.alert``, ``slawatch.delivery``) grows by every alert;
without pruning, a long run's claims insert into ever larger tables and
indexes. :func:`prune` removes whole alerts -- an alert with all its
deliveries -- fired before ``now - retention``, a batch per statement and
transaction, never one huge DELETE. An alert with a delivery still pending is
kept with all its deliveries, whatever its age: nothing that may still be sent
is lost.

Old alerts are found per rule through the ``alert_rule_fired`` index (the
rules themselves by a skip scan of the same index), their deliveries through
``delivery_once``: a batch reads the old rows it removes, not the table. The
claim's inserts get no extra index entry for it. Space freed here is reused
by new alerts once (auto)vacuum has run, so the tables stay as large as the
retention window.

:meth:`slawatch.runtime.scheduler.Runner.maintain` runs :func:`prune` as an interval
job of ``slawatch run``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from slawatch.clock import Clock
from slawatch.db import Connection, Database
from slawatch.engine.queries import queries

log = logging.getLogger(__name__)

BATCH = 5000  # alerts per statement: a short transaction, a bounded lock set and WAL burst
BUDGET = timedelta(minutes=2)  # the most one run spends; the next run goes on
EVERY = timedelta(minutes=10)  # between runs inside `slawatch run`


@dataclass
class PruneResult:
    """What one :func:`prune` run removed, in how many statements."""

    alerts: int = 0
    deliveries: int = 0
    batches: int = 0


def prune_batch(conn: Connection, cutoff: datetime, batch: int = BATCH) -> tuple[int, int]:
    """Remove at most ``batch`` alerts fired before ``cutoff`` (none with a pending
    delivery), with their deliveries, in one statement; return (alerts, deliveries).

    ``conn`` is an autocommit connection: the statement is its own transaction.
    """
    row = conn.execute(queries()["prune_history"], {"cutoff": cutoff, "batch": batch}).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def prune(
    db: Database,
    clock: Clock,
    retention: timedelta,
    *,
    batch: int = BATCH,
    budget: timedelta = BUDGET,
) -> PruneResult:
    """Remove the history older than ``retention`` at ``clock.now()``, batch after batch,
    while batches come back full and ``budget`` is not spent.

    Raises ``DatabaseError`` (after the batches that committed) when the database fails.
    """
    cutoff = clock.now() - retention
    started = time.monotonic()
    result = PruneResult()
    while True:
        # db.run: one statement, so a lost prepared statement (PgBouncer) is retried once.
        alerts, deliveries = db.run(
            "pruning alert history", lambda conn: prune_batch(conn, cutoff, batch)
        )
        result.alerts += alerts
        result.deliveries += deliveries
        result.batches += 1
        # A short batch: nothing more is old and finished (or a concurrent
        # pruner took some); the next run looks again.
        if alerts < batch:
            return result
        if time.monotonic() - started >= budget.total_seconds():
            log.info(
                "pruning history: time budget spent with old history left; the next run goes on"
            )
            return result
