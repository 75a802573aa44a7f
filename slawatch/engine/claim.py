"""The batch claim: one statement finds due rows through the partial indexes,
opens or continues their episodes, schedules the next notification and writes
the alerts and their deliveries into the outbox, all in one transaction.

An episode (docs/explanation/episodes.md) is one stretch of a row being overdue: it starts when
the deadline passes while ``open_when`` holds and ends when ``open_when`` turns
false or the deadline value changes. The row keeps the deadline value its
episode is for (``sw_<rule>_seen``) and the episode's number (``sw_<rule>_ep``):

- *first*: due rows whose deadline value has no episode yet (never notified,
  or the deadline moved) start episode ep+1 at notification #1;
- *again*: rows of an open episode whose re-notification is due get n+1, until
  the cap (then ``next`` is NULL and the row leaves every index);
- *ended*: rows whose episode ended are closed (``seen``, ``next`` cleared), so
  they leave the index that found them; a later overdue stretch is a new episode.

On a partitioned table rows are addressed by (tableoid, ctid): a ctid alone
names a slot in every partition.

Correctness under concurrency: the index scans lock the rows they pick
(``FOR NO KEY UPDATE SKIP LOCKED``: the weakest lock an update of non-key columns
needs, so the application's inserts of child rows, which take KEY SHARE on this
row, neither block nor hide it), so concurrent scanners take disjoint batches and
a row the application is updating right now is left for the next scan; rows
are then addressed by ``ctid`` (a TID scan, no second index lookup), and each
UPDATE re-checks its predicate, so a row completed or already notified in the
meantime is never claimed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any
from zoneinfo import ZoneInfo

from psycopg import sql

from slawatch.clock import Clock
from slawatch.config.rules import Rule
from slawatch.db import Connection, Database, retry_conflicts, translate
from slawatch.engine.acting import Act, due_column, parse_due
from slawatch.engine.catalog import table_ident
from slawatch.engine.generation import GATE_CTE, GATE_WHERE, generation
from slawatch.engine.outbox import (
    CLAIM_ENDED,
    DEFAULT_OUTBOX,
    SEVERITIES,
    Outbox,
    Tally,
    resolved,
    row_cap,
    rule_outbox,
    severities,
    unguarded_first,
)
from slawatch.engine.predicates import predicates
from slawatch.engine.probefn import (
    INLINE_PARAMS,
    TABLE_PARAMS,
    Definition,
    Parts,
    ProbeFunction,
    Rendered,
    define,
    render,
)
from slawatch.engine.statetable import TablePlan, TableScan, compose, drain_table
from slawatch.engine.timers import housekeep
from slawatch.errors import ConfigError

log = logging.getLogger(__name__)

_CLAIM = """\
WITH {gate},
first AS (
    SELECT tableoid, ctid{first_cols} FROM {table}
     WHERE {deadline} < %(cutoff)s AND {first}
     ORDER BY {deadline}
     LIMIT %(batch)s::integer
       FOR NO KEY UPDATE SKIP LOCKED
), again AS (
    SELECT tableoid, ctid, {key} AS sw_key, {ep} AS sw_episode FROM {table}
     WHERE {next} < %(renotify_by)s::timestamptz AND {again}
     ORDER BY {next}
     LIMIT %(batch)s::integer - (SELECT count(*) FROM first)
       FOR NO KEY UPDATE SKIP LOCKED
), acked AS (
    -- Episodes acknowledged since their last notification (slawatch.ack): their
    -- re-notification is cleared instead of sent, so they leave the re-notify index.
    SELECT g.tableoid, g.ctid FROM again g
     WHERE EXISTS (SELECT 1 FROM slawatch.ack k
                    WHERE k.rule = %(rule)s AND k.key = g.sw_key AND k.episode = g.sw_episode)
), quieted AS (
    UPDATE {table} SET {next} = NULL
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM acked)){acked_match}
       AND {next} < %(renotify_by)s::timestamptz AND {again}
    RETURNING 1
), ended AS (
    -- Ordered by the ended index's key, as first and again are by theirs: without it a
    -- planner that expects many ended rows (no statistics of the tracking columns yet)
    -- takes a sequential scan to stop early, and reads the whole table when there are none.
    SELECT tableoid, ctid{ended_cols} FROM {table}
     WHERE {ended}
       AND (tableoid, ctid) NOT IN (SELECT tableoid, ctid FROM first)
     ORDER BY {seen}
     LIMIT %(batch)s::integer
       FOR NO KEY UPDATE SKIP LOCKED
), closed AS (
    UPDATE {table} SET {seen} = NULL, {next} = NULL, {n} = 0
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM ended)){ended_match}
       AND {ended}
    RETURNING {key} AS sw_key
), targets AS (
    SELECT tableoid AS toid, ctid AS tid FROM first
    UNION ALL
    SELECT tableoid, ctid FROM again
     WHERE (tableoid, ctid) NOT IN (SELECT tableoid, ctid FROM acked)
), claimed AS (
    UPDATE {table}
       SET {ep} = CASE WHEN {new_episode} THEN {next_episode} ELSE {ep} END,
           {n} = {new_n},
           {seen} = {deadline},
           {next} = CASE WHEN {new_n} >= %(max)s::integer THEN NULL
                         ELSE %(now)s::timestamptz + {interval} END
     WHERE ctid = ANY (ARRAY(SELECT tid FROM targets)){partition_match}
       AND ({deadline} < %(cutoff)s AND {first}
            OR {next} < %(renotify_by)s::timestamptz AND {again})
    RETURNING {key} AS key, {ep} AS episode, {n} AS n,
              CASE WHEN isfinite({deadline}) THEN {deadline_tz} END AS deadline,
              {row} AS row_data
{outbox}{resolved}
SELECT (SELECT count(*) FROM alerts), (SELECT count(*) FROM deliveries),
       (SELECT count(*) FROM closed), {severities},
       -- Delivered on commit: wakes the delivery workers at once (no extra round trip).
       (SELECT pg_notify('slawatch_delivery', '') WHERE {wake}){due}{gate_where}"""

# "Anything to do?" before the claim: one statement, three index probes (the claim's
# own three predicates, each answered by the first entry of its partial index), no
# lock and no write. An idle scan costs this and nothing more; a row that falls due
# between the probe and the claim is the next scan's.
#
# The earliest deadline (and re-notification) is read from its index and then
# compared, rather than `EXISTS (... WHERE deadline < $1 ...)`: no parameter reaches
# the subquery, so its plan is the index's first entry in a custom plan and in the
# generic one alike. PostgreSQL's generic plan of the EXISTS form (kept after 5 runs
# of a prepared probe) guesses a third of the index below an unknown `$1` and scans
# the table instead: 13 ms at 100,000 open rows, 150 ms at 1,000,000 (benchmarks:
# bench/events.py --probe). NULLs sort last: an index of NULLs alone compares NULL.
#
# Its three parts (engine/probefn.py's Parts): the earliest deadline not notified, the
# earliest re-notification, and whether anything else is to do (an ended episode, an
# event rule's chores), none of which takes a parameter; the probe compares the first
# two with the cutoffs.
_PROBE = """\
SELECT COALESCE(({due})
                < %(cutoff)s, false)
    OR COALESCE(({again})
                < %(renotify_by)s::timestamptz, false)
    OR {other}"""
_PROBE_DUE = "SELECT {deadline} FROM {table} WHERE {first} ORDER BY {deadline} LIMIT 1"
_PROBE_AGAIN = "SELECT {next} FROM {table} WHERE {again} ORDER BY {next} LIMIT 1"
_PROBE_ENDED = "EXISTS (SELECT 1 FROM {table} WHERE {ended})"
# The same three parts as one statement without a parameter, whose first two values
# the caller compares with the cutoffs (ClaimPlan.answer): PostgreSQL plans a prepared
# statement that takes no parameter generic at its first run, where one that takes the
# cutoffs is planned five times more on each connection before its plan is kept (with
# 100 rules on a pool of 8, 4,800 plannings over the first 100 s or so: a restart's
# cost, measured in docs/performance.md). Each time is brought within the years a
# Python datetime holds, so that an infinite or far deadline loads and compares as
# the statement compared it: -infinity (or a year BC) is before any cutoff, infinity
# (or a year past 9998) after.
_PROBE_VALUES = "SELECT {due},\n       {again},\n       {other}"
_WITHIN_YEARS = (
    "(SELECT CASE WHEN s.v < '0002-01-01' THEN '0002-01-01'"
    " WHEN s.v > '9998-12-31' THEN '9998-12-31' ELSE s.v END\n          FROM ({part}) AS s(v))"
)

# rule `resolve: true`: the notified episodes this claim ends, for their resolved
# notices (outbox.resolved). `ended` and `first` carry the values from before the
# claim's updates: closed rows (completed, or the deadline moved to a time not yet
# due), and rows whose deadline moved to a time already due, which start their next
# episode at once (`first`) and so never pass through `closed`.
#
# What the statement read is paired with what it wrote without a join of two CTEs: such
# a join is planned on the CTEs' estimates, and statistics from before a wave of ended
# episodes put them at 1 row, a nested loop comparing each row with every other
# (tests/integration/test_resolved.py). `IN (...) IS TRUE` is a hashed subplan, never
# pulled up into a join; the rows of the claimed ones are read from one object (an
# InitPlan) by binary search.
_ENDED_EPISODES = """\
    SELECT e.sw_key AS key, e.sw_episode AS episode, e.sw_n AS n,
           CASE WHEN isfinite(e.sw_seen) THEN {e_seen_tz} END AS deadline, e.sw_row AS row_data
      FROM ended e
     WHERE e.sw_n > 0 AND (e.sw_key IN (SELECT c.sw_key FROM closed c)) IS TRUE
    UNION ALL
    SELECT f.sw_key, f.sw_episode, f.sw_n, CASE WHEN isfinite(f.sw_seen) THEN {f_seen_tz} END,
           (SELECT jsonb_object_agg(c.key, c.row_data) FROM claimed c
             WHERE (c.key IN (SELECT g.sw_key FROM first g
                               WHERE g.sw_seen IS NOT NULL AND g.sw_n > 0)) IS TRUE)
           -> f.sw_key
      FROM first f
     WHERE f.sw_seen IS NOT NULL AND f.sw_n > 0
       AND (f.sw_key IN (SELECT c.key FROM claimed c)) IS TRUE"""


@dataclass(frozen=True)
class ClaimPlan:
    """A rule's claim statement, composed once, and how to fill its parameters."""

    rule: Rule
    statement: sql.Composed  # inline: the claim; track: table: see ``table``
    deadline_has_tz: bool
    table: TablePlan | None = None  # track: table
    # The rule's action (engine/acting.py): runs the due actions before the claim commits.
    act: Act | None = None
    # inline: whether anything is due (_PROBE); the claim runs only then.
    probe: sql.Composed | None = None
    # Its parts, for the probe function's body (engine/probefn.py).
    probe_parts: Parts | None = None
    # The probe as slawatch."<rule>_probe", where migrate created it (engine/probefn.py).
    probe_fn: ProbeFunction | None = None
    # SLAWATCH_OUTBOX=rows: the claim writes the outbox in rows (docs/explanation/outbox-rows.md).
    rows: bool = False
    # inline: ``statement`` is sent without the outbox's guards against rows written
    # already, this one with them where that fails (outbox.unguarded_first).
    guarded: sql.Composed | None = None

    @cached_property
    def probe_values(self) -> Rendered | None:
        """The probe's parts as one statement without a parameter (:data:`_PROBE_VALUES`),
        rendered once per plan, for every idle scan without the function."""
        parts = self.probe_parts
        if parts is None:
            return None
        due, again = (sql.SQL(_WITHIN_YEARS).format(part=p) for p in (parts.due, parts.again))
        statement = sql.SQL(_PROBE_VALUES).format(due=due, again=again, other=parts.other)
        return render(statement, ())

    def with_act(self, act: Act) -> ClaimPlan:
        """This plan with ``act`` running its rule's action (no change without one).
        The copy is kept for the last ``act`` asked: a scan asks at each run, with the
        runner's one ``act``, and a copy made each time would render its probe again."""
        if self.rule.action is None or self.act is act:
            return self
        made: ClaimPlan | None = self.__dict__.get("_with_act")
        if made is None or made.act is not act:
            table = None if self.table is None else replace(self.table, act=act)
            made = replace(self, act=act, table=table)
            object.__setattr__(self, "_with_act", made)  # a cache on a frozen plan
        return made

    def to_deadline(self, t: datetime) -> datetime:
        """An aware time as a value of the deadline column's type.

        A `timestamp` deadline is wall time in the rule's zone: compare like with like
        so the index on the column is usable and the session TimeZone plays no part.
        """
        if self.deadline_has_tz:
            return t
        return t.astimezone(ZoneInfo(self.rule.timezone)).replace(tzinfo=None)

    def params(self, now: datetime) -> dict[str, Any]:
        """The parameters for a claim at ``now`` (an aware datetime)."""
        rule = self.rule
        cutoff = self.to_deadline(rule.cutoff(now))
        params: dict[str, Any] = {
            "now": now,
            "cutoff": cutoff,
            "renotify_by": rule.renotify_cutoff(now),
            "max": rule.max_notifications,
            "batch": rule.batch,
            "rule": rule.name,
            "generation": generation(rule),
            # The alerts' due_at is deadline + after; with a calendar it is per row in
            # working time, which the statement cannot compute: NULL, filled in before
            # the claim commits (_dated; Rule.due_at gives it). An outbox row without
            # `after` has a due time per element instead (0023_outbox_rows_calendar.sql).
            "after": rule.after if rule.calendar is None else None,
            "tz": rule.timezone,
            "severity": rule.severity,
            "notify": list(rule.notify),
        }
        if rule.action is not None:
            params["action_on"] = rule.action_on
        renotify = rule.renotify
        if renotify is not None and renotify.every is not None:
            params["every"] = renotify.every
        elif renotify is not None and renotify.backoff is not None:
            params["first"] = renotify.backoff.first
            params["cap"] = renotify.backoff.max
            params["doublings"] = renotify.backoff.doublings
        for i, tier in enumerate(rule.escalate):
            params[f"sev{i}"], params[f"notify{i}"] = rule.tier_for(tier.from_)
        if rule.resolve:
            params["paged"] = rule.paged_notifiers(1)
            for i, tier in enumerate(rule.escalate):
                params[f"paged{i}"] = rule.paged_notifiers(tier.from_)
        return params


# On a partitioned table a ctid names a slot in every partition: the TID scans
# probe each partition, and this keeps only the (partition, slot) pairs picked.
_PARTITION_MATCH = "\n       AND (tableoid, ctid) IN (SELECT {}, {} FROM {})"


def sql_text(fragment: str) -> sql.SQL:
    """SQL text for a statement with parameters: a literal ``%`` (a LIKE pattern in
    open_when) must not be taken for a placeholder."""
    return sql.SQL(fragment.replace("%", "%%"))


def plan_claim(
    rule: Rule,
    deadline_type: str,
    partitioned: bool = False,
    key: list[str] | None = None,
    *,
    outbox_in: Outbox = DEFAULT_OUTBOX,
) -> ClaimPlan:
    """Compose the claim for ``rule`` whose deadline column has ``deadline_type``.

    ``key``: the columns that identify a row (default: the rule's ``key``).
    ``outbox_in``: SLAWATCH_OUTBOX, the outbox's shape (docs/explanation/outbox-rows.md).
    """
    rows = outbox_in == "rows"
    key = key or list(rule.key or ())
    if not key:
        raise ConfigError(f"{rule.source}: key: no key columns for rule {rule.name!r}")
    has_tz = deadline_type == "timestamp with time zone"
    n, nxt = sql.Identifier(rule.n_column), sql.Identifier(rule.next_column)
    seen, ep = sql.Identifier(rule.seen_column), sql.Identifier(rule.episode_column)
    deadline = sql_text(rule.deadline_sql())
    first, again, ended = (sql_text(p) for p in predicates(rule))
    new_episode = sql.SQL("{} IS DISTINCT FROM {}").format(seen, deadline)
    # The notification number this claim writes: 1 in a new episode, else one more.
    new_n = sql.SQL("(CASE WHEN {} THEN 1 ELSE {} + 1 END)").format(new_episode, n)

    def wait_after(n: sql.Composable) -> sql.Composable:
        """The wait after notification number ``n`` (an SQL expression)."""
        if rule.renotify is None:
            return sql.SQL("NULL::interval")
        if rule.renotify.every is not None:
            return sql.SQL("%(every)s::interval")
        # first * 2^(n-1), capped; the exponent stops where the cap is reached, so a
        # row notified forever never overflows the interval.
        return sql.SQL(
            "LEAST(%(first)s::interval * power(2, LEAST({n} - 1, %(doublings)s::integer))::float8,"
            " %(cap)s::interval)"
        ).format(n=n)

    interval = wait_after(new_n)
    row = sql.SQL("jsonb_build_object({})").format(
        sql.SQL(", ").join(
            sql.SQL("{}, {}").format(sql.Literal(c), sql.Identifier(c))
            for c in rule.alert_columns(key)
        )
    )
    if len(key) == 1:
        key_text: sql.Composable = sql.SQL("{}::text").format(sql.Identifier(key[0]))
    else:
        # PostgreSQL's record text, e.g. (42,"2026-03-01 00:00:00+00"): one readable,
        # unambiguous string.
        key_text = sql.SQL("ROW({})::text").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in key)
        )

    def by_tier(n: sql.Composable, base: str, placeholder: str, cast: str) -> sql.Composable:
        """The value of notification number ``n`` (an SQL expression): the parameter
        ``base``, or ``placeholder{i}`` of the last escalation tier reached."""
        if not rule.escalate:
            return sql.SQL("{}::{}").format(sql.Placeholder(base), sql.SQL(cast))
        # Highest tier first: the last tier reached wins.
        whens = [(i, t.from_) for i, t in enumerate(rule.escalate)][::-1]
        return sql.SQL("CASE {} ELSE {}::{} END").format(
            sql.SQL(" ").join(
                sql.SQL("WHEN {} >= {} THEN {}::{}").format(
                    n, sql.Literal(f), sql.Placeholder(f"{placeholder}{i}"), sql.SQL(cast)
                )
                for i, f in whens
            ),
            sql.Placeholder(base),
            sql.SQL(cast),
        )

    severity = by_tier(sql.SQL("c.n"), "severity", "sev", "text")
    notify = by_tier(sql.SQL("a.n"), "notify", "notify", "text[]")
    # Resolved notices: the severity the episode ended at, to every notifier it paged.
    resolved_severity = by_tier(sql.SQL("e.n"), "severity", "sev", "text")
    paged = by_tier(sql.SQL("e.n"), "paged", "paged", "text[]")

    def as_tz(value: sql.Composable) -> sql.Composable:
        """A deadline value as timestamptz (a `timestamp` is wall time in the rule's zone)."""
        return value if has_tz else sql.SQL("({} AT TIME ZONE %(tz)s)").format(value)

    def match(toid: str, tid: str, source: str) -> sql.Composable:
        if not partitioned:
            return sql.SQL("")
        return sql.SQL(_PARTITION_MATCH).format(
            sql.Identifier(toid), sql.Identifier(tid), sql.Identifier(source)
        )

    if rule.resolve:
        # Prefixed names: an ORDER BY of the deadline column must not read one of them.
        before = sql.SQL(", {} AS sw_key, {} AS sw_episode, {} AS sw_n, {} AS sw_seen").format(
            key_text, ep, n, seen
        )
        first_cols: sql.Composable = before
        ended_cols: sql.Composable = sql.SQL("{}, {} AS sw_row").format(before, row)
        resolved_ctes: sql.Composable = resolved(
            sql.SQL(_ENDED_EPISODES).format(
                e_seen_tz=as_tz(sql.Identifier("e", "sw_seen")),
                f_seen_tz=as_tz(sql.Identifier("f", "sw_seen")),
            ),
            resolved_severity,
            paged,
            drop=row_cap(rule, key),
            rows=rows,
            ended_now=CLAIM_ENDED,
        )
        wake = sql.SQL(
            "EXISTS (SELECT 1 FROM deliveries) OR EXISTS (SELECT 1 FROM resolved_deliveries)"
        )
    else:
        first_cols = ended_cols = resolved_ctes = sql.SQL("")
        wake = sql.SQL("EXISTS (SELECT 1 FROM deliveries)")

    # A new episode's number: the next one, or in the guarded claim one past every
    # episode its key has in the history (a row deleted and its key inserted again
    # starts over at 0: 0027_next_episode.sql).
    next_episode = {
        False: sql.SQL("{} + 1").format(ep),
        True: sql.SQL(
            "slawatch.next_episode(%(rule)s, {}, {}, CASE WHEN isfinite({}) THEN {} END)"
        ).format(key_text, ep, deadline, as_tz(deadline)),
    }

    def claim_with(guarded: bool) -> sql.Composed:
        return sql.SQL(_CLAIM).format(
            # The rule's definition must be the recorded one (engine/generation.py).
            gate=sql.SQL(GATE_CTE),
            gate_where=sql.SQL(GATE_WHERE),
            first_cols=first_cols,
            ended_cols=ended_cols,
            resolved=resolved_ctes,
            wake=wake,
            acked_match=match("tableoid", "ctid", "acked"),
            table=table_ident(rule),
            n=n,
            next=nxt,
            seen=seen,
            ep=ep,
            deadline=deadline,
            deadline_tz=as_tz(deadline),
            first=first,
            again=again,
            ended=ended,
            new_episode=new_episode,
            next_episode=next_episode[guarded],
            new_n=new_n,
            key=key_text,
            interval=interval,
            row=row,
            outbox=rule_outbox(
                rule,
                key,
                severity,
                notify,
                closed=sql.SQL("SELECT sw_key FROM closed"),
                rows=rows,
                guarded=guarded,
            ),
            severities=sql.SQL(SEVERITIES),
            due=due_column(rule, key),
            partition_match=match("toid", "tid", "targets"),
            ended_match=match("tableoid", "ctid", "ended"),
        )

    statement = claim_with(False)
    if rule.track == "table":
        table = compose(
            rule,
            key,
            open_when=sql_text(f"({rule.open_when})"),
            table=table_ident(rule),
            as_tz=as_tz,
            interval=wait_after,
            severity=severity,
            notify=notify,
            resolved_severity=resolved_severity,
            paged=paged,
            due=due_column(rule, key),
            rows=rows,
        )
        return ClaimPlan(rule, statement, has_tz, table, rows=rows)
    other: sql.Composable = sql.SQL(_PROBE_ENDED).format(table=table_ident(rule), ended=ended)
    if rule.events is not None:
        # The timers' housekeeping (timers.housekeep) runs only when the probe finds work:
        # a scheduled beat without its deadline, a too-fast stop whose page was claimed.
        chores: list[sql.Composable] = []
        if rule.events.schedule is not None:
            chores.append(sql.SQL("open AND due_at IS NULL"))
        if rule.events.min is not None:
            chores.append(sql.SQL("open AND too_fast AND {} > 0").format(n))
        for chore in chores:
            other = sql.SQL("{}\n    OR EXISTS (SELECT 1 FROM {} WHERE {})").format(
                other, table_ident(rule), chore
            )
    parts = Parts(
        due=sql.SQL(_PROBE_DUE).format(deadline=deadline, table=table_ident(rule), first=first),
        again=sql.SQL(_PROBE_AGAIN).format(next=nxt, table=table_ident(rule), again=again),
        other=other,
    )
    probe = sql.SQL(_PROBE).format(due=parts.due, again=parts.again, other=parts.other)
    return ClaimPlan(
        rule,
        statement,
        has_tz,
        probe=probe,
        probe_parts=parts,
        rows=rows,
        guarded=claim_with(True),
    )


def probe_definition(plan: ClaimPlan) -> Definition | None:
    """The rule's probe function (engine/probefn.py): its probe between sweeps for
    ``track: table``, else its probe; None for a rule without one."""
    if plan.table is not None:
        if plan.table.probe is None:
            return None
        return define(plan.rule, plan.table.probe, TABLE_PARAMS)
    if plan.probe is None:
        return None
    return define(plan.rule, plan.probe, INLINE_PARAMS, plan.probe_parts)


def batches(conn: Connection, plan: ClaimPlan, now: datetime) -> Callable[[], int]:
    """One drain at ``now`` on ``conn``, a batch per call: the alerts each call wrote
    (both ways to track; a benchmark's view of the claim)."""
    if plan.table is None:
        # Each call as a drain's first batch: the probe, then the claim if anything is due.
        return lambda: claim_batch(conn, plan, now) if anything_due(conn, plan, now) else 0
    table = plan.table
    # As drain_table does: a drain starts with the probe between sweeps (or reads the
    # watermark and sweeps: the first here, before the first call), claims batch after
    # batch, and after a short batch records the watermark when that matters.
    first = TableScan(table, plan.params, plan.to_deadline)
    due = first.start(conn, now)
    scan: TableScan | None = first

    def step() -> int:
        nonlocal scan, due
        if scan is None:  # a new drain
            scan = TableScan(table, plan.params, plan.to_deadline)
            due = scan.start(conn, now)
        if not due:
            scan = None
            return 0
        got = scan.batch(conn, now)
        if not got.full(table.rule.batch):
            scan.finish(conn, now)
            scan = None
        return got.alerts

    return step


def anything_due(conn: Connection, plan: ClaimPlan, now: datetime) -> bool:
    """Whether an inline claim at ``now`` would claim or close anything (:data:`_PROBE`).

    One read-only statement on the partial indexes, prepared where the pooler allows."""
    if plan.probe is None:
        return True
    cutoff = plan.to_deadline(plan.rule.cutoff(now))
    params = {"cutoff": cutoff, "renotify_by": plan.rule.renotify_cutoff(now)}
    if plan.probe_fn is not None:
        answer = plan.probe_fn.ask(conn, params)
        if answer is not None:
            return answer
    probe = plan.probe_values
    assert probe is not None
    # Prepared at once where the pooler allows: the probe is what an idle scan costs.
    # Binary: the times are read whatever the session's DateStyle (psycopg reads text
    # times in the ISO style only).
    row = probe.first(conn, {}, f"probe for rule {plan.rule.name}", binary=True)
    if row is None:
        return False
    return probe_answer(row, cutoff, params["renotify_by"])


def probe_answer(values: Sequence[Any], cutoff: datetime, renotify_by: datetime) -> bool:
    """The probe's answer from its three values (:data:`_PROBE_VALUES`), as the probe
    compares (:data:`_PROBE`): a NULL (no entry, or a NULL time) is not due."""
    due, again, other = values
    return (
        (due is not None and due < cutoff)
        or (again is not None and again < renotify_by)
        or bool(other)
    )


def claim_batch(conn: Connection, plan: ClaimPlan, now: datetime) -> int:
    """Claim at most one batch at ``now`` in one transaction; return the alerts written.

    Inline tracking; for either way, see :func:`batches` and :func:`drain`."""
    return claim_counted(conn, plan, now).alerts


def claim_counted(conn: Connection, plan: ClaimPlan, now: datetime) -> Tally:
    """:func:`claim_batch`, with the episodes it closed and its alerts per severity."""
    if plan.table is not None:
        raise ValueError(f"rule {plan.rule.name} is track: table: use batches() or drain()")
    if plan.rule.action is not None:
        return _claim_acting(conn, plan, now)
    # One statement, one round trip: it commits on its own (the NOTIFY inside with it).
    row = unguarded_first(conn, plan.rule.name, plan.statement, plan.guarded, plan.params(now))
    if row is None:
        return Tally()
    return Tally(int(row[0]), int(row[2]), severities(row[3]))


def _claim_acting(conn: Connection, plan: ClaimPlan, now: datetime) -> Tally:
    """:func:`claim_counted` of a rule with an action: the claim and its actions in
    one transaction (engine/acting.py)."""
    if plan.act is None:
        raise ValueError(f"rule {plan.rule.name} has an action and its plan no runner")
    act, rule = plan.act, plan.rule
    row = unguarded_first(
        conn,
        rule.name,
        plan.statement,
        plan.guarded,
        plan.params(now),
        lambda row: act(conn, rule, parse_due(row[-1], rule), now),
    )
    return Tally(int(row[0]), int(row[2]), severities(row[3]))


@dataclass(frozen=True)
class DrainResult:
    """What one drain of a rule did: alerts written, batches, episodes closed, and the
    alerts per severity."""

    claimed: int
    batches: int
    closed: int = 0
    severities: dict[str, int] = field(default_factory=dict)


def _claim_on(db: Database, plan: ClaimPlan, clock: Clock, probe: bool = False) -> Tally | None:
    """One claim; with ``probe``, None without one when nothing is due (the probe, on
    the same connection)."""
    with db.connection(f"claim for rule {plan.rule.name}") as conn:
        now = clock.now()
        if probe and not anything_due(conn, plan, now):
            return None
        if plan.rule.calendar is None:
            return claim_counted(conn, plan, now)
        with _dated(conn, plan.rule, now, plan.rows):
            return claim_counted(conn, plan, now)


@contextmanager
def _dated(
    conn: Connection, rule: Rule, since: datetime, in_rows: bool = False
) -> Iterator[Connection]:
    """A calendar rule's claim in one transaction with its alerts' due times: the
    claim writes ``due_at`` NULL (ClaimPlan.params) and the alerts it fired at
    ``since`` or later are given ``Rule.due_at(deadline)`` before it commits, so that
    no notifier (woken by the NOTIFY at the commit) sends one without it.

    ``in_rows``: the claim writes the outbox in rows, whose rows without ``after`` it
    fired at ``since`` or later are given their elements' due times (``due_ats``) the
    same way (a webhook action's alerts, in slawatch.alert, as above)."""
    with translate(f"due times of the alerts of rule {rule.name}"), conn.transaction():
        yield conn
        if in_rows:
            _dated_rows(conn, rule, since)
        rows = conn.execute(
            "SELECT id, deadline FROM slawatch.alert WHERE rule = %s AND fired_at >= %s"
            " AND due_at IS NULL AND deadline IS NOT NULL",
            (rule.name, since),
        ).fetchall()
        if rows:
            conn.execute(
                "UPDATE slawatch.alert a SET due_at = v.due"
                " FROM unnest(%s::bigint[], %s::timestamptz[]) AS v(id, due) WHERE a.id = v.id",
                ([i for i, _ in rows], [rule.due_at(deadline) for _, deadline in rows]),
            )


def drain(
    db: Database,
    plan: ClaimPlan,
    clock: Clock,
    budget: timedelta | None = None,
    *,
    sweep: bool = False,
) -> DrainResult:
    """Claim batch after batch while batches come back full, within ``budget``.

    ``sweep``: a ``track: table`` rule sweeps even when its sweep is not due, so the
    drain also finds rows that became overdue before the watermark's look-back
    (backfills): ``run --once`` drains every due row. An inline drain always does.
    """
    done = _drain(db, plan, clock, budget, sweep)
    if plan.rule.calendar is not None and done.claimed:
        # Not after a drain of nothing (an idle scan stays one statement): what a crash
        # left between a claim and this is filled by the next drain that claims, and by
        # `slawatch run`'s maintenance (Runner.maintain).
        with db.connection(f"due times of rule {plan.rule.name}") as conn:
            fill_due(conn, plan.rule)
    return done


# An outbox row of a calendar rule as the claim wrote it (0023_outbox_rows_calendar.sql):
# no `after`, a NULL due time for an element whose deadline is finite. Found through
# outbox_row_fired; a row another process's claim wrote and filled is passed over. The
# row is updated in the transaction that inserted it, before any reader can see it.
_UNDATED_ROWS = """\
SELECT id, deadlines FROM slawatch.outbox_row
 WHERE rule = %s AND fired_at >= %s AND after IS NULL
   AND EXISTS (SELECT 1 FROM unnest(deadlines, due_ats) AS u(deadline, due)
                WHERE u.deadline IS NOT NULL AND u.due IS NULL)"""
_DATE_ROWS = """\
UPDATE slawatch.outbox_row r SET due_ats = v.dues
  FROM (SELECT u.id, array_agg(u.due ORDER BY u.p) AS dues
          FROM unnest(%s::bigint[], %s::integer[], %s::timestamptz[]) AS u(id, p, due)
         GROUP BY u.id) v
 WHERE r.id = v.id"""


def _dated_rows(conn: Connection, rule: Rule, since: datetime) -> None:
    """:func:`_dated`'s due times for the outbox in rows: each element's
    ``Rule.due_at(deadline)`` (NULL where the deadline is not finite)."""
    rows = conn.execute(_UNDATED_ROWS, (rule.name, since)).fetchall()
    if not rows:
        return
    ids: list[int] = []
    places: list[int] = []
    dues: list[datetime | None] = []
    for row_id, deadlines in rows:
        for place, deadline in enumerate(deadlines, start=1):
            ids.append(row_id)
            places.append(place)
            dues.append(None if deadline is None else rule.due_at(deadline))
    conn.execute(_DATE_ROWS, (ids, places, dues))


# Episodes given their due time per fill (the next drain goes on with the rest).
FILL_DUE_BATCH = 5_000


def fill_due(conn: Connection, rule: Rule, batch: int = FILL_DUE_BATCH) -> int:
    """Give a calendar rule's new episodes their due time in the history.

    The claim cannot compute working time per row, so it writes ``due_at`` NULL
    (ClaimPlan.params); after a drain, this sets each history row's (slawatch.episode,
    which the SLA report reads) to the calendar's ``Rule.due_at(deadline)``, found
    through ``episode_due`` (rule, due_at NULL). A crash in between leaves them to the
    next drain. The alerts keep ``due_at`` NULL (receivers show ``fired_at``)."""
    with translate(f"filling in due times of rule {rule.name}"):
        rows = conn.execute(
            "SELECT key, episode, deadline FROM slawatch.episode"
            " WHERE rule = %s AND due_at IS NULL AND deadline IS NOT NULL LIMIT %s",
            (rule.name, batch),
        ).fetchall()
        if not rows:
            return 0
        conn.execute(
            "UPDATE slawatch.episode h SET due_at = v.due"
            " FROM unnest(%s::text[], %s::integer[], %s::timestamptz[]) AS v(key, episode, due)"
            " WHERE h.rule = %s AND h.key = v.key AND h.episode = v.episode AND h.due_at IS NULL",
            (
                [key for key, _, _ in rows],
                [episode for _, episode, _ in rows],
                [rule.due_at(deadline) for _, _, deadline in rows],
                rule.name,
            ),
        )
    return len(rows)


def _drain(
    db: Database, plan: ClaimPlan, clock: Clock, budget: timedelta | None, sweep: bool
) -> DrainResult:
    tally = Tally()
    probe = True  # the first claim is probed for
    if plan.rule.events is not None:
        if plan.table is None:
            with db.connection(f"probe for rule {plan.rule.name}") as conn:
                if not anything_due(conn, plan, clock.now()):
                    return DrainResult(0, 0)
            probe = False
        housekeep(db, plan.rule)  # scheduled beats' deadlines; too-fast timers closed
    if plan.table is not None:
        began = clock.now()

        @contextmanager
        def claiming() -> Iterator[Connection]:
            with db.connection(f"claim for rule {plan.rule.name}") as conn:
                if plan.rule.calendar is None:
                    yield conn
                    return
                with _dated(conn, plan.rule, began, plan.rows):
                    yield conn

        alerts, batches = drain_table(
            claiming,
            plan.table,
            plan.params,
            plan.to_deadline,
            clock,
            budget or plan.rule.every,
            tally,
            sweep,
        )
        return DrainResult(alerts, batches, tally.closed, tally.severities)
    budget_s = (budget or plan.rule.every).total_seconds()
    started = time.monotonic()
    batches = 0
    while True:
        # The first batch is probed for: an idle scan costs one cheap statement.
        def claim(first: bool = probe and batches == 0) -> Tally | None:
            return _claim_on(db, plan, clock, probe=first)

        got = retry_conflicts(claim)
        if got is None:
            return DrainResult(0, 0)
        tally += got
        batches += 1
        if got.alerts < plan.rule.batch:
            return DrainResult(tally.alerts, batches, tally.closed, tally.severities)
        if time.monotonic() - started >= budget_s:
            log.warning(
                "rule %s: time budget of %.0fs spent with rows still due; the next scan goes on",
                plan.rule.name,
                budget_s,
            )
            return DrainResult(tally.alerts, batches, tally.closed, tally.severities)
