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

Between sweeps a scan first asks, in one read-only statement (:data:`_PROBE`),
whether the first two find anything; only then it claims. The watermark is kept
in memory per rule (:class:`Mark`) and written only when it matters: see
:meth:`Mark.should_store`.

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
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from psycopg import sql

from slawatch.clock import Clock
from slawatch.config.rules import Rule
from slawatch.db import Connection, lock_bounded, retry_conflicts, translate
from slawatch.engine.acting import Act, parse_due
from slawatch.engine.generation import GATE_CTE, GATE_WHERE
from slawatch.engine.outbox import (
    CLAIM_ENDED,
    SEVERITIES,
    Tally,
    history_ended,
    resolved,
    row_cap,
    rule_outbox,
    severities,
    unguarded_first,
)
from slawatch.engine.probefn import TABLE_PARAMS, ProbeFunction, Rendered, render

log = logging.getLogger(__name__)

# The state table's own columns (its other columns are the watched table's key).
SEEN, EPISODE, N, NEXT = "sw_seen", "sw_ep", "sw_n", "sw_next"

_CLAIM = """\
WITH {gate},
fresh AS MATERIALIZED (
    -- The row's JSON is built after the LIMIT, for the batch only, from the columns
    -- it needs: when the planner hashes the anti join (once the state table has
    -- statistics), it reads and sorts every row due in the window, and it built the
    -- JSON for each (50,000 for a batch of 10,000 in a drain of a 100,000 backlog; the
    -- sort spilled to disk).
    SELECT {distinct}{t_keys}, {td} AS deadline, {t_key_text} AS key, {t_row} AS row_data{read}
      FROM (SELECT {t_needed} FROM {table} t
             WHERE {td} >= %(since)s AND {td} < %(cutoff)s AND ({open_when}
                   )
               AND NOT EXISTS (SELECT 1 FROM {state} s WHERE {s_is_t} AND s.sw_seen = {td})
             ORDER BY {td}
             LIMIT %(batch)s::integer) t{distinct_order}
), again AS (
    SELECT {s_keys}, s.sw_ep, s.sw_n, s.sw_seen FROM {state} s
     WHERE s.sw_next < %(renotify_by)s::timestamptz AND s.sw_next IS NOT NULL
       -- NOT IN, never pulled up into a join: a hashed subplan of at most a batch of
       -- keys (as an anti join, planned on a 1-row estimate of `fresh`, a nested loop
       -- compared every re-notification with every fresh row).
       AND ({s_keys}) NOT IN (SELECT {f_keys} FROM fresh f)
     ORDER BY s.sw_next
     LIMIT %(batch)s::integer - (SELECT count(*) FROM fresh)
       FOR UPDATE OF s SKIP LOCKED
), checked AS MATERIALIZED (
    -- open_when is evaluated where only the watched table is in scope. acked: the
    -- episode was acknowledged (slawatch.ack): its re-notification is cleared, not sent.
    SELECT {a_keys}, {s_key_text} AS key, a.sw_ep AS episode, a.sw_n AS n, a.sw_seen AS seen,
           COALESCE(w.deadline IS NOT DISTINCT FROM s.sw_seen AND w.open, false) AS still,
           EXISTS (SELECT 1 FROM slawatch.ack k
                    WHERE k.rule = %(rule)s AND k.key = {s_key_text} AND k.episode = a.sw_ep)
               AS acked,
           COALESCE(w.row_data, {s_key_row}) AS row_data
      FROM again a JOIN {state} s ON {s_is_a}
      LEFT JOIN LATERAL (
           SELECT {td} AS deadline, ({open_when}
                  ) IS TRUE AS open, {t_row} AS row_data
             FROM {table} t WHERE {t_is_a}{one_match}) w ON true
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
     WHERE {s_is_c} AND c.still AND NOT c.acked
    RETURNING {s_keys}, s.sw_ep, s.sw_n, s.sw_seen
), quieted AS (
    UPDATE {state} s SET sw_next = NULL
      FROM checked c
     WHERE {s_is_c} AND c.still AND c.acked
    RETURNING 1
), closed AS (
    -- RETURNING reads `checked`: the episode as it was before this update.
    UPDATE {state} s SET sw_seen = NULL, sw_next = NULL, sw_n = 0
      FROM checked c
     WHERE {s_is_c} AND NOT c.still
    RETURNING c.key, c.episode, c.n, c.seen, c.row_data
), opened_episodes AS MATERIALIZED (
    -- The episodes `opened` wrote, by key, for fresh's rows. A join of the two CTEs was
    -- planned on their estimates, and statistics from before a backlog put both at 1
    -- row: a nested loop of 10,000 x 10,000 comparisons (22 s of a 23 s batch in
    -- bench/scale.py's backlog curve). One object, read once (an InitPlan), whose keys
    -- are found by binary search: linear in the batch, whatever the estimates.
    SELECT jsonb_object_agg({o_key_text}, o.sw_ep) AS episodes FROM opened o
), claimed AS (
    SELECT c.key, c.episode, c.n,
           CASE WHEN isfinite(c.seen) THEN {seen_tz} END AS deadline, c.row_data
      -- n and seen as `opened` writes them (sw_n = 1, sw_seen = the fresh deadline).
      FROM (SELECT f.key, ((SELECT episodes FROM opened_episodes) ->> f.key)::integer AS episode,
                   1 AS n, f.deadline AS seen, f.row_data
              FROM fresh f
             WHERE (SELECT episodes FROM opened_episodes) ? f.key
            UNION ALL
            -- An opened episode whose key reads otherwise in the state table than in
            -- the row (numeric 1.0 stored, 1.00 now; a citext key's case): its row's
            -- columns are not found by that key; the alert carries the key's.
            SELECT {o_key_text}, o.sw_ep, o.sw_n, o.sw_seen, {o_key_row}
              FROM opened o
             WHERE ({o_key_text} IN (SELECT f.key FROM fresh f)) IS NOT TRUE
            UNION ALL
            -- Re-notifications, by what `renotified` wrote (a hashed subplan), for the
            -- same reason. `again` locked these rows, so the next branch should find
            -- nothing: it is a safeguard, so that no written re-notification goes
            -- unsent whatever this pairing misses.
            SELECT c.key, c.episode, c.n + 1, c.seen, c.row_data
              FROM checked c
             WHERE ((c.key, c.episode, c.n + 1)
                    IN (SELECT {r_key_text}, r.sw_ep, r.sw_n FROM renotified r)) IS TRUE
            UNION ALL
            SELECT {r_key_text}, r.sw_ep, r.sw_n, r.sw_seen, {r_key_row}
              FROM renotified r
             WHERE (({r_key_text}, r.sw_ep, r.sw_n)
                    IN (SELECT c.key, c.episode, c.n + 1 FROM checked c)) IS NOT TRUE) c
    -- At most a batch anyway (fresh, then again up to the rest). Said here for the
    -- planner: it guessed 50 times that from the joins of CTEs without statistics,
    -- priced the statement over jit_above_cost, and JIT compilation took 0.2-0.4 s
    -- of a 0.6-1.3 s batch of 10,000 (bench/run.py's EXPLAIN).
     LIMIT %(batch)s::integer
{outbox}{resolved}
SELECT (SELECT count(*) FROM alerts), (SELECT count(*) FROM deliveries),
       (SELECT {fresh_read} FROM fresh),
       (SELECT max(deadline) FILTER (WHERE isfinite(deadline)) FROM fresh),
       (SELECT count(*) FROM again),
       -- Delivered on commit: wakes the delivery workers at once (no extra round trip).
       (SELECT pg_notify('slawatch_delivery', '') WHERE {wake}),
       (SELECT count(*) FROM closed), {severities}{due}{gate_where}"""

# rule `resolve: true`: the notified episodes this claim ends (outbox.resolved):
# closed at their re-notification time, or replaced by a new episode because the
# deadline moved (`opened` over a state row whose episode was open; `p` reads that
# row as it was before this statement).
_ENDED_EPISODES = """\
    SELECT c.key, c.episode, c.n, CASE WHEN isfinite(c.seen) THEN {c_seen_tz} END AS deadline,
           c.row_data
      FROM closed c
     WHERE c.n > 0
    UNION ALL
    SELECT m.key, m.episode, m.n, CASE WHEN isfinite(m.seen) THEN {m_seen_tz} END,
           -- Their rows from `fresh`, read by key from one object (the claim's
           -- opened_episodes says why not a join); the key's columns if not found.
           COALESCE((SELECT jsonb_object_agg(f.key, f.row_data) FROM fresh f
                      WHERE (f.key IN (SELECT key FROM moved)) IS TRUE) -> m.key, m.key_row)
      FROM moved m"""

# The episodes `opened` replaced (their deadline moved to a time already due), for
# _ENDED_EPISODES: as each state row was before this statement (`p`).
_MOVED = """\
    SELECT {o_key_text} AS key, o.sw_ep - 1 AS episode, p.sw_n AS n, p.sw_seen AS seen,
           {o_key_row} AS key_row
      FROM opened o JOIN {state} p ON {p_is_o}
     WHERE p.sw_seen IS NOT NULL AND p.sw_n > 0"""

# The sweep's first half: close every open episode whose row is no longer open with
# the episode's deadline (completed, deleted, or the deadline moved). The UPDATE
# re-checks the episode, so one that a concurrent claim or sweep changed is left.
# `IS NOT DISTINCT FROM` (here `=`: sw_seen is not null) keeps the planner on the
# watched row's key, off the deadline index (docs/performance-notes.md).
_CLOSE = """\
WITH {gate},
ended AS (
    SELECT {s_keys}, s.sw_ep, s.sw_n, s.sw_seen FROM {state} s
     WHERE s.sw_seen IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM {table} t
                        WHERE {t_is_s} AND {td} IS NOT DISTINCT FROM s.sw_seen AND ({open_when}
                              ))
), closed AS (
    UPDATE {state} s SET sw_seen = NULL, sw_next = NULL, sw_n = 0
      FROM ended e
     WHERE {s_is_e} AND s.sw_seen = e.sw_seen AND s.sw_ep = e.sw_ep
    RETURNING {e_keys}, {e_key_text} AS key, e.sw_ep AS episode, e.sw_n AS n,
              e.sw_seen AS seen
){history}{resolved}
SELECT (SELECT count(*) FROM closed),
       (SELECT pg_notify('slawatch_delivery', '') WHERE {wake}){gate_where}"""

# The sweep's resolved notices: the closed episodes that were notified, with the
# row's columns as they are now (the key alone for a deleted row).
_SWEPT_EPISODES = """\
    SELECT c.key, c.episode, c.n, CASE WHEN isfinite(c.seen) THEN {c_seen_tz} END AS deadline,
           COALESCE((SELECT {t_row} FROM {table} t WHERE {t_is_c}{one}), {c_key_row})
               AS row_data
      FROM closed c
     WHERE c.n > 0"""

# "Anything to do?" between sweeps: the claim's `fresh` and `again` cases, each the
# first entry of a partial index, with no lock and no write. Ended episodes need no case
# (`again` or the sweep, decided in memory, closes them); a row that falls due between
# the probe and the claim is the next scan's. The earliest re-notification is read
# from its index and compared (as claim.py's probe does), so that the generic plan of
# the prepared probe reads the index's first entry too, not every open episode.
# current_schema() (parallel-unsafe, always a value here) keeps the probe out of
# parallel plans: PostgreSQL's generic plan of `fresh` on a large table (a range of
# unknown width) is a parallel bitmap scan whose workers take 15-30 ms to start, for a
# read that takes 0.2 ms without them (measured on 300,000 rows).
_PROBE = """\
SELECT (EXISTS (SELECT 1 FROM {table} t
                 WHERE {td} >= %(since)s AND {td} < %(cutoff)s AND ({open_when}
                       )
                   AND NOT EXISTS (SELECT 1 FROM {state} s WHERE {s_is_t} AND s.sw_seen = {td}))
        OR COALESCE((SELECT s.sw_next FROM {state} s WHERE s.sw_next IS NOT NULL
                      ORDER BY s.sw_next LIMIT 1) < %(renotify_by)s::timestamptz, false))
   AND COALESCE(current_schema(), '') IS NOT NULL"""

# A query rule's sweep: a key its output holds more than once among the open overdue
# rows (the first by count), and how many such keys (docs/reference/rules.md).
_DUPLICATES = """\
SELECT key, n, count(*) OVER () FROM (
    SELECT {t_key_text} AS key, count(*) AS n FROM {table} t
     WHERE {td} < %(cutoff)s AND ({open_when}
           )
     GROUP BY {t_keys} HAVING count(*) > 1) d
 ORDER BY n DESC, key LIMIT 1"""

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


# How old the stored watermark may be before a drain that claimed fresh rows stores
# it again (Mark.should_store).
STORE_AFTER = timedelta(minutes=1)


@dataclass
class Mark:
    """A ``track: table`` rule's watermark as this process knows it, kept across drains.

    ``scanned_to``: every row due by ``rule.cutoff(scanned_to)`` (less the look-back)
    was claimed: the latest of the stored watermark and this process's own complete
    drains (a probe that found nothing is one). ``swept_at``: the last sweep, stored
    or this process's. ``stored``: the ``scanned_to`` the database holds, as far as
    this process knows (read by the last full begin, or written by it since).
    """

    scanned_to: datetime | None = None
    swept_at: datetime | None = None
    stored: datetime | None = None

    def between_sweeps(self, rule: Rule, now: datetime) -> bool:
        """Whether a drain at ``now`` may start with the probe: the watermark is known
        and no sweep is due (else it reads the stored watermark, and sweeps if due)."""
        return (
            self.scanned_to is not None
            and self.swept_at is not None
            and now - self.swept_at < rule.sweep
        )

    def advance(self, now: datetime) -> None:
        """A drain (or a probe) at ``now`` found everything due up to ``now`` claimed."""
        self.scanned_to = now if self.scanned_to is None else max(self.scanned_to, now)

    def should_store(self, now: datetime, swept: bool, fresh: int) -> bool:
        """Whether a complete drain at ``now`` writes the watermark.

        Always after a sweep: ``swept_at`` is shared, so the processes sweep once per
        ``sweep`` between them and a restart does not sweep again. Otherwise only a
        drain that claimed fresh rows, and only when the stored watermark is
        :data:`STORE_AFTER` old or more: an idle rule writes nothing but its sweep's
        watermark (once per ``sweep``, 10 min by default), a busy one once a minute.

        What a crash or a restart then re-reads: its first drain starts the fresh
        window at ``cutoff(stored) - look-back`` instead of this process's own mark.
        Nothing is missed: the stored value is the time of a complete drain (written
        at its end, never moved back: GREATEST), so every row due before the window
        was claimed, and a row that opened with an older deadline is the sweep's, as
        ever. The extra re-read is bounded: every row that fell due after the stored
        time and was claimed by a drain at least a minute after it made that drain
        store, so the window holds at most a minute's fresh rows beyond the
        look-back, read once and skipped (their state rows hold that deadline).
        """
        if swept or self.stored is None:
            return True
        return fresh > 0 and now - self.stored >= STORE_AFTER


@dataclass(frozen=True)
class TablePlan:
    """A ``track: table`` rule's statements, composed once."""

    rule: Rule
    claim: sql.Composed
    close: sql.Composed
    act: Act | None = None  # the rule's action (engine/acting.py), run before the commit
    probe: sql.Composed | None = None  # whether anything is due between sweeps (_PROBE)
    duplicates: sql.Composed | None = None  # a query rule's keys held twice (_DUPLICATES)
    # The probe as slawatch."<rule>_probe", where migrate created it (engine/probefn.py).
    probe_fn: ProbeFunction | None = None
    # ``claim`` is sent without the outbox's guards against rows written already, this
    # one with them where that fails (outbox.unguarded_first).
    claim_guarded: sql.Composed | None = None
    # This process's watermark, kept across drains (dataclasses.replace keeps it).
    mark: Mark = field(default_factory=Mark, compare=False)

    @cached_property
    def probe_text(self) -> Rendered | None:
        """``probe`` rendered once per plan, for every idle scan (without the function)."""
        return None if self.probe is None else render(self.probe, TABLE_PARAMS)


def compose(
    rule: Rule,
    key: list[str],
    *,
    open_when: sql.SQL,
    table: sql.Composable,
    as_tz: Callable[[sql.Composable], sql.Composable],
    interval: Callable[[sql.Composable], sql.Composable],
    severity: sql.Composable,
    notify: sql.Composable,
    resolved_severity: sql.Composable,
    paged: sql.Composable,
    due: sql.Composable | None = None,
    rows: bool = False,
) -> TablePlan:
    """Compose the claim and the sweep's close for ``rule`` keyed by ``key``.

    ``open_when`` is the condition as SQL text (columns unqualified: it is applied
    to the watched table, aliased ``t``); ``as_tz(v)`` is a deadline value as
    timestamptz; ``interval(n)`` is the wait after notification ``n``; the resolved
    notices' severity and notifiers (``paged``) read ``e.n``. ``rows``: the outbox in
    rows (SLAWATCH_OUTBOX=rows, docs/explanation/outbox-rows.md).
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
    # The deadline read from the watched row (aliased t): its column, or the expression
    # with its columns qualified (the state table s is in scope beside it).
    td = sql.SQL(rule.deadline_sql("t").replace("%", "%%"))
    first_next = sql.SQL(
        "CASE WHEN 1 >= %(max)s::integer THEN NULL ELSE %(now)s::timestamptz + {} END"
    ).format(interval(sql.SQL("1")))

    def key_row(alias: str) -> sql.Composable:
        """The key columns as an alert's row: all that is left of a deleted row."""
        return sql.SQL("jsonb_build_object({})").format(
            sql.SQL(", ").join(
                sql.SQL("{}, {}").format(sql.Literal(c), sql.Identifier(alias, c)) for c in key
            )
        )

    # A query's output may hold a key twice (a join that fans out): the claim takes one
    # row per key (the earliest deadline) and counts what it read before that, so a
    # batch is still full when it read a batch; the sweep warns (_DUPLICATES).
    query = rule.query is not None
    distinct: sql.Composable = sql.SQL("")
    distinct_order: sql.Composable = sql.SQL("")
    read: sql.Composable = sql.SQL("")
    fresh_read: sql.Composable = sql.SQL("count(*)")
    one: sql.Composable = sql.SQL("")
    one_match: sql.Composable = sql.SQL("")
    if query:
        distinct = sql.SQL("DISTINCT ON ({}) ").format(cols("t"))
        distinct_order = sql.SQL(" ORDER BY {}, {}").format(cols("t"), td)
        read = sql.SQL(", count(*) OVER () AS read")
        fresh_read = sql.SQL("COALESCE(max(read), 0)")
        one = sql.SQL(" LIMIT 1")
        # Of a key's rows, the one still open with the episode's deadline, if any.
        one_match = sql.SQL(
            "\n            ORDER BY ({} IS NOT DISTINCT FROM s.sw_seen AND ({}) IS TRUE) DESC"
            " LIMIT 1"
        ).format(td, open_when)

    wake: sql.Composable = sql.SQL("EXISTS (SELECT 1 FROM deliveries)")
    claim_resolved: sql.Composable = sql.SQL("")
    close_resolved: sql.Composable = sql.SQL("")
    close_wake: sql.Composable = sql.SQL("false")
    if rule.resolve:
        wake = sql.SQL("{} OR EXISTS (SELECT 1 FROM resolved_deliveries)").format(wake)
        close_wake = sql.SQL("EXISTS (SELECT 1 FROM resolved_deliveries)")
        claim_resolved = resolved(
            sql.SQL("    WITH moved AS MATERIALIZED (\n{}\n    )\n{}").format(
                sql.SQL(_MOVED).format(
                    o_key_text=key_text("o"),
                    o_key_row=key_row("o"),
                    p_is_o=eq("p", "o"),
                    state=state_table(rule),
                ),
                sql.SQL(_ENDED_EPISODES).format(
                    c_seen_tz=as_tz(sql.Identifier("c", "seen")),
                    m_seen_tz=as_tz(sql.Identifier("m", "seen")),
                ),
            ),
            resolved_severity,
            paged,
            drop=row_cap(rule, key),
            rows=rows,
            ended_now=CLAIM_ENDED,
        )
        close_resolved = resolved(
            sql.SQL(_SWEPT_EPISODES).format(
                c_seen_tz=as_tz(sql.Identifier("c", "seen")),
                t_row=row,
                table=table,
                t_is_c=eq("t", "c"),
                one=one,
                c_key_row=key_row("c"),
            ),
            resolved_severity,
            paged,
            drop=row_cap(rule, key),
            rows=rows,
            ended_now=sql.SQL("SELECT key, episode FROM history_ended"),
        )
    # The rule's definition must be the recorded one (engine/generation.py).
    gate, gate_where = sql.SQL(GATE_CTE), sql.SQL(GATE_WHERE)

    def claim_with(guarded: bool) -> sql.Composed:
        return sql.SQL(_CLAIM).format(
            gate=gate,
            gate_where=gate_where,
            resolved=claim_resolved,
            wake=wake,
            s_key_row=key_row("s"),
            table=table,
            state=state_table(rule),
            td=td,
            open_when=open_when,
            keys=sql.SQL(", ").join(sql.Identifier(c) for c in key),
            t_keys=cols("t"),
            t_needed=sql.SQL(", ").join(
                sql.Identifier("t", c)
                for c in dict.fromkeys([*key, *rule.deadline_columns, *rule.alert_columns(key)])
            ),
            s_keys=cols("s"),
            a_keys=cols("a"),
            f_keys=cols("f"),
            t_key_text=key_text("t"),
            s_key_text=key_text("s"),
            t_row=row,
            s_is_t=eq("s", "t"),
            s_is_a=eq("s", "a"),
            t_is_a=eq("t", "a"),
            s_is_c=eq("s", "c"),
            o_key_text=key_text("o"),
            o_key_row=key_row("o"),
            r_key_text=key_text("r"),
            r_key_row=key_row("r"),
            first_next=first_next,
            distinct=distinct,
            distinct_order=distinct_order,
            read=read,
            fresh_read=fresh_read,
            one_match=one_match,
            again_interval=interval(sql.SQL("(s.sw_n + 1)")),
            seen_tz=as_tz(sql.Identifier("c", "seen")),
            outbox=rule_outbox(
                rule,
                key,
                severity,
                notify,
                closed=sql.SQL("SELECT key FROM closed"),
                rows=rows,
                guarded=guarded,
            ),
            severities=sql.SQL(SEVERITIES),
            due=due or sql.SQL(""),
        )

    claim = claim_with(False)
    close = sql.SQL(_CLOSE).format(
        gate=gate,
        gate_where=gate_where,
        state=state_table(rule),
        table=table,
        t_is_s=eq("t", "s"),
        s_is_e=eq("s", "e"),
        s_keys=cols("s"),
        e_keys=cols("e"),
        e_key_text=key_text("e"),
        td=td,
        open_when=open_when,
        resolved=close_resolved,
        history=history_ended(sql.SQL("SELECT key FROM closed"), rows=rows, resolve=rule.resolve),
        wake=close_wake,
    )
    probe = sql.SQL(_PROBE).format(
        table=table, state=state_table(rule), td=td, open_when=open_when, s_is_t=eq("s", "t")
    )
    duplicates = None
    if query:
        duplicates = sql.SQL(_DUPLICATES).format(
            t_key_text=key_text("t"), table=table, td=td, open_when=open_when, t_keys=cols("t")
        )
    return TablePlan(
        rule, claim, close, probe=probe, duplicates=duplicates, claim_guarded=claim_with(True)
    )


@dataclass(frozen=True)
class TableBatch:
    """What one claim statement did."""

    alerts: int
    fresh: int  # rows read from the due index
    last_deadline: Any  # the latest deadline among them: where the next batch starts
    again: int  # state rows whose re-notification was due
    closed: int = 0  # of those, episodes that had ended: closed
    severities: dict[str, int] = field(default_factory=dict)  # alerts per severity

    def full(self, batch: int) -> bool:
        return self.fresh + self.again >= batch


def claim_table_batch(
    conn: Connection, plan: TablePlan, params: dict[str, Any], since: Any
) -> TableBatch:
    """One batch: fresh rows with a deadline from ``since`` on, and due re-notifications."""
    if plan.rule.action is not None:
        return _claim_acting(conn, plan, params, since)
    # One statement, one round trip: it commits on its own (the NOTIFY inside with it).
    row = unguarded_first(
        conn, plan.rule.name, plan.claim, plan.claim_guarded, params | {"since": since}
    )
    assert row is not None
    alerts, _deliveries, fresh, last, again, _woken, closed, by_severity = row
    return TableBatch(
        int(alerts), int(fresh), last, int(again), int(closed), severities(by_severity)
    )


def _claim_acting(
    conn: Connection, plan: TablePlan, params: dict[str, Any], since: Any
) -> TableBatch:
    """:func:`claim_table_batch` of a rule with an action: the claim and its actions
    in one transaction (engine/acting.py)."""
    if plan.act is None:
        raise ValueError(f"rule {plan.rule.name} has an action and its plan no runner")
    act, rule, now = plan.act, plan.rule, params["now"]
    row = unguarded_first(
        conn,
        rule.name,
        plan.claim,
        plan.claim_guarded,
        params | {"since": since},
        lambda row: act(conn, rule, parse_due(row[-1], rule), now),
    )
    alerts, _deliveries, fresh, last, again, _woken, closed, by_severity, _due = row
    return TableBatch(
        int(alerts), int(fresh), last, int(again), int(closed), severities(by_severity)
    )


class TableScan:
    """One drain of a ``track: table`` rule, batch by batch.

    ``start`` probes between sweeps, else ``begin`` reads the watermark and sweeps
    when one is due; each ``batch`` claims fresh rows from where the last full batch
    ended (``since``) and due re-notifications; once a batch came back short,
    ``done`` moves the rule's :class:`Mark` on and says whether ``store`` records it.
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
        self.closed = 0  # episodes the sweep closed
        self.fresh = 0  # rows claimed from the due index (fresh episodes)

    def start(self, conn: Connection, now: datetime, sweep: bool = False) -> bool:
        """Start a drain at ``now``: whether to claim.

        Between sweeps (:meth:`Mark.between_sweeps`) one read-only statement,
        :data:`_PROBE` from this process's watermark on, prepared where the pooler
        allows; a probe that finds nothing ends the drain (the watermark moves on in
        memory only). Else :meth:`begin`: read the stored watermark, sweep if due."""
        rule, mark = self.plan.rule, self.plan.mark
        if sweep or self.plan.probe is None or not mark.between_sweeps(rule, now):
            self.begin(conn, now, sweep)
            return True
        assert mark.scanned_to is not None
        self.since = self.to_deadline(rule.cutoff(mark.scanned_to) - lookback(rule))
        params = self.params_at(now)
        values = {
            "since": self.since,
            "cutoff": params["cutoff"],
            "renotify_by": params["renotify_by"],
        }
        answer = None if self.plan.probe_fn is None else self.plan.probe_fn.ask(conn, values)
        if answer is None:
            probe = self.plan.probe_text
            assert probe is not None
            # Prepared at once where the pooler allows: the probe is what an idle scan
            # costs. A lock on the watched table fails it at once (lock_bounded).
            with translate(f"probe for rule {rule.name}"), lock_bounded(conn):
                row = probe.run(conn, values)
            answer = bool(row and row[0])
        if answer:
            return True
        mark.advance(now)
        return False

    def begin(self, conn: Connection, now: datetime, sweep: bool = False) -> None:
        """Read the watermark and sweep when one is due, or always with ``sweep``."""
        rule, known = self.plan.rule, self.plan.mark
        with translate(f"reading the watermark of rule {rule.name}"):
            mark = conn.execute(_WATERMARK, {"rule": rule.name}).fetchone()
        scanned_to, swept_at = mark if mark else (None, None)
        known.stored, known.swept_at = scanned_to, swept_at
        if scanned_to is not None and known.scanned_to is not None:
            scanned_to = max(scanned_to, known.scanned_to)  # this process's own drains
        if sweep or scanned_to is None or swept_at is None or now - swept_at >= rule.sweep:
            with translate(f"sweep of rule {rule.name}"):
                row = conn.execute(self.plan.close, self.params_at(now)).fetchone()
                closed = int(row[0]) if row else 0
            self.closed += closed
            if closed:
                log.debug("rule %s: sweep closed %d ended episodes", rule.name, closed)
            if self.plan.duplicates is not None:
                self.warn_duplicates(conn, now)
            self.since, self.swept = "-infinity", True
        else:
            self.since = self.to_deadline(rule.cutoff(scanned_to) - lookback(rule))

    def warn_duplicates(self, conn: Connection, now: datetime) -> None:
        """A query rule's sweep: one warning naming a key its output holds more than
        once among the open overdue rows (such a key is watched as one of its rows)."""
        assert self.plan.duplicates is not None
        rule = self.plan.rule
        with translate(f"duplicate keys of rule {rule.name}"):
            row = conn.execute(
                self.plan.duplicates, {"cutoff": self.params_at(now)["cutoff"]}
            ).fetchone()
        if row is not None:
            key, n, keys = row
            more = f" (and {keys - 1} more keys)" if keys > 1 else ""
            log.warning(
                "rule %s: key %s is in the query's output %d times%s: it is watched as the"
                " row with the earliest deadline; make the query return one row per key"
                " (docs/reference/rules.md)",
                rule.name,
                key,
                n,
                more,
            )

    def batch(self, conn: Connection, now: datetime) -> TableBatch:
        got = claim_table_batch(conn, self.plan, self.params_at(now), self.since)
        self.fresh += got.fresh
        if got.fresh >= self.plan.rule.batch and got.last_deadline is not None:
            self.since = got.last_deadline  # rows before it are notified; ties are re-read
        return got

    def done(self, now: datetime) -> bool:
        """The drain read everything due up to ``now``: the next starts from there.
        Whether to write that down (:meth:`store`, see :meth:`Mark.should_store`)."""
        mark = self.plan.mark
        mark.advance(now)
        if self.swept:
            mark.swept_at = now if mark.swept_at is None else max(mark.swept_at, now)
        return mark.should_store(now, self.swept, self.fresh)

    def store(self, conn: Connection, now: datetime) -> None:
        """Write the watermark: the drain at ``now`` was complete."""
        rule = self.plan.rule
        with translate(f"recording the watermark of rule {rule.name}"):
            conn.execute(
                _SET_WATERMARK,
                {"rule": rule.name, "scanned_to": now, "swept_at": now if self.swept else None},
            )
        self.plan.mark.stored = now

    def finish(self, conn: Connection, now: datetime) -> None:
        """:meth:`done`, and :meth:`store` when it says so."""
        if self.done(now):
            self.store(conn, now)


def drain_table(
    connection: Callable[[], AbstractContextManager[Connection]],
    plan: TablePlan,
    params_at: Callable[[datetime], dict[str, Any]],
    to_deadline: Callable[[datetime], Any],
    clock: Clock,
    budget: timedelta,
    tally: Tally | None = None,
    sweep: bool = False,
) -> tuple[int, int]:
    """Drain a ``track: table`` rule within ``budget``: (alerts, batches).

    ``tally``, if given, also gets the episodes closed and the alerts per severity;
    ``sweep``: sweep whether or not one is due (``run --once``: every rule drained)."""
    tally = tally if tally is not None else Tally()
    rule = plan.rule
    scan = TableScan(plan, params_at, to_deadline)
    now = clock.now()
    with connection() as conn:
        due = scan.start(conn, now, sweep)
    tally.closed += scan.closed
    if not due:  # idle: the probe alone
        return 0, 0
    started = time.monotonic()
    alerts = batches = 0
    while True:

        def batch(now: datetime = now) -> TableBatch:
            with connection() as conn:
                return scan.batch(conn, now)

        got = retry_conflicts(batch)
        tally += Tally(got.alerts, got.closed, got.severities)
        alerts += got.alerts
        batches += 1
        if not got.full(rule.batch):
            if scan.done(now):
                with connection() as conn:
                    scan.store(conn, now)
            return alerts, batches
        if time.monotonic() - started >= budget.total_seconds():
            log.warning(
                "rule %s: time budget of %.0fs spent with rows still due; the next scan goes on",
                rule.name,
                budget.total_seconds(),
            )
            return alerts, batches
        now = clock.now()
