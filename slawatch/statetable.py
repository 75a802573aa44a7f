"""``track: table``: a rule's state in a narrow table of slawatch's own.

slawatch never writes the watched table, and the role that runs it needs only
``SELECT`` there. The watched table needs one partial index, on the deadline of
its open rows (``sw_<rule>_due``). Per rule, ``slawatch."<rule>_state"`` holds
one row per watched row that was ever notified: its key, the deadline value of
its current episode (``sw_seen``, NULL when none is open), the episode number,
the notifications sent in it and the time of the next one (partial index).

A scan finds work in three ways, each costing what it finds:

- *fresh*: open rows whose deadline passed since the last scan, read from the
  due index between a **watermark** (the last complete scan, less a look-back
  for transactions that commit late) and now, without a state row for that
  deadline value: a new episode, notification #1;
- *again*: state rows whose re-notification is due, re-checked against the
  watched table: still open with the same deadline means n+1; otherwise the
  episode ended and is closed;
- the **sweep**, every ``sweep`` (and on the first scan): closes the episodes
  whose rows completed or moved, and reads the whole due index once, for rows
  that became open with a deadline already older than the look-back
  (backfills, a job restarted, a refund reopened).

Concurrent scanners cannot lock the watched rows (no UPDATE privilege); the
state table's primary key decides instead: an episode is opened by an upsert
that changes a state row only when its deadline value differs, so of two
scanners that found the same row, one writes the alert and the other nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg import sql

from slawatch.clock import Clock
from slawatch.db import Connection, one_statement, retry_conflicts, translate
from slawatch.outbox import outbox
from slawatch.rules import Rule

log = logging.getLogger(__name__)

# The state table's own columns (its other columns are the watched table's key).
SEEN, EPISODE, N, NEXT = "sw_seen", "sw_ep", "sw_n", "sw_next"

_CLAIM = """\
WITH fresh AS MATERIALIZED (
    SELECT {t_keys}, t.{d} AS deadline, {t_key_text} AS key, {t_row} AS row_data
      FROM {table} t
     WHERE t.{d} >= %(since)s AND t.{d} < %(cutoff)s AND ({open_when}
           )
       AND NOT EXISTS (SELECT 1 FROM {state} s WHERE {s_is_t} AND s.sw_seen = t.{d})
     ORDER BY t.{d}
     LIMIT %(batch)s::integer
), again AS (
    SELECT {s_keys} FROM {state} s
     WHERE s.sw_next < %(now)s::timestamptz AND s.sw_next IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM fresh f WHERE {s_is_f})
     ORDER BY s.sw_next
     LIMIT %(batch)s::integer - (SELECT count(*) FROM fresh)
       FOR UPDATE OF s SKIP LOCKED
), checked AS MATERIALIZED (
    -- open_when is evaluated where only the watched table is in scope.
    SELECT {a_keys}, {s_key_text} AS key,
           COALESCE(w.deadline IS NOT DISTINCT FROM s.sw_seen AND w.open, false) AS still,
           w.row_data
      FROM again a JOIN {state} s ON {s_is_a}
      LEFT JOIN LATERAL (
           SELECT t.{d} AS deadline, ({open_when}
                  ) IS TRUE AS open, {t_row} AS row_data
             FROM {table} t WHERE {t_is_a}) w ON true
), opened AS (
    INSERT INTO {state} AS s ({keys}, sw_seen, sw_ep, sw_n, sw_next)
    SELECT {f_keys}, f.deadline, 1, 1, {first_next} FROM fresh f
    ON CONFLICT ({keys}) DO UPDATE
       SET sw_seen = excluded.sw_seen, sw_ep = s.sw_ep + 1, sw_n = 1, sw_next = excluded.sw_next
     WHERE s.sw_seen IS DISTINCT FROM excluded.sw_seen
    RETURNING {s_keys}, s.sw_ep, s.sw_n, s.sw_seen
), renotified AS (
    UPDATE {state} s
       SET sw_n = s.sw_n + 1,
           sw_next = CASE WHEN s.sw_n + 1 >= %(max)s::integer THEN NULL
                          ELSE %(now)s::timestamptz + {again_interval} END
      FROM checked c
     WHERE {s_is_c} AND c.still
    RETURNING {s_keys}, s.sw_ep, s.sw_n, s.sw_seen
), closed AS (
    UPDATE {state} s SET sw_seen = NULL, sw_next = NULL, sw_n = 0
      FROM checked c
     WHERE {s_is_c} AND NOT c.still
    RETURNING 1
), claimed AS (
    SELECT c.key, c.episode, c.n,
           CASE WHEN isfinite(c.seen) THEN {seen_tz} END AS deadline, c.row_data
      FROM (SELECT f.key, o.sw_ep AS episode, o.sw_n AS n, o.sw_seen AS seen, f.row_data
              FROM opened o JOIN fresh f ON {o_is_f}
            UNION ALL
            SELECT c.key, r.sw_ep, r.sw_n, r.sw_seen, c.row_data
              FROM renotified r JOIN checked c ON {r_is_c}) c
{outbox}
SELECT (SELECT count(*) FROM alerts), (SELECT count(*) FROM deliveries),
       (SELECT count(*) FROM fresh),
       (SELECT max(deadline) FILTER (WHERE isfinite(deadline)) FROM fresh),
       (SELECT count(*) FROM again),
       -- Delivered on commit: wakes the delivery workers at once (no extra round trip).
       (SELECT pg_notify('slawatch_delivery', '') WHERE EXISTS (SELECT 1 FROM deliveries))"""

# The sweep's first half: close every open episode whose row is no longer open with
# the episode's deadline (completed, deleted, or the deadline moved).
_CLOSE = """\
UPDATE {state} s SET sw_seen = NULL, sw_next = NULL, sw_n = 0
 WHERE s.sw_seen IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM {table} t
                    WHERE {t_is_s} AND t.{d} = s.sw_seen AND ({open_when}
                          ))"""

_WATERMARK = """\
SELECT scanned_to, swept_at FROM slawatch.watermark WHERE rule = %(rule)s"""

_SET_WATERMARK = """\
INSERT INTO slawatch.watermark AS w (rule, scanned_to, swept_at)
VALUES (%(rule)s, %(scanned_to)s, %(swept_at)s)
ON CONFLICT (rule) DO UPDATE
   SET scanned_to = GREATEST(w.scanned_to, excluded.scanned_to),
       swept_at = COALESCE(GREATEST(w.swept_at, excluded.swept_at), w.swept_at,
                           excluded.swept_at)"""


def state_table(rule: Rule) -> sql.Identifier:
    return sql.Identifier("slawatch", f"{rule.name}_state")


LOOKBACK_MIN, LOOKBACK_MAX = timedelta(seconds=10), timedelta(minutes=5)


def lookback(rule: Rule) -> timedelta:
    """How far behind the watermark a fresh scan starts: room for transactions that
    commit a while after the deadline they wrote (a row created with
    ``deadline = now()`` in a transaction that takes seconds to commit).

    A scan re-reads the rows that fell due within the look-back, so its cost is
    (every + look-back) / every times the newly due rows: one scan interval keeps
    that at twice, at least 10 s covers ordinary transactions however often the rule
    runs, and rows committed later than that are found by the sweep. (It was
    ``max(5m, 2 * every)``: at 30 s scans every row was read eleven times.)
    """
    return min(max(rule.every, LOOKBACK_MIN), LOOKBACK_MAX)


@dataclass(frozen=True)
class TablePlan:
    """A ``track: table`` rule's statements, composed once."""

    rule: Rule
    claim: sql.Composed
    close: sql.Composed


def compose(
    rule: Rule,
    key: list[str],
    *,
    open_when: sql.SQL,
    table: sql.Identifier,
    seen_tz: sql.Composable,
    interval: Callable[[sql.Composable], sql.Composable],
    severity: sql.Composable,
    notify: sql.Composable,
) -> TablePlan:
    """Compose the claim and the sweep's close for ``rule`` keyed by ``key``.

    ``open_when`` is the condition as SQL text (columns unqualified: it is applied
    to the watched table, aliased ``t``); ``interval(n)`` is the wait after
    notification ``n``.
    """

    def eq(left: str, right: str) -> sql.Composable:
        return sql.SQL(" AND ").join(
            sql.SQL("{}.{} = {}.{}").format(
                sql.Identifier(left), sql.Identifier(c), sql.Identifier(right), sql.Identifier(c)
            )
            for c in key
        )

    def cols(alias: str) -> sql.Composable:
        return sql.SQL(", ").join(sql.Identifier(alias, c) for c in key)

    def key_text(alias: str) -> sql.Composable:
        if len(key) == 1:
            return sql.SQL("{}::text").format(sql.Identifier(alias, key[0]))
        return sql.SQL("ROW({})::text").format(cols(alias))

    row = sql.SQL("jsonb_build_object({})").format(
        sql.SQL(", ").join(
            sql.SQL("{}, {}").format(sql.Literal(c), sql.Identifier("t", c))
            for c in rule.alert_columns(key)
        )
    )
    d = sql.Identifier(rule.deadline)
    first_next = sql.SQL(
        "CASE WHEN 1 >= %(max)s::integer THEN NULL ELSE %(now)s::timestamptz + {} END"
    ).format(interval(sql.SQL("1")))
    claim = sql.SQL(_CLAIM).format(
        table=table,
        state=state_table(rule),
        d=d,
        open_when=open_when,
        keys=sql.SQL(", ").join(sql.Identifier(c) for c in key),
        t_keys=cols("t"),
        s_keys=cols("s"),
        a_keys=cols("a"),
        f_keys=cols("f"),
        t_key_text=key_text("t"),
        s_key_text=key_text("s"),
        t_row=row,
        s_is_t=eq("s", "t"),
        s_is_f=eq("s", "f"),
        s_is_a=eq("s", "a"),
        t_is_a=eq("t", "a"),
        s_is_c=eq("s", "c"),
        o_is_f=eq("o", "f"),
        r_is_c=eq("r", "c"),
        first_next=first_next,
        again_interval=interval(sql.SQL("(s.sw_n + 1)")),
        seen_tz=seen_tz,
        outbox=outbox(severity, notify),
    )
    close = sql.SQL(_CLOSE).format(
        state=state_table(rule), table=table, t_is_s=eq("t", "s"), d=d, open_when=open_when
    )
    return TablePlan(rule, claim, close)


@dataclass(frozen=True)
class TableBatch:
    """What one claim statement did."""

    alerts: int
    fresh: int  # rows read from the due index
    last_deadline: Any  # the latest deadline among them: where the next batch starts
    again: int  # state rows whose re-notification was due

    def full(self, batch: int) -> bool:
        return self.fresh + self.again >= batch


def claim_table_batch(
    conn: Connection, plan: TablePlan, params: dict[str, Any], since: Any
) -> TableBatch:
    """One batch: fresh rows with a deadline from ``since`` on, and due re-notifications."""
    # One statement, one round trip: it commits on its own (the NOTIFY inside with it).
    with translate(f"claim for rule {plan.rule.name}"), one_statement(conn):
        row = conn.execute(plan.claim, params | {"since": since}).fetchone()
        assert row is not None
        alerts, _deliveries, fresh, last, again, _woken = row
    return TableBatch(int(alerts), int(fresh), last, int(again))


class TableScan:
    """One drain of a ``track: table`` rule, batch by batch.

    ``begin`` reads the watermark and sweeps when one is due; each ``batch`` claims
    fresh rows from where the last full batch ended (``since``) and due
    re-notifications; ``finish`` records the watermark once a batch came back short.
    ``params_at(now)`` gives the claim's parameters; ``to_deadline(t)`` turns an aware
    time into a value comparable with the deadline column.
    """

    def __init__(
        self,
        plan: TablePlan,
        params_at: Callable[[datetime], dict[str, Any]],
        to_deadline: Callable[[datetime], Any],
    ) -> None:
        self.plan, self.params_at, self.to_deadline = plan, params_at, to_deadline
        self.since: Any = "-infinity"
        self.swept = False

    def begin(self, conn: Connection, now: datetime) -> None:
        rule = self.plan.rule
        with translate(f"reading the watermark of rule {rule.name}"):
            mark = conn.execute(_WATERMARK, {"rule": rule.name}).fetchone()
        scanned_to, swept_at = mark if mark else (None, None)
        if scanned_to is None or swept_at is None or now - swept_at >= rule.sweep:
            with translate(f"sweep of rule {rule.name}"):
                closed = conn.execute(self.plan.close).rowcount
            if closed:
                log.info("rule %s: sweep closed %d ended episodes", rule.name, closed)
            self.since, self.swept = "-infinity", True
        else:
            self.since = self.to_deadline(scanned_to - rule.after - lookback(rule))

    def batch(self, conn: Connection, now: datetime) -> TableBatch:
        got = claim_table_batch(conn, self.plan, self.params_at(now), self.since)
        if got.fresh >= self.plan.rule.batch and got.last_deadline is not None:
            self.since = got.last_deadline  # rows before it are notified; ties are re-read
        return got

    def finish(self, conn: Connection, now: datetime) -> None:
        """The drain read everything due up to ``now``: the next starts from there."""
        rule = self.plan.rule
        with translate(f"recording the watermark of rule {rule.name}"):
            conn.execute(
                _SET_WATERMARK,
                {"rule": rule.name, "scanned_to": now, "swept_at": now if self.swept else None},
            )


def drain_table(
    connection: Callable[[], AbstractContextManager[Connection]],
    plan: TablePlan,
    params_at: Callable[[datetime], dict[str, Any]],
    to_deadline: Callable[[datetime], Any],
    clock: Clock,
    budget: timedelta,
) -> tuple[int, int]:
    """Drain a ``track: table`` rule within ``budget``: (alerts, batches)."""
    rule = plan.rule
    scan = TableScan(plan, params_at, to_deadline)
    now = clock.now()
    with connection() as conn:
        scan.begin(conn, now)
    started = time.monotonic()
    alerts = batches = 0
    while True:

        def batch(now: datetime = now) -> TableBatch:
            with connection() as conn:
                return scan.batch(conn, now)

        got = retry_conflicts(batch)
        alerts += got.alerts
        batches += 1
        if not got.full(rule.batch):
            with connection() as conn:
                scan.finish(conn, now)
            return alerts, batches
        if time.monotonic() - started >= budget.total_seconds():
            log.warning(
                "rule %s: time budget of %.0fs spent with rows still due; the next scan goes on",
                rule.name,
                budget.total_seconds(),
            )
            return alerts, batches
        now = clock.now()
