"""The SLA report (docs/how-to/report.md): per rule and period, how many deadlines fell due,
how many episodes were breached, the compliance, what was open at the period's end,
how late episodes ended and how fast they were acknowledged, and the actions' outcome.

Everything but ``due`` comes from slawatch's own episode history (``slawatch.episode``,
0006_episode_history.sql) in one statement: periods from ``generate_series``, the
episodes that fell due in the window read through ``episode_due``, those that ended in
it through ``episode_ended``, those due before it and still open through ``episode_due``
too (ended_at is among its INCLUDE columns: no index of open episodes for the claim to
write, 0007_lean_claim.sql), each grouped
per period with ``percentile_cont``; ``open`` is a running sum (open before the window,
plus breached, less ended), so no period is joined to every episode.

``due`` counts deadlines, which live in the watched table (an event rule's: its timer
table), by when they fell due as the claim decides it: a deadline is due at ``t`` when
it is less than the claim's cutoff at ``t`` (``Rule.cutoff``: ``t - after``, or with a
calendar ``after`` of working time), so the deadlines due in a period are those
between the cutoffs at its start and its end, one ``width_bucket`` over the periods'
cutoffs. It is counted only where an index on the deadline covers every row (a btree
index led by the column or expression, with no WHERE: the rule's own partial indexes
hold only open rows), one index range scan per rule; otherwise ``due`` and
``compliance`` are unknown (``-`` in the table, null in JSON) and the report says why:
it never reads a watched table without an index.

All of it is read in one READ ONLY transaction (one snapshot), with JIT off.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from typing import Literal, cast, get_args

from psycopg import sql
from pydantic import BaseModel

from slawatch.config.durations import parse_duration
from slawatch.config.files import shorten
from slawatch.config.rules import Rule
from slawatch.db import Connection, translate
from slawatch.engine.catalog import TIMESTAMP_TYPES, deadline_type_of, rule_table, table_ident
from slawatch.engine.claim import ClaimPlan, sql_text
from slawatch.engine.migrate import index_specs
from slawatch.errors import BadInput, ConfigError
from slawatch.operate.inspect import check_rule_name

By = Literal["hour", "day", "week"]
Format = Literal["table", "json", "csv"]
STEPS: dict[str, timedelta] = {
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
    "week": timedelta(weeks=1),
}
DEFAULT_SINCE = "7d"
MAX_PERIODS = 2000  # a report is for people: 83 days by hour, 5 years by day

REPORT_SQL = """\
WITH periods AS (
    SELECT p AS start FROM generate_series(%(start)s::timestamptz,
                                           %(until)s::timestamptz - interval '1 microsecond',
                                           %(step)s::interval) p
), rules AS (
    SELECT unnest(%(rules)s::text[]) AS rule
), fell AS (
    -- Episodes that fell due in each period: breached; how late those that ended did
    -- end (due -> end), how soon those acknowledged were (first notice -> ack).
    SELECT e.rule, date_bin(%(step)s::interval, e.due_at, %(start)s::timestamptz) AS start,
           count(*) AS breached,
           percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (
               ORDER BY extract(epoch FROM e.ended_at - e.due_at))
               FILTER (WHERE e.ended_at IS NOT NULL) AS late,
           percentile_cont(ARRAY[0.5, 0.9]) WITHIN GROUP (
               ORDER BY extract(epoch FROM e.acked_at - e.notified_at))
               FILTER (WHERE e.acked_at IS NOT NULL) AS ack
      FROM slawatch.episode e
     WHERE e.rule = ANY (%(rules)s::text[])
       AND e.due_at >= %(start)s::timestamptz AND e.due_at < %(until)s::timestamptz
     GROUP BY 1, 2
), ended AS (
    -- Episodes that ended in each period; `before`: of those, the ones due before the
    -- window, which were open at its start.
    SELECT e.rule, date_bin(%(step)s::interval, e.ended_at, %(start)s::timestamptz) AS start,
           count(*) AS ended,
           count(*) FILTER (WHERE e.due_at < %(start)s::timestamptz) AS before
      FROM slawatch.episode e
     WHERE e.ended_at >= %(start)s::timestamptz AND e.ended_at < %(until)s::timestamptz
       AND e.rule = ANY (%(rules)s::text[])
     GROUP BY 1, 2
), still AS (
    -- Episodes due before the window and open now.
    SELECT e.rule, count(*) AS still
      FROM slawatch.episode e
     WHERE e.rule = ANY (%(rules)s::text[]) AND e.ended_at IS NULL
       AND e.due_at < %(start)s::timestamptz
     GROUP BY 1
), acted AS (
    SELECT a.rule, date_bin(%(step)s::interval, a.at, %(start)s::timestamptz) AS start,
           count(*) FILTER (WHERE a.status = 'ok') AS ok,
           count(*) FILTER (WHERE a.status = 'failed') AS failed
      FROM slawatch.action a
     WHERE a.at >= %(start)s::timestamptz AND a.at < %(until)s::timestamptz
       AND a.rule = ANY (%(rules)s::text[])
     GROUP BY 1, 2
), carried AS (
    SELECT r.rule, COALESCE((SELECT s.still FROM still s WHERE s.rule = r.rule), 0)
                   + COALESCE((SELECT sum(x.before) FROM ended x WHERE x.rule = r.rule), 0)
                   AS open
      FROM rules r
)
SELECT r.rule, p.start, COALESCE(f.breached, 0) AS breached,
       (c.open + sum(COALESCE(f.breached, 0)) OVER w - sum(COALESCE(x.ended, 0)) OVER w)::bigint
           AS open,
       f.late, f.ack, COALESCE(a.ok, 0) AS ok, COALESCE(a.failed, 0) AS failed
  FROM rules r CROSS JOIN periods p
  JOIN carried c ON c.rule = r.rule
  LEFT JOIN fell f ON f.rule = r.rule AND f.start = p.start
  LEFT JOIN ended x ON x.rule = r.rule AND x.start = p.start
  LEFT JOIN acted a ON a.rule = r.rule AND a.start = p.start
WINDOW w AS (PARTITION BY r.rule ORDER BY p.start)
 ORDER BY r.rule, p.start"""

# The deadline is indexed for every row: a valid btree index, without a WHERE, whose
# first key is the deadline as PostgreSQL prints it (a partitioned table's own index
# counts: each partition has one). A column prints as its quoted name; an expression as
# the rule's own partial index on it prints it (``own``: migrate makes that index; equal
# expressions print alike, however they were written). ``key`` is NULL when the rule's
# own index is not there.
_INDEXED = """\
SELECT k.key IS NOT NULL, EXISTS (
    SELECT 1 FROM pg_index i
      JOIN pg_class c ON c.oid = i.indexrelid
      JOIN pg_am m ON m.oid = c.relam
     WHERE i.indrelid = %(table)s::regclass AND i.indpred IS NULL AND i.indisvalid
       AND m.amname = 'btree' AND pg_get_indexdef(i.indexrelid, 1, false) = k.key)
  FROM (SELECT COALESCE(quote_ident(%(column)s::text),
                        (SELECT pg_get_indexdef(o.indexrelid, 1, false) FROM pg_index o
                          WHERE o.indexrelid = to_regclass(%(own)s::text)
                            AND o.indrelid = %(table)s::regclass)) AS key) k"""

# Deadlines that fell due in each period, read through that index: bucket i holds those
# between the claim's cutoffs at the start and the end of period i (1-based).
_DUE = """\
SELECT width_bucket({d}, %(cutoffs)s::{kind}[]), count(*)
  FROM {table}
 WHERE {d} >= %(low)s::{kind} AND {d} < %(high)s::{kind}
 GROUP BY 1"""


class ReportRow(BaseModel):
    """One rule in one period. Durations in seconds; null: nothing to measure."""

    rule: str
    period: datetime  # the period's start (UTC)
    due: int | None  # null: not counted (see the report's notes)
    breached: int
    compliance: float | None  # 1 - breached / due
    open: int  # episodes open at the period's end (or now, for the current period)
    late_p50: float | None
    late_p90: float | None
    late_p99: float | None
    ack_p50: float | None
    ack_p90: float | None
    actions_ok: int | None  # null: the rule has no action
    actions_failed: int | None


class Report(BaseModel):
    """The SLA report: periods of ``by`` from ``start`` to ``until`` (UTC)."""

    by: By
    start: datetime
    until: datetime
    rows: list[ReportRow]
    notes: list[str]  # why a rule's due is not counted


@dataclass(frozen=True)
class ReportQuery:
    """A checked report request."""

    rules: list[Rule]
    start: datetime
    until: datetime
    by: By

    @property
    def step(self) -> timedelta:
        return STEPS[self.by]


def check_format(text: str) -> Format:
    """``text`` if it is a report format, else BadInput."""
    if text not in get_args(Format):
        raise BadInput(f"format: {shorten(text)} is not one of table, json, csv")
    return cast(Format, text)


def query(
    rules: list[Rule], *, rule: str | None, since: str | None, by: str | None, now: datetime
) -> ReportQuery:
    """Check a report's parameters against the configured ``rules``; BadInput names the
    first bad one. Periods are aligned to UTC hours, days, or weeks from Monday; the
    first is the one ``since`` before ``now`` falls in, the last the one ``now`` is in."""
    by = "day" if by is None else by
    if by not in STEPS:
        raise BadInput(f"by: {shorten(by)} is not one of hour, day, week")
    try:
        window = parse_duration(DEFAULT_SINCE if since is None else since)
    except ValueError as exc:
        raise BadInput(f"since: {exc}") from None  # exc quotes the value
    if window <= timedelta(0):
        raise BadInput(f"since: {shorten(since or '')} must be more than 0")
    chosen = rules
    if rule is not None:
        check_rule_name(rule)
        chosen = [r for r in rules if r.name == rule]
        if not chosen:
            raise BadInput(f"rule: no rule named {rule!r}")
    step = STEPS[by]
    now = now.astimezone(UTC)
    start = _floor(now - window, cast(By, by))
    until = _floor(now, cast(By, by)) + step
    if (until - start) / step > MAX_PERIODS:
        raise BadInput(
            f"since: {shorten(since or '')} by {by} is more than {MAX_PERIODS} periods;"
            " report by a longer period"
        )
    return ReportQuery(sorted(chosen, key=lambda r: r.name), start, until, cast(By, by))


def _floor(t: datetime, by: By) -> datetime:
    """The start of the UTC hour, day or week (from Monday) ``t`` falls in."""
    t = t.replace(minute=0, second=0, microsecond=0)
    if by == "hour":
        return t
    t = t.replace(hour=0)
    return t if by == "day" else t - timedelta(days=t.weekday())


def report(conn: Connection, q: ReportQuery) -> Report:
    """The report for ``q``: one statement over the episode history, and one index range
    scan per rule whose deadline is indexed for ``due``; all in one READ ONLY
    transaction of its own on ``conn``, so every figure is of one snapshot."""
    params = {
        "rules": [r.name for r in q.rules],
        "start": q.start,
        "until": q.until,
        "step": q.step,
    }
    dues: dict[str, dict[datetime, int] | None] = {}
    notes = []
    with translate("reading the episode history"), conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        # The planner's guess for generate_series (1000 rows) prices the statement high
        # enough for JIT, whose compilation took 5 s of a 5.4 s report (bench/report.py).
        conn.execute("SET LOCAL jit = off")
        rows = conn.execute(REPORT_SQL, params).fetchall()
        for rule in q.rules:
            dues[rule.name], note = due_by_period(conn, rule, q)
            if note:
                notes.append(note)
    by_name = {r.name: r for r in q.rules}
    out = []
    for name, start, breached, open_, late, ack, ok, failed in rows:
        due_counts = dues[name]
        due = None if due_counts is None else due_counts.get(start, 0)
        compliance = None if not due else max(0.0, 1 - breached / due)
        late = late or [None, None, None]
        ack = ack or [None, None]
        acting = by_name[name].action is not None
        out.append(
            ReportRow(
                rule=name,
                period=start,
                due=due,
                breached=breached,
                compliance=compliance,
                open=open_,
                late_p50=late[0],
                late_p90=late[1],
                late_p99=late[2],
                ack_p50=ack[0],
                ack_p90=ack[1],
                actions_ok=ok if acting else None,
                actions_failed=failed if acting else None,
            )
        )
    return Report(by=q.by, start=q.start, until=q.until, rows=out, notes=notes)


def due_by_period(
    conn: Connection, rule: Rule, q: ReportQuery
) -> tuple[dict[datetime, int] | None, str]:
    """Deadlines of ``rule`` due in each period of ``q`` (by its start), or None and why
    they are not counted. Run it in the report's transaction (a snapshot, JIT off)."""
    if rule.query is not None:
        # Its deadlines are the query's output, read by its scans, with no index to count
        # a window through (docs/how-to/watch-a-table.md#watch-a-query).
        return None, f"{rule.name}: due not counted: a query rule's deadlines are not indexed"
    info = rule_table(conn, rule)
    if info is None:
        return None, f"{rule.name}: due not counted: {rule.table} is not there"
    deadline = rule.deadline_column or rule.deadline_sql()
    try:
        kind: str | None = deadline_type_of(rule, info)
    except ConfigError:  # its column or expression is not (or no longer) there
        kind = None
    if kind not in TIMESTAMP_TYPES:
        return None, (
            f"{rule.name}: due not counted: its deadline {deadline} is not a timestamp"
            f" of {rule.table}"
        )
    table = table_ident(rule)
    own = index_specs(rule)[0]  # the rule's partial index on the deadline
    with translate(f"reading the indexes of {rule.table}"):
        row = conn.execute(
            _INDEXED,
            {
                "table": table.as_string(conn),
                "column": rule.deadline_column,
                "own": sql.Identifier(own.schema, own.name).as_string(conn),
            },
        ).fetchone()
    if row is not None and not row[0]:
        return None, (
            f"{rule.name}: due not counted: the rule's index {own.name} on its deadline"
            " expression is not there (slawatch migrate makes it)"
        )
    if not (row and row[1]):
        return None, (
            f"{rule.name}: due not counted: no index on {rule.table} ({deadline}) for every"
            " row; create one to count it"
        )
    # The claim's cutoff at each period's start and at the window's end, as deadline
    # values (ClaimPlan.params): a deadline is due at t exactly when it is below t's.
    plan = ClaimPlan(rule, sql.Composed([]), kind == "timestamp with time zone")
    periods = round((q.until - q.start) / q.step)
    starts = [q.start + i * q.step for i in range(periods)]
    # Non-decreasing, as width_bucket needs: a `timestamp` deadline's wall time runs back
    # when summer time ends; a deadline in that hour counts once, in the first period
    # whose cutoff passes it.
    cutoffs = list(accumulate((plan.to_deadline(rule.cutoff(t)) for t in [*starts, q.until]), max))
    d = sql_text(rule.deadline_sql())
    statement = sql.SQL(_DUE).format(
        d=d,
        table=table,
        kind=sql.SQL("timestamptz" if plan.deadline_has_tz else "timestamp"),
    )
    params = {"cutoffs": cutoffs, "low": cutoffs[0], "high": cutoffs[-1]}
    with translate(f"counting the deadlines of rule {rule.name}"):
        got = conn.execute(statement, params).fetchall()
    return {starts[int(i) - 1]: int(n) for i, n in got}, ""


# ---------------------------------------------------------------- output

COLUMNS = [
    "rule",
    "period",
    "due",
    "breached",
    "compliance",
    "open",
    "late_p50",
    "late_p90",
    "late_p99",
    "ack_p50",
    "ack_p90",
    "actions_ok",
    "actions_failed",
]


def as_json(r: Report) -> str:
    return r.model_dump_json(indent=2)


def as_csv(r: Report) -> str:
    """One line per rule and period, durations in seconds, empty when unknown."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(COLUMNS)
    for row in r.rows:
        values = row.model_dump(mode="json")
        out.writerow(["" if values[c] is None else values[c] for c in COLUMNS])
    return buf.getvalue()


def as_table(r: Report) -> str:
    """The report for people: ``-`` where a figure is unknown, notes below."""
    header = ["rule", "period (UTC)", "due", "breached", "compliance", "open"]
    header += ["late p50", "p90", "p99", "ack p50", "p90", "actions ok/failed"]
    stamp = "%Y-%m-%d %H:%M" if r.by == "hour" else "%Y-%m-%d"
    lines = []
    for row in r.rows:
        lines.append(
            [
                row.rule,
                row.period.astimezone(UTC).strftime(stamp),
                _n(row.due),
                str(row.breached),
                "-" if row.compliance is None else f"{row.compliance:.1%}",
                str(row.open),
                *(_d(v) for v in (row.late_p50, row.late_p90, row.late_p99)),
                *(_d(v) for v in (row.ack_p50, row.ack_p90)),
                "-" if row.actions_ok is None else f"{row.actions_ok}/{row.actions_failed}",
            ]
        )
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]
    text = [
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(x, widths, strict=True))
        )
        for x in [header, *lines]
    ]
    if not lines:
        text.append("no rules")
    text += [f"- {note}" for note in r.notes]
    return "\n".join(t.rstrip() for t in text)


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def _d(seconds: float | None) -> str:
    """A duration for a cell: its two largest units (``2h05m``, ``45s``)."""
    if seconds is None:
        return "-"
    s = round(seconds)
    parts = [(s // 86400, "d"), (s % 86400 // 3600, "h"), (s % 3600 // 60, "m"), (s % 60, "s")]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    head = parts[:2]
    return f"{head[0][0]}{head[0][1]}" + (
        f"{head[1][0]:02d}{head[1][1]}" if len(head) > 1 and head[1][0] else ""
    )


def render(r: Report, fmt: Format) -> str:
    if fmt == "json":
        return as_json(r)
    if fmt == "csv":
        return as_csv(r).rstrip("\n")
    return as_table(r)
