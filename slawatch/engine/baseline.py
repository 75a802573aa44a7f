"""First deployment without a flood: mark what is overdue now as already seen.

A new rule on a production table can find years of rows that are already
overdue; its first scan would page for each. ``slawatch migrate --baseline``
records, for every row overdue at one cutoff (``now - after``), that its current
episode was *seen* but never notified:

- ``track: inline``: ``sw_<rule>_seen = deadline`` with ``n = 0`` and ``next``
  NULL. The row leaves the first-notice index (its deadline value has an
  episode) for the open-episode one (``_again``), where no claim reads a row
  whose ``next`` is NULL (``status`` counts it as overdue); ``ep`` is unchanged,
  so the first episode that pages is numbered as it would have been. ``seen`` set
  with ``n = 0`` is a state only a baseline makes: an episode nobody was paged for.
- ``track: table``: a state row (``sw_seen = deadline``, ``sw_n = 0``,
  ``sw_next`` NULL); nothing is written to the watched table.

From there the claim does the rest unchanged: a baselined row that completes is
closed without a resolved notice (those go only to episodes with ``n > 0``); a
row whose deadline moves, or that reopens after a scan saw it close, starts a new
episode and pages from #1 when it falls due.

An episode that was already notified (``n > 0``) is left alone, whatever its
deadline now says: its re-notifications, and the resolved notice when it ends,
are owed to the people who were paged.

The work goes in batches (``batch`` rows, one transaction each) in deadline
order, from where the last batch ended, so no batch re-reads what an earlier one
did. Each batch adds its count to ``slawatch.baseline`` in the same transaction:
an interrupted baseline loses nothing, and running it again finishes the rest
(the rows themselves say what is done) and changes nothing already done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from psycopg import sql

from slawatch.config.rules import Rule
from slawatch.db import Connection, translate
from slawatch.engine.catalog import TableInfo, deadline_type_of, key_columns, table_ident
from slawatch.engine.predicates import predicates
from slawatch.engine.statetable import state_table
from slawatch.errors import ConfigError

BATCH = 10_000

_INLINE = """\
WITH picked AS (
    SELECT tableoid, ctid, {d} AS deadline FROM {table}
     WHERE {d} >= {since} AND {d} < {cutoff} AND {first} AND {n} = 0
     ORDER BY {d}
     LIMIT {batch}
), done AS (
    UPDATE {table} SET {seen} = {d}, {next} = NULL
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM picked)){partition_match}
       -- The re-check, for rows changed since `picked` read them. IS TRUE keeps it out
       -- of the planner's reach: as plain conditions they match the first-notice index,
       -- and without statistics (a table just migrated) the planner read that index's
       -- whole due range for every batch instead of fetching the picked rows by ctid.
       AND ({d} < {cutoff} AND {first} AND {n} = 0) IS TRUE
    RETURNING 1
){record}"""

# A state row for each due open row whose deadline value has none yet, unless the
# row has a notified episode (sw_n > 0: left alone, see the module's docstring).
_TABLE = """\
WITH picked AS (
    SELECT {t_keys}, {td} AS deadline FROM {table} t
     WHERE {td} >= {since} AND {td} < {cutoff} AND ({open_when}
           )
       AND NOT EXISTS (SELECT 1 FROM {state} s
                        WHERE {s_is_t} AND (s.sw_seen = {td} OR s.sw_n > 0))
     ORDER BY {td}
     LIMIT {batch}
), done AS (
    INSERT INTO {state} AS s ({keys}, sw_seen, sw_ep, sw_n, sw_next)
    SELECT {p_keys}, p.deadline, 0, 0, NULL FROM picked p
    ON CONFLICT ({keys}) DO UPDATE SET sw_seen = excluded.sw_seen, sw_next = NULL
     WHERE s.sw_n = 0 AND s.sw_seen IS DISTINCT FROM excluded.sw_seen
    RETURNING 1
){record}"""

_RECORD = """\
, recorded AS (
    INSERT INTO slawatch.baseline AS b (rule, rows, baselined_at)
    SELECT {rule}, count(*), {now} FROM done
    ON CONFLICT (rule) DO UPDATE SET rows = b.rows + excluded.rows,
                                     baselined_at = excluded.baselined_at
)
SELECT (SELECT count(*) FROM picked), (SELECT count(*) FROM done),
       (SELECT max(deadline) FROM picked){into}"""

_PARTITION_MATCH = "\n       AND (tableoid, ctid) IN (SELECT tableoid, ctid FROM picked)"


@dataclass(frozen=True)
class Values:
    """What fills a batch statement: parameters (run by slawatch) or PL/pgSQL
    variables and literals (the script ``migrate --print --baseline`` prints)."""

    since: sql.Composable
    cutoff: sql.Composable
    batch: sql.Composable
    now: sql.Composable
    rule: sql.Composable
    into: sql.Composable
    text: Callable[[str], sql.SQL]  # operator-authored SQL text as it must be written


PARAMS = Values(
    since=sql.Placeholder("since"),
    cutoff=sql.Placeholder("cutoff"),
    batch=sql.SQL("%(batch)s::integer"),
    now=sql.SQL("%(now)s::timestamptz"),
    rule=sql.Placeholder("rule"),
    into=sql.SQL(""),
    # A literal % (a LIKE pattern in open_when) must not be taken for a placeholder.
    text=lambda s: sql.SQL(s.replace("%", "%%")),
)


def statement(rule: Rule, info: TableInfo, values: Values = PARAMS) -> sql.Composed:
    """One batch of the baseline of ``rule``; returns (picked, baselined, last deadline)."""
    record = sql.SQL(_RECORD).format(rule=values.rule, now=values.now, into=values.into)
    d = values.text(rule.deadline_sql())
    if rule.track == "inline":
        return sql.SQL(_INLINE).format(
            table=table_ident(rule),
            d=d,
            since=values.since,
            cutoff=values.cutoff,
            batch=values.batch,
            first=values.text(predicates(rule)[0]),
            n=sql.Identifier(rule.n_column),
            seen=sql.Identifier(rule.seen_column),
            next=sql.Identifier(rule.next_column),
            partition_match=sql.SQL(_PARTITION_MATCH if info.relkind == "p" else ""),
            record=record,
        )
    key = key_columns(rule, info)

    def cols(alias: str) -> sql.Composable:
        return sql.SQL(", ").join(sql.Identifier(alias, c) for c in key)

    return sql.SQL(_TABLE).format(
        table=table_ident(rule),
        state=state_table(rule),
        td=values.text(rule.deadline_sql("t")),
        since=values.since,
        cutoff=values.cutoff,
        batch=values.batch,
        open_when=values.text(rule.open_when),
        keys=sql.SQL(", ").join(sql.Identifier(c) for c in key),
        t_keys=cols("t"),
        p_keys=cols("p"),
        s_is_t=sql.SQL(" AND ").join(
            sql.SQL("s.{c} = t.{c}").format(c=sql.Identifier(c)) for c in key
        ),
        record=record,
    )


def cutoff(rule: Rule, info: TableInfo, now: datetime) -> datetime:
    """What is due at ``now``, as a value of the deadline column's type (a `timestamp`
    deadline is wall time in the rule's zone, as in the claim)."""
    at = rule.cutoff(now)
    if deadline_type_of(rule, info) == "timestamp with time zone":
        return at
    return at.astimezone(ZoneInfo(rule.timezone)).replace(tzinfo=None)


@dataclass(frozen=True)
class Progress:
    """Where one rule's baseline is: rows baselined by this run so far."""

    rule: str
    rows: int
    batches: int
    seconds: float
    finished: bool


def baseline_rule(
    conn: Connection,
    rule: Rule,
    info: TableInfo,
    now: datetime,
    *,
    batch: int = BATCH,
    progress: Callable[[Progress], None] | None = None,
) -> int:
    """Baseline one rule on ``conn`` (autocommit: each batch commits on its own);
    the rows this run baselined."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    composed = statement(rule, info)
    params: dict[str, Any] = {
        "since": "-infinity",
        "cutoff": cutoff(rule, info, now),
        "batch": batch,
        "now": now,
        "rule": rule.name,
    }
    started = time.monotonic()
    rows = batches = 0
    while True:
        with translate(f"baseline of rule {rule.name}"):
            row = conn.execute(composed, params).fetchone()
        assert row is not None
        picked, done, last = int(row[0]), int(row[1]), row[2]
        rows += done
        batches += 1
        finished = picked < batch
        if finished and rows and rule.track == "table":
            analyze(conn, rule)
        if progress is not None:
            progress(Progress(rule.name, rows, batches, time.monotonic() - started, finished))
        if finished:
            return rows
        # Rows before `last` are done; ties with it are read again (and skipped).
        params["since"] = last


def _analyze(rule: Rule) -> sql.Composed:
    return sql.SQL("ANALYZE {}").format(state_table(rule))


def analyze(conn: Connection, rule: Rule) -> None:
    """Statistics for a state table that just grew by a baseline: without them the
    planner took its re-notify probe for a scan of the whole table (measured: 0.8 s
    instead of milliseconds per scan at 1 M rows, until autovacuum came by)."""
    with translate(f"analyze of slawatch.{rule.name}_state"):
        conn.execute(_analyze(rule))


@dataclass(frozen=True)
class Baselined:
    """What baselines recorded for a rule: rows in all, and when the last one ran."""

    rows: int
    at: datetime


def recorded(conn: Connection) -> dict[str, Baselined]:
    """Each rule's baseline record (none before the first baseline or migrate)."""
    with translate("reading the baseline records"):
        exists = conn.execute("SELECT to_regclass('slawatch.baseline') IS NOT NULL").fetchone()
        if not (exists and exists[0]):
            return {}
        rows = conn.execute("SELECT rule, rows, baselined_at FROM slawatch.baseline").fetchall()
    return {rule: Baselined(int(n), at) for rule, n, at in rows}


def select(rules: list[Rule], names: list[str], where: str) -> list[Rule]:
    """The rules named (all when none are); ConfigError naming any unknown."""
    if not names:
        return rules
    by_name = {r.name: r for r in rules}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        shown = ", ".join(repr(n[:60]) for n in unknown)
        raise ConfigError(f"--rule: no rule named {shown} in {where}")
    return [by_name[n] for n in dict.fromkeys(names)]


# Dollar-quoting tag of the printed DO blocks.
_TAG = "$slawatch_baseline$"


def render(rule: Rule, info: TableInfo, now: datetime, batch: int = BATCH) -> str:
    """The baseline of ``rule`` as a DO block a DBA runs with psql (autocommit, as psql
    does by default; PostgreSQL 11 or later: it commits after every batch)."""
    values = Values(
        since=sql.Identifier("_sw_since"),
        cutoff=sql.Literal(cutoff(rule, info, now)),
        batch=sql.Literal(batch),
        now=sql.Literal(now),
        rule=sql.Literal(rule.name),
        into=sql.SQL("\n  INTO _sw_picked, _sw_done, _sw_last"),
        text=sql.SQL,
    )
    body = statement(rule, info, values).as_string(None)
    if _TAG in body:  # only inside a string in open_when; refuse rather than mis-quote
        raise ConfigError(f"{rule.source}: open_when: contains {_TAG}; cannot print a baseline")
    var_type: sql.Composable = sql.SQL(deadline_type_of(rule, info))
    if rule.deadline_column is not None:
        var_type = sql.SQL("{}%TYPE").format(
            sql.Identifier(rule.schema_name, rule.table_name, rule.deadline_column)
        )
    head = sql.SQL(
        "DECLARE\n"
        "    _sw_since {t} := '-infinity';\n"
        "    _sw_last {t};\n"
        "    _sw_picked bigint;\n"
        "    _sw_done bigint;\n"
        "    _sw_total bigint := 0;\n"
        "BEGIN\n"
        "    LOOP\n"
    ).format(t=var_type)
    indented = "\n".join("        " + line for line in body.splitlines())
    tail = sql.SQL(
        ";\n        _sw_total := _sw_total + _sw_done;\n"
        "        COMMIT;\n"
        "        RAISE NOTICE 'rule %: % rows baselined', {rule}, _sw_total;\n"
        "        EXIT WHEN _sw_picked < {batch};\n"
        "        _sw_since := _sw_last;\n"
        "    END LOOP;\n"
        "END\n"
    ).format(rule=sql.Literal(rule.name), batch=sql.Literal(batch))
    after = f"{_analyze(rule).as_string(None)};\n" if rule.track == "table" else ""
    return (
        f"-- baseline of rule {rule.name} ({rule.source}) on {rule.table}: rows due before"
        f" {values.cutoff.as_string(None)}\n"
        f"DO {_TAG}\n{head.as_string(None)}{indented}{tail.as_string(None)}{_TAG};\n{after}"
    )


_PRINT_HEAD = """\
-- slawatch baseline: every row overdue at the cutoff below is marked as seen, so
-- the first 'slawatch run' pages only for what falls due after it. Run with psql
-- in autocommit (its default), after the migration above: each DO block commits
-- every {batch} rows; if interrupted, run it again: it finishes the rest.
-- Rows that fall due between printing and running are not baselined (they page):
-- print again just before running for a later cutoff.
"""


def render_all(rules: list[Rule], tables: dict[str, TableInfo], now: datetime) -> str:
    """The baselines of ``rules`` (``migrate --print --baseline``). An event rule whose
    timer table the script above creates has no timer to mark yet: a comment says so."""
    out = [_PRINT_HEAD.format(batch=f"{BATCH:,}")]
    for rule in rules:
        info = tables.get(rule.name)
        if info is None:
            out.append(
                f"-- {rule.name}: its timer table {rule.schema_name}.{rule.table_name} is"
                " created by the migration above; no timer to mark as seen yet\n"
            )
        else:
            out.append(render(rule, info, now))
    return "\n".join(out)
