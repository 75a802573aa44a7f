"""Maintenance: alert and delivery history older than the retention, dropped a whole id
range at a time where it can be and otherwise removed in bounded batches, with the
acks and silences that belong to it.

Since 0015_rotate.sql the outbox is partitioned by alert id ranges
(slawatch/engine/rotate.py): :func:`prune` first rotates (opens the next range once the
open one is :func:`~slawatch.engine.rotate.rotate_every` old) and drops every closed
range whose newest alert is older than the window and which holds nothing retention
keeps (``slawatch.history_drop``): a DROP TABLE, not a DELETE per row. What the drops
leave -- a range kept past its turn, the open range under a window shorter than a
rotation period -- goes by the batches below, one range after the other
(:func:`prune_ranges`): a batch reads one range's partitions, their indexes in order.
A rotation or a drop that fails (a lock not granted in 2 s, any error) is one warning
line and changes nothing; the batches go on, and the next run tries again. Since
0026_outbox_rows_ranges.sql the outbox in rows (``slawatch.outbox_row``,
``slawatch.outbox_send``) is kept in the same ranges: the same rotation and drop take
its rows and sends, and :func:`prune_rows` takes what the drops leave, range by range.

The outbox (``slawatch.alert``, ``slawatch.delivery``) grows by every alert;
without pruning, a long run's claims insert into ever larger tables and
indexes. :func:`prune` removes whole alerts -- an alert with all its
deliveries -- fired before ``now - retention``, a batch per statement and
transaction, never one huge DELETE. An alert with a delivery still pending is
kept with all its deliveries, whatever its age: nothing that may still be sent
is lost.

Operators' records go by the same window, in the same statements: an ack
(``slawatch.ack``) goes with the alert it names, never after it, and keeps that
alert while the ack itself is younger than the window (the claim still reads it
when the episode's re-notification comes due); a silence goes once it ended
before ``now - retention``.

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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from slawatch.clock import Clock
from slawatch.config.rules import Rule
from slawatch.db import Connection, Database, DatabaseUnavailable, Interrupted, translate
from slawatch.engine.queries import queries
from slawatch.engine.rotate import rotate_every
from slawatch.engine.timers import DEDUPE, prune_timers
from slawatch.errors import DatabaseError

T = TypeVar("T")

log = logging.getLogger(__name__)

BATCH = 5000  # alerts per statement: a short transaction, a bounded lock set and WAL burst
BUDGET = timedelta(minutes=2)  # the most one run spends; the next run goes on
EVERY = timedelta(minutes=10)  # between runs inside `slawatch run`


@dataclass
class PruneResult:
    """What one :func:`prune` run (or one batch) removed, in how many statements."""

    alerts: int = 0
    deliveries: int = 0
    batches: int = 0
    acks: int = 0
    silences: int = 0
    orphans: int = 0  # of the acks, those whose alert was gone already
    timers: int = 0  # event rules' closed timers (and stops that never met their start)
    event_ids: int = 0  # event ids older than the dedupe window
    held: int = 0  # held events (of types no rule knew) older than the retention
    episodes: int = 0  # the episode history's rows of episodes ended before the window
    ranges: int = 0  # id ranges dropped whole (their alerts and deliveries are counted)
    rows: int = 0  # rows of the outbox in rows (0020_outbox_rows.sql), with their sends
    sends: int = 0

    def __iadd__(self, other: PruneResult) -> PruneResult:
        self.alerts += other.alerts
        self.deliveries += other.deliveries
        self.batches += other.batches
        self.acks += other.acks
        self.silences += other.silences
        self.orphans += other.orphans
        self.timers += other.timers
        self.event_ids += other.event_ids
        self.held += other.held
        self.episodes += other.episodes
        self.ranges += other.ranges
        self.rows += other.rows
        self.sends += other.sends
        return self

    def full(self, batch: int) -> bool:
        """Some part of a batch came back full: there may be more of it."""
        return max(self.alerts, self.orphans, self.silences, self.episodes) >= batch


IdRange = tuple[int, int]  # alert ids [low, high): one partition of the outbox


def prune_ranges(conn: Connection, cutoff: datetime) -> list[IdRange]:
    """The alert id ranges the batches go through, oldest first: those drops leave
    (kept past their turn, and the open one); all ids while the outbox is unconverted."""
    with translate("reading the alert history ranges"):
        rows = conn.execute(queries()["prune_ranges"], {"cutoff": cutoff}).fetchall()
    return [(int(r[0]), int(r[1])) for r in rows]


def prune_batch(
    conn: Connection, cutoff: datetime, batch: int = BATCH, ids: IdRange | None = None
) -> PruneResult:
    """Remove, in one statement, at most ``batch`` alerts fired before ``cutoff`` (none
    with a pending delivery, none named by an ack from after ``cutoff``) with their
    deliveries and acks, at most ``batch`` acks from before ``cutoff`` whose alert is
    gone, and at most ``batch`` silences that ended before ``cutoff``; then, in a second
    statement, at most ``batch`` episodes of the history that ended before ``cutoff``.

    The alerts are those of the id range ``ids`` (one of :func:`prune_ranges`); without
    it, of the first range that has any to remove.

    ``conn`` is an autocommit connection: each statement is its own transaction.
    """
    if ids is None:
        result = PruneResult()
        for each in prune_ranges(conn, cutoff):
            result = prune_batch(conn, cutoff, batch, each)
            if result.alerts:
                break
        return result
    params = {"cutoff": cutoff, "batch": batch, "lo": ids[0], "hi": ids[1]}
    with conn.transaction():
        # Priced high (the correlated lookups over every partition they may probe), the
        # statement was JIT-compiled each batch: 3.7 s of a 4 s batch (docs/performance.md).
        conn.execute("SET LOCAL jit = off")
        row = conn.execute(queries()["prune_history"], params).fetchone()
    episodes = conn.execute(queries()["prune_episodes"], params).rowcount
    if row is None:
        return PruneResult(batches=1, episodes=episodes)
    alerts, deliveries, acks, orphans, silences = (int(v) for v in row)
    return PruneResult(
        episodes=episodes,
        alerts=alerts,
        deliveries=deliveries,
        batches=1,
        acks=acks + orphans,
        silences=silences,
        orphans=orphans,
    )


def prune(
    db: Database,
    clock: Clock,
    retention: timedelta,
    *,
    batch: int = BATCH,
    budget: timedelta = BUDGET,
) -> PruneResult:
    """Remove the history older than ``retention`` at ``clock.now()`` (alerts with their
    deliveries and acks, orphaned acks, ended silences), batch after batch, while a
    batch comes back full and ``budget`` is not spent.

    Raises ``DatabaseError`` (after the batches that committed) when the database fails.
    """
    now = clock.now()
    cutoff = now - retention
    started = time.monotonic()
    result = rotate(db, now, retention)
    todo = db.run("pruning alert history", lambda conn: prune_ranges(conn, cutoff))
    # No range to read (every one waits for its drop): one batch still takes the
    # orphaned acks, ended silences and episodes.
    for ids in todo or [(0, 0)]:

        def one(conn: Connection, ids: IdRange = ids) -> PruneResult:
            return prune_batch(conn, cutoff, batch, ids)

        while True:
            # db.run: one statement, so a lost prepared statement (PgBouncer) is retried once.
            got = db.run("pruning alert history", one)
            result += got
            # Every part short: nothing more is old and finished in this range (or a
            # concurrent pruner took some); on to the next range.
            if not got.full(batch):
                break
            if time.monotonic() - started >= budget.total_seconds():
                log.info(
                    "pruning history: time budget spent with old history left; the next run goes on"
                )
                return result
    result += prune_rows(db, cutoff, batch, started, budget)
    return result


def prune_rows(
    db: Database, cutoff: datetime, batch: int, started: float, budget: timedelta
) -> PruneResult:
    """The outbox in rows (docs/explanation/outbox-rows.md): rows fired before ``cutoff``
    whose every send is settled, removed with their sends, ``batch`` rows a statement
    (queries.sql, prune_outbox_rows), one id range after the other (those
    ``history_drop`` leaves: prune_row_ranges), while a batch comes back full and the
    ``budget`` (from ``started``, time.monotonic) is not spent. A row with a send pending
    is kept."""
    result = PruneResult()

    def ranges(conn: Connection) -> list[IdRange]:
        with translate("reading the outbox rows' ranges"):
            got = conn.execute(queries()["prune_row_ranges"], {"cutoff": cutoff}).fetchall()
        return [(int(r[0]), int(r[1])) for r in got]

    for lo, hi in db.run("pruning the outbox rows", ranges):

        def one(conn: Connection, lo: int = lo, hi: int = hi) -> tuple[int, int]:
            params = {"cutoff": cutoff, "batch": batch, "lo": lo, "hi": hi}
            with translate("pruning the outbox rows"), conn.transaction():
                conn.execute("SET LOCAL jit = off")
                row = conn.execute(queries()["prune_outbox_rows"], params).fetchone()
            return (int(row[0]), int(row[1])) if row else (0, 0)

        while True:
            rows, sends = db.run("pruning the outbox rows", one)
            result += PruneResult(rows=rows, sends=sends)
            if time.monotonic() - started >= budget.total_seconds():
                return result
            if rows < batch:
                break
    return result


def drop_range(conn: Connection, cutoff: datetime) -> PruneResult:
    """Drop the oldest id range that can go (``slawatch.history_drop``), in one short
    transaction; an empty result when none can."""
    with translate("dropping an alert history range"):
        row = conn.execute(
            "SELECT n, alerts, deliveries, acks FROM slawatch.history_drop(%(cutoff)s)",
            {"cutoff": cutoff},
        ).fetchone()
    if row is None:
        return PruneResult()
    log.info("dropped alert history range %s (about %s alerts)", row[0], row[1])
    return PruneResult(alerts=int(row[1]), deliveries=int(row[2]), acks=int(row[3]), ranges=1)


def rotate(db: Database, now: datetime, retention: timedelta) -> PruneResult:
    """Open the next id range when the open one is due to close, then drop, one
    transaction each, every range that is past the window and holds nothing kept.

    A rotation or a drop that fails (a lock not granted within the functions'
    lock_timeout, any error of the database) is one warning line: the run goes on with
    the row-by-row batches, which take what the drops left, and the next run tries
    again. A database that cannot be reached raises ``DatabaseUnavailable`` (nothing
    else can go on; the outage's line says it), and a stopping slawatch ``Interrupted``.
    """
    every = rotate_every(retention)

    def turn(conn: Connection) -> None:
        with translate("rotating alert history"):
            row = conn.execute(
                "SELECT slawatch.history_rotate(%(now)s, %(every)s)", {"now": now, "every": every}
            ).fetchone()
        if row and row[0] is not None:
            log.info("opened alert history range %s", row[0])

    _or_warn(db, turn, "the open range stays open; the next run tries again")
    result = PruneResult()
    while True:
        got = _or_warn(
            db,
            lambda conn: drop_range(conn, now - retention),
            "the range is kept; the next run tries again",
        )
        if got is None or not got.ranges:
            return result
        result += got


def _or_warn(db: Database, work: Callable[[Connection], T], then: str) -> T | None:
    """``work``'s result, or None after one warning line (the error, then ``then``)
    when the database refused it; an outage and a stop go on up."""
    try:
        return db.run("pruning alert history", work)
    except (DatabaseUnavailable, Interrupted):
        raise
    except DatabaseError as exc:
        log.warning("%s (%s)", exc, then)
        return None


_PRUNE_EVENT_IDS = """\
DELETE FROM slawatch.event_seen WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM slawatch.event_seen WHERE at < %(cutoff)s LIMIT %(batch)s))"""
_PRUNE_HELD = """\
DELETE FROM slawatch.event_held WHERE n = ANY (ARRAY(
    SELECT n FROM slawatch.event_held WHERE received < %(cutoff)s LIMIT %(batch)s))"""


def prune_events(
    db: Database,
    rules: list[Rule],
    clock: Clock,
    retention: timedelta,
    *,
    batch: int = BATCH,
    budget: timedelta = BUDGET,
    dedupe: timedelta = DEDUPE,
) -> PruneResult:
    """Remove event rules' closed timers older than ``retention`` (a stop that waited
    ``within`` for its start sooner), held events older than ``retention``, and event
    ids older than the dedupe window ``dedupe`` (``SLAWATCH_DEDUPE_WINDOW``), batch
    after batch within ``budget``."""
    now = clock.now()
    started = time.monotonic()
    result = PruneResult()

    def spent() -> bool:
        return time.monotonic() - started >= budget.total_seconds()

    for rule in rules:
        if rule.events is None:
            continue
        while not spent():

            def timers(conn: Connection, rule: Rule = rule) -> int:
                return prune_timers(conn, rule, now - retention, now, batch)

            got = db.run(f"pruning timers of rule {rule.name}", timers)
            result.timers += got
            result.batches += 1
            if got < batch:
                break
    ids, batches = _prune_rows(db, "event ids", _PRUNE_EVENT_IDS, now - dedupe, batch, spent)
    held, more = _prune_rows(db, "held events", _PRUNE_HELD, now - retention, batch, spent)
    result.event_ids, result.held, result.batches = ids, held, result.batches + batches + more
    return result


def _prune_rows(
    db: Database,
    what: str,
    statement: str,
    cutoff: datetime,
    batch: int,
    spent: Callable[[], bool],
) -> tuple[int, int]:
    """Run a DELETE of at most ``batch`` rows older than ``cutoff`` until one comes back
    short or the time is ``spent``: the rows removed, in how many statements."""
    removed = batches = 0

    def old(conn: Connection) -> int:
        with translate(f"pruning {what}"):
            return conn.execute(statement, {"cutoff": cutoff, "batch": batch}).rowcount

    while not spent():
        got = db.run(f"pruning {what}", old)
        removed, batches = removed + got, batches + 1
        if got < batch:
            break
    return removed, batches
