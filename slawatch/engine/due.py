"""What the next scan of a rule would send, counted without writing anything.

``check`` and ``run --dry-run`` read these counts: what ``run --once`` then
sends, a drain of every rule that for ``track: table`` includes a sweep. They
follow the claim (claim.py, statetable.py) case by case, reading the same
partial indexes:

- *first* notices: due open rows whose deadline value has no episode yet (a
  baselined row has one: it is not counted); for ``track: table`` the whole due
  index, as the sweep reads it, not only the window after the watermark, so a
  row backfilled with an old deadline is counted;
- *re-notifications* due, by the number they would carry (escalation tiers pick
  their notifiers), leaving out acknowledged episodes (the claim clears those)
  and, for ``track: table``, episodes whose row is no longer open with that
  deadline (the claim closes those);
- *resolved* notices (``resolve: true``): notified episodes the scan would end.

Why counting and not the claim itself in a rolled-back transaction: before a
baseline the due rows can be a million; the claim would lock and rewrite every one
of them (on ``track: inline`` a new version in every index of the shop's table)
and keep the locks until the rollback, blocking the application's updates of
those rows, then leave as many dead tuples behind. Counting takes no lock, writes
nothing (a READ ONLY transaction makes sure), and is bounded (``limit`` rows per
kind, 30 s). Tests compare these counts with what the claim then sends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from slawatch.config.rules import Rule
from slawatch.db import Connection, translate
from slawatch.engine.catalog import (
    TableInfo,
    deadline_type_of,
    inspect_table,
    key_columns,
    rule_table,
    table_ident,
)
from slawatch.engine.claim import ClaimPlan, sql_text
from slawatch.engine.predicates import predicates
from slawatch.engine.statetable import state_table
from slawatch.errors import DatabaseError

LIMIT = 1_000_000
Counts = tuple[sql.Composed, sql.Composed, sql.Composed]  # first, again, resolved
TIMEOUT = "30s"


@dataclass(frozen=True)
class Due:
    """What the next scan of a rule would write, by kind (each at most the limit)."""

    first: int = 0
    again: dict[int, int] = field(default_factory=dict)  # notification number -> rows
    resolved: dict[int, int] = field(default_factory=dict)  # notifications sent -> episodes

    @property
    def notices(self) -> int:
        """Rows that would be notified: first notices and re-notifications."""
        return self.first + sum(self.again.values())

    @property
    def alerts(self) -> int:
        return self.notices + sum(self.resolved.values())

    def deliveries(self, rule: Rule) -> dict[str, int]:
        """Deliveries per notifier: each notice to its tier's notifiers, each resolved
        notice to every notifier its episode paged."""
        out: dict[str, int] = dict.fromkeys(rule.all_notifiers(), 0)
        for n, rows in [(1, self.first), *self.again.items()]:
            for name in rule.tier_for(n)[1]:
                out[name] += rows
        for n, rows in self.resolved.items():
            for name in rule.paged_notifiers(n):
                out[name] += rows
        return {k: v for k, v in sorted(out.items())}


def _key_text(alias: str | None, key: list[str]) -> sql.Composable:
    """The key as the alert's text (claim.py's, so that ack rows match)."""
    cols = [sql.Identifier(alias, c) if alias else sql.Identifier(c) for c in key]
    if len(cols) == 1:
        return sql.SQL("{}::text").format(cols[0])
    return sql.SQL("ROW({})::text").format(sql.SQL(", ").join(cols))


def _by_n(rows: list[tuple[Any, ...]]) -> dict[int, int]:
    return {int(n): int(c) for n, c in rows if c}


def count(
    conn: Connection, rule: Rule, info: TableInfo, now: datetime, limit: int = LIMIT
) -> Due | None:
    """What a drain at ``now`` would write (``run --once``: for ``track: table`` with a
    sweep); None when counting took over 30 s.

    Without tracking (not migrated yet) every due open row counts as a first notice.
    Runs in a READ ONLY transaction of its own on ``conn``.
    """

    has_tz = deadline_type_of(rule, info) == "timestamp with time zone"
    plan = ClaimPlan(rule, sql.Composed([]), has_tz)
    params = plan.params(now) | {"limit": limit}
    t, d = table_ident(rule), sql_text(rule.deadline_sql())
    open_when = sql_text(f"({rule.open_when}\n)")
    untracked = sql.SQL(
        "SELECT count(*) FROM (SELECT 1 FROM {t} u WHERE {d} < %(cutoff)s AND {ow}"
        " LIMIT %(limit)s) f"
    ).format(t=t, d=d, ow=open_when)
    again: sql.Composed | None = None
    resolved: sql.Composed | None = None
    try:
        with translate(f"counting due rows for rule {rule.name}"), conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(TIMEOUT)))
            if rule.track == "table":
                state = inspect_table(conn, "slawatch", f"{rule.name}_state")
                if state is None:
                    first: sql.Composed = untracked
                else:
                    first, again, resolved = _table(rule, info, open_when)
            elif all(c in info.columns for c in rule.tracking_columns):
                first, again, resolved = _inline(rule, info)
            else:
                first = untracked
            row = conn.execute(first, params).fetchone()
            due = Due(first=min(int(row[0]) if row else 0, limit))
            if again is not None:
                due.again.update(_by_n(conn.execute(again, params).fetchall()))
            if resolved is not None and rule.resolve:
                due.resolved.update(_by_n(conn.execute(resolved, params).fetchall()))
    except DatabaseError as exc:
        if isinstance(exc.__cause__, psycopg.errors.QueryCanceled):
            return None
        raise
    return due


def count_due(
    conn: Connection, rule: Rule, info: TableInfo, now: datetime, limit: int = 1_000_000
) -> int | None:
    """How many rows a drain at ``now`` would notify (first notices and due
    re-notifications; ``track: table`` backfills too, as ``run --once`` sweeps), counted
    up to ``limit``; None when counting took too long.

    Without tracking columns (not migrated yet) every due open row counts as a first
    notice. Nothing is written.
    """
    due = count(conn, rule, info, now, limit)
    return None if due is None else min(due.notices, limit)


def _inline(rule: Rule, info: TableInfo) -> Counts:
    t, d = table_ident(rule), sql_text(rule.deadline_sql())
    n, nxt = sql.Identifier(rule.n_column), sql.Identifier(rule.next_column)
    first, again, ended = (sql_text(p) for p in predicates(rule))
    acked = sql.SQL(
        "EXISTS (SELECT 1 FROM slawatch.ack k WHERE k.rule = %(rule)s AND k.key = {key}"
        " AND k.episode = {ep})"
    ).format(key=_key_text(None, key_columns(rule, info)), ep=sql.Identifier(rule.episode_column))
    return (
        sql.SQL(
            "SELECT count(*) FROM (SELECT 1 FROM {t} WHERE {d} < %(cutoff)s AND {first}"
            " LIMIT %(limit)s) f"
        ).format(t=t, d=d, first=first),
        sql.SQL(
            "SELECT n + 1, count(*) FROM (SELECT {n} AS n FROM {t}"
            " WHERE {next} < %(renotify_by)s::timestamptz AND {again} AND NOT {acked}"
            " LIMIT %(limit)s) a GROUP BY 1"
        ).format(t=t, n=n, next=nxt, again=again, acked=acked),
        sql.SQL(
            "SELECT n, count(*) FROM (SELECT {n} AS n FROM {t} WHERE {ended} AND {n} > 0"
            " LIMIT %(limit)s) e GROUP BY 1"
        ).format(t=t, n=n, ended=ended),
    )


def _table(rule: Rule, info: TableInfo, open_when: sql.SQL) -> Counts:
    t, d, s = table_ident(rule), sql_text(rule.deadline_sql("t")), state_table(rule)
    key = key_columns(rule, info)
    s_is_t = sql.SQL(" AND ").join(
        sql.SQL("s.{c} = t.{c}").format(c=sql.Identifier(c)) for c in key
    )
    still = sql.SQL(
        "EXISTS (SELECT 1 FROM {t} t WHERE {s_is_t} AND {d} = s.sw_seen AND {ow})"
    ).format(t=t, s_is_t=s_is_t, d=d, ow=open_when)
    return (
        sql.SQL(
            "SELECT count(*) FROM (SELECT 1 FROM {t} t WHERE {d} < %(cutoff)s AND {ow}"
            " AND NOT EXISTS (SELECT 1 FROM {s} s WHERE {s_is_t} AND s.sw_seen = {d})"
            " LIMIT %(limit)s) f"
        ).format(t=t, d=d, ow=open_when, s=s, s_is_t=s_is_t),
        sql.SQL(
            "SELECT n + 1, count(*) FROM (SELECT s.sw_n AS n FROM {s} s"
            " WHERE s.sw_next < %(renotify_by)s::timestamptz AND {still}"
            " AND NOT EXISTS (SELECT 1 FROM slawatch.ack k WHERE k.rule = %(rule)s"
            " AND k.key = {key} AND k.episode = s.sw_ep)"
            " LIMIT %(limit)s) a GROUP BY 1"
        ).format(s=s, still=still, key=_key_text("s", key)),
        # Ended notified episodes: the sweep closes every one of them.
        sql.SQL(
            "SELECT n, count(*) FROM (SELECT s.sw_n AS n FROM {s} s"
            " WHERE s.sw_seen IS NOT NULL AND s.sw_n > 0 AND NOT {still}"
            " LIMIT %(limit)s) e GROUP BY 1"
        ).format(s=s, still=still),
    )


# The most due actions ``run --dry-run`` lists per rule (it counts them all).
ACTIONS_SHOWN = 100


@dataclass(frozen=True)
class WouldAct:
    """A row whose next notification triggers its rule's action: the alert's key and
    number, and the values the statement's placeholders would be bound to (as text, as
    the claim binds them: engine/acting.py)."""

    key: str
    n: int
    params: dict[str, str | None]

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "n": self.n, "params": self.params}


def would_act(
    conn: Connection, rule: Rule, info: TableInfo, now: datetime, limit: int = ACTIONS_SHOWN
) -> tuple[list[WouldAct], int] | None:
    """The due rows whose notification number is the action's ``on`` (at most
    ``limit``, in key order) and how many there are (up to :data:`LIMIT`); None when
    reading them took over 30 s. The same rows :func:`count` counts under that number
    (acknowledged episodes left out; a silenced one would be recorded skipped).
    Nothing is written: a READ ONLY transaction of its own on ``conn``."""
    on = rule.action_on
    if rule.action is None or on is None or rule.events is not None:
        return [], 0
    key = key_columns(rule, info)
    cols = rule.alert_columns(key)
    # The claim binds row_data ->> name: the column's JSON value as text.
    pairs = [
        sql.SQL("{}, {}").format(
            sql.Literal(name),
            sql.SQL("to_jsonb({}) #>> '{{}}'").format(sql.Identifier("t", name))
            if name in cols
            else _key_text("t", key),
        )
        for name in rule.action.placeholders
    ]
    select = sql.SQL("SELECT {key}, jsonb_build_object({params}) FROM {t} t WHERE ").format(
        key=_key_text("t", key), params=sql.SQL(", ").join(pairs), t=table_ident(rule)
    )
    where = _acting(conn, rule, info, key, on)
    if where is None:
        return [], 0
    params = ClaimPlan(
        rule, sql.Composed([]), deadline_type_of(rule, info) == "timestamp with time zone"
    ).params(now) | {"limit": limit, "all": LIMIT, "before": on - 1}
    try:
        with translate(f"reading the due actions of rule {rule.name}"), conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(TIMEOUT)))
            rows = conn.execute(
                select + where + sql.SQL(" ORDER BY 1 LIMIT %(limit)s"), params
            ).fetchall()
            counted = conn.execute(
                sql.SQL(
                    "SELECT count(*) FROM (SELECT 1 FROM {t} t WHERE {w} LIMIT %(all)s) c"
                ).format(t=table_ident(rule), w=where),
                params,
            ).fetchone()
    except DatabaseError as exc:
        if isinstance(exc.__cause__, psycopg.errors.QueryCanceled):
            return None
        raise
    found = [WouldAct(str(k), on, {str(n): v for n, v in dict(p).items()}) for k, p in rows]
    return found, int(counted[0]) if counted else len(found)


def _acting(
    conn: Connection, rule: Rule, info: TableInfo, key: list[str], on: int
) -> sql.Composable | None:
    """The condition (on the watched table as ``t``) of the rows whose next notification
    is number ``on``: :func:`_inline`'s and :func:`_table`'s, one number of them."""
    d = sql_text(rule.deadline_sql("t"))
    open_when = sql_text(f"({rule.open_when}\n)")
    tracked = all(c in info.columns for c in rule.tracking_columns)
    state = inspect_table(conn, "slawatch", f"{rule.name}_state") if rule.track == "table" else None
    if (rule.track == "inline" and not tracked) or (rule.track == "table" and state is None):
        # Not migrated yet: every due open row is a first notice.
        return sql.SQL("{d} < %(cutoff)s AND {ow}").format(d=d, ow=open_when) if on == 1 else None
    if rule.track == "inline":
        first, again, _ = (sql_text(p) for p in predicates(rule))
        if on == 1:
            return sql.SQL("{d} < %(cutoff)s AND {first}").format(d=d, first=first)
        acked = sql.SQL(
            "EXISTS (SELECT 1 FROM slawatch.ack k WHERE k.rule = %(rule)s AND k.key = {key}"
            " AND k.episode = t.{ep})"
        ).format(key=_key_text("t", key), ep=sql.Identifier(rule.episode_column))
        acted = sql.SQL(
            "EXISTS (SELECT 1 FROM slawatch.action x WHERE x.rule = %(rule)s"
            " AND x.key = {key} AND x.episode = t.{ep})"
        ).format(key=_key_text("t", key), ep=sql.Identifier(rule.episode_column))
        return sql.SQL(
            "t.{next} < %(renotify_by)s::timestamptz AND {again} AND NOT {acked} AND NOT {acted}"
            " AND t.{n} = %(before)s::integer"
        ).format(
            next=sql.Identifier(rule.next_column),
            again=again,
            acked=acked,
            acted=acted,
            n=sql.Identifier(rule.n_column),
        )
    s = state_table(rule)
    s_is_t = sql.SQL(" AND ").join(
        sql.SQL("s.{c} = t.{c}").format(c=sql.Identifier(c)) for c in key
    )
    if on == 1:
        return sql.SQL(
            "{d} < %(cutoff)s AND {ow}"
            " AND NOT EXISTS (SELECT 1 FROM {s} s WHERE {s_is_t} AND s.sw_seen = {d})"
        ).format(d=d, ow=open_when, s=s, s_is_t=s_is_t)
    return sql.SQL(
        "{ow} AND EXISTS (SELECT 1 FROM {s} s WHERE {s_is_t} AND s.sw_seen = {d}"
        " AND s.sw_next < %(renotify_by)s::timestamptz AND s.sw_n = %(before)s::integer"
        " AND NOT EXISTS (SELECT 1 FROM slawatch.ack k WHERE k.rule = %(rule)s"
        " AND k.key = {key} AND k.episode = s.sw_ep)"
        " AND NOT EXISTS (SELECT 1 FROM slawatch.action x WHERE x.rule = %(rule)s"
        " AND x.key = {key} AND x.episode = s.sw_ep))"
    ).format(ow=open_when, s=s, s_is_t=s_is_t, d=d, key=_key_text("s", key))


@dataclass(frozen=True)
class RuleDue:
    """One rule's line of ``run --dry-run``."""

    rule: Rule
    due: Due | None  # None: could not count in 30 s
    # The rows whose notification would run the rule's action (at most ACTIONS_SHOWN),
    # and how many there are; None: could not read them in 30 s.
    acts: tuple[list[WouldAct], int] | None = ([], 0)

    def to_dict(self) -> dict[str, Any]:
        if self.due is None:
            return {"rule": self.rule.name, "counted": False}
        out: dict[str, Any] = {
            "rule": self.rule.name,
            "counted": True,
            "alerts": self.due.alerts,
            "first": self.due.first,
            "renotify": sum(self.due.again.values()),
            "resolved": sum(self.due.resolved.values()),
            "deliveries": self.due.deliveries(self.rule),
        }
        if self.rule.action is not None:
            acts = self.acts
            out["action"] = {
                "sql": self.rule.action.sql,
                "statement": self.rule.action.statement,
                "counted": acts is not None,
                "would_run": acts[1] if acts is not None else None,
                "rows": [a.to_dict() for a in acts[0]] if acts is not None else [],
            }
        return out


def dry_run(conn: Connection, rules: list[Rule], now: datetime) -> list[RuleDue]:
    """Each rule's count at ``now``: what ``run --once`` would send, and the actions its
    claims would run, nothing written."""
    out = []
    for rule in rules:
        info = rule_table(conn, rule)
        if info is None:  # prepare_all said it exists; dropped since
            raise DatabaseError(f"rule {rule.name}: table {rule.table} does not exist")
        out.append(RuleDue(rule, count(conn, rule, info, now), would_act(conn, rule, info, now)))
    return out
