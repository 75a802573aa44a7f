"""What an operator reads: each rule's status, the alerts with their deliveries,
and counts. ``slawatch status`` / ``alerts`` and the admin API (``admin.py``) both
call these, so the terminal and ``/v1`` show the same numbers in the same shapes
(the pydantic models below are the API's response models and the CLI's ``--json``).

Looking must not slow the claim: counts of watched rows go through the rules'
partial indexes and stop at :data:`COUNT_LIMIT`, the delivery backlog is read
through the partial indexes of pending and dead deliveries, lists are paged by
key, and every statement runs under a statement timeout.

What is overdue is counted where each way to track keeps it: ``track: table``
reads the range of the due index (the deadline of open rows) that is past, and
probes the state table's primary key per row for whether its episode was
notified; ``inline`` adds the rows not yet notified (the first-notice index's
past range) to the open episodes (the whole re-notify index, which holds every
open episode: one entry per overdue notified row). Each part stops at
:data:`COUNT_LIMIT` rows read, so a count costs at most that many index entries
(and their heap rows), however large the table or the backlog.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Generic, Literal, TypeVar

import psycopg
from psycopg import sql
from pydantic import BaseModel, Field

from slawatch.actions.history import ActionAttempt, actions_of
from slawatch.config.durations import format_duration, parse_duration
from slawatch.config.files import shorten
from slawatch.config.rules import RULE_NAME, Rule
from slawatch.db import LOCK_TIMEOUT, Connection, pipelined, translate
from slawatch.engine import generation
from slawatch.engine.catalog import (
    TableInfo,
    deadline_type_of,
    existing_indexes,
    inspect_tables,
    key_columns,
    locked_problem,
    rule_table,
    table_ident,
    with_deadline_type,
)
from slawatch.engine.claim import ClaimPlan, sql_text
from slawatch.engine.migrate import IndexSpec, index_specs, require_schema
from slawatch.engine.outbox import alert_id
from slawatch.engine.predicates import predicates
from slawatch.engine.queries import queries
from slawatch.engine.statetable import state_table
from slawatch.errors import BadInput, DatabaseError, NotFound
from slawatch.operate.lifecycle import INT8, parse_alert

# Counts of watched rows stop here: past it an operator needs no exact number, and
# counting on would read more of the index for nothing.
COUNT_LIMIT = 100_000
# No read of the operator's surface may hold a connection longer than this.
READ_TIMEOUT = "10s"
# The rules' counts together (the on-call page, /v1/rules, 'slawatch status'), in seconds:
# each count waits at most READ_TIMEOUT, and with several watched tables locked each
# would wait its own. Past this the rules not yet counted are shown not counted, as a
# rule whose count ran out of time is; one locked table still costs only its own rule.
COUNTS_TIMEOUT = 20.0
# How long a count waits for a watched table's lock (or a state table's), as the scans'
# probes do (slawatch.db.LOCK_TIMEOUT): a table an ALTER TABLE, a LOCK TABLE or a VACUUM
# FULL holds is shown not counted at once, and the rules after it are counted, instead
# of its count waiting out READ_TIMEOUT (docs/how-to/operate.md). READ_TIMEOUT stays
# the bound of a count that is slow for its reads.
COUNT_LOCK_TIMEOUT = LOCK_TIMEOUT
MAX_LIMIT, DEFAULT_LIMIT = 1000, 50
STATUSES = ("pending", "sent", "dead", "silenced", "summarized", "acknowledged", "orphaned")
DeliveryStatus = Literal[
    "pending", "sent", "dead", "silenced", "summarized", "acknowledged", "orphaned"
]

# The on-call page's chart: alerts per hour over the last day, at most this many read
# per rule (a storm of 20 k alerts in an hour is drawn as "capped", not counted on).
HOURS = 24
HOURLY_CAP = 100_000

T = TypeVar("T")


# ---------------------------------------------------------------- shapes


class LastScan(BaseModel):
    """A rule's last scan by ``slawatch run``."""

    at: datetime
    duration_ms: int
    claimed: int = Field(description="alerts the scan wrote")
    error: str | None = Field(description="why the scan failed; null when it worked")


class RuleStatus(BaseModel):
    """One rule: what is due, what is waiting to be sent, and its last scan."""

    name: str
    description: str
    table: str
    events: str | None = Field(
        default=None,
        description="an event rule: the events it watches, e.g. 'parcel_shipped → "
        "parcel_delivered within 3d' (its table is slawatch's timer table); null for a "
        "table rule",
    )
    track: Literal["inline", "table"]
    severity: str
    notify: list[str]
    every_seconds: float
    overdue: int | None = Field(
        description="rows overdue now (open, deadline + after passed), notified or not "
        "(baselined rows too), counted up to "
        f"{COUNT_LIMIT}; null when not counted (see problem; or its table was locked, or "
        "the count ran out of time)"
    )
    overdue_capped: bool = Field(description=f"overdue reached {COUNT_LIMIT}: there are more")
    not_notified: int | None = Field(
        default=None,
        description="of the overdue rows, those not yet notified in their current episode "
        "(the next scan's first notices), counted up to the same limit; null when not counted",
    )
    not_notified_capped: bool = Field(
        default=False, description=f"not_notified reached {COUNT_LIMIT}, or overdue did first"
    )
    notified: int | None = Field(
        description="open episodes with a re-notification scheduled (read from the re-notify "
        "partial index, counted up to the same limit); null for a rule without renotify. "
        "An episode that reached its cap is in no index and not counted."
    )
    abandoned: int = Field(
        default=0,
        description="episodes ended as abandoned, open longer than the rule's give_up_after "
        "(those still in the history: the retention prunes them)",
    )
    pending: int = Field(description="deliveries of this rule's alerts still to send")
    dead: int = Field(description="deliveries given up on ('slawatch replay' sends them again)")
    orphaned: int = Field(
        default=0,
        description="deliveries whose notifier was removed from the configuration "
        "('slawatch replay --notifier OLD --to NEW' sends them to another)",
    )
    oldest_pending_seconds: float | None = Field(
        description="age of the alert behind the oldest pending delivery"
    )
    last_scan: LastScan | None
    problem: str | None = Field(description="why the rule cannot be counted or scanned")
    definition: str | None = Field(
        default=None,
        description="set when this rule as configured here is not the definition 'slawatch "
        "migrate' recorded: instances running it do not claim it (docs/how-to/rolling-deploys.md)",
    )


class RulesReport(BaseModel):
    """Every configured rule's status at one time."""

    at: datetime
    rules: list[RuleStatus]
    held_events: dict[str, int] = Field(
        default_factory=dict,
        description="events of types slawatch.event() knows no rule for, kept, by type"
        f" (counted up to {COUNT_LIMIT:,} in all): the migrate that brings a rule for a type"
        " applies its events",
    )


class Delivery(BaseModel):
    """One alert's delivery to one notifier."""

    id: int = Field(
        description="the delivery's id; for an alert in the outbox's rows the alert's id "
        "(a row's delivery to a notifier has none of its own per alert)"
    )
    notifier: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime | None = Field(description="when a pending delivery is tried next")
    last_error: str | None
    sent_at: datetime | None
    summary_id: int | None = Field(
        default=None,
        description="the storm summary (an alert of kind summary) sent in place of this one",
    )


class Alert(BaseModel):
    """One notification of one watched row, with its deliveries."""

    id: int = Field(
        description="numeric id; the alerts list's cursor. Negative for an alert kept in the "
        "outbox's rows (SLAWATCH_OUTBOX=rows, docs/explanation/outbox-rows.md): "
        "-(row id * 128 + its place in the row)"
    )
    idempotency_id: str = Field(
        description="rule:key:eEPISODE:nN (rule:key:eEPISODE:resolved for a resolved notice, "
        "rule:storm:NOTIFIER:FIRST for a storm summary), "
        "as notifiers receive it"
    )
    rule: str
    key: str
    episode: int
    n: int = Field(
        description="notification number in the episode; 0 for a resolved notice or a summary"
    )
    kind: Literal["firing", "resolved", "summary"]
    severity: str
    deadline: datetime | None
    due_at: datetime | None
    fired_at: datetime
    row: dict[str, Any]
    deliveries: list[Delivery]
    actions: list[ActionAttempt] = Field(
        default_factory=list,
        description="the attempts of the rule's action this notification triggered "
        "(docs/explanation/actions.md), first attempt first",
    )


class AlertPage(BaseModel):
    """A page of alerts, newest first."""

    alerts: list[Alert]
    next_cursor: str | None = Field(
        description="pass as cursor for the next page; null on the last page"
    )


class RuleSeverityCount(BaseModel):
    rule: str
    severity: str
    alerts: int


class NotifierStatusCount(BaseModel):
    notifier: str
    status: str
    deliveries: int


class Stats(BaseModel):
    """Counts over the kept history (``SLAWATCH_RETENTION``)."""

    alerts: list[RuleSeverityCount]
    deliveries: list[NotifierStatusCount]


class HourlyAlerts(BaseModel):
    """A rule's firing alerts per hour: ``counts[i]`` fired in the hour beginning at
    ``start + i hours``; the last hour is the current one, so far."""

    rule: str
    start: datetime
    counts: list[int]
    capped: bool = Field(description=f"{HOURLY_CAP} alerts were read: there were more")


class EpisodeAck(BaseModel):
    """Who acknowledged an episode, and when."""

    acked_by: str
    acked_at: datetime


# ---------------------------------------------------------------- input


def check_rule_name(text: str) -> str:
    """``text`` if it can be a rule's name, else BadInput."""
    if not RULE_NAME.fullmatch(text):
        raise BadInput(f"rule: {shorten(text)} is not a rule name ([a-z][a-z0-9_]{{0,39}})")
    return text


def check_status(text: str) -> DeliveryStatus:
    if text not in STATUSES:
        raise BadInput(f"status: {shorten(text)} is not one of {', '.join(STATUSES)}")
    return text  # type: ignore[return-value]


def check_limit(value: int) -> int:
    if not 1 <= value <= MAX_LIMIT:
        raise BadInput(f"limit: {value} is not from 1 to {MAX_LIMIT}")
    return value


def parse_cursor(text: str) -> int:
    """A cursor (an alert id) from the previous page's ``next_cursor``: negative in the
    part of the list that holds the outbox's rows (queries.sql, list_alerts)."""
    digits = text[1:] if text.startswith("-") else text
    if (
        not digits.isascii()
        or not digits.isdigit()
        or len(digits) > 19
        or int(text) == 0
        or not -INT8 <= int(text) <= INT8
    ):
        raise BadInput(f"cursor: {shorten(text)} is not a cursor from a previous page")
    return int(text)


def parse_since(text: str, now: datetime) -> datetime:
    """A point in time: ISO 8601 (``2026-03-01``, ``2026-03-01T12:00:00Z``; UTC unless
    it says otherwise), or a duration before ``now`` (``1h``, ``2d``, ``PT30M``)."""
    try:
        return now - parse_duration(text.strip())
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadInput(
            f"since: {shorten(text)} is neither a time (2026-03-01T12:00:00Z) nor a duration "
            "before now (1h, 2d)"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


# ---------------------------------------------------------------- reads


def _read(conn: Connection, what: str, statement: Any, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one bounded read: its own transaction with the statement timeout."""
    with translate(what), conn.transaction():
        conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(READ_TIMEOUT)))
        return conn.execute(statement, params).fetchall()


def _problem(
    rule: Rule,
    info: TableInfo | None,
    tables: dict[tuple[str, str], TableInfo],
    specs: list[IndexSpec],
    indexes: set[tuple[str, str]],
) -> str | None:
    """Why the rule's rows cannot be counted: no table, or not migrated (from
    :func:`_catalog`'s look-ups; whether each index is still the right one is for
    ``check``)."""
    if info is None:
        return f"table {rule.table} does not exist"
    if info.locked:
        return locked_problem(rule)
    if rule.deadline_column is None and rule.deadline not in info.deadline_types:
        return f"deadline {rule.deadline_sql()} is not a value of {rule.table} (see check)"
    if rule.deadline_column is not None and rule.deadline not in info.columns:
        return f"column {rule.deadline!r} is not in {rule.table}"
    if rule.track == "inline":
        missing = [c for c in rule.tracking_columns if c not in info.columns]
    else:
        state = ("slawatch", f"{rule.name}_state")
        missing = [] if state in tables else [f"slawatch.{rule.name}_state"]
    missing += [s.name for s in specs if (s.schema, s.name) not in indexes]
    if missing:
        return f"not migrated (missing {', '.join(missing)}); run 'slawatch migrate'"
    return None


def _catalog(conn: Connection, rules: list[Rule]) -> list[tuple[TableInfo | None, str | None]]:
    """Each rule's table and why its rows cannot be counted (:func:`_problem`): the
    tables, state tables and indexes of all the rules in two statements (a query rule's
    columns, an expression deadline's type: a statement of their own each, which waits
    for a locked table at most the scans' lock timeout, and then the rule says its
    table is locked: docs/how-to/operate.md)."""
    names = [(r.schema_name, r.table_name) for r in rules if r.query is None]
    names += [("slawatch", f"{r.name}_state") for r in rules if r.track == "table"]
    tables = inspect_tables(conn, names)
    specs = [_INDEX_SPECS.get(r, (), partial(index_specs, r)) for r in rules]
    indexes = existing_indexes(conn, [(s.schema, s.name) for wanted in specs for s in wanted])
    out = []
    for rule, wanted in zip(rules, specs, strict=True):
        if rule.query is not None:
            info = rule_table(conn, rule, wait=False)
        else:
            table = tables.get((rule.schema_name, rule.table_name))
            info = with_deadline_type(conn, rule, table, wait=False)
        out.append((info, _problem(rule, info, tables, wanted, indexes)))
    return out


def notified_statement(rule: Rule, *, params: bool = False) -> sql.Composed:
    """Open episodes awaiting a re-notification, counted through the re-notify partial
    index (the watched table's ``_again`` index, or the state table's). An episode
    given up (``give_up_after``: next is ``infinity``) is not counted. ``params``: for
    a statement with parameters (a ``%`` of the predicate doubled)."""
    if rule.track == "table":
        source: sql.Composable = sql.SQL("{} WHERE sw_next < 'infinity'").format(state_table(rule))
    else:
        # The predicate word for word as the index has it, so the planner matches them
        # (run without parameters a `%` in it stays as it is; with, it is doubled, and the
        # server gets it as it is); `next < 'infinity'` is then a condition on the
        # index's key (its non-null, not given up part).
        again = predicates(rule)[1]
        source = sql.SQL("{} WHERE {} < 'infinity' AND {}").format(
            table_ident(rule),
            sql.Identifier(rule.next_column),
            sql_text(again) if params else sql.SQL(again),
        )
    return sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} LIMIT {}) a").format(
        source, sql.Literal(COUNT_LIMIT)
    )


def open_timers_statement(rule: Rule) -> sql.Composed:
    """An event rule's open timers (``WHERE open``), up to :data:`COUNT_LIMIT`: one row
    ``(count,)``. Read as three disjoint parts, each through a partial index of the
    timer table, so the closed timers that wait for retention are never read: not yet
    notified (the first-notice index), in an open episode (the re-notify index), and a
    scheduled beat whose deadline the scan has not filled in yet (``_unscheduled``)."""
    t, seen = table_ident(rule), sql.Identifier(rule.seen_column)
    first, again, _ = (sql_text(p) for p in predicates(rule))
    unscheduled = sql.SQL("open AND due_at IS NULL AND {} IS NULL").format(seen)
    parts = [
        sql.SQL("(SELECT count(*) FROM (SELECT 1 FROM {} WHERE {} LIMIT {}) x)").format(
            t, where, sql.Literal(COUNT_LIMIT)
        )
        for where in (first, again, unscheduled)
    ]
    return sql.SQL("SELECT least({}, {})").format(
        sql.SQL(" + ").join(parts), sql.Literal(COUNT_LIMIT)
    )


def events_text(rule: Rule) -> str | None:
    """What an event rule watches, for people: ``parcel_shipped → parcel_delivered within
    72h`` (None for a table rule)."""
    events = rule.events
    if events is None:
        return None
    if events.start is not None and events.stop is not None:
        text = f"{', '.join(events.start)} → {', '.join(events.stop)}"
        text += f" within {format_duration(events.within or timedelta(0))}"
        if events.min is not None:
            text += f", not sooner than {format_duration(events.min)}"
    elif events.within is not None:
        text = f"{', '.join(events.beat or [])} at least every {format_duration(events.within)}"
    else:
        text = f"{', '.join(events.beat or [])} on schedule {events.schedule!r}"
        if events.timezone != "UTC":
            text += f" ({events.timezone})"
        if events.grace:
            text += f", grace {format_duration(events.grace)}"
    if events.fail:
        text += f"; fails on {', '.join(events.fail)}"
    return text


def overdue_statement(rule: Rule, info: TableInfo) -> sql.Composed:
    """Rows overdue now, and of them those not yet notified: one row ``(overdue,
    not_notified, overdue_capped, not_notified_capped)``; parameter ``cutoff`` (now less
    ``after``, as a value of the deadline's type). Reads at most :data:`COUNT_LIMIT`
    entries of each index it uses, and never the watched table without one."""
    t, d = table_ident(rule), sql_text(rule.deadline_sql())
    cap = sql.Literal(COUNT_LIMIT)
    if rule.track == "table":
        # The past range of the due index; per row, one probe of the state table's
        # primary key for an episode of this deadline value (notified, or baselined).
        s_is_t = sql.SQL(" AND ").join(
            sql.SQL("s.{c} = t.{c}").format(c=sql.Identifier(c)) for c in key_columns(rule, info)
        )
        return sql.SQL(
            "SELECT count(*), count(*) FILTER (WHERE o.fresh), count(*) >= {cap},"
            " count(*) >= {cap}"
            " FROM (SELECT NOT EXISTS (SELECT 1 FROM {s} s WHERE {s_is_t} AND s.sw_seen = {td})"
            " AS fresh FROM {t} t WHERE {td} < %(cutoff)s AND {ow} LIMIT {cap}) o"
        ).format(
            cap=cap,
            s=state_table(rule),
            s_is_t=s_is_t,
            td=sql_text(rule.deadline_sql("t")),
            t=t,
            ow=sql_text(f"({rule.open_when}\n)"),
        )
    # Inline: rows not yet notified for their deadline value (the first-notice index's
    # past range), and open episodes (the whole re-notify index: its predicate, word for
    # word, so the planner matches it). The two are disjoint: seen = deadline or not.
    first, again, _ = (sql_text(p) for p in predicates(rule))
    return sql.SQL(
        "SELECT least(f.n + e.n, {cap}), f.n, f.n + e.n >= {cap}, f.n >= {cap}"
        " FROM (SELECT count(*) AS n FROM (SELECT 1 FROM {t} WHERE {d} < %(cutoff)s AND {first}"
        " LIMIT {cap}) x) f,"
        " (SELECT count(*) AS n FROM (SELECT 1 FROM {t} WHERE {again} AND {d} < %(cutoff)s"
        " LIMIT {cap}) y) e"
    ).format(cap=cap, t=t, d=d, first=first, again=again)


def _cutoff(rule: Rule, info: TableInfo, now: datetime) -> Any:
    """:func:`overdue_statement`'s ``cutoff`` at ``now``."""
    has_tz = deadline_type_of(rule, info) == "timestamp with time zone"
    return ClaimPlan(rule, sql.Composed([]), has_tz).to_deadline(rule.cutoff(now))


def count_overdue(
    conn: Connection, rule: Rule, info: TableInfo, now: datetime
) -> tuple[int, int, bool, bool] | None:
    """:func:`overdue_statement` at ``now``; None when it ran out of time."""
    rows = _bounded_read(
        conn,
        f"counting overdue rows of rule {rule.name}",
        overdue_statement(rule, info),
        {"cutoff": _cutoff(rule, info, now)},
    )
    if rows is None:
        return None
    ((overdue, fresh, capped, fresh_capped),) = rows
    return int(overdue), int(fresh), bool(capped), bool(fresh_capped)


def _bounded_read(conn: Connection, what: str, statement: Any, params: Any = None) -> Any:
    """:func:`_read`, or None when the statement ran out of time (READ_TIMEOUT)."""
    try:
        return _read(conn, what, statement, params)
    except DatabaseError as exc:
        if isinstance(exc.__cause__, psycopg.errors.QueryCanceled):
            return None
        raise


Counts = tuple[tuple[int, int, bool, bool] | None, int | None]


def _counts(conn: Connection, counted: list[tuple[Rule, TableInfo]], now: datetime) -> list[Counts]:
    """Each rule's overdue rows (:func:`count_overdue`) and open episodes
    (:func:`notified_statement`, None for a rule without ``renotify``): one statement a
    rule, all in one request, each bounded by :data:`READ_TIMEOUT`, and its wait for a
    locked table by :data:`COUNT_LOCK_TIMEOUT`. A statement that runs out of time (or
    of its lock's) fails the request from there on (the server runs it as one transaction,
    and skips what follows a failure): that rule says it could not count (None, None),
    the counts before it stand, and the rules after it go in a request of their own. So
    a timeout costs the rule that ran out of time, and a round trip, not the others.

    All of them together are bounded by :data:`COUNTS_TIMEOUT`: each request's statements
    wait at most what is left of it, and once it has passed the rules not yet counted are
    not counted (None, None), without a request (docs/how-to/operate.md)."""
    out: list[Counts] = []
    deadline = time.monotonic() + COUNTS_TIMEOUT
    while len(out) < len(counted):
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms < 1:  # out of time: the rest as a count that ran out of it
            return out + [(None, None)] * (len(counted) - len(out))
        out += _count_until_timeout(conn, counted[len(out) :], now, left_ms)
    return out


# A statement's time: READ_TIMEOUT, or less when less is left of COUNTS_TIMEOUT; and
# its wait for a lock: COUNT_LOCK_TIMEOUT.
_TIMEOUT = (
    "SELECT set_config('statement_timeout', greatest(1, 1000 * extract(epoch FROM"
    " least(%(read)s::interval, make_interval(secs => %(left)s))))::bigint::text, true),"
    " set_config('lock_timeout', %(lock)s, true)"
)
# What ends a count early, that rule alone shown not counted: it ran out of time
# (statement_timeout), or a table it reads was locked past COUNT_LOCK_TIMEOUT.
_NOT_COUNTED = (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)


def _count_until_timeout(
    conn: Connection, counted: list[tuple[Rule, TableInfo]], now: datetime, left_ms: int
) -> list[Counts]:
    """:func:`_counts` of the first of ``counted``, each statement bounded by
    :data:`READ_TIMEOUT` or ``left_ms``, whichever is less, and its wait for a lock by
    :data:`COUNT_LOCK_TIMEOUT`: all of them in one request, or, when one ran out of time
    or of its lock's, those up to it (it counted as (None, None)); never none."""
    cursors: list[psycopg.Cursor[Any]] = []
    try:
        with translate("counting the rules' rows"), pipelined(conn):
            conn.execute(
                _TIMEOUT,
                {"read": READ_TIMEOUT, "left": left_ms / 1000, "lock": COUNT_LOCK_TIMEOUT},
            )
            for rule, info in counted:
                cur = conn.cursor()
                cursors.append(cur)
                cur.execute(_count_statement(rule, info), {"cutoff": _cutoff(rule, info, now)})
    except DatabaseError as exc:
        if not isinstance(exc.__cause__, _NOT_COUNTED):
            raise
        # The statements before the one that ran out of time have their rows; it and
        # those after it have none (pipelined: skipped; in a transaction: never sent).
        done = next((i for i, cur in enumerate(cursors) if not _answered(cur)), len(cursors))
        return [_counted(cur) for cur in cursors[:done]] + [(None, None)]
    return [_counted(cur) for cur in cursors]


class _PerRule(Generic[T]):
    """Values made from a rule once, not on every look: composing the statements and
    index names of a page of many rules is most of its Python time (2,000 rules: some
    0.5 s of CPU a page). By the rule's id, the rule held (its id not reused) and
    checked (a rule is not changed once loaded: a reload makes new ones), with ``key``:
    what else the value is made from (the catalog's part in it)."""

    MAX = 20_000  # then the values of the rules of reloads before go

    def __init__(self) -> None:
        self._known: dict[int, tuple[Rule, Hashable, T]] = {}

    def get(self, rule: Rule, key: Hashable, make: Callable[[], T]) -> T:
        known = self._known.get(id(rule))
        if known is not None and known[0] is rule and known[1] == key:
            return known[2]
        value = make()
        if len(self._known) >= self.MAX:
            self._known.clear()
        self._known[id(rule)] = (rule, key, value)
        return value


_COUNT_STATEMENTS: _PerRule[str] = _PerRule()
_INDEX_SPECS: _PerRule[list[IndexSpec]] = _PerRule()


def _count_statement(rule: Rule, info: TableInfo) -> str:
    """:func:`overdue_statement` with :func:`notified_statement` (NULL for a rule
    without ``renotify``) as its last column; composed once a rule (and key columns,
    which a ``track: table`` rule's statement takes from the catalog)."""

    def make() -> str:
        notified: sql.Composable = sql.SQL("NULL::bigint")
        if rule.renotify is not None:
            notified = sql.SQL("({})").format(notified_statement(rule, params=True))
        statement = sql.SQL("SELECT o.*, {} FROM ({}) o").format(
            notified, overdue_statement(rule, info)
        )
        return statement.as_string(None)

    key = tuple(key_columns(rule, info)) if rule.track == "table" else ()
    return _COUNT_STATEMENTS.get(rule, key, make)


def _answered(cur: psycopg.Cursor[Any]) -> bool:
    return cur.pgresult is not None and cur.pgresult.status == psycopg.pq.ExecStatus.TUPLES_OK


def _counted(cur: psycopg.Cursor[Any]) -> Counts:
    ((n, fresh, capped, fresh_capped, episodes),) = cur.fetchall()
    return (
        (int(n), int(fresh), bool(capped), bool(fresh_capped)),
        None if episodes is None else int(episodes),
    )


def rule_status(conn: Connection, rules: Iterable[Rule], now: datetime) -> list[RuleStatus]:
    """The status of each of ``rules`` at ``now``."""
    rules = list(rules)
    q = queries()
    backlog = {
        r[0]: r[1:] for r in _read(conn, "reading the delivery backlog", q["delivery_backlog"])
    }
    scans = {
        r[0]: LastScan(at=r[1], duration_ms=r[2], claimed=r[3], error=r[4])
        for r in _read(conn, "reading the last scans", q["last_scans"])
    }
    abandoned = {
        str(r[0]): int(r[1])
        for r in _read(conn, "counting abandoned episodes", q["abandoned_episodes"])
    }
    records = generation.recorded(conn)
    catalog = _catalog(conn, rules)
    counted = [
        (rule, info)
        for rule, (info, problem) in zip(rules, catalog, strict=True)
        if info is not None and problem is None
    ]
    counts = dict(zip([r.name for r, _ in counted], _counts(conn, counted, now), strict=True))
    out = []
    for rule, (_, problem) in zip(rules, catalog, strict=True):
        overdue, notified = counts.get(rule.name, (None, None))
        pending, dead, oldest, orphaned = backlog.get(rule.name, (0, 0, None, 0))
        out.append(
            RuleStatus(
                name=rule.name,
                description=rule.description,
                table=rule.table,
                events=events_text(rule),
                track=rule.track,
                severity=rule.severity,
                notify=list(rule.notify),
                every_seconds=rule.every.total_seconds(),
                overdue=None if overdue is None else overdue[0],
                overdue_capped=overdue is not None and overdue[2],
                not_notified=None if overdue is None else overdue[1],
                not_notified_capped=overdue is not None and overdue[3],
                notified=notified,
                abandoned=abandoned.get(rule.name, 0),
                pending=pending,
                dead=dead,
                orphaned=orphaned,
                oldest_pending_seconds=None
                if oldest is None
                else max((now - oldest).total_seconds(), 0.0),
                last_scan=scans.get(rule.name),
                problem=problem,
                definition=generation.unrecorded(rule, records.get(rule.name)),
            )
        )
    return out


def rules_report(conn: Connection, rules: Iterable[Rule], now: datetime) -> RulesReport:
    """:func:`rule_status` of every rule; ConfigError before ``slawatch migrate``."""
    require_schema(conn)
    return RulesReport(at=now, rules=rule_status(conn, rules, now), held_events=held_events(conn))


_HELD = f"""\
SELECT type, count(*) FROM (
    SELECT type FROM slawatch.event_held ORDER BY type LIMIT {COUNT_LIMIT}) h
 GROUP BY type ORDER BY type"""


def held_events(conn: Connection) -> dict[str, int]:
    """Events held in ``slawatch.event_held`` by type (of a type no rule knew when they
    came), read through its type index, counted up to :data:`COUNT_LIMIT` in all."""
    with translate("counting held events"):
        rows = conn.execute(_HELD).fetchall()
    return {str(t): int(n) for t, n in rows}


def _alerts(conn: Connection, rows: list[tuple[Any, ...]]) -> list[Alert]:
    """Alerts from ``alert`` rows, each with its deliveries (one more statement)."""
    ids = [r[0] for r in rows]
    deliveries: dict[int, list[Delivery]] = {i: [] for i in ids}
    if ids:
        for alert, *d in _read(
            conn, "reading deliveries", queries()["deliveries_of"], {"ids": ids}
        ):
            deliveries[alert].append(
                Delivery(
                    id=d[0],
                    notifier=d[1],
                    status=d[2],
                    attempts=d[3],
                    next_attempt_at=d[4] if d[2] == "pending" else None,
                    last_error=d[5],
                    sent_at=d[6],
                    summary_id=d[7],
                )
            )
    firing = [(r[1], r[2], r[3], r[4]) for r in rows if r[5] == "firing"]
    acted = actions_of(conn, firing) if firing else {}
    return [
        Alert(
            id=i,
            idempotency_id=alert_id(rule, key, ep, n, kind),
            rule=rule,
            key=key,
            episode=ep,
            n=n,
            kind=kind,
            severity=severity,
            deadline=deadline,
            due_at=due_at,
            fired_at=fired_at,
            row=row,
            deliveries=deliveries[i],
            actions=acted.get((rule, key, ep, n), []),
        )
        for i, rule, key, ep, n, kind, severity, deadline, due_at, fired_at, row in rows
    ]


def list_alerts(
    conn: Connection,
    *,
    rule: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    cursor: int | None = None,
    limit: int = DEFAULT_LIMIT,
) -> AlertPage:
    """A page of alerts, newest first; ``cursor``: the previous page's ``next_cursor``.

    ``status``: alerts with at least one delivery in that status.
    """
    params = {
        "rule": None if rule is None else check_rule_name(rule),
        "status": None if status is None else check_status(status),
        "since": since,
        "before": cursor,
        "limit": check_limit(limit),
    }
    rows = _read(conn, "listing alerts", queries()["list_alerts"], params)
    alerts = _alerts(conn, rows)
    more = len(alerts) == limit
    return AlertPage(alerts=alerts, next_cursor=str(alerts[-1].id) if more else None)


def get_alert(conn: Connection, ref: str) -> Alert:
    """One alert by its numeric id or its idempotency id (``lifecycle.parse_alert``, as
    ``slawatch ack`` reads it); NotFound when there is none, BadInput when malformed."""
    parsed = parse_alert(ref)
    q = queries()
    if isinstance(parsed, int):
        rows = _read(conn, "reading an alert", q["alert_by_id"], {"id": parsed})
    else:
        rule, key, episode, n = parsed
        params = {"rule": rule, "key": key, "episode": episode, "n": n}
        rows = _read(conn, "reading an alert", q["alert_by_name"], params)
    if not rows:
        raise NotFound(f"no alert {shorten(ref)}")
    return _alerts(conn, rows)[0]


def stats(conn: Connection) -> Stats:
    """Alerts by rule and severity, deliveries by notifier and status."""
    q = queries()
    return Stats(
        alerts=[
            RuleSeverityCount(rule=r, severity=s, alerts=c)
            for r, s, c in _read(conn, "counting alerts", q["stats_alerts"])
        ],
        deliveries=[
            NotifierStatusCount(notifier=nt, status=s, deliveries=c)
            for nt, s, c in _read(conn, "counting deliveries", q["stats_deliveries"])
        ],
    )


def alerts_per_hour(
    conn: Connection, rules: Iterable[str], now: datetime, hours: int = HOURS
) -> list[HourlyAlerts]:
    """Firing alerts per hour of each of ``rules`` over the ``hours`` UTC clock hours
    that end with the current one (a rule without alerts: all zeros)."""
    names = list(rules)
    start = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(
        hours=hours - 1
    )
    counts = {name: [0] * hours for name in names}
    params = {
        "rules": names,
        "start": start,
        "end": start + timedelta(hours=hours),
        "cap": HOURLY_CAP,
    }
    for rule, hour, count in _read(
        conn, "counting alerts per hour", queries()["alerts_per_hour"], params
    ):
        counts[rule][hour] = count
    return [
        HourlyAlerts(rule=n, start=start, counts=c, capped=sum(c) >= HOURLY_CAP)
        for n, c in counts.items()
    ]


def acks_of(
    conn: Connection, episodes: Iterable[tuple[str, str, int]]
) -> dict[tuple[str, str, int], EpisodeAck]:
    """The acks of the given (rule, key, episode)s that have one."""
    wanted = sorted(set(episodes))
    if not wanted:
        return {}
    rules, keys, numbers = (list(column) for column in zip(*wanted, strict=True))
    params = {"rules": rules, "keys": keys, "episodes": numbers}
    return {
        (rule, key, episode): EpisodeAck(acked_by=by, acked_at=at)
        for rule, key, episode, by, at in _read(conn, "reading acks", queries()["acks_of"], params)
    }
